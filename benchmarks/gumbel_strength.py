"""Gumbel AlphaZero against PUCT at equal simulations, and what tree reuse is worth.

With the shipped Connect Four net (``problems.pretrained("connect_four")``), one JSON
object (printed, and written to --out):

- ``accuracy``: on the solver-labelled sets (``problems.connect_four_positions``,
  "middle" and "end", 200 positions each), the fraction of positions where each player
  picks an optimal move (``search.move_accuracy``) at each of --simulations: the net
  alone; PUCT ``search.mcts`` without root noise; Gumbel ``search.gumbel_mcts`` without
  noise (``gumbel_scale=0``) and with it (the mean over --seeds seeds); and each search
  again with tree reuse: the parent position (the labelled moves less the last) is
  searched first at the same budget, and the position's search goes on from the
  subtree of the move that was played there, at the same number of NEW simulations
  (``reused_visits``: the mean visits carried over).
- ``selfplay_reuse``: --games self-play-like games from the empty board at each budget
  (Gumbel with noise plays its action; PUCT with root noise samples its visit counts
  for the first 8 moves), each search reusing the last: visits carried over per move,
  as a fraction of the new simulations, and evaluations per move with and without.
- ``match``: reuse against no reuse at equal new simulations, each search without
  noise, over every two-move opening (49) with both colours: the reusing player's
  score (wins + draws / 2) per game.

Everything runs concurrently through one ``asr.serve`` of the NumPy net. Progress goes
to stderr.

Usage: python benchmarks/gumbel_strength.py [--simulations 16,32] [--seeds 3]
[--games 20] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.files import write_file
from async_search.search.reuse import subtree

GAME = problems.ConnectFour()
STAGES = ("middle", "end")


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def searcher(kind: str, n: int, seed: int = 0) -> Callable:
    """``run(state, evaluate, reuse=None)``: the search of ``kind`` at ``n`` new
    simulations, keeping its tree."""
    if kind == "puct":
        return lambda state, ev, reuse=None: search.mcts(
            GAME, state, ev, num_simulations=n, dirichlet_fraction=0.0, reuse=reuse,
            keep_tree=True)
    scale = {"gumbel": 0.0, "gumbel_noise": 1.0}[kind]
    return lambda state, ev, reuse=None: search.gumbel_mcts(
        GAME, state, ev, num_simulations=n, gumbel_scale=scale, seed=seed, reuse=reuse,
        keep_tree=True)


async def accuracy(evaluate, positions, kind: str, n: int, seed: int, reuse: bool
                   ) -> Dict[str, float]:
    run = searcher(kind, n, seed)
    carried: List[int] = []

    async def choose(state) -> int:
        kept = None
        if reuse:
            moves = by_state[state]
            parent = GAME.from_moves(moves[:-1])
            kept = (await run(parent, evaluate)).subtree(moves[-1])
        r = await run(state, evaluate, kept)
        carried.append(r.reused_visits)
        return r.action

    by_state = {p.state: p.moves for p in positions}
    result = await search.move_accuracy(choose, positions)
    return {"accuracy": result.accuracy, "reused_visits": statistics.fmean(carried)}


async def accuracy_table(evaluate, sims: List[int], seeds: int) -> List[Dict[str, Any]]:
    rows = []
    for stage in STAGES:
        positions = problems.connect_four_positions(stage)
        policy = await search.move_accuracy(
            search.policy_chooser(GAME, evaluate), positions)
        rows.append({"stage": stage, "player": "policy", "simulations": 0,
                     "accuracy": policy.accuracy})
        for n in sims:
            for kind in ("puct", "gumbel", "gumbel_noise"):
                for reuse in (False, True):
                    start = time.perf_counter()
                    runs = [await accuracy(evaluate, positions, kind, n, seed, reuse)
                            for seed in range(seeds if kind == "gumbel_noise" else 1)]
                    row = {"stage": stage, "player": kind, "simulations": n,
                           "reuse": reuse,
                           "accuracy": round(statistics.fmean(r["accuracy"] for r in runs),
                                             4),
                           "reused_visits": round(statistics.fmean(
                               r["reused_visits"] for r in runs), 2),
                           "seconds": round(time.perf_counter() - start, 2)}
                    if len(runs) > 1:
                        row["accuracy_by_seed"] = [r["accuracy"] for r in runs]
                    log(row)
                    rows.append(row)
    return rows


async def selfplay_game(evaluate, kind: str, n: int, game_id: int, reuse: bool
                        ) -> Dict[str, List[int]]:
    rng = np.random.default_rng(game_id)
    state, kept = GAME.initial_state(), None
    carried, evaluations = [], []
    move = 0
    while GAME.terminal_value(state) is None:
        seed = int(rng.integers(2 ** 31))
        if kind == "puct":
            r = await search.mcts(GAME, state, evaluate, num_simulations=n, seed=seed,
                                  reuse=kept, keep_tree=reuse)
            if move < 8:
                counts = np.asarray(r.visit_counts, np.float64)
                action = int(rng.choice(len(counts), p=counts / counts.sum()))
            else:
                action = r.action
        else:
            r = await search.gumbel_mcts(GAME, state, evaluate, num_simulations=n,
                                         seed=seed, reuse=kept, keep_tree=reuse)
            action = r.action
        carried.append(r.reused_visits)
        evaluations.append(r.evaluations)
        kept = r.subtree(action) if reuse else None
        state = GAME.play(state, action)
        move += 1
    return {"carried": carried, "evaluations": evaluations}


async def selfplay_table(evaluate, sims: List[int], games: int) -> List[Dict[str, Any]]:
    rows = []
    for n in sims:
        for kind in ("puct", "gumbel"):
            row: Dict[str, Any] = {"player": kind, "simulations": n, "games": games}
            for reuse in (False, True):
                played = await asyncio.gather(*[
                    selfplay_game(evaluate, kind, n, g, reuse) for g in range(games)])
                carried = [c for p in played for c in p["carried"]]
                evals = [e for p in played for e in p["evaluations"]]
                key = "reuse" if reuse else "fresh"
                row[f"{key}_moves"] = len(evals)
                row[f"{key}_evaluations_per_move"] = round(statistics.fmean(evals), 2)
                if reuse:
                    row["carried_visits_per_move"] = round(statistics.fmean(carried), 2)
                    row["carried_fraction_of_new"] = round(statistics.fmean(carried) / n,
                                                           3)
            log(row)
            rows.append(row)
    return rows


async def match_game(evaluate, kind: str, n: int, opening, reuser_first: bool) -> float:
    """One game from ``opening`` between a reusing and a fresh player; the reusing
    player's score. The reusing player walks its kept tree down its own move and then
    the reply (``search.reuse.subtree`` twice)."""
    run = searcher(kind, n)
    state = GAME.from_moves(opening)
    kept: Optional[Any] = None
    reuser = 0 if reuser_first else 1
    turn = 0
    while GAME.terminal_value(state) is None:
        mine = turn % 2 == reuser
        r = await run(state, evaluate, kept if mine else None)
        if mine:
            kept = r.subtree(r.action)
        elif kept is not None:
            kept = subtree(kept, r.action)
        state = GAME.play(state, r.action)
        turn += 1
    value = GAME.terminal_value(state)  # for the player to move at the end
    reuser_value = value if turn % 2 == reuser else -value
    return (reuser_value + 1) / 2


async def match_table(evaluate, sims: List[int]) -> List[Dict[str, Any]]:
    rows = []
    openings = [(a, b) for a in range(7) for b in range(7)]
    for n in sims:
        for kind in ("puct", "gumbel"):
            scores = await asyncio.gather(*[
                match_game(evaluate, kind, n, o, first) for o in openings
                for first in (True, False)])
            row = {"player": kind, "simulations": n, "games": len(scores),
                   "reuse_score": round(statistics.fmean(scores), 4),
                   "wins": sum(s == 1.0 for s in scores),
                   "draws": sum(s == 0.5 for s in scores),
                   "losses": sum(s == 0.0 for s in scores)}
            log(row)
            rows.append(row)
    return rows


async def measure(args) -> Dict[str, Any]:
    net = problems.pretrained("connect_four")
    sims = [int(s) for s in args.simulations.split(",")]
    async with asr.serve(net, max_batch_size=512) as evaluate:
        out = {"host": {"python": platform.python_version(), "cpus": os.cpu_count()},
               "simulations": sims}
        out["accuracy"] = await accuracy_table(evaluate, sims, args.seeds)
        out["selfplay_reuse"] = await selfplay_table(evaluate, sims, args.games)
        out["match"] = await match_table(evaluate, sims)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", default="16,32")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--games", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for name in ("seeds", "games"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    try:
        sims = [int(s) for s in args.simulations.split(",")]
    except ValueError:
        sims = []
    if not sims or min(sims) < 1:
        parser.error(f"--simulations takes comma-separated integers >= 1, "
                     f"not {args.simulations!r}")
    out = asyncio.run(measure(args))
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
