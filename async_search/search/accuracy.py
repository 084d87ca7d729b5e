"""Move accuracy: how often a player picks an optimal move on solved positions.

``move_accuracy(choose_move, positions)`` asks a chooser for a move in each position and
counts those among the position's optimal moves (solver labels, such as
``problems.connect_four_positions``). The choosers for a policy-value network:
``policy_chooser`` (the net alone: the legal move with the largest logit) and
``mcts_chooser`` (``search.mcts`` at a fixed number of simulations, no root noise) and
``gumbel_chooser`` (``search.gumbel_mcts`` likewise, no Gumbel noise).
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
from typing import (Any, Awaitable, Callable, Coroutine, Iterable, Protocol, Tuple, Union,
                    runtime_checkable)

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_int
from async_search.errors import ModelOutputError
from async_search.problems.base import Game, State
from async_search.search.base import (GAME_METHODS, check_evaluate, check_num_actions,
                                      check_protocol, check_search_constant, encoded,
                                      evaluated, policy_logits_of)
from async_search.search.gumbel import gumbel_mcts
from async_search.search.puct import mcts


#: A move chooser: the move for a state, or an awaitable of it.
ChooseMove = Callable[[State], Union[int, Awaitable[int]]]


@runtime_checkable
class LabelledPosition(Protocol):
    """A position with the moves that count as correct in it."""

    # Read-only (properties), so that a frozen dataclass meets it too.
    @property
    def state(self) -> State:
        """The position (not over)."""

    @property
    def optimal_moves(self) -> Tuple[int, ...]:
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


def _checked_game(game: Any) -> int:
    """The game's ``num_actions``, once ``game`` is checked to be a ``Game`` instance
    (TypeError naming what it lacks): a chooser is made before any position."""
    check_protocol("game", game, GAME_METHODS, "Game", "problems.ConnectFour()")
    return check_num_actions(game)


def policy_chooser(game: Game, evaluate: Evaluate,
                   ) -> Callable[[State], Coroutine[Any, Any, int]]:
    """The network alone: the legal action with the largest policy logit (ties: the
    lowest action), one request of one state per position.

    Args:
        game: the game.
        evaluate: ``await evaluate(game.encode(states))`` gives ``(policy_logits
            [n, num_actions], value)``.

    Raises:
        TypeError: for a ``game`` that is not a ``Game`` (so do the other choosers).

    Raises (from the chooser):
        ModelOutputError: for outputs that are not ``(logits [1, num_actions], value)``.
        TypeError: if ``evaluate(x)`` returns something that cannot be awaited (a
            model passed where ``asr.immediate(model)`` belongs).
    """
    num_actions = _checked_game(game)
    check_evaluate(evaluate)

    async def choose(state: State) -> int:
        game.check_state(state)
        legal = game.legal_actions(state)
        if not legal:  # asked nothing: a finished game has no move to choose
            raise ValueError("policy_chooser: the game is over in this state; there is "
                             "no move to choose")
        y = await evaluated(evaluate, encoded(game, game.encode([state]), 1))
        row = policy_logits_of(y, 1, num_actions)[0]
        logits = np.asarray([row[a] for a in legal], np.float64)
        if np.isnan(logits).any() or np.isposinf(logits).any():
            raise ModelOutputError(f"policy_chooser: the model's policy logits for the "
                                   f"legal moves must be finite or -inf, got {logits}")
        return int(max(legal, key=lambda a: (row[a], -a)))

    return choose


def mcts_chooser(game: Game, evaluate: Evaluate, *, num_simulations: int = 100,
                 num_parallel: int = 8, c_puct: float = 1.25, solve: bool = False
                 ) -> Callable[[State], Coroutine[Any, Any, int]]:
    """``search.mcts`` without root noise (deterministic): its most visited action.

    Args:
        game: the game.
        evaluate: the policy-value network, as for ``search.mcts``.
        num_simulations: simulations per position (>= 1).
        num_parallel: leaves in flight per tree (>= 1).
        c_puct: PUCT's exploration constant (> 0).
        solve: prove values as the search goes (``search.mcts``'s ``solve``).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> choose = mcts_chooser(game, asr.immediate(problems.pretrained("connect_four")),
        ...                       num_simulations=16)
        >>> asyncio.run(choose(game.from_moves([0, 1, 0, 1, 0])))   # block column 0
        0
    """
    _checked_game(game)
    check_evaluate(evaluate)
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    c_puct = check_search_constant("c_puct", c_puct, strict=True)

    async def choose(state: State) -> int:
        result = await mcts(game, state, evaluate, num_simulations=num_simulations,
                            num_parallel=num_parallel, c_puct=c_puct,
                            dirichlet_fraction=0.0, solve=solve)
        return int(result.action)

    return choose


def gumbel_chooser(game: Game, evaluate: Evaluate, *, num_simulations: int = 32,
                   num_parallel: int = 8, max_num_considered_actions: int = 16,
                   c_visit: float = 50.0, c_scale: float = 0.1
                   ) -> Callable[[State], Coroutine[Any, Any, int]]:
    """``search.gumbel_mcts`` without noise (``gumbel_scale=0``, deterministic): the
    action Sequential Halving chooses.

    Args:
        game: the game.
        evaluate: the policy-value network, as for ``search.gumbel_mcts``.
        num_simulations: simulations per position (>= 1).
        num_parallel: leaves in flight per tree (>= 1).
        max_num_considered_actions: root actions considered (>= 1).
        c_visit, c_scale: ``sigma``'s constants (>= 0).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> choose = gumbel_chooser(game, asr.immediate(problems.pretrained("connect_four")),
        ...                         num_simulations=16)
        >>> asyncio.run(choose(game.from_moves([0, 1, 0, 1, 0])))   # block column 0
        0
    """
    _checked_game(game)
    check_evaluate(evaluate)
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    max_considered = check_int("max_num_considered_actions", max_num_considered_actions,
                               minimum=1)
    c_visit = check_search_constant("c_visit", c_visit)
    c_scale = check_search_constant("c_scale", c_scale)

    async def choose(state: State) -> int:
        result = await gumbel_mcts(game, state, evaluate, num_simulations=num_simulations,
                                   max_num_considered_actions=max_considered,
                                   num_parallel=num_parallel, c_visit=c_visit,
                                   c_scale=c_scale, gumbel_scale=0.0)
        return int(result.action)

    return choose
