"""Fair batches: small requests beside a hog, with the fair default and with FIFO.

Workload (issue 25): one coroutine sends 100,000-row requests back to back (the hog)
beside 64 coroutines that each send 1-row requests back to back (the small callers),
through one ``serve(model, max_batch_size=256)``. Two models (``--models``):

- ``mlp``: an MLP 16-256-256-1 in NumPy (about 1-1.6 ms for a batch of 256 on one core
  here), run with one BLAS thread, so that the device thread computes on one core while
  the loop runs on the other. On a shared 2-core machine the loop's work for the small
  callers takes CPU from the model itself.
- ``accelerator``: a model that waits 0.5 ms + 2 us a row without using the CPU (a
  stand-in for a GPU: the device's time does not depend on what the loop does), so the
  hog loses only the rows the small callers take.

Each round runs, in turn, on a fresh server each time: the small callers alone, the hog
alone, and both together, for ``--seconds`` each. ``--rounds`` rounds use the server's
default batcher (``FairBatcher``: the rest of a split request goes to the back of the
queue) and ``--fifo_rounds`` the first-in, first-out ``BatchSizeBatcher(256)`` it
replaced, the two kinds alternating. Reported per model and batcher, as the median and
the range over its rounds (the ratios are taken within a round; the hog's rows are
counted as its pieces are computed):

- ``small_p99_ms``: the small requests' 99th percentile latency, alone and beside the
  hog, and their ratio (goal: at most 10x);
- ``small_answers_per_s``: how many answers the small callers get within the window;
- ``hog_rows_per_s``: the hog's own rows per second, alone and beside the small callers,
  and their ratio (goal: at least 0.9x).

Prints one JSON object and writes it to results/benchmarks/fairness.json.
Usage: python benchmarks/fairness.py [--rounds 20] [--fifo_rounds 2] [--seconds 1.3]
[--models mlp,accelerator] [--small 64] [--hog_rows 100000] [--max_batch_size 256]
[--out PATH]
"""

from __future__ import annotations

import os

# One BLAS thread: the model is the "device" (one core), the loop has the other.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import async_search as asr  # noqa: E402
from async_search.batchers import BatchSizeBatcher  # noqa: E402
from async_search.files import write_file  # noqa: E402
from async_search.models import MLP  # noqa: E402

WARM_UP_S = 0.3  # latencies of requests made before this are left out


class Accelerator:
    """Waits ``0.5 ms + 2 us`` a row, off the CPU (as a GPU kernel does), and returns
    one value a row."""

    input_spec = asr.TensorSpec((16,), np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.5e-3 + 2e-6 * len(x))
        return x[:, :1] * 2.0


MODELS = {
    "mlp": ("MLP 16-256-256-1 in NumPy, 1 BLAS thread",
            lambda: MLP((16,), hidden_sizes=(256, 256), output_size=1, seed=0)),
    "accelerator": ("waits 0.5 ms + 2 us a row off the CPU (a stand-in for a GPU)",
                    Accelerator),
}


async def run(model, *, small: int, hog_rows: int, seconds: float, max_batch_size: int,
              fifo: bool) -> dict:
    """One server, for ``seconds``: ``small`` one-row callers (0: none) and a hog of
    ``hog_rows``-row requests (0: none). Measured over the window after the warm-up:
    the small requests made in it (latencies), the small answers in it, and the hog's
    rows in it (the rows of the batches answered in it, less the small answers: the
    hog's pieces are counted as they are computed, not when a whole request ends)."""
    batcher = BatchSizeBatcher(max_batch_size) if fifo else None
    latencies: list = []
    small_answered: list = []  # when each small request was answered
    batches: list = []  # (answered at, size) per batch
    rng = np.random.default_rng(0)
    async with asr.serve(model, max_batch_size=max_batch_size, batcher=batcher,
                         on_batch=lambda record: batches.append(
                             (time.perf_counter(), record.size))) as evaluate:
        start = time.perf_counter()
        window = (start + WARM_UP_S, start + seconds)

        async def small_caller(i: int) -> None:
            x = rng.standard_normal((1, 16)).astype(np.float32)
            while True:
                sent = time.perf_counter()
                if sent >= window[1]:
                    return
                await evaluate(x)
                now = time.perf_counter()
                small_answered.append(now)
                if sent >= window[0]:
                    latencies.append(now - sent)

        async def hog() -> None:
            x = rng.standard_normal((hog_rows, 16)).astype(np.float32)
            while True:
                await evaluate(x)

        hog_task = asyncio.ensure_future(hog()) if hog_rows else None
        await asyncio.gather(*(small_caller(i) for i in range(small)),
                             asyncio.sleep(max(0.0, window[1] - time.perf_counter())))
        if hog_task is not None:
            hog_task.cancel()  # its request's rest is dropped: the server ends at once
            await asyncio.gather(hog_task, return_exceptions=True)
        stats = evaluate.stats
    span_s = window[1] - window[0]
    in_window = [size for t, size in batches if window[0] <= t <= window[1]]
    small_rows = sum(window[0] <= t <= window[1] for t in small_answered)
    out = {"mean_batch_size": round(stats["mean_batch_size"], 1),
           "batches_in_window": len(in_window)}
    if small:
        out["small_p99_ms"] = round(1e3 * float(np.percentile(latencies, 99)), 3) if (
            latencies) else None
        out["small_p50_ms"] = round(1e3 * float(np.percentile(latencies, 50)), 3) if (
            latencies) else None
        out["small_answers_per_s"] = round(small_rows / span_s)
    if hog_rows:
        out["hog_rows_per_s"] = round((sum(in_window) - small_rows) / span_s)
    return out


def spread(values) -> dict:
    """The median and the range of a figure over the rounds (None: not measured, as a
    latency when no request was answered in the window; counted, not averaged)."""
    known = [v for v in values if v is not None]
    out = {"median": round(float(np.median(known)), 3) if known else None,
           "range": [min(known), max(known)] if known else None}
    if len(known) < len(values):
        out["rounds_without_a_figure"] = len(values) - len(known)
    return out


def one_round(model, scenarios, common, fifo, turn) -> dict:
    """Every scenario once, on fresh servers, in an order that turns each round (so that
    a slow spell of the shared machine does not always fall on the same one)."""
    names = list(scenarios)
    names = names[turn % len(names):] + names[:turn % len(names)]
    figures = {name: asyncio.run(run(model, fifo=fifo, **common, **scenarios[name]))
               for name in names}
    beside, alone = figures["both"]["small_p99_ms"], figures["small_alone"]["small_p99_ms"]
    # None: no small request made in the window was answered in it (FIFO behind a hog).
    figures["small_p99_ratio"] = round(beside / alone, 2) if beside else None
    figures["hog_throughput_ratio"] = round(
        figures["both"]["hog_rows_per_s"] / figures["hog_alone"]["hog_rows_per_s"], 3)
    return figures


def summary_of(runs) -> dict:
    pick = {
        "small_p99_ms_alone": ("small_alone", "small_p99_ms"),
        "small_p99_ms_beside_hog": ("both", "small_p99_ms"),
        "small_answers_per_s_alone": ("small_alone", "small_answers_per_s"),
        "small_answers_per_s_beside_hog": ("both", "small_answers_per_s"),
        "hog_rows_per_s_alone": ("hog_alone", "hog_rows_per_s"),
        "hog_rows_per_s_beside_small": ("both", "hog_rows_per_s"),
    }
    out = {name: spread([r[a][b] for r in runs]) for name, (a, b) in pick.items()}
    out["small_p99_ratio"] = spread([r["small_p99_ratio"] for r in runs])
    out["hog_throughput_ratio"] = spread([r["hog_throughput_ratio"] for r in runs])
    met = sum(r["small_p99_ratio"] is not None and r["small_p99_ratio"] <= 10
              and r["hog_throughput_ratio"] >= 0.9 for r in runs)
    out["rounds_meeting_both_goals"] = f"{met} of {len(runs)}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20,
                        help="rounds with the default (fair) batcher")
    parser.add_argument("--fifo_rounds", type=int, default=2,
                        help="rounds with the FIFO batcher it replaced")
    parser.add_argument("--seconds", type=float, default=1.3, help="per scenario")
    parser.add_argument("--models", default="mlp,accelerator",
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--hog_rows", type=int, default=100_000)
    parser.add_argument("--max_batch_size", type=int, default=256)
    parser.add_argument("--out", default="results/benchmarks/fairness.json")
    args = parser.parse_args()
    for name in ("small", "hog_rows", "max_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if min(args.rounds, args.fifo_rounds) < 0 or max(args.rounds, args.fifo_rounds) < 1:
        parser.error(f"--rounds and --fifo_rounds must be integers >= 0, one of them >= 1, "
                     f"got {args.rounds} and {args.fifo_rounds}")
    if not args.seconds > WARM_UP_S:  # the figures are taken after the warm-up
        parser.error(f"--seconds must be more than the {WARM_UP_S} s warm-up, "
                     f"got {args.seconds}")

    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown or not names:
        parser.error(f"--models: {unknown or names} not among {', '.join(MODELS)}")
    models = {name: MODELS[name][1]() for name in names}
    common = dict(seconds=args.seconds, max_batch_size=args.max_batch_size)
    scenarios = {"small_alone": dict(small=args.small, hog_rows=0),
                 "hog_alone": dict(small=0, hog_rows=args.hog_rows),
                 "both": dict(small=args.small, hog_rows=args.hog_rows)}
    rounds = {name: {"fair": [], "fifo": []} for name in names}
    for turn in range(max(args.rounds, args.fifo_rounds)):
        for name, model in models.items():  # the models alternate too
            if turn < args.rounds:
                rounds[name]["fair"].append(
                    one_round(model, scenarios, common, False, turn))
            if turn < args.fifo_rounds:
                rounds[name]["fifo"].append(
                    one_round(model, scenarios, common, True, turn))
    report = {
        "workload": {"small_callers": args.small, "hog_rows": args.hog_rows,
                     "max_batch_size": args.max_batch_size, "seconds": args.seconds,
                     "models": {name: MODELS[name][0] for name in names},
                     "loop": "asyncio"},
        "goals": {"small_p99_ratio_at_most": 10, "hog_throughput_ratio_at_least": 0.9},
        "python": platform.python_version(),
        "summary": {name: {kind: summary_of(runs) for kind, runs in kinds.items() if runs}
                    for name, kinds in rounds.items()},
        "rounds": rounds,
    }
    text = json.dumps(report, indent=2)
    print(text)
    write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
