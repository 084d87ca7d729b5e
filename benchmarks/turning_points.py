"""Where Connect Four agents lose against UCT: each game's turning points, by a solver.

Each net in --nets plays the final evaluation's agent (``experiments.training.FINAL_AGENT``:
MCTS with --simulations, one leaf in flight, no noise) against UCT with --rollouts random
rollouts, --games games on each seed in --seeds, first player alternating
(``training.play_games``). The solver then values every position of every game from
--from_ply on (``training.turns.turning_points``) and counts the moves that changed the value:
the agent's own mistakes (a won game let go, a draw lost) and UCT's.

A match score says how often an agent loses; this says whether it loses positions that
were won, where, and how often the opponent hands them back. Solving costs most near
the empty board: from ply 12, about a second a game; from ply 10, several.

Prints one JSON object and writes it to --out.

Usage: python benchmarks/turning_points.py [--nets shipped DIR ...] [--games 40]
[--seeds 1 2 3] [--rollouts 1000] [--simulations 100] [--from_ply 12] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Sequence

import async_search as asr
from async_search import problems
from async_search.experiments.training import FINAL_AGENT
from async_search.files import write_json
from async_search.problems.checkpoints import load_checkpoint
from async_search.problems.connect_four_solver import ConnectFourSolver
from async_search.training import (MatchGame, MCTSPlayer, UCTPlayer, play_games, tally,
                                   turning_points)


async def games_against_uct(model: Any, *, seeds: Sequence[int], games: int, rollouts: int,
                            simulations: int) -> List[MatchGame]:
    """The agent's games against UCT, every seed's in turn."""
    game = problems.ConnectFour()
    records: List[MatchGame] = []
    async with asr.serve(model, max_batch_size=512) as evaluate:
        agent = MCTSPlayer(evaluate, simulations=simulations, name="agent", **FINAL_AGENT)
        for seed in seeds:
            records += await play_games(game, agent, UCTPlayer(rollouts), num_games=games,
                                        seed=seed)
    return records


def summarise(records: Sequence[MatchGame], from_ply: int) -> Dict[str, Any]:
    """Scores by side, the value at ``from_ply``, and the mistakes of each side by ply."""
    solver = ConnectFourSolver()
    by_side: Dict[str, Dict[str, Any]] = {}
    for first in (True, False):
        side = [r for r in records if r.player_first == first]
        mistakes = {"agent": collections.Counter(), "uct": collections.Counter()}
        start = collections.Counter()
        games_turned = 0  # games the agent's own mistake turned from won or drawn to lost
        for record in side:
            if len(record.moves) <= from_ply:
                start["over before from_ply"] += 1
                continue
            turns = turning_points(record, from_ply=from_ply, solver=solver)
            # The value holds between turns: at from_ply it is the first turn's "before",
            # or the outcome when nothing turned.
            value_at_start = turns[0].before if turns else int(record.outcome)
            start[{1: "won", 0: "drawn", -1: "lost"}[value_at_start]] += 1
            for turn in turns:
                mistakes["agent" if turn.by_player else "uct"][turn.ply] += 1
            games_turned += (record.outcome < 0 <= value_at_start
                             and any(turn.by_player for turn in turns))
        counts = (dataclasses.asdict(tally(side)) if side
                  else {"wins": 0, "draws": 0, "losses": 0})
        by_side["agent_first" if first else "agent_second"] = {
            "games": len(side), **counts,
            "value_at_from_ply": dict(start),
            "agent_mistakes": sum(mistakes["agent"].values()),
            "uct_mistakes": sum(mistakes["uct"].values()),
            "losses_from_a_won_or_drawn_position": games_turned,
            "agent_mistakes_by_ply": dict(sorted(mistakes["agent"].items())),
            "uct_mistakes_by_ply": dict(sorted(mistakes["uct"].items())),
        }
    result = tally(records)
    return {"games": result.games, "wins": result.wins, "draws": result.draws,
            "losses": result.losses, "score": result.score,
            "agent_mistakes_per_game": sum(s["agent_mistakes"] for s in by_side.values())
            / len(records),
            "distinct_games": len({r.moves for r in records}),
            "sides": by_side}


def load(path: str) -> Any:
    return problems.pretrained("connect_four") if path == "shipped" else load_checkpoint(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=["shipped"],
                        help="checkpoint folders, or 'shipped' (problems.pretrained)")
    parser.add_argument("--games", type=int, default=40, help="games per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--from_ply", type=int, default=12,
                        help="the first ply valued by the solver")
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "turning_points.json"))
    args = parser.parse_args()
    for name in ("games", "rollouts", "simulations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.from_ply < 0:
        parser.error(f"--from_ply must be an integer >= 0, got {args.from_ply}")
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be integers >= 0, got {args.seeds}")
    try:
        models = {path: load(path) for path in args.nets}
    except ValueError as e:  # CheckpointError: a damaged or missing checkpoint, named
        parser.error(str(e))
    result: Dict[str, Any] = {"workload": vars(args), "python": platform.python_version(),
                              "machine": platform.machine(), "nets": {}}
    for path, model in models.items():
        start = time.perf_counter()
        records = asyncio.run(games_against_uct(
            model, seeds=args.seeds, games=args.games, rollouts=args.rollouts,
            simulations=args.simulations))
        played = time.perf_counter()
        out = summarise(records, args.from_ply)
        out["play_s"] = round(played - start, 1)
        out["solve_s"] = round(time.perf_counter() - played, 1)
        result["nets"][path] = out
        brief = {k: v for k, v in out.items() if k != "sides"}
        print(json.dumps({"net": path, **brief}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
