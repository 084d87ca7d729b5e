"""The searches' own Python cost, with a free model: µs per A* expansion, MCTS simulations/s.

A free model answers at once with constant outputs (zeros; a uniform policy and a zero
value for MCTS) through ``asr.immediate``, so that only the search is timed: what is
left is the Python work around the model that issue 12's goals 2 and 3 are about
(A* at most 3 µs an expansion; MCTS twice today's simulations per second).

- astar: batched A* on the 15-puzzle (100 random moves from the goal, budget
  --astar_budget evaluations, buffer 16), several starts, process CPU time per node
  expanded; astar_varied_values_buffer_4: the same with values that differ from state
  to state (as a trained net's; zeros tie everything) and buffer 4 (as
  search_speedup.py), which costs more per expansion;
- mcts: MCTS on Connect Four from the opening, --simulations simulations, 8 leaves in
  flight, several seeds, simulations per second of process CPU time; the same for the
  pre-issue-12 MCTS (its tree, mcts coroutine and ConnectFour at commit 3c80ed5, read from
  the git history by benchmarks/git_history.py), alternating search by search, and the ratio (new over baseline, measured in one run: the goal is 2x; its range over
  repeats shows the noise, so use --repeats 10).

Each figure is the best of --repeats runs (this machine is shared). Prints one JSON
object. Usage: python benchmarks/search_cost.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

import async_search as asr
from async_search import problems, search

#: The last commit before issue 12 (goal 3: twice the simulations per second) rewrote
#: the MCTS tree, the mcts coroutine and ConnectFour: the yardstick ``mcts_rate`` times.
MCTS_BASELINE_COMMIT = "3c80ed5f627cd10a5ddfefe6107e21f21e544778"


def free_heuristic(x: np.ndarray) -> np.ndarray:
    return np.zeros(len(x), np.float32)


def free_policy_value(num_actions: int):
    def model(x: np.ndarray):
        return np.zeros((len(x), num_actions), np.float32), np.zeros((len(x), 1), np.float32)
    return model


def varied_heuristic(x: np.ndarray) -> np.ndarray:
    """Values that differ from state to state, as a trained net's do (a hash of the
    encoding, 0 to 30): without the ties of zeros, nearly every node gets its own
    priority."""
    digits = np.ascontiguousarray(x).reshape(len(x), -1) @ np.arange(
        1, x[0].size + 1, dtype=np.float32)
    return ((digits * 0.6180339) % 1.0 * 30.0).astype(np.float32)


def astar_cost(starts: int, budget: int, repeats: int, model=free_heuristic,
               buffer_size: int = 16) -> dict:
    puzzle = problems.SlidingPuzzle(4)
    states = [puzzle.scramble(100, seed=s) for s in range(starts)]
    evaluate = asr.immediate(model)

    async def run():
        return [await search.batched_astar(puzzle, s, evaluate, budget=budget,
                                           buffer_size=buffer_size) for s in states]

    best, expanded = float("inf"), 0
    for _ in range(repeats):
        start = time.process_time()
        results = asyncio.run(run())
        best = min(best, time.process_time() - start)
        expanded = sum(r.nodes_expanded for r in results)
    return {"starts": starts, "budget": budget, "buffer_size": buffer_size,
            "nodes_expanded": expanded,
            "cpu_s": round(best, 3), "us_per_expansion": round(1e6 * best / expanded, 2)}


def mcts_rate(games: int, simulations: int, repeats: int) -> dict:
    """Simulations per second of CPU of ``search.mcts`` and of the pre-issue-12 MCTS
    (``MCTS_BASELINE_COMMIT``'s, loaded from the git history), alternating search by
    search (baseline, new, new, baseline, ...) so that both share the machine's noise. Each repeat sums
    the CPU time of its searches; ``ratio`` is the best repeat of the new over the best
    of the baseline, ``ratio_per_pair`` each repeat's, ``ratio_median`` their median;
    ``equal_results`` says whether both returned the same results."""
    import dataclasses
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # run as a script: the repository root is not on the path
        sys.path.insert(0, root)
    from benchmarks.git_history import import_at_commit

    # Module paths as they were at that commit, wherever the modules live today.
    alphazero = import_at_commit("async_search.search.alphazero", MCTS_BASELINE_COMMIT)
    connect_four = import_at_commit("async_search.problems.connect_four",
                                    MCTS_BASELINE_COMMIT)
    game = problems.ConnectFour()
    before = connect_four.ConnectFour()
    evaluate = asr.immediate(free_policy_value(game.num_actions))

    implementations = {"baseline": (alphazero.mcts, before), "new": (search.mcts, game)}
    # The fields the baseline has (later results add some, e.g. for tree reuse).
    compared = [f.name for f in dataclasses.fields(alphazero.MCTSResult)]

    async def one_repeat(order):
        """CPU seconds of each implementation over the searches, alternating search by
        search (in ``order``, then reversed) so that both see the same noise."""
        cpu = dict.fromkeys(implementations, 0.0)
        results = {k: [] for k in implementations}
        for s in range(games):
            for name in (order if s % 2 == 0 else order[::-1]):
                mcts, g = implementations[name]
                start = time.process_time()
                r = await mcts(g, g.initial_state(), evaluate, num_simulations=simulations,
                               num_parallel=8, seed=s)
                cpu[name] += time.process_time() - start
                results[name].append(tuple(getattr(r, f) for f in compared))
        return cpu, results["baseline"] == results["new"]

    asyncio.run(one_repeat(["baseline", "new"]))  # warm up, not counted
    times = {k: [] for k in implementations}
    equal = True
    for repeat in range(repeats):
        cpu, same = asyncio.run(one_repeat(["baseline", "new"][::(-1) ** repeat]))
        equal = equal and same
        for k in implementations:
            times[k].append(cpu[k])
    total = games * simulations
    best = {k: min(v) for k, v in times.items()}
    pairs = [b / n for b, n in zip(times["baseline"], times["new"])]
    return {"searches": games, "simulations_each": simulations,
            "cpu_s": round(best["new"], 3), "simulations_per_s": round(total / best["new"]),
            "baseline_cpu_s": round(best["baseline"], 3),
            "baseline_simulations_per_s": round(total / best["baseline"]),
            "ratio": round(best["baseline"] / best["new"], 2),
            "ratio_median": round(float(np.median(pairs)), 2),
            "ratio_per_pair": [round(r, 2) for r in pairs],
            "equal_results": equal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--astar_starts", type=int, default=8)
    parser.add_argument("--astar_budget", type=int, default=5000)
    parser.add_argument("--mcts_searches", type=int, default=8)
    parser.add_argument("--simulations", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for name in ("astar_starts", "astar_budget", "mcts_searches", "simulations", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    print(json.dumps({
        "astar": astar_cost(args.astar_starts, args.astar_budget, args.repeats),
        "astar_varied_values_buffer_4": astar_cost(args.astar_starts, args.astar_budget,
                                                   args.repeats, varied_heuristic, 4),
        "mcts": mcts_rate(args.mcts_searches, args.simulations, args.repeats),
    }, indent=2))


if __name__ == "__main__":
    main()
