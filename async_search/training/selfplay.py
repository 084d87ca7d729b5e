"""Self-play: one game of MCTS against itself, as training arrays.

A game is a deterministic function of its id, the seed and the model's outputs (the
Dirichlet noise and the sampled opening moves are seeded by both), so it is the same on
every backend and in a resumed run. It is a plain coroutine over ``evaluate``: any
number of games run concurrently and their requests batch in the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from async_search import search
from async_search.checks import check_float, check_int

__all__ = ["SelfPlayConfig", "GameRecord", "selfplay_game"]


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    """How a self-play game searches and samples.

    Attributes:
        simulations: MCTS simulations per move.
        num_parallel: leaves in flight per MCTS round (one request per round).
        sampling_moves: the first moves are drawn in proportion to the visit counts
            (temperature 1); later moves take the most visited action.
        dirichlet_alpha: root noise concentration (AlphaZero used 0.3 for chess; about
            10 / legal moves suits Connect Four).
        dirichlet_fraction: weight of the noise in the root prior.
        c_puct: PUCT's exploration constant.
        value_target: ``outcome``: the game's result z for the player to move;
            ``mixed``: the mean of z and the search's root value q, a less noisy target
            that speeds up early learning.
        seed: seeds every game's noise and sampling, with the game id.
    """

    simulations: int = 64
    num_parallel: int = 4
    sampling_moves: int = 10
    dirichlet_alpha: float = 1.0
    dirichlet_fraction: float = 0.25
    c_puct: float = 1.5
    value_target: str = "outcome"
    seed: int = 0

    def __post_init__(self):
        check_int("simulations", self.simulations, minimum=1)
        check_int("num_parallel", self.num_parallel, minimum=1)
        check_int("sampling_moves", self.sampling_moves, minimum=0)
        check_float("dirichlet_alpha", self.dirichlet_alpha, minimum=0.0, strict=True)
        check_float("dirichlet_fraction", self.dirichlet_fraction, minimum=0.0)
        check_float("c_puct", self.c_puct, minimum=0.0, strict=True)
        check_int("seed", self.seed, minimum=0)
        if self.value_target not in ("outcome", "mixed"):
            raise ValueError(f"value_target must be 'outcome' or 'mixed', got "
                             f"{self.value_target!r}")


class GameRecord(NamedTuple):
    """One self-play game as training arrays (``n`` positions)."""

    x: np.ndarray
    """float32 ``[n, *input_shape]``: each position, encoded for the player to move."""
    policy: np.ndarray
    """float32 ``[n, num_actions]``: the root's visit distribution."""
    value: np.ndarray
    """float32 ``[n]``: the game's result for the player to move (1, 0 or -1)."""
    moves: tuple
    """The actions played, in order."""
    winner: int
    """+1 if the first player won, -1 the second, 0 a draw."""


async def selfplay_game(game_id: int, evaluate: Any, *, game: Any,
                        config: SelfPlayConfig) -> GameRecord:
    """Plays game ``game_id`` with MCTS for both players and returns its samples.

    The signature fits ``run_searches``: ``functools.partial(selfplay_game, game=game,
    config=config)`` is a search function whose starts are game ids.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> ev = asr.immediate(problems.PolicyValueMLP(game, seed=0))
        >>> record = asyncio.run(selfplay_game(0, ev, game=game,
        ...                      config=SelfPlayConfig(simulations=8)))
        >>> record.x.shape[0] == len(record.moves)
        True
    """
    rng = np.random.default_rng([config.seed, game_id])
    state = game.initial_state()
    states, visits, moves, root_values = [], [], [], []
    while game.terminal_value(state) is None:
        move = len(moves)
        r = await search.mcts(
            game, state, evaluate, num_simulations=config.simulations,
            num_parallel=config.num_parallel, c_puct=config.c_puct,
            dirichlet_alpha=config.dirichlet_alpha,
            dirichlet_fraction=config.dirichlet_fraction,
            seed=int(rng.integers(2 ** 63)))
        states.append(state)
        visits.append(r.visit_counts)
        root_values.append(r.root_value)
        if move < config.sampling_moves:
            counts = np.asarray(r.visit_counts, np.float64)
            action = int(rng.choice(len(counts), p=counts / counts.sum()))
        else:
            action = r.action
        moves.append(action)
        state = game.play(state, action)
    final = game.terminal_value(state)  # for the player to move at the end
    n = len(states)
    # The player to move at position i is the one to move at the end iff n - i is even.
    value = np.array([final if (n - i) % 2 == 0 else -final for i in range(n)], np.float32)
    if config.value_target == "mixed":
        value = (0.5 * (value + np.asarray(root_values, np.float64))).astype(np.float32)
    winner = int(game.winner(state)) if hasattr(game, "winner") else 0
    return GameRecord(game.encode(states), np.asarray(visits, np.float32), value,
                      tuple(moves), winner)
