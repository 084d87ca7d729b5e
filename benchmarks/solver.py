"""The Connect Four solver's speed by depth, the cost of labelling, and move accuracy.

Three parts, one JSON object (printed, and written to --out):

- ``solve_times``: for positions of random and self-play-like games
  (``problems.solved_positions.MOVERS``) at each number of stones in --stones,
  --per_depth positions each (fresh solver per position): seconds for the exact score,
  the outcome alone (weak), the optimal moves and the labels of
  ``generate_positions`` (every move's exact score); nodes and microseconds a node.
- ``labelling``: seconds to generate and label each shipped set (200 positions);
  with --write_positions the package's data file is rewritten from them.
- ``move_accuracy``: on the shipped sets, by stage and source, the fraction of positions
  where each player picks an optimal move: a uniformly random legal move (its expected
  value, exact, and one seeded run), the shipped net alone (policy argmax), and MCTS at
  --simulations (no root noise) with the shipped net for each of --agents (leaves in
  flight, c_puct, and whether it proves values: ``search.mcts``'s ``solve``); with the seconds each took through one ``asr.serve``. Each
  player's figure is split too: ``*_not_lost`` over the won or drawn positions (where a
  move can give the outcome away: the issue's "optimal-outcome move"), ``*_lost`` over
  the lost ones (where only the moves that lose latest count, and every move keeps the
  outcome).

Progress goes to stderr; the JSON to stdout and --out.

Usage: python benchmarks/solver.py [--stones 10,12,...] [--per_depth 6]
[--simulations 100] [--agents 8:1.25,1:1.5,1:1.5:solve] [--checkpoint DIR]
[--write_positions] [--skip_times]
[--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

import async_search as asr
from async_search import problems
from async_search.problems import solved_positions as positions_module
from async_search.problems.checkpoints import load_checkpoint
from async_search.problems.connect_four_solver import ConnectFourSolver
from async_search.search.accuracy import mcts_chooser, move_accuracy, policy_chooser

GAME = problems.ConnectFour()


def summary(values):
    values = sorted(values)
    return {"median": round(statistics.median(values), 5),
            "p90": round(values[int(0.9 * (len(values) - 1))], 5),
            "max": round(values[-1], 5), "mean": round(statistics.fmean(values), 5)}


def positions_at(stones: int, source: str, n: int, seed: int):
    mover = positions_module.MOVERS[source]
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        moves = positions_module._play_to(GAME, stones, mover, rng)
        if moves is not None:
            out.append(GAME.from_moves(moves))
    return out


def timed(fn, state):
    solver = ConnectFourSolver()
    start = time.perf_counter()
    fn(solver, state)
    return time.perf_counter() - start, solver.nodes


def solve_times(stones_list, per_depth):
    rows = []
    tasks = {"exact": lambda s, x: s.solve(x), "weak": lambda s, x: s.solve(x, weak=True),
             "optimal_moves": lambda s, x: s.optimal_moves(x),
             "labels": lambda s, x: s.move_scores(x)}
    for stones in stones_list:
        for source in sorted(positions_module.MOVERS):
            states = positions_at(stones, source, per_depth, seed=stones)
            row = {"stones": stones, "source": source, "positions": len(states)}
            for name, fn in tasks.items():
                runs = [timed(fn, s) for s in states]
                row[name + "_s"] = summary([t for t, _ in runs])
                if name == "exact":
                    nodes = [n for _, n in runs]
                    row["exact_nodes"] = summary(nodes)
                    row["us_per_node"] = round(
                        1e6 * sum(t for t, _ in runs) / max(1, sum(nodes)), 2)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def labelling(write: bool):
    out = {}
    if write:
        start = time.perf_counter()
        positions_module.write_connect_four_positions()
        out["write_connect_four_positions_s"] = round(time.perf_counter() - start, 1)
    for i, (stage, stones) in enumerate(positions_module.STAGES.items()):
        start = time.perf_counter()
        solver = ConnectFourSolver()
        for j, source in enumerate(sorted(positions_module.MOVERS)):
            positions_module.generate_positions(100, stones=stones, source=source,
                                                seed=10 * i + j, stage=stage,
                                                solver=solver)
        out[stage + "_200_positions_s"] = round(time.perf_counter() - start, 1)
        print(json.dumps({stage: out[stage + "_200_positions_s"]}), file=sys.stderr,
              flush=True)
    return out


def by_outcome(result, ps) -> dict:
    """``result``'s accuracy over the won or drawn positions of ``ps`` (``not_lost``)
    and over the lost ones (``lost``); None for a subset without positions."""
    wrong = set(result.mistakes)
    out = {}
    for name, keep in (("not_lost", lambda p: p.score >= 0), ("lost", lambda p: p.score < 0)):
        kept = [i for i, p in enumerate(ps) if keep(p)]
        out[name] = (round(sum(i not in wrong for i in kept) / len(kept), 3) if kept
                     else None)
    return out


def record(row: dict, name: str, result, ps) -> None:
    row[name] = result.accuracy
    for subset, accuracy in by_outcome(result, ps).items():
        row[f"{name}_{subset}"] = accuracy


async def accuracies(simulations, agents, seed, checkpoint=None):
    net = (problems.pretrained("connect_four") if checkpoint is None
           else load_checkpoint(checkpoint))
    rows = []
    async with asr.serve(net, max_batch_size=2048) as evaluate:
        for stage in positions_module.STAGES:
            for source in (None, *sorted(positions_module.MOVERS)):
                ps = problems.connect_four_positions(stage, source=source)
                row = {"stage": stage, "source": source or "both", "positions": len(ps),
                       "positions_not_lost": sum(p.score >= 0 for p in ps),
                       "random_expected": round(float(np.mean(
                           [len(p.optimal_moves) / len(GAME.legal_actions(p.state))
                            for p in ps])), 3)}
                rng = np.random.default_rng(seed)
                row[f"random_seed{seed}"] = (await move_accuracy(
                    lambda s: positions_module.random_move(GAME, s, rng), ps)).accuracy
                start = time.perf_counter()
                record(row, "net", await move_accuracy(policy_chooser(GAME, evaluate),
                                                       ps), ps)
                row["net_s"] = round(time.perf_counter() - start, 2)
                for num_parallel, c_puct, solve in agents:
                    name = (f"mcts{simulations}_leaves{num_parallel}_c{c_puct}"
                            + ("_solve" if solve else ""))
                    chooser = mcts_chooser(GAME, evaluate, num_simulations=simulations,
                                           num_parallel=num_parallel, c_puct=c_puct,
                                           solve=solve)
                    start = time.perf_counter()
                    record(row, name, await move_accuracy(chooser, ps), ps)
                    row[name + "_s"] = round(time.perf_counter() - start, 2)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def parse_agent(text: str):
    """``"1:1.5"`` or ``"1:1.5:solve"`` -> ``(num_parallel, c_puct, solve)``."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "solve"):
            raise ValueError
        leaves, c_puct = int(parts[0]), float(parts[1])
        if leaves < 1 or not 0 <= c_puct < math.inf:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--agents: {text!r} is not leaves:c_puct[:solve] (leaves >= 1, "
                         f"c_puct >= 0)") from None
    return leaves, c_puct, len(parts) == 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stones", default="10,12,14,16,18,20,22,24,28,32,36")
    parser.add_argument("--per_depth", type=int, default=6)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--agents", default="8:1.25,1:1.5,1:1.5:solve",
                        help="MCTS agents as leaves_in_flight:c_puct[:solve], "
                             "comma-separated; ':solve' proves values (MCTS-Solver) "
                             "(search.mcts's defaults; docs/benchmarks.md's evaluation "
                             "agent; the training arena's)")
    parser.add_argument("--seed", type=int, default=0, help="the random mover's seed")
    parser.add_argument("--checkpoint", default=None,
                        help="a Connect Four checkpoint folder (a run's 'best'); "
                             "default: the shipped net")
    parser.add_argument("--write_positions", action="store_true",
                        help="rewrite the package's connect_four_positions.json")
    parser.add_argument("--skip_times", action="store_true")
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "solver.json"))
    args = parser.parse_args()
    for name in ("per_depth", "simulations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        parser.error(f"--seed must be an integer >= 0, got {args.seed}")
    try:
        stones = [int(s) for s in args.stones.split(",")]
    except ValueError:
        stones = []
    if not stones or not all(0 <= s <= 41 for s in stones):
        parser.error(f"--stones takes comma-separated integers 0-41, not {args.stones!r}")
    agents = [parse_agent(a) for a in args.agents.split(",")]  # before any work
    result = {"workload": vars(args), "python": platform.python_version(),
              "machine": platform.machine()}
    if not args.skip_times:
        result["solve_times"] = solve_times(stones, args.per_depth)
    result["labelling"] = labelling(args.write_positions)
    result["move_accuracy"] = asyncio.run(accuracies(args.simulations, agents, args.seed,
                                                     args.checkpoint))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        from async_search.files import write_file
        write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
