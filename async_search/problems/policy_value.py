"""A seeded NumPy policy-value network for games, with row-independent exact outputs.

The output format every policy-value model in async_search follows (and ``search.mcts``
expects) is the tuple ``(policy_logits [n, num_actions], value [n, 1])``, float32.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from async_search.models import MLP
from async_search.problems.base import Game


class PolicyValueMLP:
    """A seeded, untrained policy-value network for a game, in NumPy.

    Output: the tuple ``(policy_logits, value)``: float32 ``[n, num_actions]`` logits
    over all actions (the search masks illegal ones), and float32 ``[n, 1]`` values in
    [-1, 1] for the player to move. One MLP with ``num_actions + 1`` outputs computes
    both; the value is its last output clipped to [-1, 1] (a piecewise-linear squashing,
    so rows stay exact). ``tf_nets.policy_value_tf_net`` with the same arguments computes
    bitwise the same outputs on TensorFlow.

    Args:
        game: gives the input spec and the number of actions.
        hidden_sizes: widths of the ReLU hidden layers.
        seed: seeds the weights.

    Example:
        >>> from async_search.problems.connect_four import ConnectFour
        >>> game = ConnectFour()
        >>> logits, value = PolicyValueMLP(game)(game.encode([game.initial_state()]))
        >>> logits.shape, value.shape
        ((1, 7), (1, 1))
    """

    def __init__(self, game: Game, *, hidden_sizes: Sequence[int] = (64,), seed: int = 0):
        if not (hasattr(game, "num_actions") and hasattr(game, "input_spec")):
            raise TypeError(f"PolicyValueMLP takes a game (with num_actions and "
                            f"input_spec, as ConnectFour), got {type(game).__name__}")
        self.num_actions = int(game.num_actions)
        self.body = MLP(game.input_spec.shape, tuple(hidden_sizes), self.num_actions + 1,
                        seed)
        self.input_spec = self.body.input_spec

    def with_weights(self, weights: Sequence[Tuple[np.ndarray, np.ndarray]]
                     ) -> "PolicyValueMLP":
        """A copy with trained ``(w, b)`` layers of the same shapes (rounded onto the
        exact grid of ``models.MLP``); the last layer has ``num_actions + 1`` outputs:
        the logits, then the value."""
        copy = object.__new__(PolicyValueMLP)
        copy.__dict__.update(self.__dict__)
        copy.body = self.body.with_weights(weights)
        return copy

    @property
    def hidden_sizes(self) -> Tuple[int, ...]:
        return tuple(w.shape[1] for w, _ in self.body.weights[:-1])

    def __call__(self, batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        out = self.body(batch)
        a = self.num_actions
        return np.ascontiguousarray(out[:, :a]), np.clip(out[:, a:], -1.0, 1.0)
