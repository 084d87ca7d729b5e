"""What the searches need from a problem: the SearchProblem and Game protocols.

Searches depend on these protocols, never on a concrete problem. A state is any hashable
value; problems keep states compact (``bytes``, small tuples) because searches hold
hundreds of thousands of them in dicts and heaps.
"""

from __future__ import annotations

from typing import (AbstractSet, Any, Hashable, List, Optional, Protocol, Sequence,
                    Tuple, runtime_checkable)

import numpy as np

from async_search.base import TensorSpec


#: A problem's state: hashable and cheap to compare. Typed as Any, since each problem
#: takes its own kind (``bytes``, a tuple): a protocol method typed for every hashable
#: would be one no problem's narrower method meets.
State = Any


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

    def neighbors(self, state: State) -> Sequence[Tuple[State, float]]:
        """The successors of ``state`` with the cost of each step."""

    def is_goal(self, state: State) -> bool:
        """Whether ``state`` is a goal."""

    def encode(self, states: Sequence[State]) -> np.ndarray:
        """The model input for ``states``: an array ``[len(states), *input_spec.shape]``,
        a new one at each call (``asr.serve`` reads a request when its batch forms, so
        an array refilled by a later call would give other states' values)."""

    # Optional: ``compact_keys(self) -> CompactKeys | None``. A* uses it when a problem
    # has it and it returns an object; otherwise A* calls ``neighbors`` state by state.


@runtime_checkable
class CompactKeys(Protocol):
    """A problem's states as compact keys, expanded and encoded many at a time (A*).

    A SearchProblem may offer ``compact_keys()`` returning one of these (or None when it
    cannot, for some sizes say). A* then keeps compact keys (small ints, say) instead of
    states, expands all the nodes of a step in one call and encodes from the keys; it
    returns the same result, and sends the same requests, as with ``neighbors``,
    ``is_goal`` and ``encode``, which these must therefore agree with exactly:

    - ``key(state)`` is one-to-one, ``state(key(s)) == s``;
    - ``expand`` gives the keys of ``neighbors`` in the same order, each step costing
      ``step_cost`` (> 0), leaving out the move back to a given parent (A* never needs
      it: with positive costs, a node's parent is never reached more cheaply through
      the node);
    - ``goal_keys`` are exactly the keys of the states for which ``is_goal`` is true;
    - ``encode(keys)`` equals ``problem.encode([state(k) for k in keys])``, bit for bit.

    ``SlidingPuzzle`` offers one for sizes up to 4 (a state in one int).
    """

    step_cost: float
    """The cost of every step (an int keeps path costs ints)."""
    goal_keys: AbstractSet[Hashable]
    """The keys of the goal states."""

    def key(self, state: State) -> Hashable:
        """The compact key of ``state``."""

    def state(self, key: Hashable) -> State:
        """The state whose key is ``key``."""

    def expand(self, keys: Sequence[Hashable],
               parents: Sequence[Hashable]) -> Tuple[List[Hashable], List[int]]:
        """The successors of many nodes at once: ``(children, counts)``.

        ``children`` lists the keys of the successors of ``keys[0]`` (``counts[0]`` of
        them, in ``neighbors`` order, without ``parents[0]``), then those of
        ``keys[1]``, and so on. A parent equal to its key leaves nothing out.
        """

    def encode(self, keys: Sequence[Hashable]) -> np.ndarray:
        """The model input for the states of ``keys``, as ``SearchProblem.encode``."""


def compact_keys_of(problem: SearchProblem) -> Optional[CompactKeys]:
    """The problem's ``CompactKeys`` if it offers them, else None."""
    offer = getattr(problem, "compact_keys", None)
    return offer() if callable(offer) else None


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

    def legal_actions(self, state: State) -> Sequence[int]:
        """The actions the player to move may take, ascending; empty exactly when the
        game is over (searches rely on it to skip the terminal test)."""

    def play(self, state: State, action: int) -> State:
        """The state after the player to move takes ``action``; ValueError if illegal."""

    def terminal_value(self, state: State) -> float | None:
        """The value for the player to move if the game is over, else None."""

    def encode(self, states: Sequence[State]) -> np.ndarray:
        """The network input for ``states``: ``[len(states), *input_spec.shape]``, a
        new array at each call (as ``SearchProblem.encode``)."""


def board_planes(game: Game, owner: str) -> Tuple[int, int, int]:
    """``(planes, rows, columns)``: the input of a game encoded as planes.

    Raises:
        ValueError: naming ``owner`` (the net that needs planes), for any other input.
    """
    shape = tuple(game.input_spec.shape)
    if len(shape) != 3:
        raise ValueError(f"{owner} takes a game encoded as planes [planes, rows, "
                         f"columns], got input shape {shape}")
    return shape
