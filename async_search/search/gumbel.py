"""Gumbel AlphaZero search (Danihelka et al., 2022) as a coroutine over ``evaluate``.

At the root, ``k`` actions are sampled without replacement by Gumbel-Top-k and the
simulation budget is spread over them by Sequential Halving (``search.halving``); the
action played is the survivor with the best ``g + logits + sigma(q)``. Below the root,
descents are deterministic: the action whose visits lag furthest behind the improved
policy ``softmax(logits + sigma(completed Q))`` (``search.completed_q``). The result
carries that improved policy at the root, the paper's policy target, which improves on
the prior even with few simulations (16-32 suffice to learn well).

The policy-value model is that of ``search.mcts``: ``game.encode(states)`` in,
``(policy_logits [n, num_actions], value [n, 1] or [n])`` out, values in [-1, 1] for
the player to move. The tree is ``search.tree.Tree``, shared with ``search.mcts``:
terminal states back up their own value, and a kept subtree (``keep_tree``, ``reuse``)
serves either search.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_int
from async_search.problems.base import Game, State
from async_search.search.base import (check_evaluate, check_search_constant, encoded,
                                      evaluated, split_policy_value)
from async_search.search.completed_q import (ValueBounds, completed_values,
                                             improved_policy, log_priors, mixed_value,
                                             select_by_visit_deficit, sigma)
from async_search.search.halving import gumbel_top_k, halving_schedule, phase_order
from async_search.search.reuse import kept_subtree, start_search
from async_search.search.sums import left_sum
from async_search.search.tree import Path, Tree


@dataclasses.dataclass(frozen=True)
class GumbelResult:
    """What ``gumbel_mcts`` returns; per-action tuples have one entry per action of the
    game (``game.num_actions``), zero for illegal actions."""

    action: int
    """The action to play: of the actions that survived Sequential Halving (the most
    visited of the last phase), the one with the largest ``g + logits + sigma(q)``."""
    policy: Tuple[float, ...]
    """The improved policy ``softmax(logits + sigma(completed Q))`` over the legal
    actions (it sums to 1): the policy target for training."""
    visit_counts: Tuple[int, ...]
    """Visits of each root action; they sum to ``num_simulations + reused_visits``."""
    action_values: Tuple[float, ...]
    """Mean backed-up value of each root action for the player to move, in [-1, 1];
    0.0 for unvisited actions."""
    completed_values: Tuple[float, ...]
    """The completed Q-values: ``action_values`` where visited, the root's mixed value
    ``v_mix`` for unvisited legal actions; in [-1, 1]."""
    root_prior: Tuple[float, ...]
    """``softmax(logits)`` of the network over the legal actions (no noise)."""
    considered: Tuple[int, ...]
    """The actions sampled by Gumbel-Top-k, largest ``g + logits`` first:
    ``min(max_num_considered_actions, legal actions)`` of them."""
    root_value: float
    """The network's value of the root and every backed-up value of its actions,
    averaged (``1 + num_simulations + reused_visits`` values), for the player to
    move."""
    network_value: float
    """The network's own value of the root."""
    num_simulations: int
    """Simulations run by this search (descents backed up)."""
    reused_visits: int
    """Root visits carried over from ``reuse`` (0 without it)."""
    tree_size: int
    """Nodes in the tree, the root and terminal nodes included."""
    evaluations: int
    """States sent to the network (the root included unless reused)."""
    requests: int
    """Calls to ``evaluate``: one for the root (none with ``reuse``), then at most one
    per round."""
    tree: Optional[Tree] = dataclasses.field(default=None, repr=False, compare=False)
    """The search tree with ``keep_tree=True``, else None; ``subtree`` reads it."""

    def subtree(self, action: int) -> Optional[Tree]:
        """The part of the tree under ``action``, for ``reuse=`` in the next search
        after ``action`` is played (``search.reuse.subtree``); needs ``keep_tree``."""
        return kept_subtree(self.tree, action)


class _NodeRule:
    """The ``Tree.descend`` rule of Gumbel search: at the root, the edge that Sequential
    Halving scheduled (``root_edge``, set before each descent); below it, the action
    whose visits lag furthest behind the improved policy."""

    def __init__(self, tree: Tree, bounds: ValueBounds, c_visit: float, c_scale: float):
        self.tree, self.bounds = tree, bounds
        self.c_visit, self.c_scale = c_visit, c_scale
        self.root_edge = 0
        self._log_priors: Dict[int, List[float]] = {}  # by node: priors never change

    def __call__(self, node: int, edges: range) -> int:
        if not node:
            return self.root_edge
        tree, start, stop = self.tree, edges.start, edges.stop
        logits = self._log_priors.get(node)
        if logits is None:
            logits = self._log_priors[node] = log_priors(tree.edge_prior[start:stop])
        # Visits in flight count for the visit deficit (they spread one round's
        # descents), not for Q: a value not yet backed up is unknown.
        seen = [n - 1 for n in tree.edge_seen1[start:stop]]
        visits = [n - v for n, v in zip(seen, tree.edge_virtual[start:stop])]
        sums = tree.edge_value_sum[start:stop]
        v_mix = mixed_value(tree.node_value[node], tree.edge_prior[start:stop], visits,
                            sums)
        q = completed_values(sums, visits, v_mix)
        policy = improved_policy(logits, sigma(q, visits, self.bounds, self.c_visit,
                                               self.c_scale))
        return start + select_by_visit_deficit(policy, seen)


def _root_statistics(tree: Tree, bounds: ValueBounds, c_visit: float, c_scale: float
                     ) -> Tuple[List[int], List[float], List[float]]:
    """The root's completed visits, completed Q-values and ``sigma`` of them."""
    visits = tree.visits(0)
    sums = tree.value_sums(0)
    v_mix = mixed_value(tree.node_value[0], tree.priors(0), visits, sums)
    q = completed_values(sums, visits, v_mix)
    return visits, q, sigma(q, visits, bounds, c_visit, c_scale)


def _bounds_of(tree: Tree) -> ValueBounds:
    """The bounds of every value in ``tree``: the network's values of its nodes and the
    mean value of each visited edge (a reused tree brings its own)."""
    bounds = ValueBounds()
    for value in tree.node_value.values():
        bounds.add(value)
    for node in range(tree.num_nodes):
        terminal = tree.terminal_value(node)
        if terminal is not None:
            bounds.add(terminal)
    for w, n1, v in zip(tree.edge_value_sum, tree.edge_seen1, tree.edge_virtual):
        if n1 - 1 - v > 0:
            bounds.add(w / (n1 - 1 - v))
    return bounds


async def gumbel_mcts(game: Game, state: State, evaluate: Evaluate, *,
                      num_simulations: int, max_num_considered_actions: int = 16,
                      num_parallel: int = 8, c_visit: float = 50.0, c_scale: float = 0.1,
                      gumbel_scale: float = 1.0, seed: int = 0,
                      reuse: Optional[Tree] = None, keep_tree: bool = False
                      ) -> GumbelResult:
    """Gumbel AlphaZero search from ``state``, with up to ``num_parallel`` leaves in
    flight.

    The root is evaluated (unless ``reuse`` brings it), Gumbel(0, 1) noise ``g`` drawn
    for its legal actions from ``seed``, and the ``k`` actions with the largest ``g +
    logits`` considered. Sequential Halving then visits them phase by phase
    (``search.halving.halving_schedule``). A phase's visits go in rounds of up to
    ``num_parallel`` descents, whose new leaves are evaluated in ONE request; below
    the root each descent takes the action whose visits lag furthest behind the
    improved policy, counting the descents already in flight. A round ends early if a
    descent reaches a leaf already waiting in it. Nothing depends on timing: the result
    is a function of the arguments and the model's outputs, whether ``evaluate`` is
    ``asr.immediate(model)`` or served in batches.

    Q-values are normalised to [0, 1] by the smallest and largest value seen so far in
    the search, a running minimum and maximum as MuZero's (network values, terminal
    values, and each visited edge's mean after every round, never narrowed: a mean that
    later moves keeps its old extreme); a search resumed from a kept tree starts them
    from that tree's values.

    Args:
        game: the game (``Game``).
        state: the position to search; checked with ``game.check_state``; not terminal.
        evaluate: ``await evaluate(game.encode(states))`` gives
            ``(policy_logits [n, num_actions], value [n, 1])``.
        num_simulations: descents to back up (>= 1); 16-32 are enough for learning.
        max_num_considered_actions: ``k``'s cap (>= 1); ``k = min(cap, legal)``.
        num_parallel: descents per round, evaluated in one request (>= 1).
        c_visit: ``sigma``'s visit offset (>= 0).
        c_scale: ``sigma``'s scale (>= 0; 0 ignores the values: the prior decides).
        gumbel_scale: the noise's scale (>= 0); 0 turns the sampling (and the seed's
            effect) off, for evaluation.
        seed: seeds the Gumbel noise.
        reuse: the previous search's ``result.subtree(action)`` for the move played
            (``search.reuse``), rooted at ``state``: its statistics (copied, not
            changed) inform Q-values and descents; the root gets fresh noise and a
            fresh Sequential Halving over this search's simulations. None: a new tree.
        keep_tree: keep the tree in the result (``result.subtree``), for ``reuse``.

    Returns:
        A ``GumbelResult``: the action, the improved policy, visits, values.

    Raises:
        ValueError: for a bad argument, an invalid state, or a terminal state, before
            any request is made; for a game with no legal action that is not over.
        TypeError: at the first request, if ``evaluate(x)`` returns something that
            cannot be awaited (a model passed where ``asr.immediate(model)`` belongs).
        ModelOutputError: for model outputs of the wrong form or shape, values that
            are not finite or outside [-1, 1], or logits that are NaN or +inf (or -inf
            for every legal action).

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> ev = asr.immediate(problems.pretrained("connect_four"))
        >>> r = asyncio.run(gumbel_mcts(game, game.from_moves([0, 1, 0, 1, 0]), ev,
        ...                             num_simulations=16, gumbel_scale=0.0))
        >>> r.action, sum(r.visit_counts), round(sum(r.policy), 6)   # block column 0
        (0, 16, 1.0)
    """
    check_evaluate(evaluate)
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    max_considered = check_int("max_num_considered_actions", max_num_considered_actions,
                               minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    c_visit = check_search_constant("c_visit", c_visit)
    c_scale = check_search_constant("c_scale", c_scale)
    gumbel_scale = check_search_constant("gumbel_scale", gumbel_scale)
    seed = check_int("seed", seed, minimum=0)
    tree, evaluations = await start_search(game, state, evaluate, reuse, keep_tree)
    requests = evaluations
    num_actions = int(game.num_actions)
    encode = game.encode
    edges = tree.make_edges(0)
    actions = tree.actions(0)
    reused = tree.node_visits(0)
    network_value = tree.node_value[0]
    bounds = _bounds_of(tree)
    root_logits = log_priors(tree.priors(0))
    noise = (np.random.default_rng(seed).gumbel(size=len(actions)) * gumbel_scale
             if gumbel_scale else np.zeros(len(actions)))
    g = noise.tolist()
    considered = gumbel_top_k([x + y for x, y in zip(g, root_logits)],
                              min(max_considered, len(actions)))

    def root_scores() -> List[float]:
        sigmas = _root_statistics(tree, bounds, c_visit, c_scale)[2]
        return [x + y + s for x, y, s in zip(g, root_logits, sigmas)]

    rule = _NodeRule(tree, bounds, c_visit, c_scale)
    remaining: List[int] = considered
    last_phase: Dict[int, int] = {}  # the last phase's visits of each action
    simulations = 0
    for size, each in halving_schedule(num_simulations, len(considered)):
        remaining = phase_order(remaining, root_scores())[:size]
        # The phase visits remaining[0], [1], ... in turn, ``each`` times round, cut
        # short by the budget (indexed, not listed: a budget of 10**30 is no list).
        length = min(len(remaining) * each, num_simulations - simulations)
        done = 0
        while done < length:
            paths: List[Path] = []
            leaves: List[int] = []
            states: List[State] = []
            while done + len(paths) < length and len(paths) < num_parallel:
                rule.root_edge = edges[remaining[(done + len(paths)) % len(remaining)]]
                descent = tree.descend(rule)
                if descent is None:  # a leaf already waiting in this round
                    break
                path, leaf, leaf_state = descent
                paths.append(path)
                leaves.append(leaf)
                if leaf_state is not None:
                    states.append(leaf_state)
            if states:
                evaluations += len(states)
                requests += 1
                y = await evaluated(evaluate, encoded(game, encode(states), len(states)))
                logits, values = split_policy_value(y, len(states), num_actions)
            else:
                logits, values = None, []
            tree.complete_leaves(paths, leaves, logits, values)
            for value in values:
                bounds.add(value)
            value_sum, seen1 = tree.edge_value_sum, tree.edge_seen1
            for path, leaf in zip(paths, leaves):
                end = tree.terminal_value(leaf)
                if end is not None:
                    bounds.add(end)
                for e in path:
                    bounds.add(value_sum[e] / (seen1[e] - 1))
            done += len(paths)
        simulations += length
        rounds, extra = divmod(length, len(remaining))
        last_phase = {i: rounds + (j < extra) for j, i in enumerate(remaining)
                      if rounds + (j < extra)}

    # The survivors: the most visited actions of the last phase (all of its actions,
    # unless the budget cut it short).
    counts = last_phase
    most = max(counts.values())
    scores = root_scores()
    best = phase_order([i for i in counts if counts[i] == most], scores)[0]

    visits, completed, sigmas = _root_statistics(tree, bounds, c_visit, c_scale)
    policy = improved_policy(root_logits, sigmas)
    sums = tree.value_sums(0)
    per_action: Dict[str, List[float]] = {
        name: [0.0] * num_actions for name in ("policy", "q", "completed")}
    root_prior = [0.0] * num_actions
    visit_counts = [0] * num_actions
    for i, a in enumerate(actions):
        visit_counts[a] = visits[i]
        per_action["policy"][a] = policy[i]
        per_action["q"][a] = sums[i] / visits[i] if visits[i] else 0.0
        per_action["completed"][a] = completed[i]
        root_prior[a] = tree.edge_prior[edges[i]]
    root_value = (network_value + left_sum(sums)) / (1 + reused + simulations)
    return GumbelResult(
        action=int(actions[best]), policy=tuple(per_action["policy"]),
        visit_counts=tuple(visit_counts), action_values=tuple(per_action["q"]),
        completed_values=tuple(per_action["completed"]),
        root_prior=tuple(root_prior),
        considered=tuple(int(actions[i]) for i in considered), root_value=root_value,
        network_value=network_value, num_simulations=simulations, reused_visits=reused,
        tree_size=tree.num_nodes, evaluations=evaluations, requests=requests,
        tree=tree if keep_tree else None)
