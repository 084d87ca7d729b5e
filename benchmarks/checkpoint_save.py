"""What a training run's save costs: seconds per ``Commander`` save, this tree against
another (a checkout from before a change), alternating, at the default sizes.

Each round runs one child process per tree; a child builds a ``Commander`` with the
default net (256x256) and a replay buffer filled to ``--samples`` (the default capacity,
200,000 Connect Four samples: 74 MB), then times ``--saves`` saves into a fresh folder
on the same disk. An AlphaZero iteration saves twice (after self-play, at its end).
Prints JSON and writes it to results/benchmarks/checkpoint_save.json.

    git worktree add /tmp/before <commit>
    python benchmarks/checkpoint_save.py --other /tmp/before [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(samples: int, saves: int, folder: str) -> dict:
    """Runs in the child: times ``saves`` saves of a full-size run's state."""
    import time

    import numpy as np

    from async_search.training import Commander, CommanderConfig

    config = CommanderConfig(backend="local", num_procs=1)
    commander = Commander(config, None)
    rng = np.random.default_rng(0)
    x = (rng.random((samples, 2, 6, 7)) < 0.3).astype(np.float32)
    policy = rng.random((samples, 7)).astype(np.float32) + 0.01
    commander.buffer.add(x, policy, rng.uniform(-1, 1, samples).astype(np.float32))
    commander.save_dir = folder
    if hasattr(commander, "_folder"):  # the commit point: a RunFolder does the saving
        from async_search.training.run_folder import RunFolder
        commander._folder = RunFolder(folder, "alphazero")
    os.makedirs(folder, exist_ok=True)
    times = []
    for i in range(saves):
        commander.best_version = i  # a promotion each time: best/ is written too
        start = time.perf_counter()
        commander._save_state()
        times.append(time.perf_counter() - start)
    size = sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(folder) for f in files)
    return {"save_s": times, "bytes_on_disk": size, "buffer_samples": len(commander.buffer)}


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the servers and
    # children it started end with it (they outlived it, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="a checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--dir", default=None, help="where to save (default: a temp dir)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "benchmarks",
                                                      "checkpoint_save.json"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("rounds", "saves", "samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if not args.child and not os.path.isfile(os.path.join(args.other, "async_search",
                                                          "__init__.py")):
        # (another folder measured whatever `import async_search` found instead)
        parser.error(f"--other {args.other}: not a checkout (no async_search package)")
    if args.child:
        sys.path.insert(0, args.child[0])
        print(json.dumps(child(args.samples, args.saves, args.child[1])))
        return
    trees = {"this": HERE, "other": os.path.abspath(args.other)}
    base = tempfile.mkdtemp(prefix="checkpoint_save-", dir=args.dir)
    results = {name: [] for name in trees}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    try:
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                folder = os.path.join(base, f"{name}-{round_}")
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--other", args.other,
                     "--saves", str(args.saves), "--samples", str(args.samples),
                     "--child", trees[name], folder],
                    capture_output=True, text=True, check=True, env=env, cwd=trees[name])
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    median = {name: [statistics.median(r["save_s"]) for r in runs]
              for name, runs in results.items()}
    best = {name: [min(r["save_s"]) for r in runs] for name, runs in results.items()}
    ratios = [t / o for t, o in zip(median["this"], median["other"])]
    best_ratios = [t / o for t, o in zip(best["this"], best["other"])]
    summary = {
        "what": "seconds per Commander save (2 per AlphaZero iteration), default net, "
                f"{args.samples} buffer samples; median of {args.saves} saves per child, "
                f"one child per tree per round, alternating",
        "this": HERE, "other": trees["other"], "rounds": args.rounds,
        "median_save_s": median,
        "ratio_this_over_other": {"min": min(ratios), "max": max(ratios),
                                  "each": ratios},
        "fastest_save_s": best,
        "fastest_ratio_this_over_other": {"min": min(best_ratios),
                                          "max": max(best_ratios), "each": best_ratios},
        "bytes_on_disk": {name: runs[0]["bytes_on_disk"] for name, runs in results.items()},
        "runs": results,
    }
    from async_search.files import write_json

    print(json.dumps(summary, indent=1))
    write_json(args.out, summary)


if __name__ == "__main__":
    main()
