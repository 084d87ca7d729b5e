"""What the searches need from a problem: the SearchProblem and Game protocols.

Searches depend on these protocols, never on a concrete problem. A state is any hashable
value; problems keep states compact (``bytes``, small tuples) because searches hold
hundreds of thousands of them in dicts and heaps.
"""

from __future__ import annotations

from typing import Hashable, List, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from async_search.base import TensorSpec

__all__ = ["State", "SearchProblem", "Game"]

#: A problem's state: hashable and cheap to compare.
State = Hashable


@runtime_checkable
class SearchProblem(Protocol):
    """A graph to search for a goal (A*, rollouts).

    ``neighbors`` returns ``(next_state, step_cost)`` pairs in a fixed order, so that a
    search over them is deterministic; step costs are positive. ``encode`` turns a list
    of states into one batch ``[n, *input_spec.shape]`` for the model, in one vectorized
    call per request.
    """

    input_spec: TensorSpec

    def check_state(self, state: State) -> None:
        """Raise ValueError, naming the problem and the fix, unless ``state`` is valid."""

    def neighbors(self, state: State) -> List[Tuple[State, float]]:
        """The successors of ``state`` with the cost of each step."""

    def is_goal(self, state: State) -> bool:
        """Whether ``state`` is a goal."""

    def encode(self, states: Sequence[State]) -> np.ndarray:
        """The model input for ``states``: an array ``[len(states), *input_spec.shape]``."""


@runtime_checkable
class Game(Protocol):
    """A two-player, zero-sum, alternating-move game with a fixed action set (MCTS).

    Values are always from the point of view of the player to move: +1 a win, -1 a loss.
    """

    input_spec: TensorSpec
    num_actions: int

    def initial_state(self) -> State:
        """The position before the first move."""

    def check_state(self, state: State) -> None:
        """Raise ValueError, naming the game and the fix, unless ``state`` is valid."""

    def legal_actions(self, state: State) -> Tuple[int, ...]:
        """The actions the player to move may take, ascending; empty exactly when the
        game is over (searches rely on it to skip the terminal test)."""

    def play(self, state: State, action: int) -> State:
        """The state after the player to move takes ``action``; ValueError if illegal."""

    def terminal_value(self, state: State) -> float | None:
        """The value for the player to move if the game is over, else None."""

    def encode(self, states: Sequence[State]) -> np.ndarray:
        """The network input for ``states``: ``[len(states), *input_spec.shape]``."""
