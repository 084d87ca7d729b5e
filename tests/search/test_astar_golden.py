"""Batched and continuous A* give exactly the results, and send exactly the requests, that
they gave before their inner loop was vectorised (issue 12).

The goldens in ``data/astar_golden.json`` were recorded from the per-state implementation
(``neighbors`` one state at a time, ``bytes`` keys, ``encode`` joining bytes); each case
compares the whole ``AStarResult`` and a digest of every request, in order (shape, dtype
and the bytes of the model input, so the rows and their order are pinned), across
problems, models (zeros: every tie goes to the insertion order), weights 0, 0.5 and 1,
budgets that end mid-search, buffer sizes and in-flight limits.

Regenerate (only when a change of results is intended) with
``python tests/search/test_astar_golden.py --regenerate``.
"""

import asyncio
import functools
import hashlib
import json
import pathlib
import sys

import numpy as np
import pytest

from async_search import problems, search

GOLDEN = pathlib.Path(__file__).parent / "data" / "astar_golden.json"


@functools.lru_cache(maxsize=None)
def problem_of(name):
    if name == "puzzle3":
        return problems.SlidingPuzzle(3)
    if name == "puzzle4":
        return problems.SlidingPuzzle(4)
    if name == "graph":
        return problems.SyntheticGraph(branching=3, depth=7, seed=5, goal_fraction=0.05)
    if name == "graph_no_goal":
        return problems.SyntheticGraph(branching=2, depth=6, seed=2, goal_fraction=0.0)
    raise KeyError(name)


def start_of(name, token):
    """``goal``, ``<moves>x<seed>`` (a scrambled puzzle) or a SyntheticGraph tree index."""
    problem = problem_of(name)
    if token == "goal":
        return problem.goal
    if "x" in token:
        moves, seed = token.split("x")
        return problem.scramble(int(moves), seed=int(seed))
    return problem.start(int(token))


@functools.lru_cache(maxsize=None)
def model_of(problem_name, kind):
    problem = problem_of(problem_name)
    if kind == "zero":
        return lambda x: np.zeros(len(x), np.float32)
    if kind == "exact":
        if problem_name.startswith("puzzle"):
            return problems.ManhattanHeuristic(problem)
        return problems.DepthHeuristic(problem)
    if kind == "mlp":
        return problems.heuristic_mlp(problem, hidden_sizes=(16,), seed=1)
    raise KeyError(kind)


def cases():
    out = []
    for problem_name, starts, budgets in (
            ("puzzle3", ("40x0", "40x1", "goal"), (150, 2500)),
            ("puzzle4", ("100x0", "16x2"), (150, 2500)),
            ("graph", ("0", "1"), (100, 2000)),
            ("graph_no_goal", ("0",), (1000,))):
        for start in starts:
            for kind in ("zero", "exact", "mlp"):
                for weight in (0.0, 0.5, 1.0):
                    for budget in budgets:
                        for variant in ("batched", "continuous"):
                            for width in (1, 4, 16):
                                out.append(f"{problem_name}/{start}/{kind}/{weight}/"
                                           f"{budget}/{variant}/{width}")
    return out


def state_json(state):
    return state.hex() if isinstance(state, bytes) else list(state)


async def run_case(case):
    problem_name, start, kind, weight, budget, variant, width = case.split("/")
    problem, model = problem_of(problem_name), model_of(problem_name, kind)
    digest = hashlib.sha256()

    async def evaluate(x):
        digest.update(repr((x.shape, str(x.dtype))).encode())
        digest.update(np.ascontiguousarray(x).tobytes())
        return model(x)

    start = start_of(problem_name, start)
    if variant == "batched":
        r = await search.batched_astar(problem, start, evaluate, budget=int(budget),
                                       buffer_size=int(width), weight=float(weight))
    else:
        r = await search.continuous_astar(problem, start, evaluate, budget=int(budget),
                                          max_in_flight=int(width), weight=float(weight))
    assert r.path is None or all(type(s) is type(start) for s in r.path)
    return {"status": r.status.value,
            "path": None if r.path is None else [state_json(s) for s in r.path],
            "cost": r.cost, "nodes_expanded": r.nodes_expanded,
            "nodes_generated": r.nodes_generated, "evaluations": r.evaluations,
            "requests": r.requests, "request_digest": digest.hexdigest()}


@functools.lru_cache(maxsize=None)
def goldens():
    return json.loads(GOLDEN.read_text())


CASES = cases()
GROUPS = sorted({case.rsplit("/", 4)[0] for case in CASES})


@pytest.mark.parametrize("group", GROUPS)
async def test_astar_results_and_requests_equal_the_goldens(group):
    expected = goldens()
    for case in CASES:
        if case.startswith(group + "/"):
            assert await run_case(case) == expected[case], case


def test_the_goldens_cover_every_case_and_end_in_every_way():
    expected = goldens()
    assert sorted(expected) == sorted(CASES)
    assert {r["status"] for r in expected.values()} == {
        "goal_found", "budget_exhausted", "space_exhausted"}


async def regenerate():
    return {case: await run_case(case) for case in CASES}


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(asyncio.run(regenerate()), indent=0, sort_keys=True)
                      + "\n")
    print(f"wrote {len(CASES)} cases to {GOLDEN}")
