"""The pure core of AlphaZero MCTS: an array-backed tree, PUCT selection with virtual
loss, backup.

No event loop here. ``Tree.select_leaves`` descends the tree up to ``k`` times, adding a
virtual loss along each path so that the next descent prefers other leaves; the caller
evaluates the new leaves in one request; ``Tree.complete_leaves`` expands them and backs
up all ``k`` values in selection order. Both steps are plain functions of the tree and the
network's outputs, so a search is deterministic given its seed and ``num_parallel``.

The tree lives in flat Python lists indexed by node id and edge id (as mctx stores its
tree in arrays; plain lists, because a node has at most a handful of edges and NumPy's
per-call cost is larger than the work). Statistics live on edges (AlphaGo Zero): for
the ``i``-th legal action of a node, the edge ``node_edges[node][i]`` holds its prior,
``edge_value_sum`` (from the point of view of the player to move at the node) and
``edge_virtual`` (descents in flight through the edge). An edge with virtual visits
counts each as a visit that lost (value -1). What selection reads is kept up to date on
every change, so that a descent adds nothing per edge: ``edge_seen1 = 1 + visits +
virtual`` and ``edge_q = (value_sum - virtual) / (visits + virtual)`` (0 when unseen).

A node gets its edges (legal actions, priors) lazily, the first time a descent passes
through it: most evaluated leaves of a search are never passed through, and they cost
neither a softmax nor their edges. Games may offer unchecked fast rules through an
internal ``_mcts_rules()`` (``ConnectFour`` does); any ``Game`` works without them.

Example:
    >>> from async_search.problems import ConnectFour
    >>> game = ConnectFour()
    >>> tree = Tree(game, game.initial_state())
    >>> tree.expand_root([0.0] * 7)
    >>> paths, leaves, states = tree.select_leaves(1.25, 3)
    >>> [tree.edge_action[path[0]] for path in paths]  # virtual loss spreads them
    [0, 1, 2]
    >>> states == [game.play(game.initial_state(), a) for a in (0, 1, 2)]
    True
    >>> tree.complete_leaves(paths, leaves, np.zeros((3, 7)), [0.5, 0.0, -0.5])
    >>> tree.visits(0), tree.value_sums(0)
    ([1, 1, 1, 0, 0, 0, 0], [-0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from async_search.errors import ModelOutputError
from async_search.problems.base import Game, State
from async_search.search.sums import left_sum


# ``node_edges[node]`` is the range of a node's edge ids once it has edges (never empty:
# a game that is not over has a legal move); before, one of these empty ranges, told
# apart by identity (``is``), never by ``==``:
LEAF = range(-1, -1)  # created, never sent for evaluation
PENDING = range(-2, -2)  # selected for evaluation in the current round
TERMINAL = range(-3, -3)  # the game is over: never evaluated, never expanded
EVALUATED = range(-4, -4)  # evaluated (logits kept), edges not made: a descent makes them
_STATUS = {id(LEAF): "LEAF", id(PENDING): "PENDING", id(TERMINAL): "TERMINAL",
           id(EVALUATED): "EVALUATED"}

Path = List[int]  # the edges a descent took, from the root


def priors_from_logits(actions: Sequence[int], logits: Sequence[float]) -> List[float]:
    """Softmax of ``logits`` (one per action of the game) over the legal ``actions``.

        >>> priors_from_logits((0, 2), [0.0, 5.0, 0.0])
        [0.5, 0.5]
    """
    legal = [float(logits[a]) for a in actions]
    top = max(legal)
    weights = [math.exp(x - top) for x in legal]
    total = left_sum(weights)
    # At least 1 (the top's weight) unless a logit is NaN or +inf, or all are -inf.
    if not total >= 1.0:
        raise ModelOutputError(f"policy logits must be numbers, not NaN or +inf, with "
                               f"at least one legal action above -inf; got {legal} for "
                               f"the legal actions {tuple(actions)}")
    return [w / total for w in weights]


def _generic_rules(game: Game) -> Tuple[Callable, Callable]:
    """``(child, legal)`` from the ``Game`` protocol, as ``ConnectFour._mcts_rules``;
    a game that breaks the protocol gets a ValueError naming it, not an error deep in
    the search (an action past ``num_actions`` indexes the policy)."""
    play, legal_actions, num_actions = game.play, game.legal_actions, game.num_actions

    def legal(state: State) -> Tuple[int, ...]:
        actions = tuple(legal_actions(state))  # a generator is read once, here
        before = -1
        for a in actions:
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not (
                    0 <= a < num_actions):
                raise ValueError(f"{game!r}: legal_actions gave {a!r} for {state!r}; "
                                 f"actions are integers in [0, num_actions="
                                 f"{num_actions}) (the Game protocol)")
            if a <= before:  # a repeat would count its visits twice, or lose them
                raise ValueError(f"{game!r}: legal_actions gave {actions!r} for "
                                 f"{state!r}; actions are ascending, each once (the "
                                 f"Game protocol)")
            before = a
        return actions

    def child(state: State, action: int) -> Tuple[State, Optional[float], Tuple[int, ...]]:
        new = play(state, action)
        actions = legal(new)
        return new, (None if actions else _game_over(game, new)), actions

    return child, legal


def _game_over(game: Game, state: State) -> float:
    """The terminal value of a state without legal actions: a game has none exactly
    when it is over, and its value is in [-1, 1] as the net's (the Game protocol);
    ValueError if ``game`` breaks that."""
    value = game.terminal_value(state)
    if value is None:
        raise ValueError(f"{game!r}: legal_actions is empty but terminal_value is None "
                         f"for {state!r}; a game has no legal action exactly when it is "
                         f"over")
    try:
        ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
              and -1.0 <= float(value) <= 1.0)  # False for NaN
    except (OverflowError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{game!r}: terminal_value is {value!r} for {state!r}; values "
                         f"are numbers in [-1, 1], for the player to move (the Game "
                         f"protocol)")
    return float(value)


class Tree:
    """An MCTS tree over ``game`` from ``state`` (node 0, the root), in flat lists.

    Nodes (ids 0, 1, ... in order of creation): ``node_state`` and ``node_edges`` (the
    range of its edge ids, or LEAF / PENDING / TERMINAL / EVALUATED). Edges (ids in
    order of creation; a node's edges are contiguous, its legal actions ascending):
    ``edge_action``, ``edge_child`` (0 until the child exists: the root is nobody's
    child), ``edge_prior``, ``edge_value_sum``, ``edge_virtual``, and what selection
    reads: ``edge_seen1`` (1 + visits + virtual) and ``edge_q``. Edge 0 stands for the
    edge into the root: a descent adds one to its ``edge_seen1`` on leaving.

    A node's edge visits ``N`` (``node_visits``) are not stored: every descent through
    the edge into a node went on into one of its edges, but the one that stopped there
    to evaluate it, so ``1 + N = edge_seen1[edge into the node] - 2`` (for the root too,
    since its edge starts at 2).

    ``node_value`` keeps the network's value of each evaluated node (for the player to
    move there): Gumbel search mixes it into its completed Q-values, and a tree kept for
    the next move (``search.reuse``) knows its new root's value without asking again.

    Args:
        game: the game (``Game``).
        state: the root position (not checked here; ``search.mcts`` checks it).
    """

    __slots__ = ("node_state", "node_edges", "edge_action", "edge_child", "edge_prior",
                 "edge_value_sum", "edge_virtual", "edge_seen1", "edge_q", "node_value",
                 "_terminal", "_actions", "_logits", "_child", "_legal", "_proofs",
                 "_proving")

    def __init__(self, game: Game, state: State):
        rules = getattr(game, "_mcts_rules", None)
        rules = rules() if rules is not None else None
        self._child, self._legal = rules if rules is not None else _generic_rules(game)
        # The root through the game's own legal_actions (it checks a caller's state);
        # a generic game's actions are checked against num_actions besides.
        actions = game.legal_actions(state) if rules is not None else self._legal(state)
        terminal = None if actions else _game_over(game, state)
        self.node_state: List[State] = [state]
        self.node_edges: List[range] = [LEAF if terminal is None else TERMINAL]
        self.edge_action: List[int] = [-1]
        self.edge_child: List[int] = [0]
        self.edge_prior: List[float] = [0.0]
        self.edge_value_sum: List[float] = [0.0]
        self.edge_virtual: List[int] = [0]
        self.edge_seen1: List[int] = [2]
        self.edge_q: List[float] = [0.0]
        self.node_value: Dict[int, float] = {}
        # Kept only for the few nodes that need them:
        self._terminal: Dict[int, float] = {} if terminal is None else {0: terminal}
        self._actions: Dict[int, Tuple[int, ...]] = {0: actions} if actions else {}
        self._logits: Dict[int, Sequence[float]] = {}
        # Plies to the game's end under each node solved by a proof (``prove``).
        self._proofs: Dict[int, int] = {}
        self._proving = False

    # -- reading ------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root and terminal nodes included."""
        return len(self.node_state)

    def status(self, node: int) -> str:
        """``"LEAF"``, ``"PENDING"``, ``"TERMINAL"``, ``"EVALUATED"`` or ``"EDGES"``."""
        return _STATUS.get(id(self.node_edges[node]), "EDGES")

    def terminal_value(self, node: int) -> Optional[float]:
        """The value for the player to move at a terminal node; None for the others."""
        return self._terminal.get(node)

    def proof(self, node: int) -> Optional[Tuple[float, int]]:
        """``(value, plies)`` of a node whose value is exact: a terminal node (0 plies),
        or one a proving search (``prove``) solved, with the plies to the game's end
        under best play as far as the proof goes; None for the others."""
        value = self._terminal.get(node)
        if value is None:
            return None
        return value, self._proofs.get(node, 0)

    def is_expanded(self, node: int) -> bool:
        """Whether the node was evaluated (so that a descent goes through it)."""
        edges = self.node_edges[node]
        return bool(edges) or edges is EVALUATED

    def is_pending(self, node: int) -> bool:
        """Whether the node waits for its evaluation in the current round."""
        return self.node_edges[node] is PENDING

    def edges(self, node: int) -> range:
        """The node's edge ids (empty until a descent went through it)."""
        return self.node_edges[node] or range(0)

    def node_visits(self, node: int) -> int:
        """``N``: visits plus virtual visits over the node's edges (it searches for the
        edge into the node: for reading, the descent keeps that edge at hand)."""
        into = self.edge_child.index(node) if node else 0
        return self.edge_seen1[into] - 2 if self.is_expanded(node) else 0

    def actions(self, node: int) -> Tuple[int, ...]:
        """The legal actions of a node's edges, ascending."""
        return tuple(self.edge_action[e] for e in self.edges(node))

    def children(self, node: int) -> List[Optional[int]]:
        """The child of each edge of ``node``, or None where it was never reached."""
        return [self.edge_child[e] or None for e in self.edges(node)]

    def visits(self, node: int) -> List[int]:
        """Completed visits of each edge of ``node`` (virtual ones left out)."""
        return [self.edge_seen1[e] - 1 - self.edge_virtual[e] for e in self.edges(node)]

    def value_sums(self, node: int) -> List[float]:
        """Sum of backed-up values of each edge, for the player to move at ``node``."""
        e = self.edges(node)
        return self.edge_value_sum[e.start:e.stop]

    def virtual(self, node: int) -> List[int]:
        """Descents in flight through each edge of ``node``."""
        e = self.edges(node)
        return self.edge_virtual[e.start:e.stop]

    def priors(self, node: int) -> List[float]:
        """The prior of each edge of ``node``."""
        e = self.edges(node)
        return self.edge_prior[e.start:e.stop]

    # -- growing ------------------------------------------------------------------------

    def expand_root(self, logits: Sequence[float], value: Optional[float] = None) -> None:
        """Give the root its edges, with priors from the network's ``logits`` (one per
        action of the game); ``value``, the network's value of the root, is kept in
        ``node_value``."""
        if self.node_edges[0] is not LEAF:
            raise ValueError("the root is terminal or already expanded")
        self._logits[0] = logits
        if value is not None:
            self.node_value[0] = value
        self._make_edges(0)

    def _make_edges(self, node: int) -> range:
        """Give an evaluated node its edges (legal actions, priors); their range."""
        actions = self._actions.pop(node, None)
        if actions is None:
            actions = self._legal(self.node_state[node])
        prior = priors_from_logits(actions, self._logits.pop(node))
        first = len(self.edge_child)
        k = len(actions)
        self.edge_action += actions
        self.edge_child += [0] * k
        self.edge_prior += prior
        self.edge_value_sum += [0.0] * k
        self.edge_virtual += [0] * k
        self.edge_seen1 += [1] * k
        self.edge_q += [0.0] * k
        edges = self.node_edges[node] = range(first, first + k)
        return edges

    def add_exploration_noise(self, rng: np.random.Generator, alpha: float,
                              fraction: float) -> None:
        """Mix Dirichlet(alpha) noise into the expanded root's priors (AlphaZero)."""
        edges = self.node_edges[0]
        if fraction == 0.0 or not edges:
            return
        first, end = edges.start, edges.stop
        noise = rng.dirichlet([alpha] * (end - first))
        self.edge_prior[first:end] = [(1.0 - fraction) * p + fraction * float(n)
                                      for p, n in zip(self.edge_prior[first:end], noise)]

    # -- one round ----------------------------------------------------------------------

    def select_child(self, node: int, c_puct: float) -> int:
        """Which of ``node``'s legal actions (its index) a descent takes: the edge
        maximising ``Q + c_puct * P * sqrt(1 + N) / (1 + n)``; ties go to the first.

        ``N`` counts the node's edge visits (virtual ones included), ``n`` the edge's;
        an edge with no visits has ``Q = 0``. ``select_leaves`` inlines this rule.
        """
        edges = self.node_edges[node]
        if edges is EVALUATED:
            edges = self._make_edges(node)
        elif not edges:
            raise ValueError(f"node {node} is not expanded")
        q, prior, seen1 = self.edge_q, self.edge_prior, self.edge_seen1
        scale = c_puct * math.sqrt(1 + self.node_visits(node))
        best, best_score = edges.start, -math.inf
        for e in edges:
            score = q[e] + scale * prior[e] / seen1[e]
            if score > best_score:
                best, best_score = e, score
        return best - edges.start

    def select_leaves(self, c_puct: float, k: int
                      ) -> Tuple[List[Path], List[int], List[State]]:
        """Up to ``k`` descents for one round, in selection order: their paths (edge ids
        from the root), leaves (node ids), and the states to evaluate (of the leaves
        that became pending, in order).

        Each descends from the root through expanded nodes by ``select_child``, adding a
        virtual loss on every edge taken and creating the child it reaches if new, to a
        node that is not expanded: new (it becomes pending: the caller evaluates it),
        terminal (it backs up its own value; terminal leaves may repeat), or pending. A
        descent that reaches a leaf already pending in this round is undone and ends
        the round early (the first descent always succeeds: nothing is pending yet).
        """
        node_edges, states = self.node_edges, self.node_state
        child, action, prior = self.edge_child, self.edge_action, self.edge_prior
        value_sum, virtual = self.edge_value_sum, self.edge_virtual
        seen1, q = self.edge_seen1, self.edge_q
        sqrt, minus_inf = math.sqrt, -math.inf
        make_child, terminals, known = self._child, self._terminal, self._actions
        if not node_edges[0]:
            raise ValueError("select_leaves needs an expanded root (expand_root)")
        paths: List[Path] = []
        leaves: List[int] = []
        pending: List[State] = []
        for _ in range(k):
            node = into = 0
            seen1[0] += 1
            path: Path = []
            while True:
                edges = node_edges[node]
                if not edges:
                    if edges is not EVALUATED:
                        break
                    edges = self._make_edges(node)
                # select_child, inlined: the edge of highest score, the first on ties.
                scale = c_puct * sqrt(seen1[into] - 2)
                best, best_score = edges.start, minus_inf
                for e in edges:
                    score = q[e] + scale * prior[e] / seen1[e]
                    if score > best_score:
                        best, best_score = e, score
                # A virtual loss on the edge: one more visit, valued -1.
                v = virtual[best] + 1
                virtual[best] = v
                n1 = seen1[best] + 1
                seen1[best] = n1
                q[best] = (value_sum[best] - v) / (n1 - 1)
                path.append(best)
                into = best
                parent, node = node, child[best]
                if not node:
                    # _add_child, inlined: the call cost MCTS about 3 % of its
                    # simulations/s (benchmarks/search_cost.py), once a simulation.
                    node = child[best] = len(states)
                    state, terminal, actions = make_child(states[parent], action[best])
                    states.append(state)
                    if terminal is None:
                        node_edges.append(LEAF)
                        if actions is not None:
                            known[node] = actions
                    else:
                        node_edges.append(TERMINAL)
                        terminals[node] = terminal
            if edges is PENDING:
                self._revert(path)
                break
            if edges is LEAF:
                node_edges[node] = PENDING
                pending.append(states[node])
            paths.append(path)
            leaves.append(node)
        return paths, leaves, pending

    def _revert(self, path: Path) -> None:
        """Undo the virtual loss that a descent added along ``path``."""
        value_sum, virtual = self.edge_value_sum, self.edge_virtual
        seen1, q = self.edge_seen1, self.edge_q
        seen1[0] -= 1
        for e in path:
            v = virtual[e] - 1
            virtual[e] = v
            n1 = seen1[e] - 1
            seen1[e] = n1
            q[e] = (value_sum[e] - v) / (n1 - 1) if n1 > 1 else 0.0

    def make_edges(self, node: int) -> range:
        """The edge ids of an expanded node, made now if no descent passed through it
        yet; ValueError for a node that is not expanded."""
        edges = self.node_edges[node]
        if edges is EVALUATED:
            return self._make_edges(node)
        if not edges:
            raise ValueError(f"node {node} is not expanded")
        return edges

    def descend(self, choose: Callable[[int, range], int]
                ) -> Optional[Tuple[Path, int, Optional[State]]]:
        """One descent from the expanded root by another selection rule than PUCT.

        At each expanded node the descent takes the edge ``choose(node, edges)`` (an
        edge id in ``edges``, the node's edge range), adding a virtual visit to it as
        ``select_leaves`` does, and creates the child it reaches if new. It stops at a
        node that is not expanded: a new leaf (it becomes pending; its state is
        returned for evaluation), a terminal node, or a leaf already pending in this
        round, in which case the descent is undone and None returned.

        Returns:
            ``(path, leaf, state)``: the edges taken, the node reached, and the leaf's
            state if it must be evaluated (else None). ``complete_leaves`` backs it up.
        """
        if not self.node_edges[0]:
            raise ValueError("descend needs an expanded root (expand_root)")
        node_edges, child = self.node_edges, self.edge_child
        value_sum, virtual = self.edge_value_sum, self.edge_virtual
        seen1, q = self.edge_seen1, self.edge_q
        node = 0
        seen1[0] += 1
        path: Path = []
        while True:
            edges = node_edges[node]
            if not edges:
                if edges is not EVALUATED:
                    break
                edges = self._make_edges(node)
            best = choose(node, edges)
            v = virtual[best] + 1
            virtual[best] = v
            n1 = seen1[best] + 1
            seen1[best] = n1
            q[best] = (value_sum[best] - v) / (n1 - 1)
            path.append(best)
            parent, node = node, child[best]
            if not node:
                node = self._add_child(parent, best)
        if edges is PENDING:
            self._revert(path)
            return None
        if edges is LEAF:
            node_edges[node] = PENDING
            return path, node, self.node_state[node]
        return path, node, None

    def _add_child(self, parent: int, edge: int) -> int:
        """Create the child that ``edge`` of ``parent`` leads to; its node id."""
        node = self.edge_child[edge] = len(self.node_state)
        state, terminal, actions = self._child(self.node_state[parent],
                                               self.edge_action[edge])
        self.node_state.append(state)
        if terminal is None:
            self.node_edges.append(LEAF)
            if actions is not None:
                self._actions[node] = actions
        else:
            self.node_edges.append(TERMINAL)
            self._terminal[node] = terminal
        return node

    def complete_leaves(self, paths: Sequence[Path], leaves: Sequence[int],
                        logits: Any, values: Sequence[float]) -> None:
        """Expand the evaluated leaves and back up every descent, in selection order.

        ``logits[j]`` (one per action of the game) and ``values[j]`` (for the player to
        move at the leaf) belong to the ``j``-th pending leaf of ``leaves``; terminal
        leaves back up their own value. Along a path, each edge is credited from the
        view of the player who took it, replacing its virtual loss.
        """
        node_edges, terminals, kept = self.node_edges, self._terminal, self._logits
        node_value = self.node_value
        value_sum, virtual = self.edge_value_sum, self.edge_virtual
        seen1, q = self.edge_seen1, self.edge_q
        rows = logits.tolist() if logits is not None else []  # Python floats: cheaper
        proving = self._proving
        j = 0
        for path, leaf in zip(paths, leaves):
            if node_edges[leaf] is PENDING:
                node_edges[leaf] = EVALUATED  # its edges wait for a descent through it
                kept[leaf] = rows[j]
                value = node_value[leaf] = values[j]
                j += 1
            else:
                value = terminals[leaf]
            if proving:
                self._back_up_proving(path, value)
                if leaf in terminals:
                    self._prove_up(path)
                continue
            # The same backup as _back_up_proving's, without its lookup a step: this
            # loop runs once per edge of every simulation, inline (no call).
            for e in reversed(path):
                value = -value
                v = virtual[e] - 1
                virtual[e] = v
                w = value_sum[e] + value
                value_sum[e] = w
                q[e] = (w - v) / (seen1[e] - 1)

    # -- proofs (MCTS-Solver) -------------------------------------------------------------

    def prove(self) -> None:
        """Turn proving on (MCTS-Solver, Winands et al. 2008): a descent that ends on a
        terminal node then solves the nodes above it that it settles.

        A node is solved when a child's exact value is the worst possible for the child's
        player (-1: the node's player wins by moving there), or when every legal action
        has a child with an exact value (the node's value is the best of them). A solved
        node below the root becomes terminal: descents stop there and back up its exact
        value, and the edge into it is revalued as if every past visit had known it.
        The root keeps its edges; ``proof`` reads what is known of its children.
        A copy of the tree (``search.reuse``) keeps the solved nodes, not proving: its
        next search turns it on again.
        """
        self._proving = True

    def _back_up_proving(self, path: Path, value: float) -> None:
        """``complete_leaves``' backup while proving: a descent that went through a node
        solved since it was selected (by another descent of its round) backs up that
        node's exact value from there, as a descent made after the proof would, and as
        the edge into it was revalued."""
        child, terminals = self.edge_child, self._terminal
        value_sum, virtual, seen1, q = (self.edge_value_sum, self.edge_virtual,
                                        self.edge_seen1, self.edge_q)
        for e in reversed(path):
            proved = terminals.get(child[e])
            if proved is not None:
                value = proved
            value = -value
            v = virtual[e] - 1
            virtual[e] = v
            w = value_sum[e] + value
            value_sum[e] = w
            q[e] = (w - v) / (seen1[e] - 1)

    def _prove_up(self, path: Path) -> None:
        """Solve what the descent along ``path`` (ending on a terminal node) settles,
        from the leaf's parent toward the root."""
        child, node_edges, terminals = self.edge_child, self.node_edges, self._terminal
        proofs = self._proofs
        value_sum, virtual, seen1, q = (self.edge_value_sum, self.edge_virtual,
                                        self.edge_seen1, self.edge_q)
        for i in range(len(path) - 1, 0, -1):
            node = child[path[i - 1]]
            edges = node_edges[node]
            if not edges:  # already solved by an earlier descent of this round
                return
            best, plies, complete = -math.inf, 0, True
            for e in edges:
                c = child[e]
                value = terminals.get(c) if c else None
                if value is None:
                    complete = False
                    continue
                value, depth = -value, proofs.get(c, 0) + 1
                # The best value; among equals, the quickest win or the latest loss.
                if value > best or (value == best and (depth < plies if value > 0
                                                       else depth > plies)):
                    best, plies = value, depth
            if not (best >= 1.0 or complete):
                return
            node_edges[node] = TERMINAL
            terminals[node] = best
            proofs[node] = plies
            into = path[i - 1]
            seen = seen1[into] - 1
            w = value_sum[into] = -best * (seen - virtual[into])
            q[into] = (w - virtual[into]) / seen
