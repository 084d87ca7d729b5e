"""The pre-issue-12 MCTS, kept only to measure the new one against (search_cost.py).

A verbatim copy of ``async_search/search/tree.py``, the ``mcts`` coroutine of
``async_search/search/alphazero.py``, ``ConnectFour`` of
``async_search/problems/connect_four.py`` (as ``ConnectFourBefore``) and ``values_of`` of
``async_search/search/base.py`` at commit 3c80ed5, before issue 12 (goal 3: twice the
simulations per second) rewrote them. Nothing in the package imports it; do not fix or
speed it up: it is the yardstick. ``mcts(ConnectFourBefore(), ...)`` returns the same
``MCTSResult`` fields as ``search.mcts(ConnectFour(), ...)``
(tests/search/test_mcts_golden.py pins the new one to results recorded from this code).

Example:
    >>> import asyncio, async_search as asr
    >>> from benchmarks.search_cost import free_policy_value
    >>> game = ConnectFourBefore()
    >>> ev = asr.immediate(free_policy_value(7))
    >>> r = asyncio.run(mcts(game, game.initial_state(), ev, num_simulations=16))
    >>> sum(r.visit_counts)
    16
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from async_search.base import Evaluate, TensorSpec
from async_search.checks import check_float, check_int, is_int
from async_search.errors import ModelOutputError
from async_search.problems.base import Game, State

__all__ = ["ConnectFourBefore", "MCTSResult", "mcts"]


# -- async_search/search/base.py ---------------------------------------------------------

def values_of(y: Any, n: int, what: str) -> list:
    """The ``n`` scalar outputs of a model (shape ``[n]`` or ``[n, 1]``) as Python floats.

    Raises:
        ModelOutputError: if ``y`` does not hold exactly one finite value per element.
    """
    if isinstance(y, (tuple, list, dict)):
        raise ModelOutputError(f"{what} must be one array of shape [{n}] or [{n}, 1], got "
                               f"a {type(y).__name__} of outputs; is it a policy-value "
                               f"model?")
    values = np.asarray(y, np.float64)
    if values.size != n or (values.ndim and values.shape[0] != n):
        raise ModelOutputError(f"{what} must have one value per element, shape [{n}] or "
                               f"[{n}, 1]; got shape {values.shape}")
    values = values.reshape(n)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][:3]
        raise ModelOutputError(f"{what} must be finite, got {bad}")
    return values.tolist()


# -- async_search/problems/connect_four.py ---------------------------------------------

_ROWS, _COLUMNS = 6, 7
_STRIDE = _ROWS + 1  # one empty sentinel bit on top of each column keeps shifts apart
_COLUMN_BITS = (1 << _ROWS) - 1
_BOARD = sum(_COLUMN_BITS << (c * _STRIDE) for c in range(_COLUMNS))
# Bit of (row, column), rows counted from the bottom: the layout of encode's planes.
_CELL_BITS = np.array([[c * _STRIDE + r for c in range(_COLUMNS)] for r in range(_ROWS)],
                      np.int64)


class ConnectFourState(NamedTuple):
    """A position: the stones of each player as bitboards (bit ``7 * column + row``)."""

    to_move: int
    """Stones of the player to move."""
    waiting: int
    """Stones of the player who moved last."""


def _has_four(stones: int) -> bool:
    # Vertical (1), horizontal (7) and both diagonals (6, 8): a run of four in a
    # direction leaves a bit set after two shift-and-mask steps.
    for shift in (1, _STRIDE, _STRIDE - 1, _STRIDE + 1):
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (2 * shift)):
            return True
    return False


class ConnectFourBefore:
    """Connect Four on a 6 x 7 board; actions are the columns 0..6.

    States are ``ConnectFourState(to_move, waiting)`` bitboard pairs: hashable, compact,
    and cheap to play. Values are from the point of view of the player to move; a state
    in which the player who just moved has four in a row is terminal with value -1, and a
    full board without four is a draw (0). ``encode`` gives float32 planes
    ``[2, 6, 7]``: the stones of the player to move, then the opponent's, rows counted
    from the bottom.

    Example:
        >>> game = ConnectFourBefore()
        >>> s = game.play(game.initial_state(), 3)
        >>> game.legal_actions(s)
        (0, 1, 2, 3, 4, 5, 6)
        >>> game.encode([s]).shape
        (1, 2, 6, 7)
    """

    num_actions = _COLUMNS
    rows = _ROWS
    columns = _COLUMNS

    def __init__(self):
        self.input_spec = TensorSpec((2, _ROWS, _COLUMNS), np.float32)

    def __repr__(self) -> str:
        return "ConnectFourBefore()"

    def initial_state(self) -> ConnectFourState:
        """The empty board, first player to move."""
        return ConnectFourState(0, 0)

    def from_moves(self, columns: Iterable[int]) -> ConnectFourState:
        """The state after playing ``columns`` in turn from the empty board."""
        state = self.initial_state()
        for column in columns:
            state = self.play(state, column)
        return state

    def check_state(self, state: ConnectFourState) -> None:
        """Raise ValueError unless ``state`` is a well-formed position.

        Checks the type, that stones lie on the board, fall to the bottom of their column
        and alternate in number, and that the player to move has not already won.
        """
        if not (isinstance(state, tuple) and len(state) == 2
                and all(isinstance(b, int) and b >= 0 for b in state)):
            raise ValueError(f"{self!r}: a state must be a ConnectFourState of two "
                             f"bitboards (use game.initial_state() or game.from_moves), "
                             f"got {state!r}")
        mine, theirs = state
        both = mine | theirs
        if mine & theirs or both & ~_BOARD:
            raise ValueError(f"{self!r}: state {state!r} puts two stones on a cell or a "
                             f"stone off the board")
        for c in range(_COLUMNS):
            column = (both >> (c * _STRIDE)) & _COLUMN_BITS
            if column & (column + 1):
                raise ValueError(f"{self!r}: state {state!r} has a floating stone in "
                                 f"column {c}; stones fall to the bottom")
        if theirs.bit_count() - mine.bit_count() not in (0, 1) or (
                mine.bit_count() + theirs.bit_count()) % 2 != (
                theirs.bit_count() - mine.bit_count()):
            raise ValueError(f"{self!r}: state {state!r} has {mine.bit_count()} stones "
                             f"for the player to move and {theirs.bit_count()} for the "
                             f"other; moves alternate, first player first")
        if _has_four(mine):
            raise ValueError(f"{self!r}: in state {state!r} the player to move already "
                             f"has four in a row; the game ended before")

    # -- rules ----------------------------------------------------------------------------

    def legal_actions(self, state: ConnectFourState) -> Tuple[int, ...]:
        """The columns that are not full, ascending; empty once the game is over."""
        mine, theirs = state
        both = mine | theirs
        if _has_four(theirs):
            return ()
        top = 1 << (_ROWS - 1)
        return tuple(c for c in range(_COLUMNS) if not (both >> (c * _STRIDE)) & top)

    def play(self, state: ConnectFourState, action: int) -> ConnectFourState:
        """Drop a stone of the player to move into column ``action``.

        Raises:
            ValueError: if ``action`` is not a column, the column is full, or the game is
                over.
        """
        mine, theirs = state
        if not is_int(action) or not 0 <= action < _COLUMNS:
            raise ValueError(f"{self!r}: an action is a column 0..{_COLUMNS - 1}, got "
                             f"{action!r}")
        if _has_four(theirs):
            raise ValueError(f"{self!r}: cannot play column {action}, the game is over "
                             f"(the last player won)")
        shift = int(action) * _STRIDE
        height = (((mine | theirs) >> shift) & _COLUMN_BITS).bit_length()
        if height == _ROWS:
            raise ValueError(f"{self!r}: column {action} is full; legal columns are "
                             f"{self.legal_actions(state)}")
        return ConnectFourState(theirs, mine | (1 << (shift + height)))

    def terminal_value(self, state: ConnectFourState) -> float | None:
        """-1.0 if the player who just moved won, 0.0 for a full board, else None."""
        mine, theirs = state
        if _has_four(theirs):
            return -1.0
        if (mine | theirs) == _BOARD:
            return 0.0
        return None

    def is_terminal(self, state: ConnectFourState) -> bool:
        """Whether the game is over."""
        return self.terminal_value(state) is not None

    def winner(self, state: ConnectFourState) -> int | None:
        """+1 if the first player won, -1 the second, 0 a draw, None while playing."""
        value = self.terminal_value(state)
        if value is None:
            return None
        if value == 0.0:
            return 0
        first_moved_last = (state.to_move | state.waiting).bit_count() % 2 == 1
        return 1 if first_moved_last else -1

    # -- network input --------------------------------------------------------------------

    def encode(self, states: Sequence[ConnectFourState]) -> np.ndarray:
        """float32 ``[len(states), 2, 6, 7]``: player-to-move stones, then opponent's."""
        boards = np.array(states, np.int64).reshape(len(states), 2)
        bits = (boards[:, :, None, None] >> _CELL_BITS[None, None]) & 1
        return bits.astype(np.float32)

    def render(self, state: ConnectFourState) -> str:
        """The board as text, top row first: X the first player, O the second."""
        mine, theirs = state
        first, second = (mine, theirs) if (mine | theirs).bit_count() % 2 == 0 else (
            theirs, mine)
        lines = []
        for r in reversed(range(_ROWS)):
            row = ""
            for c in range(_COLUMNS):
                bit = 1 << (c * _STRIDE + r)
                row += "X" if first & bit else "O" if second & bit else "."
            lines.append(row)
        return "\n".join(lines)


# -- async_search/search/tree.py --------------------------------------------------------

Path = List[Tuple["Node", int]]  # (node, index of the legal action taken)


class Node:
    """A state in the tree, with the statistics of the edges to its children."""

    __slots__ = ("state", "actions", "terminal_value", "expanded", "pending", "prior",
                 "visits", "value_sum", "virtual", "children", "edge_visits", "seen",
                 "credit")

    def __init__(self, state: State, actions: Tuple[int, ...],
                 terminal_value: Optional[float]):
        self.state = state
        self.actions = actions  # the legal actions, ascending
        self.terminal_value = terminal_value  # for the player to move; None if playing
        self.expanded = False  # priors set (only for non-terminal nodes)
        self.pending = False  # selected for evaluation in the current round
        k = len(actions)
        self.prior: List[float] = [0.0] * k
        self.visits: List[int] = [0] * k
        self.value_sum: List[float] = [0.0] * k
        self.virtual: List[int] = [0] * k
        self.children: List[Optional[Node]] = [None] * k
        self.edge_visits = 0  # sum of visits + virtual over the edges
        # What selection reads, kept up to date so that it adds nothing per edge:
        # seen[i] = visits[i] + virtual[i], credit[i] = value_sum[i] - virtual[i].
        self.seen: List[int] = [0] * k
        self.credit: List[float] = [0.0] * k


def new_node(game: Game, state: State) -> Node:
    """An unexpanded node for ``state``."""
    actions = game.legal_actions(state)
    # A game has no legal action exactly when it is over (the Game protocol).
    terminal = None if actions else game.terminal_value(state)
    return Node(state, actions, terminal)


def select_child(node: Node, c_puct: float) -> int:
    """The edge maximising ``Q + c_puct * P * sqrt(1 + N) / (1 + n)``; ties: first.

    ``N`` counts the node's edge visits (virtual ones included); an edge with no visits
    has ``Q = 0``.
    """
    scale = c_puct * math.sqrt(1 + node.edge_visits)
    best, best_score = 0, -math.inf
    i = 0
    for n, w, p in zip(node.seen, node.credit, node.prior):
        score = (w / n + scale * p / (1 + n)) if n else scale * p
        if score > best_score:
            best, best_score = i, score
        i += 1
    return best


def select_leaf(game: Game, root: Node, c_puct: float) -> Tuple[Path, Node]:
    """Descend from ``root`` to a node that is unexpanded or terminal, adding a virtual
    loss on every edge taken; children are created as they are first reached."""
    path: Path = []
    node = root
    while node.expanded:
        i = select_child(node, c_puct)
        add_virtual_loss(node, i)
        path.append((node, i))
        child = node.children[i]
        if child is None:
            child = new_node(game, game.play(node.state, node.actions[i]))
            node.children[i] = child
        node = child
    return path, node


def add_virtual_loss(node: Node, i: int) -> None:
    """Count a descent in flight through edge ``i`` as a visit that lost."""
    node.virtual[i] += 1
    node.seen[i] += 1
    node.credit[i] = node.value_sum[i] - node.virtual[i]
    node.edge_visits += 1


def revert_virtual_loss(path: Path) -> None:
    """Undo the virtual loss that ``select_leaf`` added along ``path``."""
    for node, i in path:
        node.virtual[i] -= 1
        node.seen[i] -= 1
        node.credit[i] = node.value_sum[i] - node.virtual[i]
        node.edge_visits -= 1


def select_leaves(game: Game, root: Node, c_puct: float, k: int) -> List[Tuple[Path, Node]]:
    """Up to ``k`` descents for one round, in selection order.

    A descent that reaches a leaf already waiting for its evaluation in this round is
    undone and ends the round early (at least one descent always succeeds, since the
    first finds nothing pending). Terminal leaves may repeat: they need no evaluation.
    """
    selected = []
    for _ in range(k):
        path, leaf = select_leaf(game, root, c_puct)
        if leaf.pending:
            revert_virtual_loss(path)
            break
        if leaf.terminal_value is None:
            leaf.pending = True
        selected.append((path, leaf))
    return selected


def priors_from_logits(node: Node, logits: Sequence[float]) -> List[float]:
    """Softmax of ``logits`` (one per action of the game) over the node's legal actions."""
    legal = [float(logits[a]) for a in node.actions]
    top = max(legal)
    weights = [math.exp(x - top) for x in legal]
    total = sum(weights)
    return [w / total for w in weights]


def expand(node: Node, prior: Sequence[float]) -> None:
    """Give an unexpanded node its priors (one per legal action)."""
    node.prior = list(prior)
    node.expanded = True
    node.pending = False


def backup(path: Path, leaf_value: float) -> None:
    """Add a leaf's value (for the player to move at the leaf) along ``path``, replacing
    the virtual loss: each edge is credited from the view of the player who took it."""
    value = leaf_value
    for node, i in reversed(path):
        value = -value
        node.virtual[i] -= 1
        node.visits[i] += 1
        node.value_sum[i] += value
        node.credit[i] = node.value_sum[i] - node.virtual[i]


def complete_leaves(selected: List[Tuple[Path, Node]], logits: np.ndarray,
                    values: Sequence[float]) -> None:
    """Expand the evaluated leaves and back up every descent, in selection order.

    ``logits[j]`` and ``values[j]`` belong to the ``j``-th non-terminal leaf of
    ``selected``; terminal leaves back up their own value.
    """
    j = 0
    leaf_values = []
    rows = logits.tolist() if logits is not None else []  # Python floats: cheaper per item
    for _, leaf in selected:
        if leaf.terminal_value is None:
            expand(leaf, priors_from_logits(leaf, rows[j]))
            leaf_values.append(values[j])
            j += 1
        else:
            leaf_values.append(leaf.terminal_value)
    for (path, _), value in zip(selected, leaf_values):
        backup(path, value)


def add_exploration_noise(node: Node, rng: np.random.Generator, alpha: float,
                          fraction: float) -> None:
    """Mix Dirichlet(alpha) noise into an expanded node's priors (AlphaZero's root)."""
    if fraction == 0.0 or not node.actions:
        return
    noise = rng.dirichlet([alpha] * len(node.actions))
    node.prior = [(1.0 - fraction) * p + fraction * float(n)
                  for p, n in zip(node.prior, noise)]


# -- async_search/search/alphazero.py ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MCTSResult:
    """What ``mcts`` returns; per-action tuples have one entry per action of the game
    (``game.num_actions``), zero for illegal actions."""

    action: int
    """The most visited action (ties go to the lowest action)."""
    visit_counts: Tuple[int, ...]
    """Visits of each root action; they sum to ``num_simulations``."""
    action_values: Tuple[float, ...]
    """Mean backed-up value of each root action for the player to move, in [-1, 1];
    0.0 for unvisited actions."""
    root_prior: Tuple[float, ...]
    """The root's prior over actions after Dirichlet noise was mixed in."""
    root_value: float
    """The search's value of the root for the player to move: the network's value of
    the root and every simulation's backed-up value, averaged (``1 + num_simulations``
    values)."""
    network_value: float
    """The network's own value of the root."""
    num_simulations: int
    """Simulations run (descents backed up)."""
    tree_size: int
    """Nodes in the tree, the root and terminal nodes included."""
    evaluations: int
    """States sent to the network (the root included)."""
    requests: int
    """Calls to ``evaluate``: one for the root, then at most one per round."""


def _split_outputs(y: Any, n: int, num_actions: int) -> Tuple[np.ndarray, list]:
    if not (isinstance(y, (tuple, list)) and len(y) == 2):
        raise ModelOutputError(f"a policy-value model must return the tuple "
                               f"(policy_logits [n, {num_actions}], value [n, 1]), got "
                               f"{type(y).__name__}")
    logits = np.asarray(y[0])
    if logits.shape != (n, num_actions):
        raise ModelOutputError(f"policy logits must have shape [{n}, {num_actions}], got "
                               f"{logits.shape}")
    return logits, values_of(y[1], n, "the policy-value model's value")


def _count_nodes(root: Node) -> int:
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(c for c in node.children if c is not None)
    return count


async def mcts(game: Game, state: State, evaluate: Evaluate, *, num_simulations: int,
               num_parallel: int = 8, c_puct: float = 1.25, dirichlet_alpha: float = 0.3,
               dirichlet_fraction: float = 0.25, seed: int = 0) -> MCTSResult:
    """AlphaZero-style PUCT search from ``state`` with up to ``num_parallel`` leaves in
    flight.

    The root is evaluated first and Dirichlet noise mixed into its prior. Then each
    round descends ``num_parallel`` times (fewer for the last round), a virtual loss on
    each path steering later descents elsewhere, evaluates all new leaves in ONE
    request, and backs up the values in selection order. Which leaves are evaluated
    together and the order of backups depend only on the tree, never on timing, so the
    result is a deterministic function of ``seed``, ``num_parallel`` and the model's
    outputs: a run through a batching server equals a run with ``asr.immediate``.

    Args:
        game: the game (``Game``).
        state: the position to search; checked with ``game.check_state``; not terminal.
        evaluate: ``await evaluate(game.encode(states))`` gives
            ``(policy_logits [n, num_actions], value [n, 1])``.
        num_simulations: descents to back up (>= 1).
        num_parallel: descents per round, evaluated in one request (>= 1). A round ends
            early if a descent reaches a leaf already waiting in it.
        c_puct: exploration constant of PUCT (> 0).
        dirichlet_alpha: concentration of the root noise (> 0).
        dirichlet_fraction: weight of the noise in the root prior, in [0, 1]; 0 turns
            the noise (and the seed's effect) off.
        seed: seeds the root noise.

    Returns:
        An ``MCTSResult``: the chosen action, visit counts, values, counts.

    Raises:
        ValueError: for a bad argument, an invalid state, or a terminal state, before
            any request is made.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> ev = asr.immediate(problems.PolicyValueMLP(game, seed=0))
        >>> r = asyncio.run(mcts(game, game.initial_state(), ev, num_simulations=32,
        ...                      num_parallel=8, seed=0))
        >>> sum(r.visit_counts)
        32
    """
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    c_puct = check_float("c_puct", c_puct, minimum=0.0, strict=True)
    dirichlet_alpha = check_float("dirichlet_alpha", dirichlet_alpha, minimum=0.0,
                                  strict=True)
    dirichlet_fraction = check_float("dirichlet_fraction", dirichlet_fraction, minimum=0.0)
    if dirichlet_fraction > 1.0:
        raise ValueError(f"dirichlet_fraction must be in [0, 1], got "
                         f"{dirichlet_fraction!r}")
    game.check_state(state)
    root = new_node(game, state)
    if root.terminal_value is not None:
        raise ValueError(f"{game!r}: cannot search from a terminal state (the game is "
                         f"over, value {root.terminal_value}); pass a position with a "
                         f"legal move")
    num_actions = int(game.num_actions)

    logits, values = _split_outputs(await evaluate(game.encode([state])), 1, num_actions)
    expand(root, priors_from_logits(root, logits[0]))
    add_exploration_noise(root, np.random.default_rng(seed), dirichlet_alpha,
                          dirichlet_fraction)
    network_value = values[0]
    evaluations, requests, simulations = 1, 1, 0
    while simulations < num_simulations:
        selected = select_leaves(game, root, c_puct,
                                 min(num_parallel, num_simulations - simulations))
        leaves = [leaf.state for _, leaf in selected if leaf.terminal_value is None]
        if leaves:
            evaluations += len(leaves)
            requests += 1
            logits, values = _split_outputs(await evaluate(game.encode(leaves)),
                                            len(leaves), num_actions)
        else:
            logits, values = None, []
        complete_leaves(selected, logits, values)
        simulations += len(selected)

    visit_counts = [0] * num_actions
    action_values = [0.0] * num_actions
    root_prior = [0.0] * num_actions
    for i, a in enumerate(root.actions):
        visit_counts[a] = root.visits[i]
        action_values[a] = root.value_sum[i] / root.visits[i] if root.visits[i] else 0.0
        root_prior[a] = root.prior[i]
    action = max(range(num_actions), key=lambda a: (visit_counts[a], -a))
    root_value = (network_value + sum(root.value_sum)) / (1 + simulations)
    return MCTSResult(action=action, visit_counts=tuple(visit_counts),
                      action_values=tuple(action_values), root_prior=tuple(root_prior),
                      root_value=root_value, network_value=network_value,
                      num_simulations=simulations, tree_size=_count_nodes(root),
                      evaluations=evaluations, requests=requests)
