"""The pure core of AlphaZero MCTS: the tree, PUCT selection with virtual loss, backup.

No event loop here. ``select_leaves`` descends the tree up to ``k`` times, adding a
virtual loss along each path so that the next descent prefers other leaves; the caller
evaluates the new leaves in one request; ``complete_leaves`` expands them and backs up
all ``k`` values in selection order. Both steps are plain functions of the tree and the
network's outputs, so a search is deterministic given its seed and ``num_parallel``.

Statistics live on edges (AlphaGo Zero): for the ``i``-th legal action of a node,
``visits[i]``, ``value_sum[i]`` (from the point of view of the player to move at the
node) and ``virtual[i]`` (descents in flight through the edge). An edge with virtual
visits counts each as a visit that lost (value -1).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from async_search.problems.base import Game, State

__all__ = ["Node", "new_node", "select_child", "select_leaf", "select_leaves",
           "add_virtual_loss", "revert_virtual_loss", "expand", "priors_from_logits",
           "backup", "complete_leaves", "add_exploration_noise", "Path"]

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
