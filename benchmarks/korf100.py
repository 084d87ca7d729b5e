"""The shipped 15-puzzle heuristic and Manhattan on all of Korf's 100, at several weights.

For each heuristic (``--heuristics``: the shipped DAVI net ``learned``, or the one in
``--checkpoint``, and ``manhattan``), each number of nodes expanded per step
(``--buffer_sizes``: more nodes a step explore more of the frontier, so paths are
shorter for more expansions) and each weight of the path cost in A*'s priority
``weight * g + h`` (``--weights``), batch-weighted A* runs on Korf's 100 random
instances (optimal lengths known, mean 53.05), all 100 searches at once through one
``asr.serve``, each within ``--budget`` model evaluations. Per heuristic, buffer and
weight the report gives: solved, the mean length of the solutions against the mean
optimal length of the instances solved (and the ratio), optimal solutions found, mean
expansions and evaluations, and seconds.

DeepCubeA's published 15-puzzle figures sit beside them for reference
(``DEEPCUBEA``): they are on 500 random states of its own, not Korf's 100, with a much
larger net and search, so they are an anchor, not a like-for-like comparison.

Progress goes to stderr; one JSON object to stdout and to ``--out``.

Usage: python benchmarks/korf100.py [--weights 0.6 0.8 1.0] [--budget 150000]
[--buffer_sizes 16 256] [--heuristics learned manhattan] [--checkpoint PATH]
[--instances 100] [--ids 14 17 ...] [--out results/benchmarks/korf100.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys

from async_search import problems
from async_search.problems.checkpoints import load_checkpoint
from async_search.experiments.heuristic_training import HeldOutConfig, evaluate_heuristic
from async_search.files import write_json

#: DeepCubeA (Agostinelli et al., Nature Machine Intelligence 2019, Table 1): the
#: 15-puzzle, 500 random test states, batch-weighted A* with its learned heuristic.
DEEPCUBEA = {"source": "Agostinelli et al. 2019, Table 1 (500 random states, not Korf's 100)",
             "mean_length": 52.02, "optimal_fraction": 0.994}


def heuristic(name: str, checkpoint: str | None = None):
    if name == "learned":
        if checkpoint is not None:
            return load_checkpoint(checkpoint)
        return problems.pretrained("15-puzzle")
    return problems.ManhattanHeuristic(problems.SlidingPuzzle(4))


def summary(result: dict) -> dict:
    """The report's row: the figures of ``evaluate_heuristic`` without the instances."""
    row = {k: v for k, v in result.items() if k != "per_instance"}
    if result["mean_length"] is not None:
        row["length_over_optimal"] = round(
            result["mean_length"] / result["mean_optimal_of_solved"], 4)
    row["unsolved_ids"] = [p["id"] for p in result["per_instance"]
                           if p["status"] != "goal_found"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", type=float, default=[0.6, 0.8, 1.0])
    parser.add_argument("--budget", type=int, default=150_000,
                        help="model evaluations each search may spend")
    parser.add_argument("--buffer_sizes", nargs="+", type=int, default=[16, 256],
                        help="nodes each A* step expands (one request); each is a run")
    parser.add_argument("--heuristics", nargs="+", default=["learned", "manhattan"],
                        choices=["learned", "manhattan"])
    parser.add_argument("--instances", type=int, default=100,
                        help="the first N of Korf's 100 (a quick look: fewer)")
    parser.add_argument("--ids", nargs="+", type=int, default=None,
                        help="only the instances of these numbers (1-100)")
    parser.add_argument("--checkpoint", default=None,
                        help="the learned heuristic's checkpoint folder (a --train "
                             "sliding_puzzle run's <save_dir>/heuristic; default: the "
                             "shipped one)")
    parser.add_argument("--out", default="results/benchmarks/korf100.json")
    args = parser.parse_args()
    if args.budget < 1 or args.instances < 1:
        parser.error(f"--budget and --instances must be integers >= 1, "
                     f"got {args.budget} and {args.instances}")
    if min(args.buffer_sizes) < 1:
        parser.error(f"--buffer_sizes must be integers >= 1, got {args.buffer_sizes}")
    if not all(0 <= w < math.inf for w in args.weights):
        parser.error(f"--weights must be >= 0, got {args.weights}")
    if args.ids is not None and not all(1 <= i <= 100 for i in args.ids):
        parser.error(f"--ids must be Korf instance numbers 1-100, got {args.ids}")
    report = {
        "workload": vars(args),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "deepcubea_published": DEEPCUBEA,
        "runs": {},
    }
    for name in args.heuristics:
        model = heuristic(name, args.checkpoint)
        for buffer_size in args.buffer_sizes:
            for weight in args.weights:
                label = f"{name} weight {weight:g} buffer {buffer_size}"
                config = HeldOutConfig(weight=weight, budget=args.budget,
                                       buffer_size=buffer_size)
                done = [0]

                def tick() -> None:
                    done[0] += 1
                    if done[0] % 10 == 0:
                        print(f"{label}: {done[0]}/{args.instances}", file=sys.stderr,
                              flush=True)

                result = evaluate_heuristic(model, config, on_done=tick,
                                            limit=args.instances, ids=args.ids)
                row = {"weight": weight, "buffer_size": buffer_size, **summary(result)}
                report["runs"][f"{name}@{weight:g}/{buffer_size}"] = row
                print(f"{label}: solved {row['solved']}/{row['instances']}, "
                      f"length/optimal {row.get('length_over_optimal')}, optimal found "
                      f"{row['optimal_found']}, mean expansions "
                      f"{row['mean_expansions']:.0f}, {row['seconds']:.1f} s",
                      file=sys.stderr, flush=True)
    write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
