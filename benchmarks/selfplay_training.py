"""Self-play throughput with and without the trainer training at the same time.

Measures, in one run: self-play positions per second (and seconds per 1000 positions,
the AlphaZero seed's figure) for Connect Four games through ``run_searches`` on the
local backend, (a) alone, (b) while a ``Trainer`` trains in a thread of the same process
(what ``Commander(overlap=True)`` does); on the local backend with the model in a
device thread or on the loop, and on the process backend with 2 clients (the training
default); and the trainer's steps per second alone and under self-play. Prints JSON and writes it to results/benchmarks/selfplay_training.json.

    python benchmarks/selfplay_training.py [--games 128] [--simulations 64]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from async_search import problems  # noqa: E402
from async_search.backends import run_searches  # noqa: E402
from async_search.training import (NetConfig, ReplayBuffer, SelfPlayConfig,  # noqa: E402
                                   Trainer, mirror_columns, selfplay_game)


def selfplay(model, games: int, simulations: int, model_thread: bool,
             backend: str = "local", num_procs: int = 1) -> dict:
    game = problems.ConnectFour()
    play = functools.partial(selfplay_game, game=game,
                             config=SelfPlayConfig(simulations=simulations, seed=1))
    start = time.perf_counter()
    records = run_searches(play, list(range(games)), _Factory(model), max_batch_size=512,
                           model_thread=model_thread, backend=backend, num_procs=num_procs)
    seconds = time.perf_counter() - start
    samples = sum(len(r.x) for r in records)
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds,
            "s_per_1000_samples": 1000 * seconds / samples,
            "mean_batch_size": records.stats["mean_batch_size"]}, records


class _Factory:
    """A picklable model factory (the process backend sends it to its server)."""

    def __init__(self, model):
        self.model = model

    def __call__(self):
        return self.model


class Training:
    """Trains in a thread until stopped; counts steps."""

    def __init__(self, trainer: Trainer, buffer: ReplayBuffer):
        self.trainer, self.buffer = trainer, buffer
        self.steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.trainer.train_steps(self.buffer, 10)
            self.steps += 10

    def __enter__(self):
        self.start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)
        self.seconds = time.perf_counter() - self.start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--simulations", type=int, default=64)
    parser.add_argument("--train_seconds", type=float, default=10.0)
    args = parser.parse_args()
    for name in ("games", "simulations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if not args.train_seconds > 0:
        parser.error(f"--train_seconds must be more than 0, got {args.train_seconds}")

    config = NetConfig("policy_value", "connect_four", (256, 256))
    trainer = Trainer(config, batch_size=256)
    model = trainer.model()
    gc.freeze()
    out = {"games": args.games, "simulations": args.simulations, "net": "256x256 MLP",
           "cpus": os.cpu_count()}
    # Warm up (TensorFlow's first step traces) and fill a buffer to train on.
    first, records = selfplay(model, 16, args.simulations, True)
    buffer = ReplayBuffer(100_000, augment=mirror_columns)
    for r in records:
        buffer.add(r.x, r.policy, r.value)
    trainer.train_steps(buffer, 10)

    placements = {"device_thread": dict(model_thread=True),
                  "on_loop": dict(model_thread=False),
                  "process_x2": dict(model_thread=True, backend="process", num_procs=2)}
    for key, how in placements.items():
        out[f"selfplay_alone_{key}"], _ = selfplay(model, args.games, args.simulations,
                                                   **how)
        with Training(trainer, buffer) as training:
            out[f"selfplay_with_training_{key}"], _ = selfplay(
                model, args.games, args.simulations, **how)
        out[f"train_steps_per_s_during_selfplay_{key}"] = training.steps / training.seconds
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < args.train_seconds:
        trainer.train_steps(buffer, 10)
        steps += 10
    out["train_steps_per_s_alone"] = steps / (time.perf_counter() - start)
    for key in placements:
        out[f"ratio_with_training_over_alone_{key}"] = (
            out[f"selfplay_with_training_{key}"]["samples_per_s"]
            / out[f"selfplay_alone_{key}"]["samples_per_s"])
    text = json.dumps(out, indent=1)
    print(text)
    os.makedirs("results/benchmarks", exist_ok=True)
    with open("results/benchmarks/selfplay_training.json", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
