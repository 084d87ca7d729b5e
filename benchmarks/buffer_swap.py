"""Is a Connect Four net short of data or of capacity: the same net trained further on
other runs' replay buffers, then played against UCT.

For each --buffer (a run's ``buffer.npz``, e.g. ``<save_dir>/gen-000100/buffer.npz``),
the net of --checkpoint (or, with --from_scratch, a net of its config from its initial
weights) takes --steps optimizer steps on that buffer (the trainer's defaults; Adam
reset every 1000 steps, as each iteration of a run does), then the final evaluation's
agent (``experiments.training.FINAL_AGENT``, MCTS with --simulations) plays UCT with
--rollouts rollouts, --games games on each of --seeds. When the same net gains on one
run's data and not on its own, the data is what it lacked.

Measured with it (issue 22): the residual 16x1 net with 8 value planes, 3000 steps on
the shipped MLP run's buffer, scored 0.929 against UCT-1000 over 120 games, and 0.758
after 3000 steps on its own buffer (0.788 before either).

Prints one JSON object and writes it to --out.

Usage: python benchmarks/buffer_swap.py --checkpoint DIR --buffer NPZ [NPZ ...]
[--steps 3000] [--from_scratch] [--games 40] [--seeds 1 2 3] [--rollouts 1000]
[--simulations 100] [--save_dir DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any, Dict

from async_search.files import write_json

# Run as a script, the repository root is not on the path: head_swap is imported from it.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.head_swap import against_uct  # noqa: E402

#: Optimizer steps between resets of Adam's moments: a training run's iteration.
STEPS_PER_RESET = 1000


def train_on(checkpoint: str, buffer_path: str, *, steps: int,
             from_scratch: bool) -> tuple:
    """``(trainer, buffer, losses)``: the checkpoint's net (or a fresh one of its config)
    after ``steps`` steps on the buffer at ``buffer_path``."""
    from async_search.training import Trainer, read_checkpoint
    from async_search.training.replay import ReplayBuffer, mirror_columns

    saved = read_checkpoint(checkpoint)
    trainer = Trainer(saved.config, weights=None if from_scratch else saved.weights)
    buffer = ReplayBuffer.load(buffer_path, augment=mirror_columns)
    losses = []
    for start in range(0, steps, STEPS_PER_RESET):
        trainer.reset_optimizer()
        losses.append(trainer.train_steps(buffer, min(STEPS_PER_RESET, steps - start)))
    return trainer, buffer, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a Connect Four checkpoint "
                        "folder (a run's 'best')")
    parser.add_argument("--buffer", required=True, nargs="+",
                        help="replay buffer files (a run's gen-*/buffer.npz)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--from_scratch", action="store_true",
                        help="train a net of the checkpoint's config from its initial "
                             "weights instead of the checkpoint's")
    parser.add_argument("--games", type=int, default=40, help="games per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--save_dir", default=None, help="save each trained net there, "
                        "as checkpoint folders named by buffer index")
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "buffer_swap.json"))
    args = parser.parse_args()
    for name in ("steps", "games", "rollouts", "simulations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be integers >= 0, got {args.seeds}")
    for path in args.buffer:
        if not os.path.isfile(path):
            parser.error(f"--buffer {path}: no such file")
    result: Dict[str, Any] = {"workload": vars(args), "python": platform.python_version(),
                              "machine": platform.machine(), "runs": []}
    for i, path in enumerate(args.buffer):
        start = time.perf_counter()
        try:
            trainer, buffer, losses = train_on(args.checkpoint, path, steps=args.steps,
                                               from_scratch=args.from_scratch)
        except ValueError as e:  # CheckpointError: a damaged checkpoint or buffer, named
            parser.error(str(e))
        train_s = time.perf_counter() - start
        if args.save_dir:
            from async_search.training import save_checkpoint
            save_checkpoint(os.path.join(args.save_dir, f"buffer{i}"), trainer.weights,
                            trainer.config, {"buffer": path, "steps": args.steps})
        start = time.perf_counter()
        games: Any = asyncio.run(against_uct(trainer.model(), seeds=args.seeds,
                                             games=args.games, rollouts=args.rollouts,
                                             simulations=args.simulations))
        run = {"buffer": path, "samples": len(buffer),
               "losses": [loss.as_dict() for loss in losses],
               "train_s": round(train_s, 1), f"vs_uct{args.rollouts}": games,
               "play_s": round(time.perf_counter() - start, 1)}
        result["runs"].append(run)
        print(json.dumps({"buffer": path, **games}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
