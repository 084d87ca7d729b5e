"""How much faster many searches run batched through ``asr.serve`` than one by one.

Two workloads, each run twice on the same model: sequentially, every search awaiting
``asr.immediate(model)`` (one model call per request), and concurrently, all searches
gathered in one event loop around one ``asr.serve(model)``.

- A*: batched A* (``--buffer-size`` nodes per step) on scrambled 15-puzzles with the
  TensorFlow heuristic net.
- MCTS: AlphaZero MCTS on Connect Four positions with the TensorFlow policy-value net.

Prints one JSON object: wall times, speedup, the server's mean batch size and fraction of
time in the model, simulations per second for MCTS, and whether both runs returned equal
results (they must: the nets are row-independent).

Example (small):
    python benchmarks/search_speedup.py --searches 8 --budget 200 --games 8 \
        --simulations 32
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.problems import tf_nets


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--searches", type=int, default=64, help="A* searches (15-puzzles)")
    p.add_argument("--budget", type=int, default=2000, help="A* evaluations per search")
    p.add_argument("--buffer-size", type=int, default=4, help="A* nodes per step")
    p.add_argument("--scramble", type=int, default=100, help="moves scrambling each start")
    p.add_argument("--hidden", default="256,256",
                   help="hidden layer widths of both nets, comma-separated")
    p.add_argument("--games", type=int, default=64, help="MCTS searches (positions)")
    p.add_argument("--simulations", type=int, default=128, help="MCTS simulations")
    p.add_argument("--num-parallel", type=int, default=8, help="MCTS leaves per round")
    p.add_argument("--max-batch-size", type=int, default=320,
                   help="server batch size; the default is about half of what 64 "
                        "searches ask for in one step, so that two batches alternate in "
                        "the server's pipeline and the searches' CPU work overlaps the "
                        "model")
    p.add_argument("--bucket", type=int, default=32,
                   help="TF batch sizes: multiples of this up to --max-batch-size, plus "
                        "the powers of two below it (less padding than powers of two)")
    p.add_argument("--tf-threads", type=int, default=0,
                   help="TensorFlow's intra-op threads (0: its default, one per core); "
                        "1 leaves a core to the searches while the model runs")
    p.add_argument("--tf-inter-threads", type=int, default=0,
                   help="TensorFlow's inter-op threads (0: its default, one per core)")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval in seconds (0: Python's 0.005). The device "
                        "thread needs the GIL several times a TensorFlow call: while the "
                        "searches hold it, each wait lasts up to this interval")
    p.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the nets with XLA")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each mode this many times and report the fastest run (on a "
                        "shared machine the minimum is the least disturbed figure)")
    p.add_argument("--skip-astar", action="store_true")
    p.add_argument("--skip-mcts", action="store_true")
    args = p.parse_args(argv)
    for name in ("searches", "budget", "buffer_size", "games", "simulations",
                 "num_parallel", "max_batch_size", "bucket", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be an integer >= 1, "
                    f"got {getattr(args, name)}")
    for name in ("scramble", "tf_threads", "tf_inter_threads"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be an integer >= 0, "
                    f"got {getattr(args, name)}")
    # (NaN passed a "< 0" check and aborted the interpreter at its first GIL wait)
    if not 0 <= args.switch_interval < 1e6:
        p.error(f"--switch-interval must be >= 0 seconds and below 1e6 (0: Python's), "
                f"got {args.switch_interval}")
    try:
        hidden = [int(h) for h in args.hidden.split(",") if h]
    except ValueError:
        hidden = []
    if not hidden or min(hidden) < 1:
        p.error(f"--hidden takes comma-separated integers >= 1, not {args.hidden!r}")
    return args


def batch_sizes(max_batch_size: int, bucket: int) -> list:
    small = [s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if s < bucket]
    return sorted(set(small + list(range(bucket, max_batch_size + 1, bucket))
                      + [max_batch_size]))


def warm_up(model, spec, sizes) -> None:
    """Trace the TensorFlow function for every batch size before timing, then freeze
    the objects alive so far (TensorFlow's many) out of the garbage collector's scans:
    otherwise every full collection triggered by the searches' nodes rescans them, which
    costs the concurrent run (many trees alive at once) more than the sequential one."""
    for n in sizes:
        model(np.zeros(spec.batch_shape(n), spec.dtype))
    gc.collect()
    gc.freeze()


async def run_sequential(run_one, starts, model):
    t = time.perf_counter()
    evaluate = asr.immediate(model)
    results = [await run_one(s, evaluate) for s in starts]
    return time.perf_counter() - t, results, dict(evaluate.stats)


async def run_concurrent(run_one, starts, model, max_batch_size: int):
    t = time.perf_counter()
    async with asr.serve(model, max_batch_size=max_batch_size) as evaluate:
        results = await asyncio.gather(*[run_one(s, evaluate) for s in starts])
        stats = dict(evaluate.stats)
    return time.perf_counter() - t, list(results), stats


async def compare(run_one, starts, model, max_batch_size: int, repeat: int) -> dict:
    sequential_s, sequential, sequential_stats = min(
        [await run_sequential(run_one, starts, model) for _ in range(repeat)],
        key=lambda run: run[0])
    concurrent_s, concurrent, stats = min(
        [await run_concurrent(run_one, starts, model, max_batch_size)
         for _ in range(repeat)], key=lambda run: run[0])
    return {
        "sequential_wall_s": round(sequential_s, 3),
        "concurrent_wall_s": round(concurrent_s, 3),
        "speedup": round(sequential_s / concurrent_s, 2),
        "sequential_requests": sequential_stats["batches"],
        "sequential_fraction_in_model": round(sequential_stats["fraction_in_model"], 3),
        "batches": stats["batches"],
        "elements": stats["elements"],
        "mean_batch_size": round(stats["mean_batch_size"], 1),
        "fraction_in_model": round(stats["fraction_in_model"], 3),
        "results_equal": concurrent == sequential,
        "_results": sequential,
    }


async def bench_astar(args, hidden, sizes) -> dict:
    puzzle = problems.SlidingPuzzle(4)
    net = tf_nets.heuristic_tf_net(puzzle, hidden_sizes=hidden, seed=0,
                                   max_batch_size=args.max_batch_size, batch_sizes=sizes,
                                   jit_compile=args.jit)
    warm_up(net, puzzle.input_spec, sizes)
    starts = [puzzle.scramble(args.scramble, seed=i) for i in range(args.searches)]

    def astar(start, evaluate):
        return search.batched_astar(puzzle, start, evaluate, budget=args.budget,
                                    buffer_size=args.buffer_size)

    out = await compare(astar, starts, net, args.max_batch_size, args.repeat)
    results = out.pop("_results")
    expanded = sum(r.nodes_expanded for r in results)
    out.update(searches=args.searches, budget=args.budget, buffer_size=args.buffer_size,
               nodes_expanded=expanded,
               evaluations=sum(r.evaluations for r in results),
               goals_found=sum(r.status is search.Status.GOAL_FOUND for r in results),
               expansions_per_s_sequential=round(expanded / out["sequential_wall_s"]),
               expansions_per_s_concurrent=round(expanded / out["concurrent_wall_s"]))
    return out


async def bench_mcts(args, hidden, sizes) -> dict:
    game = problems.ConnectFour()
    net = tf_nets.policy_value_tf_net(game, hidden_sizes=hidden, seed=0,
                                      max_batch_size=args.max_batch_size, batch_sizes=sizes,
                                      jit_compile=args.jit)
    warm_up(net, game.input_spec, sizes)
    rng = np.random.default_rng(0)
    starts = []
    for _ in range(args.games):  # a few random opening moves each
        state = game.initial_state()
        for _ in range(int(rng.integers(0, 6))):
            state = game.play(state, int(rng.choice(game.legal_actions(state))))
        starts.append(state)

    def run_mcts(state, evaluate):
        return search.mcts(game, state, evaluate, num_simulations=args.simulations,
                           num_parallel=args.num_parallel, seed=0)

    out = await compare(run_mcts, starts, net, args.max_batch_size, args.repeat)
    results = out.pop("_results")
    simulations = sum(r.num_simulations for r in results)
    out.update(games=args.games, simulations=args.simulations,
               num_parallel=args.num_parallel,
               simulations_per_s_sequential=round(simulations / out["sequential_wall_s"]),
               simulations_per_s_concurrent=round(simulations / out["concurrent_wall_s"]))
    return out


async def main(args) -> dict:
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.tf_threads or args.tf_inter_threads:
        import tensorflow as tf
        if args.tf_threads:
            tf.config.threading.set_intra_op_parallelism_threads(args.tf_threads)
        if args.tf_inter_threads:
            tf.config.threading.set_inter_op_parallelism_threads(args.tf_inter_threads)
    hidden = tuple(int(h) for h in args.hidden.split(",") if h)
    sizes = batch_sizes(args.max_batch_size, args.bucket)
    report = {"hidden_sizes": hidden, "max_batch_size": args.max_batch_size,
              "jit_compile": args.jit, "tf_threads": args.tf_threads,
              "tf_inter_threads": args.tf_inter_threads,
              "switch_interval_s": sys.getswitchinterval(), "repeat": args.repeat, "cpu_count": os.cpu_count(),
              "load_average_1min": round(os.getloadavg()[0], 2)}
    if not args.skip_astar:
        report["astar_15_puzzle"] = await bench_astar(args, hidden, sizes)
    if not args.skip_mcts:
        report["mcts_connect_four"] = await bench_mcts(args, hidden, sizes)
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args())), indent=2))
