"""AlphaZero MCTS (PUCT selection) with several leaves in flight per tree, as a coroutine over evaluate.

The policy-value model takes ``game.encode(states)`` and returns the tuple
``(policy_logits [n, num_actions], value [n, 1] or [n])``: logits over all actions
(illegal ones are masked here) and values in [-1, 1] for the player to move (a value
outside that range raises ModelOutputError: it would overflow the backed-up sums).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

from async_search.base import Evaluate
from async_search.checks import check_float, check_int
from async_search.problems.base import Game, State
from async_search.search.base import (check_dirichlet_alpha, check_evaluate,
                                      check_search_constant, encoded, evaluated)
from async_search.search.base import split_policy_value as _split_outputs
from async_search.search.reuse import kept_subtree, start_search
from async_search.search.sums import left_sum
from async_search.search.tree import Tree


@dataclasses.dataclass(frozen=True)
class MCTSResult:
    """What ``mcts`` returns; per-action tuples have one entry per action of the game
    (``game.num_actions``), zero for illegal actions."""

    action: int
    """The most visited action (ties go to the lowest action); with ``solve=True``, a
    proved win first (the quickest), and never a proved loss while a move is not one
    (where every move is proved, the best value, and among losses the latest)."""
    visit_counts: Tuple[int, ...]
    """Visits of each root action; they sum to ``num_simulations`` (plus
    ``reused_visits``)."""
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
    reused_visits: int = 0
    """Root visits carried over from ``reuse`` (0 without it): ``visit_counts`` sum to
    ``num_simulations + reused_visits``, and the root was not evaluated again."""
    network_prior: Tuple[float, ...] = ()
    """The network's prior of each root action, before the Dirichlet noise that
    ``root_prior`` has; with the visits and ``action_values``, what
    ``completed_q.root_improved_policy`` reads."""
    solved_value: Optional[float] = None
    """The root's exact value for the player to move where ``solve=True`` proved it
    (one of its moves proved a win, or every move proved), else None."""
    tree: Optional[Tree] = dataclasses.field(default=None, repr=False, compare=False)
    """The search tree with ``keep_tree=True``, else None; ``subtree`` reads it."""

    def subtree(self, action: int) -> Optional[Tree]:
        """The part of the tree under ``action``, for ``mcts(..., reuse=)`` after
        ``action`` is played (``search.reuse.subtree``); needs ``keep_tree=True``."""
        return kept_subtree(self.tree, action)


async def mcts(game: Game, state: State, evaluate: Evaluate, *, num_simulations: int,
               num_parallel: int = 8, c_puct: float = 1.25, dirichlet_alpha: float = 0.3,
               dirichlet_fraction: float = 0.25, seed: int = 0,
               reuse: Optional[Tree] = None, keep_tree: bool = False,
               solve: bool = False) -> MCTSResult:
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
        reuse: the previous search's ``result.subtree(action)`` for the move played
            (``search.reuse``), rooted at ``state``: the search goes on from its
            statistics (copied, not changed) without evaluating the root again; fresh
            root noise is mixed into its priors. None: a new tree.
        keep_tree: keep the tree in the result (``result.subtree``), for ``reuse``.
        solve: prove values as the search goes (MCTS-Solver, ``Tree.prove``): a node
            whose value the terminal positions below it settle becomes terminal, so
            simulations stop being spent on it, and the chosen action follows the
            proofs (``MCTSResult.action``). Off by default: AlphaZero's search.

    Returns:
        An ``MCTSResult``: the chosen action, visit counts, values, counts.

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
        >>> ev = asr.immediate(problems.PolicyValueMLP(game, seed=0))
        >>> r = asyncio.run(mcts(game, game.initial_state(), ev, num_simulations=32,
        ...                      num_parallel=8, seed=0))
        >>> sum(r.visit_counts)
        32
    """
    check_evaluate(evaluate)
    num_simulations = check_int("num_simulations", num_simulations, minimum=1)
    num_parallel = check_int("num_parallel", num_parallel, minimum=1)
    c_puct = check_search_constant("c_puct", c_puct, strict=True)
    dirichlet_alpha = check_dirichlet_alpha(dirichlet_alpha)
    dirichlet_fraction = check_float("dirichlet_fraction", dirichlet_fraction, minimum=0.0)
    if dirichlet_fraction > 1.0:
        raise ValueError(f"dirichlet_fraction must be in [0, 1], got "
                         f"{dirichlet_fraction!r}")
    seed = check_int("seed", seed, minimum=0)
    if not isinstance(solve, bool):
        raise ValueError(f"solve must be a bool, got {solve!r}")
    tree, evaluations = await start_search(game, state, evaluate, reuse, keep_tree)
    if solve:
        tree.prove()
    requests = evaluations
    num_actions = int(game.num_actions)
    encode = game.encode
    reused = tree.node_visits(0)
    network_prior = tree.priors(0)
    tree.add_exploration_noise(np.random.default_rng(seed), dirichlet_alpha,
                               dirichlet_fraction)
    network_value = tree.node_value[0]
    simulations = 0
    while simulations < num_simulations:
        paths, leaves, states = tree.select_leaves(
            c_puct, min(num_parallel, num_simulations - simulations))
        if states:
            evaluations += len(states)
            requests += 1
            y = await evaluated(evaluate, encoded(game, encode(states), len(states)))
            logits, values = _split_outputs(y, len(states), num_actions)
        else:
            logits, values = None, []
        tree.complete_leaves(paths, leaves, logits, values)
        simulations += len(leaves)

    visit_counts = [0] * num_actions
    action_values = [0.0] * num_actions
    root_prior = [0.0] * num_actions
    clean_prior = [0.0] * num_actions
    value_sums = tree.value_sums(0)
    for a, n, w, p, p0 in zip(tree.actions(0), tree.visits(0), value_sums, tree.priors(0),
                              network_prior):
        visit_counts[a] = n
        action_values[a] = w / n if n else 0.0
        root_prior[a] = p
        clean_prior[a] = p0
    if solve:
        action, solved_value = _choose_by_proofs(tree, visit_counts)
    else:
        action = max(range(num_actions), key=lambda a: (visit_counts[a], -a))
        solved_value = None
    root_value = (network_value + left_sum(value_sums)) / (1 + reused + simulations)
    return MCTSResult(action=action, visit_counts=tuple(visit_counts),
                      action_values=tuple(action_values), root_prior=tuple(root_prior),
                      root_value=root_value, network_value=network_value,
                      num_simulations=simulations, tree_size=tree.num_nodes,
                      evaluations=evaluations, requests=requests, reused_visits=reused,
                      network_prior=tuple(clean_prior), solved_value=solved_value,
                      tree=tree if keep_tree else None)


def _choose_by_proofs(tree: Tree, visit_counts) -> Tuple[int, Optional[float]]:
    """The action and the root's solved value (or None) of a proving search."""
    proved = {}  # action -> (value for the root's player, plies to the end)
    for e in tree.edges(0):
        child = tree.edge_child[e]
        proof = tree.proof(child) if child else None
        if proof is not None:
            proved[tree.edge_action[e]] = (-proof[0], proof[1] + 1)
    actions = tree.actions(0)
    best = max((value for value, _ in proved.values()), default=-math.inf)
    if best >= 1.0 or len(proved) == len(actions):
        # Settled: the best value; the quickest win, or the latest loss or draw.
        sign = 1 if best > 0 else -1
        chosen = max((a for a in proved if proved[a][0] == best),
                     key=lambda a: (-sign * proved[a][1], visit_counts[a], -a))
        return chosen, best
    # Not settled: the most visited action that is not a proved loss.
    open_actions = [a for a in actions if not (a in proved and proved[a][0] <= -1.0)]
    return max(open_actions, key=lambda a: (visit_counts[a], -a)), None
