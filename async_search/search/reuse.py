"""Tree reuse between moves: the subtree under the move played, kept for the next search.

A search run with ``keep_tree=True`` (``search.mcts``, ``search.gumbel_mcts``) returns
its tree in the result; ``result.subtree(action)`` (``subtree`` here) copies the part of
it under ``action`` into a new ``Tree`` whose root is the position after ``action``, and
the next search takes it as ``reuse=``. The copy keeps every statistic (visits, value
sums, priors, network values, the logits of evaluated nodes whose edges were never
made), so the next search starts where this one left off: fewer new evaluations for the
same visits, or more visits for the same evaluations.

Reuse stays deterministic: ``subtree`` is a pure function of the finished tree, and a
search copies the ``reuse`` tree it is given before growing it (``start_tree``), so one
subtree can seed several searches, each with the same result.

Example:
    >>> import asyncio, async_search as asr
    >>> from async_search import problems, search
    >>> game = problems.ConnectFour()
    >>> ev = asr.immediate(problems.PolicyValueMLP(game, seed=0))
    >>> r = asyncio.run(search.mcts(game, game.initial_state(), ev, num_simulations=32,
    ...                             keep_tree=True))
    >>> kept = r.subtree(r.action)
    >>> kept.node_visits(0) == r.visit_counts[r.action] - 1  # its own evaluation aside
    True
    >>> state = game.play(game.initial_state(), r.action)
    >>> r2 = asyncio.run(search.mcts(game, state, ev, num_simulations=32, reuse=kept))
    >>> r2.reused_visits == kept.node_visits(0), sum(r2.visit_counts) - r2.reused_visits
    (True, 32)
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from async_search.base import Evaluate
from async_search.checks import is_int
from async_search.problems.base import Game, State
from async_search.search.base import (GAME_METHODS, check_num_actions, check_protocol,
                                      encoded, evaluated, split_policy_value)
from async_search.search.tree import LEAF, PENDING, Tree


def subtree(tree: Tree, action: int) -> Optional[Tree]:
    """A copy of the part of ``tree`` under the root's ``action``, rooted at its child.

    Args:
        tree: a tree with no descent in flight (a finished search's).
        action: an action of the root.

    Returns:
        A new ``Tree`` whose root is the position after ``action``, with the statistics
        of that child and everything below it; None when there is nothing to keep:
        ``action`` was never tried (or ended the game), or no descent went through the
        root (a kept tree's root visited once). A player that searches every other
        ply walks its tree down its move and then the reply: ``subtree(subtree(tree,
        mine), theirs)``, None as soon as either is.

    Raises:
        ValueError: if ``action`` is not an integer (a bool is not one) or not one of
            the root's actions, the root is terminal, or descents are in flight.
    """
    _check_finished(tree)
    if not is_int(action):  # True == 1 and 3.0 == 3 would pass the test below
        raise ValueError(f"an action is an integer, got {action!r}")
    if tree.terminal_value(0) is not None:
        raise ValueError("the tree's root is terminal: it has no action")
    edges = tree.edges(0)
    if not edges:  # evaluated, never passed through: nothing below it yet
        return None
    actions = [tree.edge_action[e] for e in edges]
    if action not in actions:
        raise ValueError(f"action {action!r} is not one of the root's actions "
                         f"{tuple(actions)}")
    edge = edges[actions.index(action)]
    child = tree.edge_child[edge]
    if not child or not tree.is_expanded(child):
        return None
    return _copy_below(tree, child, edge)


def kept_subtree(tree: Optional[Tree], action: int) -> Optional[Tree]:
    """``subtree(tree, action)`` of a search result's ``tree`` (``result.subtree``).

    Raises:
        ValueError: if the search kept no tree (``tree`` is None), or as ``subtree``.
    """
    if tree is None:
        raise ValueError("the search did not keep its tree: pass keep_tree=True")
    return subtree(tree, action)


def start_tree(game: Game, state: State, reuse: Optional[Tree]) -> Tree:
    """The tree a search grows from ``state``: a copy of ``reuse``, or a new one.

    Raises:
        ValueError: if ``reuse`` is not a ``Tree``, is rooted at another position, or
            has descents in flight.
    """
    if reuse is None:
        return Tree(game, state)
    if not isinstance(reuse, Tree):
        raise ValueError(f"reuse must be a search.tree.Tree (result.subtree(action) of "
                         f"the previous search) or None, got {type(reuse).__name__}")
    if reuse.node_state[0] != state:
        raise ValueError(f"reuse is a tree of another position ({reuse.node_state[0]!r}); "
                         f"pass result.subtree(action) where action led to {state!r}")
    if not reuse.is_expanded(0) or 0 not in reuse.node_value:
        raise ValueError("reuse must have an evaluated root (result.subtree(action))")
    return _copy_below(reuse, 0, 0)


async def start_search(game: Game, state: State, evaluate: Evaluate,
                       reuse: Optional[Tree], keep_tree: bool) -> Tuple[Tree, int]:
    """The tree of a search from ``state`` (``start_tree``) with its root expanded:
    evaluated now for a new tree, its edges made for a ``reuse`` tree.

    ``mcts`` and ``gumbel_mcts`` start alike: after their own arguments, these checks
    and this first request (or none), in this order.

    Returns:
        ``(tree, evaluations)``: the tree, and the states evaluated (1, or 0 with
        ``reuse``) in as many requests.

    Raises:
        ValueError: ``keep_tree`` is not a bool, ``state`` is invalid or terminal, or
            ``reuse`` cannot be used (``start_tree``), before any request.
        ModelOutputError: for the root's outputs of the wrong form or shape.
    """
    if not isinstance(keep_tree, bool):
        raise ValueError(f"keep_tree must be a bool, got {keep_tree!r}")
    check_protocol("game", game, GAME_METHODS, "Game", "problems.ConnectFour()")
    num_actions = check_num_actions(game)
    game.check_state(state)
    tree = start_tree(game, state, reuse)
    terminal = tree.terminal_value(0)
    if terminal is not None:
        raise ValueError(f"{game!r}: cannot search from a terminal state (the game is "
                         f"over, value {terminal}); pass a position with a legal move")
    if reuse is not None:
        tree.make_edges(0)
        return tree, 0
    y = await evaluated(evaluate, encoded(game, game.encode([state]), 1))
    logits, values = split_policy_value(y, 1, num_actions)
    tree.expand_root(logits[0], values[0])
    return tree, 1


def _check_finished(tree: Tree) -> None:
    if any(tree.edge_virtual):
        raise ValueError("the tree has descents in flight; keep a finished search's tree")


def _copy_below(tree: Tree, root: int, into: int) -> Tree:
    """A new ``Tree`` of ``tree``'s nodes under ``root`` (whose incoming edge is
    ``into``), renumbered in depth-first order."""
    _check_finished(tree)
    new = Tree.__new__(Tree)
    new._child, new._legal = tree._child, tree._legal
    node_state: List[State] = []
    node_edges: List[range] = []
    new_id: Dict[int, int] = {}
    order: List[int] = []
    stack = [root]
    while stack:  # depth first, children in action order
        node = stack.pop()
        status = tree.node_edges[node]
        if status is PENDING or (status is LEAF and node != root):
            raise ValueError("the tree has leaves waiting for evaluation; keep a "
                             "finished search's tree")
        new_id[node] = len(order)
        order.append(node)
        stack.extend(c for c in reversed(tree.children(node)) if c is not None)
    fields = ("edge_action", "edge_child", "edge_prior", "edge_value_sum",
              "edge_virtual", "edge_seen1", "edge_q")
    edge_lists = {name: [] for name in fields}
    # Edge 0 stands for the edge into the root: its seen count carries the root's N.
    for name, first in zip(fields, (-1, 0, 0.0, 0.0, 0, tree.edge_seen1[into], 0.0)):
        edge_lists[name].append(first)
    for node in order:
        node_state.append(tree.node_state[node])
        status = tree.node_edges[node]
        if not status:  # TERMINAL or EVALUATED (a status range): kept by identity
            node_edges.append(status)
            continue
        start = len(edge_lists["edge_action"])
        for name in fields:
            edge_lists[name].extend(getattr(tree, name)[status.start:status.stop])
        child = edge_lists["edge_child"]
        child[start:] = [new_id[c] if c else 0 for c in child[start:]]
        node_edges.append(range(start, start + len(status)))
    new.node_state, new.node_edges = node_state, node_edges
    for name in fields:
        setattr(new, name, edge_lists[name])
    new.node_value = {new_id[n]: v for n, v in tree.node_value.items() if n in new_id}
    new._terminal = {new_id[n]: v for n, v in tree._terminal.items() if n in new_id}
    new._actions = {new_id[n]: a for n, a in tree._actions.items() if n in new_id}
    new._proofs = {new_id[n]: p for n, p in tree._proofs.items() if n in new_id}
    new._proving = False  # the next search decides (search.mcts's solve)
    # Rows are never changed, only popped when a node's edges are made: sharing is safe.
    new._logits = {new_id[n]: r for n, r in tree._logits.items() if n in new_id}
    return new
