"""Workloads: the starts, the search function and the model factory of an experiment.

Everything a backend ships to another process is picklable: search functions are
``functools.partial`` objects over module-level coroutines, and the model factory is a
``functools.partial`` of ``build_model``. Within one process ``build_model`` keeps the
models it built (traced and warmed up), so the baseline and every run served from this
process use the same, already traced, network and no run pays for tracing.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from async_search import problems, search
from async_search.experiments.config import ModelConfig, SearchConfig
from async_search.search.base import Status


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every run of an experiment runs: the same searches from the same starts."""

    params: SearchConfig
    """The search parameters it was made from."""
    model: ModelConfig
    """The network parameters."""
    starts: Tuple[Any, ...]
    """One start per search."""
    search_fn: Callable[[Any, Any], Any]
    """``async def search_fn(start, evaluate)``, picklable."""
    model_factory: Callable[[], Any]
    """Builds (in this process: returns the cached) model, picklable."""
    expected_elements: Optional[int]
    """How many elements all searches send to the model, where they spend their whole
    budget (MCTS: a progress bar's total); None where a search stops at its goal (A*,
    continuous A*, rollouts), since nobody knows when that is: the bar then shows a
    count and a rate, not a total it would crawl through and then jump."""

    def describe(self) -> str:
        """One line: the search, problem, budget and model."""
        p, m = self.params, self.model
        problem = ("Connect Four" if p.search == "mcts"
                   else f"{p.puzzle_size ** 2 - 1}-puzzle (scramble {p.scramble})")
        extra = {"astar": f"buffer {p.batch_size}, weight {p.weight:g}",
                 "continuous": f"{p.max_in_flight} requests in flight, weight {p.weight:g}",
                 "rollout": f"{p.num_rollouts} rollouts of depth <= {p.rollout_depth}",
                 "mcts": f"{p.batch_size} leaves per round"}[p.search]
        searches = "search" if p.num_searches == 1 else "searches"
        return (f"{p.num_searches} {p.search} {searches} on {problem}, budget "
                f"{p.gnn_budget} evaluations each, {extra}; {m.describe()}, "
                f"seed {p.seed}")


def problem_for(search_name: str, puzzle_size: int = 4) -> Any:
    """The problem a search runs on: Connect Four for MCTS, else the sliding puzzle."""
    if search_name == "mcts":
        return problems.ConnectFour()
    return problems.SlidingPuzzle(puzzle_size)


def make_starts(params: SearchConfig) -> List[Any]:
    """``num_searches`` seeded starts: scrambled puzzles, or Connect Four openings."""
    problem = problem_for(params.search, params.puzzle_size)
    if params.search != "mcts":
        return [problem.scramble(params.scramble, seed=params.seed + i)
                for i in range(params.num_searches)]
    starts = []
    for i in range(params.num_searches):
        rng = np.random.default_rng(params.seed + i)
        state = problem.initial_state()
        for _ in range(params.opening_moves):
            child = problem.play(state, int(rng.choice(problem.legal_actions(state))))
            if problem.terminal_value(child) is not None:
                break  # keep a position with a move left to search
            state = child
        starts.append(state)
    return starts


_MODELS: Dict[tuple, Any] = {}


def trained_name(search_name: str, puzzle_size: int = 4) -> str:
    """The name of the trained net (``problems.pretrained``) for a search's problem.

    Raises:
        ValueError: for a sliding puzzle other than the 15-puzzle (none is shipped).
    """
    if search_name == "mcts":
        return "connect_four"
    if puzzle_size != 4:
        raise ValueError(f"the trained heuristic is for the 15-puzzle (puzzle_size 4); "
                         f"there is none for puzzle_size {puzzle_size}: use an "
                         f"untrained net (--untrained)")
    return "15-puzzle"


def build_model(search_name: str, puzzle_size: int, params: ModelConfig) -> Any:
    """The network for a search's problem, built once per process and warmed up.

    Trained (the default): ``problems.pretrained`` (the 15-puzzle heuristic, or the
    Connect Four policy-value net), on NumPy, or on TensorFlow through
    ``problems.tf_twin``. Untrained: ``heuristic_mlp`` or ``PolicyValueMLP`` seeded with
    ``params.seed``, or their TensorFlow twins. Both frameworks compute bitwise the same
    outputs, whatever the batch.

    Raises:
        ValueError: for a trained net on a puzzle other than the 15-puzzle.
    """
    key = (search_name == "mcts", puzzle_size, params)
    model = _MODELS.get(key)
    if model is not None:
        return model
    problem = problem_for(search_name, puzzle_size)
    if params.trained:
        model = problems.pretrained(trained_name(search_name, puzzle_size))
    elif search_name == "mcts":
        model = problems.PolicyValueMLP(problem, hidden_sizes=tuple(params.hidden_sizes),
                                        seed=params.seed)
    else:
        model = problems.heuristic_mlp(problem, hidden_sizes=tuple(params.hidden_sizes),
                                       seed=params.seed)
    if params.kind == "tf":
        model = problems.tf_twin(model, max_batch_size=params.max_batch_size)
    if params.warm_up:
        spec = problem.input_spec
        for size in getattr(model, "batch_sizes", (1,)):
            model(np.zeros(spec.batch_shape(size), spec.dtype))
        # The model (and TensorFlow's many objects) live as long as the process: freeze
        # them out of the garbage collector's full scans, which many searches' nodes
        # alive at once would otherwise trigger over and over on all of them.
        gc.collect()
        gc.freeze()
    _MODELS[key] = model
    return model


@dataclasses.dataclass(frozen=True)
class RolloutSearchResult:
    """What ``budgeted_rollouts`` returns."""

    status: Status
    """GOAL_FOUND if a round reached a goal, else BUDGET_EXHAUSTED (or SPACE_EXHAUSTED
    when the last round's rollouts all ended at dead ends)."""
    path: Tuple[Any, ...]
    """The best rollout's path in the last round (to the goal, when one was found)."""
    cost: float
    """That path's cost."""
    rounds: int
    """Rounds of lockstep rollouts run."""
    evaluations: int
    """States sent to the model, over all rounds."""
    requests: int
    """Calls to ``evaluate``, over all rounds."""


async def budgeted_rollouts(problem: Any, start: Any, evaluate: Any, *, budget: int,
                            depth: int, num_rollouts: int, seed: int) -> RolloutSearchResult:
    """Rounds of ``multi_rollout`` from ``start`` until a goal is reached or ``budget``
    evaluations are spent; round ``i`` is seeded with ``(seed, i)``."""
    evaluations = requests = rounds = 0
    while True:
        r = await search.multi_rollout(problem, start, evaluate, depth=depth,
                                       num_rollouts=num_rollouts,
                                       seed=np.random.SeedSequence([seed, rounds]))
        rounds += 1
        evaluations += r.evaluations
        requests += r.requests
        if r.status is Status.GOAL_FOUND or evaluations >= budget or not r.evaluations:
            return RolloutSearchResult(status=r.status, path=r.path, cost=r.cost,
                                       rounds=rounds, evaluations=evaluations,
                                       requests=requests)


def _search_fn(params: SearchConfig, problem: Any) -> Callable[[Any, Any], Any]:
    p = params
    if p.search == "astar":
        return functools.partial(search.batched_astar, problem, budget=p.gnn_budget,
                                 buffer_size=p.batch_size, weight=p.weight)
    if p.search == "continuous":
        return functools.partial(search.continuous_astar, problem, budget=p.gnn_budget,
                                 weight=p.weight, max_in_flight=p.max_in_flight)
    if p.search == "rollout":
        return functools.partial(budgeted_rollouts, problem, budget=p.gnn_budget,
                                 depth=p.rollout_depth, num_rollouts=p.num_rollouts,
                                 seed=p.seed)
    return functools.partial(search.mcts, problem, num_simulations=p.gnn_budget,
                             num_parallel=p.batch_size, seed=p.seed)


def make_workload(params: SearchConfig, model: ModelConfig) -> Workload:
    """The workload of ``params``, its model described by ``model``.

    Raises:
        ValueError: for a trained net on a puzzle that has none (``trained_name``).
    """
    if model.trained:
        trained_name(params.search, params.puzzle_size)
    problem = problem_for(params.search, params.puzzle_size)
    # MCTS spends its whole budget (and evaluates its root first); the others stop at
    # their goal, anywhere from a few evaluations to the budget.
    expected = ((params.gnn_budget + 1) * params.num_searches if params.search == "mcts"
                else None)
    return Workload(params=params, model=model, starts=tuple(make_starts(params)),
                    search_fn=_search_fn(params, problem),
                    model_factory=functools.partial(build_model, params.search,
                                                    params.puzzle_size, model),
                    expected_elements=expected)


def summarize(results: Sequence[Any]) -> Dict[str, Any]:
    """What the searches found, JSON-ready.

    Keys: ``searches``; for searches that end in a status (A*, rollouts): ``solved``
    (searches that reached a goal), ``mean_path_length`` (moves on the solved searches'
    paths, their mean; None when none was solved) and the count of each status that
    occurred (``goal_found``, ``budget_exhausted``, ...); for MCTS: ``actions``, the
    action each search chose; ``evaluations``: states sent to the model, in all.
    """
    out: Dict[str, Any] = {"searches": len(results)}
    statuses = [getattr(r, "status", None) for r in results]
    if all(s is not None for s in statuses):
        solved = [r for r in results if r.status is Status.GOAL_FOUND]
        out["solved"] = len(solved)
        out["mean_path_length"] = (float(np.mean([len(r.path) - 1 for r in solved]))
                                   if solved else None)
        for s in Status:
            count = sum(1 for x in statuses if x is s)
            if count:
                out[s.value] = count
    elif all(hasattr(r, "action") for r in results):
        out["actions"] = [r.action for r in results]
    if all(hasattr(r, "evaluations") for r in results):
        out["evaluations"] = sum(r.evaluations for r in results)
    return out
