"""Move accuracy: how often a player picks an optimal move on solved positions.

``move_accuracy(choose_move, positions)`` asks a chooser for a move in each position and
counts those among the position's optimal moves (solver labels, such as
``problems.connect_four_positions``). The choosers for a policy-value network:
``policy_chooser`` (the net alone: the legal move with the largest logit) and
``mcts_chooser`` (``search.mcts`` at a fixed number of simulations, no root noise).
An arena player fits too: ``lambda state: player.choose(game, state, rng)``.

All positions are asked at once, so the requests of a network chooser batch when
``evaluate`` comes from ``asr.serve``; the figure is the same as with
``asr.immediate`` whenever the model's rows are independent of their batch-mates.

Example:
    >>> import asyncio, async_search as asr
    >>> from async_search import problems
    >>> game = problems.ConnectFour()
    >>> positions = problems.connect_four_positions("end")
    >>> net = asr.immediate(problems.pretrained("connect_four"))
    >>> r = asyncio.run(move_accuracy(policy_chooser(game, net), positions))
    >>> r.positions, 0.0 <= r.accuracy <= 1.0
    (200, True)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Awaitable, Callable, Iterable, Protocol, Tuple, Union, runtime_checkable

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_float, check_int
from async_search.errors import ModelOutputError
from async_search.problems.base import Game, State
from async_search.search.alphazero import mcts

__all__ = ["LabelledPosition", "ChooseMove", "MoveAccuracy", "move_accuracy",
           "policy_chooser", "mcts_chooser"]

#: A move chooser: the move for a state, or an awaitable of it.
ChooseMove = Callable[[State], Union[int, Awaitable[int]]]


@runtime_checkable
class LabelledPosition(Protocol):
    """A position with the moves that count as correct in it."""

    state: State
    """The position (not over)."""
    optimal_moves: Tuple[int, ...]
    """The actions that count as correct."""


@dataclasses.dataclass(frozen=True)
class MoveAccuracy:
    """What ``move_accuracy`` returns."""

    accuracy: float
    """The fraction of positions where the chosen move is optimal, in [0, 1] (0.0 for
    no positions)."""
    correct: int
    """Positions where the chosen move is optimal."""
    positions: int
    """Positions asked."""
    chosen: Tuple[int, ...]
    """The move chosen in each position, in order."""
    mistakes: Tuple[int, ...]
    """The indices of the positions where the chosen move is not optimal."""


async def move_accuracy(choose_move: ChooseMove, positions: Iterable[LabelledPosition]
                        ) -> MoveAccuracy:
    """The fraction of ``positions`` in which ``choose_move`` picks an optimal move.

    Args:
        choose_move: ``choose_move(state)`` gives an action, or an awaitable of one
            (a coroutine function, say); all positions are asked concurrently. A move
            that is not among the optimal ones (an illegal one included) is a mistake.
        positions: objects with ``state`` and ``optimal_moves`` (``LabelledPosition``).

    Returns:
        A ``MoveAccuracy``.

    Raises:
        ValueError: if a chosen move is not an integer (bool included).
        Whatever ``choose_move`` raises (the other questions are cancelled first).

    Example:
        >>> import asyncio
        >>> from async_search import problems
        >>> positions = problems.connect_four_positions("middle")
        >>> oracle = {p.state: p.optimal_moves[0] for p in positions}
        >>> r = asyncio.run(move_accuracy(oracle.__getitem__, positions))
        >>> r.accuracy, r.positions, r.mistakes
        (1.0, 200, ())
    """
    if not callable(choose_move):
        raise ValueError(f"choose_move must be a callable state -> action (or an "
                         f"awaitable of one), got {choose_move!r}")
    positions = list(positions)

    async def ask(position: LabelledPosition) -> int:
        move = choose_move(position.state)
        if inspect.isawaitable(move):
            move = await move
        if isinstance(move, (bool, np.bool_)) or not isinstance(move, (int, np.integer)):
            raise ValueError(f"choose_move must give an integer action, got {move!r} "
                             f"for state {position.state!r}")
        return int(move)

    tasks = [asyncio.ensure_future(ask(p)) for p in positions]
    try:
        chosen = tuple(await asyncio.gather(*tasks))
    except BaseException:
        # A chooser failed (or this call was cancelled): no question outlives the call.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    mistakes = tuple(i for i, (p, move) in enumerate(zip(positions, chosen))
                     if move not in p.optimal_moves)
    correct = len(positions) - len(mistakes)
    return MoveAccuracy(accuracy=correct / len(positions) if positions else 0.0,
                        correct=correct, positions=len(positions), chosen=chosen,
                        mistakes=mistakes)


def policy_chooser(game: Game, evaluate: Evaluate) -> Callable[[State], Awaitable[int]]:
    """The network alone: the legal action with the largest policy logit (ties: the
    lowest action), one request of one state per position.

    Args:
        game: the game.
        evaluate: ``await evaluate(game.encode(states))`` gives ``(policy_logits
            [n, num_actions], value)``.

    Raises (from the chooser):
        ModelOutputError: for outputs that are not ``(logits [1, num_actions], value)``.
    """
    if not callable(evaluate):
        raise ValueError(f"evaluate must be an awaitable callable such as "
                         f"asr.immediate(model), got {evaluate!r}")
    num_actions = int(game.num_actions)

    async def choose(state: State) -> int:
        legal = game.legal_actions(state)
        y = await evaluate(game.encode([state]))
        if not (isinstance(y, (tuple, list)) and len(y) == 2):
            raise ModelOutputError(f"a policy-value model must return the tuple "
                                   f"(policy_logits [1, {num_actions}], value), got "
                                   f"{type(y).__name__}")
        logits = np.asarray(y[0], np.float64)
        if logits.shape != (1, num_actions):
            raise ModelOutputError(f"policy logits must have shape [1, {num_actions}], "
                                   f"got {logits.shape}")
        row = logits[0]
        return int(max(legal, key=lambda a: (row[a], -a)))

    return choose


def mcts_chooser(game: Game, evaluate: Evaluate, *, num_simulations: int = 100,
                 num_parallel: int = 8, c_puct: float = 1.25
                 ) -> Callable[[State], Awaitable[int]]:
    """``search.mcts`` without root noise (deterministic): its most visited action.

    Args:
        game: the game.
        evaluate: the policy-value network, as for ``search.mcts``.
        num_simulations: simulations per position (>= 1).
        num_parallel: leaves in flight per tree (>= 1).
        c_puct: PUCT's exploration constant (> 0).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> choose = mcts_chooser(game, asr.immediate(problems.pretrained("connect_four")),
        ...                       num_simulations=16)
        >>> asyncio.run(choose(game.from_moves([0, 1, 0, 1, 0])))   # block column 0
        0
    """
    if not callable(evaluate):
        raise ValueError(f"evaluate must be an awaitable callable such as "
                         f"asr.immediate(model), got {evaluate!r}")
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    c_puct = check_float("c_puct", c_puct, minimum=0.0, strict=True)

    async def choose(state: State) -> int:
        result = await mcts(game, state, evaluate, num_simulations=num_simulations,
                            num_parallel=num_parallel, c_puct=c_puct,
                            dirichlet_fraction=0.0)
        return int(result.action)

    return choose
