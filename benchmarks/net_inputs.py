"""How well each Connect Four net generalises from perfect labels: the net's body and
what it reads (the stones, or also the threat planes), taught by the solver.

Training positions are end-game positions (--stones, 28 to 37 by default) from random
and self-play-like games (``problems.generate_positions``, seeded by --seed, none of
them in the shipped test sets), each labelled by the solver: the policy target is
uniform over the optimal moves, the value target the outcome (+1, 0, -1). Each net of
--nets (``architecture[:features[:sizes]]``: ``mlp``, ``mlp:threats``, ``residual``,
``residual:threats:8x1`` (8 channels, 1 block), ``mlp:threats:512x512``, ...) is
trained by the project's trainer for --steps minibatches with the left-right mirror,
and judged, the net alone (argmax of its policy over the legal moves), on the shipped
end-game and middle-game sets (``problems.connect_four_positions``) and on its own
training positions. No self-play: this measures what a net can learn, not what a
training run teaches it.

Prints one JSON object and writes it to --out.

Usage: python benchmarks/net_inputs.py [--positions 8000] [--steps 3000]
[--nets mlp,mlp:threats,residual,residual:threats] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

import numpy as np

import async_search as asr
from async_search.files import write_json
from async_search.problems import ConnectFour
from async_search.problems.connect_four_solver import ConnectFourSolver, outcome
from async_search.problems.nets import NetConfig
from async_search.problems.solved_positions import (connect_four_positions,
                                                    generate_positions)
from async_search.search.accuracy import move_accuracy, policy_chooser
from async_search.training import ReplayBuffer, Trainer, mirror_columns

GAME = ConnectFour()
#: The largest net --nets may name: a typo in a size must not cost the labelling first.
MAX_WEIGHTS = 20_000_000


def parse_net(spec: str, args: argparse.Namespace) -> NetConfig:
    """``architecture[:features[:sizes]]`` as a NetConfig. ``sizes`` (``512x512`` for an
    MLP's hidden widths, ``8x1`` for a convolutional net's channels x blocks) defaults
    to --hidden_sizes, or --channels and --blocks."""
    architecture, _, rest = spec.partition(":")
    features, _, sizes = rest.partition(":")
    try:
        numbers = tuple(int(size) for size in sizes.split("x")) if sizes else ()
    except ValueError:
        raise ValueError(f"--nets: sizes in {spec!r} are not integers like 512x512 "
                         "or 8x1") from None
    hidden, channels, blocks = tuple(args.hidden_sizes), args.channels, args.blocks
    if numbers and architecture == "mlp":
        hidden = numbers
    elif numbers:
        if len(numbers) != 2:
            raise ValueError(f"--nets: a convolutional net's sizes are CHANNELSxBLOCKS, "
                             f"got {sizes!r} in {spec!r}")
        channels, blocks = numbers
    config = NetConfig("policy_value", "connect_four", hidden, architecture=architecture,
                       channels=channels, blocks=blocks, features=features or "planes")
    weights = config.parameter_count
    if weights > MAX_WEIGHTS:
        raise ValueError(f"--nets: {spec!r} has {weights:,} weights, more than this "
                         f"script trains ({MAX_WEIGHTS:,})")
    return config


def labelled(positions) -> tuple:
    """``(x, policy, value)``: the encoded states, uniform over the optimal moves, and
    the outcome for the player to move."""
    x = GAME.encode([p.state for p in positions])
    policy = np.zeros((len(positions), GAME.num_actions), np.float32)
    for i, p in enumerate(positions):
        policy[i, list(p.optimal_moves)] = 1.0
    value = np.array([outcome(p.score) for p in positions], np.float32)
    return x, policy, value


def net_accuracy(model, positions) -> float:
    """The fraction of ``positions`` where the policy's best legal move is optimal
    (``search.accuracy``'s net-alone chooser)."""
    choose = policy_chooser(GAME, asr.immediate(model))
    return asyncio.run(move_accuracy(choose, positions)).accuracy


def training_positions(args: argparse.Namespace) -> list:
    """Solver-labelled positions, half from each kind of game, none in the test sets."""
    solver = ConnectFourSolver()
    shipped = {p.state for stage in ("end", "middle")
               for p in connect_four_positions(stage)}
    positions = []
    for source in ("random", "selfplay"):
        positions += generate_positions(args.positions // 2, stones=tuple(args.stones),
                                        source=source, seed=args.seed, solver=solver)
    return [p for p in positions if p.state not in shipped]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=8000)
    parser.add_argument("--stones", type=int, nargs=2, default=(28, 37))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--nets", default="mlp,mlp:threats,residual,residual:threats")
    parser.add_argument("--hidden_sizes", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "net_inputs.json"))
    args = parser.parse_args()
    if args.positions < 2:  # half from random play, half from self-play
        parser.error(f"--positions must be an integer >= 2, got {args.positions}")
    for name in ("steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if not 0 <= args.stones[0] <= args.stones[1] <= 41:
        parser.error(f"--stones takes FEWEST MOST with 0 <= FEWEST <= MOST <= 41, "
                     f"got {args.stones}")
    if args.seed < 0:
        parser.error(f"--seed must be an integer >= 0, got {args.seed}")
    try:  # every net checked before any work
        configs = [parse_net(spec, args) for spec in args.nets.split(",")]
    except ValueError as error:
        parser.error(str(error))
    start = time.perf_counter()
    train = training_positions(args)
    label_s = time.perf_counter() - start
    buffer = ReplayBuffer(len(train), args.seed, augment=mirror_columns)
    buffer.add(*labelled(train))
    tests = {stage: connect_four_positions(stage) for stage in ("end", "middle")}
    result = {"workload": vars(args), "python": platform.python_version(),
              "machine": platform.machine(), "training_positions": len(train),
              "label_s": round(label_s, 1), "nets": {}}
    for spec, config in zip(args.nets.split(","), configs):
        trainer = Trainer(config, batch_size=args.batch_size, seed=args.seed)
        start = time.perf_counter()
        losses = trainer.train_steps(buffer, args.steps)
        train_s = time.perf_counter() - start
        model = trainer.model()
        x = GAME.encode([p.state for p in train[:256]])
        model(x)
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < 0.5:
            model(x)
            calls += 1
        us_per_row = (time.perf_counter() - start) / calls / len(x) * 1e6
        row = {"net": config.describe(), "train_s": round(train_s, 1),
               "policy_loss": round(losses.policy, 4), "value_loss": round(losses.value, 4),
               "us_per_row_256": round(us_per_row, 1),
               "accuracy_train": round(net_accuracy(model, train[:2000]), 3),
               **{f"accuracy_{stage}": round(net_accuracy(model, positions), 3)
                  for stage, positions in tests.items()}}
        result["nets"][spec] = row
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
