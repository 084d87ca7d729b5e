"""MCTS with and without proving values (``search.mcts``'s ``solve``), same net, same games.

The shipped Connect Four net's (or --checkpoint's) evaluation agent (``experiments.training.FINAL_AGENT``:
MCTS with --simulations, one leaf in flight, no noise) plays one-ply, UCT with --uct
rollouts and UCT with --strong_uct rollouts, --games each, first player alternating,
once as AlphaZero's search and once with ``solve=True`` (MCTS-Solver). The matches are
seeded alike, so the two agents meet the same opponents' moves until they differ.

Prints one JSON object and writes it to --out.

Usage: python benchmarks/solve_strength.py [--games 40] [--simulations 100]
[--uct 300] [--strong_uct 1000] [--checkpoint DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

from async_search import problems
from async_search.experiments.training import evaluate_agent
from async_search.files import write_json
from async_search.problems.checkpoints import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=40)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--uct", type=int, default=300)
    parser.add_argument("--strong_uct", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--checkpoint", default=None,
                        help="a Connect Four checkpoint folder (a run's 'best'); "
                             "default: the shipped net")
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "solve_strength.json"))
    args = parser.parse_args()
    for name in ("games", "simulations", "uct", "strong_uct"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        parser.error(f"--seed must be an integer >= 0, got {args.seed}")
    net = (problems.pretrained("connect_four") if args.checkpoint is None
           else load_checkpoint(args.checkpoint))
    result = {"workload": vars(args), "python": platform.python_version(),
              "machine": platform.machine(), "agents": {}}
    for solve in (False, True):
        start = time.perf_counter()
        out = asyncio.run(evaluate_agent(
            net, games=args.games, simulations=args.simulations, uct_rollouts=args.uct,
            strong_uct_rollouts=args.strong_uct, strong_uct_games=args.games,
            seed=args.seed, solve=solve))
        out["seconds"] = round(time.perf_counter() - start, 1)
        result["agents"]["solve" if solve else "plain"] = out
        print(json.dumps({"solve": solve, **out}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
