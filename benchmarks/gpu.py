"""Searches feeding a residual net on an accelerator, measured against the model alone.

Runs unchanged on a machine with one or more GPUs and PyTorch (JAX and mctx when
present) with only the core's NumPy install: it imports neither TensorFlow nor Ray. On
a machine without a GPU it runs the same measurements on the CPU and says so
(``device.kind`` is ``"cpu"`` and ``note`` explains). Nets: AlphaZero's residual
policy-value net on Connect Four and DeepCubeA's residual cost-to-go net on the
15-puzzle (``problems.PolicyValueResNet``, ``CostToGoResNet``) in PyTorch, served
through ``models.TorchModel``; their sizes are flags (defaults: the published shapes,
trimmed, on a GPU; small ones on a CPU).

What it measures, per net:

- ``ceiling``: the model alone at each bucket size: ``on_device`` (the input already on
  the device, the module called in a loop, timed with CUDA events; on a CPU the module
  on a torch tensor) and ``with_copies`` (the ``TorchModel`` call from a NumPy batch to
  NumPy outputs: padding, host-to-device and back), as ``ms_per_batch`` and
  ``elements_per_s``. Measured before and after the runs; each figure is the faster of
  the two (the model at its best, so load on the machine counts against the runs).
- ``in_process``: A* (batched, on scrambled 15-puzzles) or MCTS (on Connect Four
  openings) with 1, 64, 256, 1024 and 4096 concurrent searches gathered around one
  ``asr.serve``. Each run does about the same total work (``--astar-evaluations`` or
  ``--mcts-simulations`` shared among its searches, each search at least a minimum).
- ``process_backend``: ``run_searches(backend="process")`` with 1, 2, 4, 8 ... up to
  cores - 2 client processes (at least 1), each running ``--process-searches``
  searches, all feeding one server in this process; ``--servers 1,2`` runs them with one
  and with two servers, each on its own copy of the adapter on the device (keys
  ``"14x2"``), so that one copies and hands back a batch while the other computes.
- ``clients_alone``: the process backend's clients without it: 1, 2, 4 ... processes,
  each running one client's searches on its own ``serve`` of a free model (the net's
  outputs for one row, repeated), nothing shared. It is the machine's own scaling of the
  searches' CPU (client processes beyond the physical cores share them; so do memory
  and turbo clocks), which bounds the process backend's: ``goals`` gives both
  efficiencies and the process backend's over this one.
- ``handwritten_torch`` (peer): a hand-written PyTorch batcher, what a user writes
  without this toolkit (a thread, a ``queue.Queue`` and asyncio futures set with
  ``call_soon_threadsafe``), on the same searches at the same concurrency.
- ``mctx`` (peer, MCTS only, when JAX and mctx import): mctx's fully jitted MuZero
  search on Connect Four (the game written in JAX), with the same net in JAX
  (``problems.jax_resnet``) on JAX's default device: the upper anchor of simulations/s
  for a search that lives entirely on the device.
- ``max_batch_size``: one workload at fixed server batch sizes and with
  ``max_batch_size="auto"`` (the server picks the size that maximises end-to-end
  throughput from measured batch times), when this tree's ``serve`` takes it.
- ``multi_device``: with more than one GPU, ``serve(..., devices=[every GPU])``, when
  this tree's ``serve`` takes it (no ``device_busy_fraction``: the copies that ``serve``
  makes are not timed, and events of two devices cannot be read against each other).

Every variant runs once a round for ``--rounds`` rounds, in turn, and reports the round
with the median nodes/s (with every round's and their range; the ratios to the peer are
taken round by round). Every run reports ``nodes_per_s`` (expansions for A*,
simulations for MCTS), ``mean_batch``, ``device_busy_fraction`` (the time the device
computes over the run's wall time: CUDA events recorded on the adapter's stream around
each batch's graph replay, or its forward pass with ``--eager``, so copies do not count,
and the union of the intervals where several servers' batches overlap;
in an eager pass the gaps between the layers' launches fall inside the events and count
as busy, which flatters a small net; on a CPU, the time in the module's forward pass;
with ``--framework jax``, not measured) and ``vs_ceiling``: the run's elements/s
over the model alone at the run's batch sizes (each batch's on-device time read off the ceiling, linearly
between bucket sizes; so padding, copies and idle time all count against it).
``vs_ceiling_with_copies`` is the same against the adapter alone at the padded size.
Where the CPU went, over the run's wall time: ``loop_cpu`` (the fraction of a core the
event loop's thread used: the searches in one process, the serving loop of the process
backend; near 1 it is the limit), ``process_cpu`` (this process's cores: the loop, the
device threads and the rest) and, for the process backend, ``clients_cpu`` (each client
process's fraction of a core over the whole run, start-up included) and ``clients_busy``
(their CPU over their wall time while their searches ran, from ``stats["clients"]``:
near 1 they compute, well below they wait on their round trips). ``device`` gives the CPU's physical cores and threads per
core (``cpu_topology``): client processes beyond the physical cores share them. Every
loop runs on uvloop when it is installed (``--loop asyncio`` for asyncio's). With
``--sample-stacks`` each run in one process and each process-backend run also records
``stacks``: this process's threads (the loop, the device threads) sampled from a thread
of its own (``stack_sampler.py``; on GPU machines py-spy and perf may not attach), what
says whether the serving process bounds the process backend.

Prints one JSON object and writes it under ``results/benchmarks/``: ``gpu.json`` on a
GPU, ``gpu_cpu.json`` on a CPU, with ``_smoke`` before ``.json`` for ``--smoke`` runs
(``--out`` overrides). ``--smoke`` is a small run that finishes in a few minutes on a
2-core CPU.

On a CPU PyTorch runs on one thread (``--torch-threads``). ``goals`` reads the issue's
goals off the runs: the busiest in-process run (device busy >= 0.9 and vs_ceiling >=
0.9; a vs_ceiling above ``PLAUSIBLE_VS_CEILING``, a ceiling timed slow on a loaded
machine, leaves it unjudged with a ``ceiling_note``), serve against the hand-written
batcher (>= 2x), and the process backend's scaling efficiency (nodes/s over k times one
client's).

``--framework jax`` serves the same nets through ``models.JaxModel`` instead (no
PyTorch peer then). ``--workloads`` and ``--sections`` pick a part of the run; the
report is rewritten after every run (``"partial": true`` with ``rounds_so_far``), so a
run stopped at a time limit leaves what it measured. ``benchmarks/gpu_session/`` holds
the scripts of the H200 run behind ``results/benchmarks/gpu.json``.

Usage: PYTHONPATH=. python3 benchmarks/gpu.py [--smoke] [--channels 128 --blocks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import gc
import importlib.util
import inspect
import itertools
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Sequence, Tuple

# JAX (the mctx peer) must not take most of the GPU's memory from PyTorch at its start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402 - after the environment above

import async_search as asr  # noqa: E402
from async_search import problems, rows, search  # noqa: E402
from async_search.backends.config import max_servers  # noqa: E402
from async_search.event_loops import loop_factory  # noqa: E402
from async_search.files import write_file  # noqa: E402
from stack_sampler import StackSampler  # noqa: E402 - benchmarks/, this script's folder

PUZZLE = problems.SlidingPuzzle(4)
#: The runs a report can hold (``--sections``); the ceiling is always measured.
SECTIONS = ("in_process", "handwritten_torch", "max_batch_size", "multi_device",
            "process_backend", "clients_alone", "mctx")
GAME = problems.ConnectFour()


# -- searches (module level: the process backend's clients import them by name) ---------
def puzzle_starts(count: int, moves: int, offset: int = 0) -> List[bytes]:
    return [PUZZLE.scramble(moves, seed=offset + i) for i in range(count)]


def game_starts(count: int, offset: int = 0) -> list:
    """Connect Four openings: a few random moves each, never a finished game."""
    rng = np.random.default_rng(offset)
    starts = []
    for _ in range(count):
        state = GAME.initial_state()
        for _ in range(int(rng.integers(0, 8))):
            child = GAME.play(state, int(rng.choice(GAME.legal_actions(state))))
            if GAME.terminal_value(child) is not None:
                break
            state = child
        starts.append(state)
    return starts


async def astar(budget: int, buffer_size: int, start: bytes, evaluate: Any) -> int:
    """One batched A* search; returns the nodes it expanded."""
    result = await search.batched_astar(PUZZLE, start, evaluate, budget=budget,
                                        buffer_size=buffer_size)
    return result.nodes_expanded


async def mcts(simulations: int, num_parallel: int, start: Any, evaluate: Any) -> int:
    """One MCTS search; returns the simulations it ran."""
    result = await search.mcts(GAME, start, evaluate, num_simulations=simulations,
                               num_parallel=num_parallel, seed=0)
    return result.num_simulations


# -- the model, timed ---------------------------------------------------------------------
class ForwardTimer:
    """Times the module's forward pass of each batch: CUDA events on the stream the
    adapter computes on (so the H2D copy before it and the D2H copy after it are not
    counted), or wall time on a CPU. ``reset`` between runs; ``busy_s`` after one."""

    def __init__(self, torch: Any, cuda: bool):
        self.torch = torch
        self.cuda = cuda
        self.events: List[tuple] = []
        self.seconds = 0.0
        self.origin: Any = None  # CUDA: the event recorded at the last reset

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            # Every batch's events are read against this one, so that batches of
            # several servers on one device (their own streams) count once when they
            # overlap.
            self.origin = self.torch.cuda.Event(enable_timing=True)
            self.origin.record()
        self.events, self.seconds = [], 0.0

    def busy_s(self) -> float:
        """Seconds the device computed since ``reset``: on CUDA the union of the
        batches' intervals; on a CPU the sum of the forward passes' wall times."""
        if self.cuda:
            self.torch.cuda.synchronize()
            origin = self.origin
            if origin is None:  # never reset: the batches' durations, overlaps and all
                return sum(start.elapsed_time(end) for start, end in self.events) / 1e3
            return union_length([(origin.elapsed_time(start), origin.elapsed_time(end))
                                 for start, end in self.events]) / 1e3
        return self.seconds


def union_length(intervals: Sequence[Tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals.

    Example:
        >>> union_length([(0, 2), (1, 3), (5, 6)])
        4
    """
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def timed_module(torch: Any, module: Any, timer: ForwardTimer) -> Any:
    """``module`` inside a module whose forward pass ``timer`` times."""

    class Timed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            if timer.cuda and torch.cuda.is_current_stream_capturing():
                return self.inner(x)  # a CUDA graph's capture: replays are not timed
            if timer.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()  # on the current stream: the adapter's own
                out = self.inner(x)
                end.record()
                timer.events.append((start, end))
                return out
            began = time.perf_counter()
            out = self.inner(x)
            timer.seconds += time.perf_counter() - began
            return out

    return Timed()


class TimedReplay:
    """A captured CUDA graph whose replays ``timer`` times: CUDA events on the stream
    the adapter replays on, around the replay (as ``timed_module`` around a forward
    pass)."""

    def __init__(self, graph: Any, timer: ForwardTimer):
        self.graph = graph
        self.timer = timer

    def replay(self) -> None:
        torch = self.timer.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        self.timer.events.append((start, end))


def time_forward(model: Any, timer: ForwardTimer) -> None:
    """Makes ``model``'s forward passes timed by ``timer`` (the benchmark reaching into
    the adapter, whose compiled pass ``timed_module`` cannot wrap: TorchScript compiles
    the module it is given, and a timer's clock is Python it lacks)."""
    runner = model._runner
    runner.forward = timed_module(timer.torch, runner.forward, timer)


def time_graph_replays(model: Any, timer: ForwardTimer) -> None:
    """Makes ``model``'s graph replays timed by ``timer`` (the benchmark reaching into
    the adapter: its graphs are captured and replayed in ``_Runner._graph``)."""
    runner = model._runner
    capture = runner._graph

    def timed(size: int, x: Any) -> Any:
        captured = capture(size, x)
        return None if captured is None else (TimedReplay(captured[0], timer), captured[1])

    runner._graph = timed


def scripted(torch: Any, module: Any) -> Any:
    """``module`` compiled by TorchScript (its parameters shared), without PyTorch's
    deprecation warning for the API."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(module)


def channels_last(torch: Any, module: Any) -> Any:
    """``module`` with its weights and each input in channels-last memory (NHWC), which
    tensor cores prefer for convolutions."""

    class ChannelsLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module.to(memory_format=torch.channels_last)

        def forward(self, x):
            return self.inner(x.contiguous(memory_format=torch.channels_last))

    return ChannelsLast().eval()


class Served:
    """One net on the device: the adapter (warmed up on every bucket), its timer, the
    raw module for the ceiling and the peer, and the ceiling once measured."""

    def __init__(self, name: str, net: Any, device: Any, args: argparse.Namespace,
                 torch: Any):
        from async_search.models import TorchModel

        self.name = name
        self.net = net
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.precision = args.precision
        self.module = problems.torch_resnet(net).to(device).eval()
        if args.channels_last and len(net.input_spec.shape) == 3:  # convolutional nets
            self.module = channels_last(torch, self.module)
        # --compile compiles the net itself (the timer's events stay outside the graph);
        # --script has the adapter compile it (TorchModel(script=True)), and the model
        # alone runs a compiled copy too.
        self.forward = (torch.compile(self.module) if args.compile else
                        scripted(torch, self.module) if args.script else self.module)
        # The hand-written peer runs the module as its user wrote it, or compiled
        # (--peer-script), to tell what batching gives from what compiling gives.
        self.peer_module = self.module
        if args.peer_script:  # the adapter's own compiled copy where it has one
            self.peer_module = self.forward if args.script else scripted(torch, self.module)
        self.timer = ForwardTimer(torch, self.cuda)
        self.timed = True
        # TorchModel's default on CUDA: a CUDA graph per bucket (--eager: none; a
        # compiled net: none either, since the benchmark compiled it itself).
        graphs = False if (args.eager or args.compile) else None
        given = self.module if args.script else timed_module(torch, self.forward, self.timer)
        self.model = TorchModel(given, input_spec=net.input_spec, device=device,
                                max_batch_size=args.max_batch_size,
                                precision=args.precision, cuda_graphs=graphs,
                                script=args.script)
        # --servers: the process backend's servers each take a copy on the same
        # device (its own stream, buffers and graphs), so that one copies and hands
        # back its batch while another computes.
        self.copies = [self.model] + [self.model.on_device(device)
                                      for _ in range(max(args.servers) - 1)]
        self.serve_with(1)
        for copy in self.copies:
            if copy.cuda_graphs:  # replays run no forward pass: time the replays
                time_graph_replays(copy, self.timer)
            elif args.script:  # the compiled pass, timed from outside
                time_forward(copy, self.timer)
        self.sizes = self.model.batch_sizes
        self.ceiling: Dict[int, Dict[str, Dict[str, float]]] = {}
        for copy in self.copies:
            for size in self.sizes:  # cudnn picks its algorithms per shape here
                copy(np.zeros(net.input_spec.batch_shape(size), np.float32))

    def serve_with(self, servers: int) -> None:
        """The factory hands out the first ``servers`` copies from now on."""
        self._handout = itertools.cycle(self.copies[:servers])

    def factory(self) -> Any:
        """The next of the adapter's copies (a server each), in turn."""
        return next(self._handout)

    def autocast(self) -> Any:
        """The adapter's reduced precision, for the model alone too."""
        if self.precision is None:
            return contextlib.nullcontext()
        # No cast cache, as in TorchModel: a CUDA graph's capture refuses it.
        return self.torch.autocast(self.device.type, getattr(self.torch, self.precision),
                                   cache_enabled=False)

    def parameters(self) -> int:
        """Every weight, batch norm's running statistics included (as JAX's params and
        the nets' named arrays count them); not its integer counter of batches seen."""
        return int(sum(p.numel() for p in self.module.parameters()) + sum(
            b.numel() for b in self.module.buffers() if b.is_floating_point()))

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def on_device_seconds(self, x_host: np.ndarray, min_s: float) -> float:
        """The module alone on a batch already on the device: CUDA events around a loop
        of calls on a GPU (the device's own clock), wall time on a CPU."""
        torch = self.torch
        x_device = torch.from_numpy(x_host).to(self.device)

        def on_device():
            with torch.inference_mode(), self.autocast():
                self.forward(x_device)

        if not self.cuda:
            return timed_calls(on_device, self.sync, min_s)
        if self.model.cuda_graphs:  # the adapter replays graphs: so does its ceiling
            on_device = self.captured(x_device)
        on_device()
        torch.cuda.synchronize()
        calls = max(3, int(min_s / max(timed_calls(on_device, self.sync, 0.0, 3), 1e-6)))
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(calls):
            on_device()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    def captured(self, x_device: Any) -> Callable[[], None]:
        """A CUDA graph of the module on ``x_device``'s shape: its replay."""
        torch = self.torch
        stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream), torch.inference_mode(), self.autocast():
            for _ in range(3):  # warm-up before capture, as CUDA graphs require
                self.forward(x_device)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), self.autocast(), torch.cuda.graph(graph, stream=stream):
            self.forward(x_device)
        return graph.replay


class JaxServed:
    """The same net in JAX through ``models.JaxModel`` (``problems.jax_resnet``), on
    JAX's default device. JAX gives no per-batch device events here, so its runs report
    no ``device_busy_fraction``; ``fraction_in_model`` (the server's time in the
    adapter's call, copies included) stands in for it."""

    def __init__(self, name: str, net: Any, args: argparse.Namespace):
        import jax
        from async_search.models import JaxModel

        self.name = name
        self.net = net
        self.jax = jax
        apply_fn, params = problems.jax_resnet(net)
        self.model = JaxModel(apply_fn, params, input_spec=net.input_spec,
                              max_batch_size=args.max_batch_size)
        self.device = self.model.device
        self.cuda = self.device.platform == "gpu"
        self.timer = ForwardTimer(None, cuda=False)  # never fed: JAX's runs are untimed
        self.timed = False
        self.sizes = self.model.batch_sizes
        self.ceiling: Dict[int, Dict[str, Dict[str, float]]] = {}
        self._apply = jax.jit(apply_fn)
        self._params = jax.device_put(params, self.device)
        self._leaves = jax.tree.leaves(params)
        for size in self.sizes:  # one compilation per bucket, here rather than in a run
            self.model(np.zeros(net.input_spec.batch_shape(size), np.float32))

    def serve_with(self, servers: int) -> None:
        """Nothing: JAX's servers share its one adapter."""

    def factory(self) -> Any:
        return self.model

    def parameters(self) -> int:
        return int(sum(np.size(leaf) for leaf in self._leaves))

    def sync(self) -> None:
        """Nothing: the adapter's NumPy outputs are ready when it returns."""

    def on_device_seconds(self, x_host: np.ndarray, min_s: float) -> float:
        jax = self.jax
        x_device = jax.device_put(x_host, self.device)
        return timed_calls(
            lambda: jax.block_until_ready(self._apply(self._params, x_device)),
            self.sync, min_s)


def rows_alone_and_among(model: Any, x: np.ndarray, size: int) -> tuple:
    """``model``'s outputs for each row of ``x`` alone, and for the same rows as the
    first rows of one batch of ``size`` whose other rows are random."""
    rng = np.random.default_rng(1)
    alone = [model(x[i:i + 1]) for i in range(len(x))]
    mates = (rng.random((size - len(x),) + x.shape[1:]) < 0.2).astype(x.dtype)
    among = model(np.concatenate([x, mates]))
    return alone, among


def batch_dependence(served: Any, rows: int = 8) -> dict:
    """How far a row's outputs move with its batch-mates, per bucket size: the largest
    absolute difference between a row computed alone and among random rows, and that
    over the outputs' largest magnitude. The adapter's ``batch_tolerance`` documents
    the bound; this is the measurement."""
    rng = np.random.default_rng(2)
    x = (rng.random(served.net.input_spec.batch_shape(rows)) < 0.2).astype(np.float32)
    out: Dict[str, Any] = {}
    for size in served.sizes:
        if size < rows:
            continue
        alone, among = rows_alone_and_among(served.model, x, size)
        worst = scale = 0.0
        for i, row in enumerate(alone):
            parts = row if isinstance(row, (tuple, list)) else (row,)
            batch_parts = among if isinstance(among, (tuple, list)) else (among,)
            for a, b in zip(parts, batch_parts):
                a, b = np.asarray(a, np.float64)[0], np.asarray(b, np.float64)[i]
                worst = max(worst, float(np.max(np.abs(a - b))))
                scale = max(scale, float(np.max(np.abs(a))))
        out[str(size)] = {"max_abs": worst, "max_rel": worst / max(scale, 1e-12)}
    tolerance = getattr(served.model, "batch_tolerance", None)
    return {"per_batch_size": out, "adapter_batch_tolerance": tolerance,
            "worst_max_abs": max((v["max_abs"] for v in out.values()), default=0.0)}


# -- the ceiling ---------------------------------------------------------------------------
def timed_calls(call: Callable[[], Any], sync: Callable[[], None], min_s: float,
                min_calls: int = 3) -> float:
    """Seconds per call: calls until ``min_s`` passed (at least ``min_calls``), after one
    warm-up call."""
    call()
    sync()
    calls, began = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - began < min_s:
        call()
        calls += 1
    sync()
    return (time.perf_counter() - began) / calls


def measure_ceiling(served: Any, min_s: float) -> dict:
    """Times the model alone at every bucket size into ``served.ceiling``; measured
    again (after the runs), each figure keeps the faster time: the model at its best."""
    rng = np.random.default_rng(0)
    out = {}
    for size in served.sizes:
        x_host = (rng.random(served.net.input_spec.batch_shape(size)) < 0.2).astype(np.float32)
        device_s = served.on_device_seconds(x_host, min_s)
        copies_s = timed_calls(lambda: served.model(x_host), served.sync, min_s)
        before = served.ceiling.get(size)
        if before is not None:
            device_s = min(device_s, before["on_device"])
            copies_s = min(copies_s, before["with_copies"])
        served.ceiling[size] = {"on_device": device_s, "with_copies": copies_s}
        out[str(size)] = {
            kind: {"ms_per_batch": round(seconds * 1e3, 4),
                   "elements_per_s": round(size / seconds)}
            for kind, seconds in (("on_device", device_s), ("with_copies", copies_s))}
    served.timer.reset()
    return out


def ceiling_seconds(served: Served, sizes: Sequence[int], kind: str) -> float:
    """The model alone's time for batches of these sizes: ``on_device`` linearly between
    bucket sizes (the net at that size, no padding), ``with_copies`` at the padded
    bucket (what the adapter runs); past the largest bucket, in chunks of it."""
    buckets = served.sizes
    times = [served.ceiling[b][kind] for b in buckets]

    def one(n: int) -> float:  # 1 <= n <= the largest bucket
        i = bisect.bisect_left(buckets, n)
        if buckets[i] == n or kind == "with_copies":
            return times[i]
        if i == 0:  # below the smallest bucket: in proportion
            return times[0] * n / buckets[0]
        low, high = buckets[i - 1], buckets[i]
        return times[i - 1] + (times[i] - times[i - 1]) * (n - low) / (high - low)

    total = 0.0
    for size in sizes:
        chunks, rest = divmod(size, buckets[-1])
        total += chunks * times[-1] + (one(rest) if rest else 0.0)
    return total


class CpuClock:
    """Where a run's CPU time went, over its wall time: ``loop_cpu``, the fraction of a
    core the event loop's thread used (searches in one process, or the serving loop of
    the process backend: near 1, it is the limit); ``process_cpu``, this process's
    cores (the loop, the device threads and the rest); ``clients_cpu``, the fraction of
    a core each client process used (process backend: the children reaped during the
    run). Started on the loop's thread, read there too. The children's CPU comes from
    ``os.times`` (in clock ticks, 10 ms); this process's from ``process_time``, exact as
    the thread's (a tick's error made it read less than its own loop's)."""

    def __init__(self):
        self.thread = time.thread_time()
        self.process = time.process_time()
        self.times = os.times()
        self.wall = time.perf_counter()

    def read(self, clients: int = 0) -> dict:
        wall = time.perf_counter() - self.wall
        record = {
            "loop_cpu": round((time.thread_time() - self.thread) / wall, 3),
            "process_cpu": round((time.process_time() - self.process) / wall, 3),
        }
        if clients:
            now, then = os.times(), self.times
            children = (now.children_user + now.children_system
                        - then.children_user - then.children_system)
            record["clients_cpu"] = round(children / wall / clients, 3)
        return record


def cpu_topology() -> dict:
    """Logical CPUs, physical cores and threads per core, from Linux's sysfs (None
    where it cannot be read): 14 client processes on 8 cores with two threads each do
    not scale as on 14 cores."""
    cores = set()
    logical = 0
    root = "/sys/devices/system/cpu"
    try:
        for name in os.listdir(root):
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            topology = os.path.join(root, name, "topology")
            with open(os.path.join(topology, "core_id")) as f:
                core = f.read().strip()
            with open(os.path.join(topology, "physical_package_id")) as f:
                package = f.read().strip()
            cores.add((package, core))
            logical += 1
    except OSError:
        return {"logical_cpus": os.cpu_count(), "physical_cores": None,
                "threads_per_core": None}
    return {"logical_cpus": logical, "physical_cores": len(cores),
            "threads_per_core": round(logical / max(len(cores), 1), 2)}


def run_record(served: Served, nodes: int, sizes: List[int], active_s: float,
               wall_s: float, extra: dict, timed: bool = True) -> dict:
    """``timed`` False: no busy fraction (the batches ran on copies the timer does not
    see, or on several devices, whose events cannot be read against one another)."""
    busy_s = served.timer.busy_s() if served.timed and timed else None
    elements = sum(sizes)
    return {
        **extra,
        "sizes": sizes,  # the batches' sizes, dropped from the report once read
        "nodes": nodes,
        "nodes_per_s": round(nodes / active_s, 1),
        "elements": elements,
        "elements_per_s": round(elements / active_s, 1),
        "batches": len(sizes),
        "mean_batch": round(elements / max(len(sizes), 1), 1),
        "device_busy_fraction": (None if busy_s is None else
                                 round(min(busy_s / active_s, 1.0), 3)),
        "vs_ceiling": round(ceiling_seconds(served, sizes, "on_device") / active_s, 3),
        "vs_ceiling_with_copies": round(
            ceiling_seconds(served, sizes, "with_copies") / active_s, 3),
        "active_s": round(active_s, 3),
        "wall_s": round(wall_s, 3),
    }


# -- workloads ------------------------------------------------------------------------------
class Workload:
    """A search on a net: its starts and per-search budget for a number of searches."""

    def __init__(self, kind: str, served: Served, args: argparse.Namespace):
        self.kind = kind
        self.served = served
        self.args = args

    def budget(self, searches: int) -> int:
        """Each search's share of the run's work, at least a minimum and at most a cap."""
        a = self.args
        if self.kind == "astar":
            return int(np.clip(a.astar_evaluations // searches, a.astar_min_budget,
                               a.astar_max_budget))
        return int(np.clip(a.mcts_simulations // searches, 2 * a.num_parallel,
                           a.mcts_max_simulations))

    def search_fn(self, searches: int) -> Callable:
        if self.kind == "astar":
            return functools.partial(astar, self.budget(searches), self.args.buffer_size)
        return functools.partial(mcts, self.budget(searches), self.args.num_parallel)

    def starts(self, count: int, offset: int = 0) -> list:
        if self.kind == "astar":
            return puzzle_starts(count, self.args.scramble, offset)
        return game_starts(count, offset)


async def in_process(work: Workload, searches: int, max_batch_size: Any = None,
                     **serve_options: Any) -> dict:
    served = work.served
    fn, starts = work.search_fn(searches), work.starts(searches)
    size = work.args.max_batch_size if max_batch_size is None else max_batch_size
    served.timer.reset()
    gc.collect()
    clock = CpuClock()
    began = time.perf_counter()
    with StackSampler(enabled=work.args.sample_stacks) as sampler:
        async with asr.serve(served.model, max_batch_size=size,
                             **serve_options) as evaluate:
            nodes = sum(await asyncio.gather(*(fn(s, evaluate) for s in starts)))
            active_s = time.perf_counter() - began
            sizes = [record.size for record in evaluate.trace]
            stats = dict(evaluate.stats)
            chosen = getattr(evaluate, "max_batch_size", None)
    # serve(devices=...) computes on copies of its own, one a device: not timed.
    record = run_record(served, nodes, sizes, active_s, time.perf_counter() - began,
                        {"searches": searches, "budget_per_search": work.budget(searches),
                         "max_batch_size": size}, timed="devices" not in serve_options)
    record["fraction_in_model"] = round(stats["fraction_in_model"], 3)
    record.update(clock.read())
    if sampler.enabled:
        record["stacks"] = sampler.report()
    if max_batch_size == "auto":  # what the server chose, and how
        record["chosen_batch_size"] = chosen
        record["auto_batch_size"] = stats.get("auto_batch_size")
    return record


async def process_backend(work: Workload, clients: int, servers: int = 1) -> dict:
    served = work.served
    searches = clients * work.args.process_searches
    starts = work.starts(searches)
    served.serve_with(servers)
    served.timer.reset()
    gc.collect()
    clock = CpuClock()
    began = time.perf_counter()
    with StackSampler(enabled=work.args.sample_stacks) as sampler:
        out = await asr.run_searches_async(
            work.search_fn(work.args.process_searches), starts, served.factory,
            backend="process", num_procs=clients, num_servers=servers,
            max_batch_size=work.args.max_batch_size,
            use_uvloop=work.args.loop == "uvloop", **waves_option(work.args.client_waves))
    wall_s = time.perf_counter() - began
    cpu = clock.read(clients)
    if sampler.enabled:  # the serving process: its loop and device threads
        cpu["stacks"] = sampler.report()
    trace = out.stats["trace"]
    sizes = batch_sizes(out.stats)
    # A server keeps its latest TRACE_SIZE batches: past them, the trace's first batch
    # is not the run's, and the clients' own times bound the run instead.
    active_s = (served_seconds(trace) if len(trace) == len(sizes)
                else searched_seconds(out.stats) or served_seconds(trace))
    return {**run_record(served, sum(out), sizes, active_s, wall_s,
                         {"clients": clients, "servers": servers,
                          "searches": searches, "client_waves": work.args.client_waves,
                          "budget_per_search": work.budget(work.args.process_searches)}),
            **cpu, "clients_busy": clients_busy(out.stats),
            **steady_state(out.stats, sum(out))}


def waves_option(waves: int) -> dict:
    """``client_waves`` for ``run_searches`` when more than one (a tree before it
    takes none: then the runs say 1)."""
    return {"client_waves": waves} if waves > 1 else {}


def steady_state(stats: dict, nodes: int) -> dict:
    """The process backend's rate while every client searched: from the last client's
    start to the first one's end (``began_at``/``ended_at`` in ``stats["clients"]``, on
    the trace's clock from ``trace_origin``). Client processes start one after another and
    end apart, and the whole run's rate counts those ends, where fewer clients feed the
    server; the steady rate is what more clients buy once all run. ``start_spread_s``:
    from the first client's start to the last's. Empty when some client attempt
    reports no times (a tree before them, or a client that died); ``steady_s`` 0 when
    no moment had every client searching (the run is too short for its clients'
    starts), and no rate either when the trace lost its first batches (past
    ``TRACE_SIZE``: the window's share of the elements would be wrong)."""
    clients = [c for c in stats.get("clients", []) if "began_at" in c]
    servers = stats.get("servers", [])
    if not clients or not servers or len(clients) != len(stats["clients"]):
        return {}
    # The trace's zero (a tree before trace_origin: the first server's start)
    origin = stats.get("trace_origin", min(s.get("started_at", 0.0) for s in servers))
    began = [c["began_at"] - origin for c in clients]
    ended = [c["ended_at"] - origin for c in clients]
    start, end = max(began), min(ended)
    record = {"start_spread_s": round(start - min(began), 3),
              "steady_s": round(max(end - start, 0.0), 3)}
    trace = stats["trace"]
    if len(trace) < sum(s.get("batches", 0) for s in servers):
        record["trace_truncated"] = True
        return record
    inside = [r for r in trace if r.finished_s - r.model_s >= start and r.finished_s <= end]
    elements = sum(r.size for r in trace)
    if end > start and inside and elements:
        steady = sum(r.size for r in inside)
        # Nodes in proportion to the elements the window's batches evaluated.
        record["steady_nodes_per_s"] = round(nodes * steady / elements / (end - start), 1)
        record["steady_fraction_in_model"] = round(
            sum(r.model_s for r in inside) / (end - start), 3)
    return record


def batch_sizes(stats: dict) -> List[int]:
    """Every batch's size (in no order) from the servers' histograms, which count
    every batch where the trace keeps the latest ``TRACE_SIZE``."""
    return [int(size) for s in stats["servers"]
            for size, count in s.get("batch_size_histogram", {}).items()
            for _ in range(count)]


def searched_seconds(stats: dict) -> float | None:
    """From the first client's searches' start to the last one's end (None when a
    client attempt reports no times)."""
    clients = stats.get("clients", [])
    if not clients or any("began_at" not in c for c in clients):
        return None
    return max(c["ended_at"] for c in clients) - min(c["began_at"] for c in clients)


def served_seconds(trace: Sequence[Any]) -> float:
    """From a run's first batch's start to its last batch's end (``BatchRecord``s in
    time order): the time the server served, the client processes' start-up left out."""
    return trace[-1].finished_s - (trace[0].finished_s - trace[0].model_s)


def clients_busy(stats: dict) -> float | None:
    """The client processes' CPU seconds over their wall seconds while their searches
    ran, averaged (``run_searches``' ``stats["clients"]``): near 1, the clients' CPU is
    the limit; well below, they wait on their round trips."""
    busy = [a["cpu_s"] / a["searching_s"] for a in stats.get("clients", [])
            if a.get("searching_s")]
    return round(sum(busy) / len(busy), 3) if busy else None


# -- the machine's own scaling: the same client processes, no shared server ---------------------
class FreeModel:
    """One row of the net's outputs, repeated for each row of a batch: a model that
    costs almost nothing, so that searches through it spend only their own CPU."""

    def __init__(self, row: Any):
        self.row = row

    def __call__(self, batch: np.ndarray) -> Any:
        return rows.map_leaves(lambda leaf: np.repeat(leaf, len(batch), axis=0), self.row)


def alone_client(fn: Callable, starts: list, row: Any, max_batch_size: int,
                 use_uvloop: bool, barrier: Any, results: Any) -> None:
    """One process of ``clients_alone``: its searches on its own ``serve`` of a
    ``FreeModel``, begun with the others' at ``barrier`` (after one search each, so that
    first calls' costs stay out); puts ``(nodes, began, ended, cpu_s, elements,
    batches)`` on ``results``."""

    async def searches(some: list) -> Tuple[int, dict]:
        async with asr.serve(FreeModel(row), max_batch_size=max_batch_size) as evaluate:
            nodes = sum(await asyncio.gather(*(fn(s, evaluate) for s in some)))
            return nodes, dict(evaluate.stats)

    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        runner.run(searches(starts[:1]))
        barrier.wait(timeout=ALONE_TIMEOUT_S)
        began, cpu = time.perf_counter(), time.process_time()
        nodes, stats = runner.run(searches(starts))
        ended = time.perf_counter()
    results.put((nodes, began, ended, time.process_time() - cpu, stats["elements"],
                 stats["batches"]))


#: The longest a ``clients_alone`` process may take to start or to run its searches.
ALONE_TIMEOUT_S = 600.0


def free_row(served: Any) -> Any:
    """The served net's outputs for one (zero) input row, as NumPy."""
    return served.model(np.zeros(served.net.input_spec.batch_shape(1),
                                 served.net.input_spec.dtype))


async def clients_alone(work: Workload, clients: int) -> dict:
    """``clients`` processes, each running the searches of one process-backend client
    on its own free model (no server, no device, nothing shared): how far this machine
    scales the searches' CPU alone, which bounds the process backend's scaling (client
    processes beyond the physical cores share them; so do memory and turbo clocks).
    ``nodes_per_s`` is every process's nodes over the time from the first start (all
    begin at one barrier) to the last end."""
    import multiprocessing

    per = work.args.process_searches
    starts = work.starts(clients * per)
    row = free_row(work.served)
    fn = work.search_fn(per)
    context = multiprocessing.get_context("spawn")  # as the process backend's clients
    barrier, results = context.Barrier(clients), context.Queue()
    processes = [context.Process(
        target=alone_client, daemon=True, name=f"clients_alone-{i}",
        args=(fn, starts[i * per:(i + 1) * per], row, work.args.max_batch_size,
              work.args.loop == "uvloop", barrier, results)) for i in range(clients)]

    def gather() -> list:
        for p in processes:
            p.start()
        found: list = []
        deadline = time.monotonic() + 2 * ALONE_TIMEOUT_S
        while len(found) < clients:
            try:
                found.append(results.get(timeout=0.5))
            except queue.Empty:
                died = [p for p in processes if p.exitcode not in (None, 0)]
                if died or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"clients_alone: {len(found)} of {clients} processes reported "
                        f"({', '.join(f'{p.name} exit {p.exitcode}' for p in died)}"
                        f"{'' if died else 'timed out'})")
        return found

    try:
        found = await asyncio.to_thread(gather)
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    active_s = max(f[2] for f in found) - min(f[1] for f in found)
    nodes, elements, batches = (sum(f[i] for f in found) for i in (0, 4, 5))
    return {"clients": clients, "searches": clients * per,
            "budget_per_search": work.budget(per), "nodes": nodes,
            "nodes_per_s": round(nodes / active_s, 1),
            "mean_batch": round(elements / max(batches, 1), 1),
            "clients_cpu": round(sum(f[3] for f in found) / active_s / clients, 3),
            "active_s": round(active_s, 3)}


# -- the peer: a hand-written PyTorch batcher -------------------------------------------------
class HandwrittenTorchBatcher:
    """What a user writes without this toolkit: requests go on a ``queue.Queue`` with an
    asyncio future each; one thread takes what is queued (up to ``max_batch_size``
    elements), concatenates, runs the module, splits the outputs and sets the futures
    with ``call_soon_threadsafe``."""

    def __init__(self, torch: Any, module: Any, device: Any, max_batch_size: int):
        self.torch = torch
        self.module = module
        self.device = device
        self.max_batch_size = max_batch_size
        self.requests: queue.Queue = queue.Queue()
        self.loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.batches: List[int] = []

    def __enter__(self) -> "HandwrittenTorchBatcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.requests.put(None)
        self.thread.join()

    async def __call__(self, x: np.ndarray) -> Any:
        future = self.loop.create_future()
        self.requests.put((x, future))
        return await future

    def _work(self) -> None:
        torch = self.torch
        while True:
            item = self.requests.get()
            if item is None:
                return
            items, count = [item], len(item[0])
            while count < self.max_batch_size:
                try:
                    item = self.requests.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.requests.put(None)
                    break
                items.append(item)
                count += len(item[0])
            x = np.concatenate([x for x, _ in items])
            try:
                with torch.inference_mode():
                    out = self.module(torch.from_numpy(x).to(self.device))
                outs = [o.cpu().numpy() for o in out] if isinstance(out, tuple) else [
                    out.cpu().numpy()]
            except Exception as e:  # noqa: BLE001 - every waiting search gets it
                for _, future in items:
                    self.loop.call_soon_threadsafe(future.set_exception, e)
                continue
            self.batches.append(len(x))
            offset = 0
            for request, future in items:
                n = len(request)
                parts = [o[offset:offset + n] for o in outs]
                offset += n
                self.loop.call_soon_threadsafe(
                    future.set_result, tuple(parts) if isinstance(out, tuple) else parts[0])


async def handwritten(work: Workload, searches: int) -> dict:
    served = work.served
    fn, starts = work.search_fn(searches), work.starts(searches)
    torch = served.torch
    module = timed_module(torch, served.peer_module, served.timer)
    served.timer.reset()
    gc.collect()
    # PyTorch's default: a batcher without buckets sees a new shape at most batches,
    # and cudnn's autotuner (on for the adapter's few shapes) would time each one.
    autotune, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
    clock = CpuClock()
    began = time.perf_counter()
    try:
        with HandwrittenTorchBatcher(torch, module, served.device,
                                     work.args.max_batch_size) as evaluate:
            nodes = sum(await asyncio.gather(*(fn(s, evaluate) for s in starts)))
            active_s = time.perf_counter() - began
    finally:
        torch.backends.cudnn.benchmark = autotune
    return {**run_record(served, nodes, evaluate.batches, active_s,
                         time.perf_counter() - began,
                         {"searches": searches, "budget_per_search": work.budget(searches)}),
            **clock.read()}


# -- the peer: mctx's jitted MCTS on Connect Four --------------------------------------------
def jax_connect_four(jax: Any, jnp: Any) -> tuple:
    """Connect Four in JAX on ``encode``'s planes ``[B, 2, 6, 7]`` (the player to move's
    stones, then the other's; rows from the bottom): ``(full_columns, play)``, where
    ``full_columns(planes)`` is ``[B, 7]`` and ``play(planes, action)`` gives the
    child's planes (sides swapped) and whether the mover made four."""

    def full_columns(planes):  # [B, 2, 6, 7] -> [B, 7]: the top cell is taken
        return (planes[:, 0, -1, :] + planes[:, 1, -1, :]) > 0

    def four(plane):  # [B, 6, 7] -> [B]: four in a row anywhere
        lines = [plane[:, :, i:7 - 3 + i] for i in range(4)]  # horizontal
        found = jnp.all(jnp.stack(lines) > 0, axis=0).any(axis=(1, 2))
        lines = [plane[:, i:6 - 3 + i, :] for i in range(4)]  # vertical
        found |= jnp.all(jnp.stack(lines) > 0, axis=0).any(axis=(1, 2))
        lines = [plane[:, i:6 - 3 + i, i:7 - 3 + i] for i in range(4)]  # diagonal
        found |= jnp.all(jnp.stack(lines) > 0, axis=0).any(axis=(1, 2))
        lines = [plane[:, 3 - i:6 - i, i:7 - 3 + i] for i in range(4)]  # anti-diagonal
        found |= jnp.all(jnp.stack(lines) > 0, axis=0).any(axis=(1, 2))
        return found

    def play(planes, action):
        """The mover (plane 0) drops a stone in ``action``; planes swap sides."""
        filled = planes[:, 0] + planes[:, 1]  # [B, 6, 7]
        height = filled.sum(axis=1).astype(jnp.int32)[jnp.arange(planes.shape[0]), action]
        stone = (jax.nn.one_hot(height, 6)[:, :, None]
                 * jax.nn.one_hot(action, 7)[:, None, :])
        mover = planes[:, 0] + stone
        return jnp.stack([planes[:, 1], mover], axis=1), four(mover)

    return full_columns, play


def mctx_peer(net: Any, args: argparse.Namespace) -> dict:
    """simulations/s of ``mctx.muzero_policy`` over a batch of Connect Four openings, the
    game and the net in JAX, the whole search jitted."""
    import jax
    import jax.numpy as jnp
    import mctx

    apply_fn, params = problems.jax_resnet(net)
    params = jax.device_put(params)
    batch, simulations = args.mctx_batch, args.mctx_simulations

    full_columns, play = jax_connect_four(jax, jnp)

    def evaluate(params, planes):
        logits, value = apply_fn(params, planes)
        logits = jnp.where(full_columns(planes), -1e9, logits)
        return logits, value[:, 0]

    def recurrent_fn(params, rng, action, embedding):
        planes, done = embedding
        child, won = play(planes, action)
        child = jnp.where(done[:, None, None, None], planes, child)
        full = full_columns(child).all(axis=1)
        over = done | won | full
        logits, value = evaluate(params, child)
        reward = jnp.where(done, 0.0, won.astype(jnp.float32))
        output = mctx.RecurrentFnOutput(
            reward=reward, discount=jnp.where(over, 0.0, -1.0),
            prior_logits=logits, value=jnp.where(over, 0.0, value))
        return output, (child, over)

    @jax.jit
    def run(params, rng, planes):
        logits, value = evaluate(params, planes)
        root = mctx.RootFnOutput(prior_logits=logits, value=value,
                                 embedding=(planes, jnp.zeros(planes.shape[0], bool)))
        out = mctx.muzero_policy(params, rng, root, recurrent_fn, simulations,
                                 invalid_actions=full_columns(planes))
        return out.action

    planes = jnp.asarray(GAME.encode(game_starts(batch)))
    rng = jax.random.PRNGKey(0)
    began = time.perf_counter()
    run(params, rng, planes).block_until_ready()  # compiles
    compile_s = time.perf_counter() - began
    rounds, began = 0, time.perf_counter()
    while rounds < 2 or time.perf_counter() - began < args.min_s:
        rng, key = jax.random.split(rng)
        run(params, key, planes).block_until_ready()
        rounds += 1
    seconds = (time.perf_counter() - began) / rounds
    return {"batch": batch, "simulations": simulations, "device": str(jax.devices()[0]),
            "jax": jax.__version__, "mctx": getattr(mctx, "__version__", "?"),
            "compile_s": round(compile_s, 2), "seconds_per_search_batch": round(seconds, 4),
            "nodes_per_s": round(batch * simulations / seconds, 1)}


# -- the report ----------------------------------------------------------------------------
def client_counts(cores: int, limit: int | None) -> List[int]:
    """1, 2, 4, 8 ... up to cores - 2 (and cores - 2 itself), at least 1."""
    top = max(1, cores - 2) if limit is None else max(1, min(limit, max(1, cores - 2)))
    counts, k = [], 1
    while k < top:
        counts.append(k)
        k *= 2
    return counts + [top]


#: The most a run's ``vs_ceiling`` may be and still be read: a run cannot outpace the
#: model alone, beyond the noise of two timings.
PLAUSIBLE_VS_CEILING = 1.05


def goals(report: dict) -> dict:
    """The issue's goals, read off the runs (on a CPU they say what the CPU does)."""
    out = {}
    for name, runs in report["runs"].items():
        # The busy goal reads the runs in one process and through client processes
        # (one server process feeding the device either way).
        inside = [(section, r) for section in ("in_process", "process_backend")
                  for r in runs.get(section, {}).values() if "vs_ceiling" in r]
        # Without device events (JAX) the busiest run is the one nearest the ceiling,
        # and whether the device was busy enough is not known.
        timed = any(r["device_busy_fraction"] is not None for _, r in inside)
        section, best = max(inside, key=lambda sr: (
            (sr[1]["device_busy_fraction"] or 0.0, sr[1]["vs_ceiling"]) if timed
            else (sr[1]["vs_ceiling"],)), default=(None, None))
        entry = {}
        if best is not None:
            entry["busiest_run"] = {"section": section, **{k: best.get(k) for k in (
                "searches", "clients", "servers", "device_busy_fraction",
                "fraction_in_model", "vs_ceiling", "mean_batch") if k in best}}
            entry["busy_goal_met"] = (None if not timed else
                                      (best["device_busy_fraction"] or 0.0) >= 0.9
                                      and best["vs_ceiling"] >= 0.9)
            fastest = max(r["vs_ceiling"] for _, r in inside)
            if fastest > PLAUSIBLE_VS_CEILING:
                # A run faster than the model alone: the ceiling (one for every run)
                # was timed slow, on a loaded machine, and a met goal may be that
                # noise alone (one not met stays not met: the figures only flatter).
                if entry["busy_goal_met"]:
                    entry["busy_goal_met"] = None
                entry["ceiling_note"] = (
                    f"a run went {fastest}x the model alone: the ceiling was timed "
                    f"slower than the model ran (a loaded machine?); vs_ceiling reads "
                    f"high, and a met busy goal is not judged: measure again on a quiet "
                    f"machine")
        peer = runs.get("handwritten_torch", {})
        ratios = {}  # per concurrency: serve's nodes/s over the peer's, round by round
        for n, r in peer.items():
            if n in runs.get("in_process", {}):
                ours = runs["in_process"][n]["nodes_per_s_rounds"]
                per_round = sorted(a / b for a, b in zip(ours, r["nodes_per_s_rounds"]))
                ratios[n] = {"median": round(statistics.median(per_round), 2),
                             "range": [round(per_round[0], 2), round(per_round[-1], 2)]}
        if ratios:
            entry["vs_handwritten_torch"] = ratios
            entry["vs_handwritten_goal_met"] = max(
                v["median"] for v in ratios.values()) >= 2.0
        # Per number of servers: k clients' nodes/s over k times one client's.
        scaling = runs.get("process_backend", {})
        for servers in sorted({k.partition("x")[2] for k in scaling}):
            suffix = f"x{servers}" if servers else ""
            one = scaling.get(f"1{suffix}")
            if one is None:
                continue
            entry["scaling_efficiency" + suffix.replace("x", "_x")] = {
                k: round(r["nodes_per_s"] / (int(k.partition("x")[0]) * one["nodes_per_s"]),
                         2) for k, r in scaling.items() if k.partition("x")[2] == servers}
            steady = {k: r for k, r in scaling.items() if k.partition("x")[2] == servers
                      and r.get("steady_nodes_per_s")}
            if one.get("steady_nodes_per_s") and len(steady) > 1:
                entry["steady_scaling_efficiency" + suffix.replace("x", "_x")] = {
                    k: round(r["steady_nodes_per_s"] / (int(k.partition("x")[0])
                                                        * one["steady_nodes_per_s"]), 2)
                    for k, r in steady.items()}
        # The same for the searches alone (no server): the machine's own scaling, and
        # the process backend's (one server) over it, at each count of clients.
        alone = runs.get("clients_alone", {})
        if "1" in alone:
            machine = {k: round(r["nodes_per_s"] / (int(k) * alone["1"]["nodes_per_s"]), 2)
                       for k, r in alone.items()}
            entry["scaling_efficiency_clients_alone"] = machine
            ours = entry.get("scaling_efficiency", {})
            shared = [k for k in ours if k in machine and machine[k] > 0]
            if shared:
                entry["scaling_over_clients_alone"] = {
                    k: round(ours[k] / machine[k], 2) for k in shared}
        out[name] = entry
    return out



def serve_takes(name: str) -> bool:
    return name in inspect.signature(asr.serve).parameters


async def auto_accepted(served: Served) -> str | None:
    """None when this tree's ``serve`` takes ``max_batch_size="auto"``, else why not."""
    try:
        async with asr.serve(served.model, max_batch_size="auto") as evaluate:
            await evaluate(np.zeros(served.net.input_spec.batch_shape(1), np.float32))
    except (TypeError, ValueError) as e:
        return f"serve(max_batch_size='auto') is not in this tree yet: {e}"
    return None


def served_nets(args: argparse.Namespace, torch: Any, device: Any) -> Dict[str, tuple]:
    """``{workload: (search kind, served net)}`` for ``--workloads``, in their order."""
    made = {}
    for workload in args.workloads:
        if workload == "mcts":
            net = problems.PolicyValueResNet(GAME, channels=args.channels, blocks=args.blocks,
                                             value_hidden=args.value_hidden, seed=0)
            name, key = "policy_value", "mcts_connect_four"
        else:
            net = problems.CostToGoResNet(PUZZLE, first_width=args.first_width,
                                          width=args.width, blocks=args.dense_blocks, seed=0)
            name, key = "cost_to_go", "astar_15_puzzle"
        served = (JaxServed(name, net, args) if args.framework == "jax" else
                  Served(name, net, device, args, torch))
        made[key] = (workload, served)
    return made


class PartialReport:
    """Writes the report, with every round measured so far, after each measurement: a
    run stopped at a time limit still leaves its figures behind."""

    def __init__(self, report: dict, out: str | None):
        self.report = report
        self.out = out
        self.rounds: Dict[str, Dict[str, Dict[str, List[dict]]]] = {}

    def add(self, workload: str, section: str, key: str, record: dict) -> None:
        shown = {k: v for k, v in record.items() if k != "sizes"}
        self.rounds.setdefault(workload, {}).setdefault(section, {}).setdefault(
            key, []).append(shown)
        self.write()

    def write(self) -> None:
        if self.out:
            text = json.dumps({**self.report, "partial": True, "rounds_so_far": self.rounds},
                              indent=1)
            write_file(self.out, text + "\n")


async def bench(args: argparse.Namespace, torch: Any, device: Any, report: dict) -> None:
    cuda = device.type == "cuda"
    nets = served_nets(args, torch, device)
    partial = PartialReport(report, args.out)
    report["nets"] = {
        served.name: {"class": type(served.net).__name__, **served.net.sizes,
                      "parameters": served.parameters(), "buckets": list(served.sizes),
                      "framework": args.framework, "device": str(served.device)}
        for _, served in nets.values()}
    report["ceiling"] = {}
    report["batch_dependence"] = {}
    for _, served in nets.values():
        report["ceiling"][served.name] = measure_ceiling(served, args.min_s)
        report["batch_dependence"][served.name] = batch_dependence(served)
        progress(f"ceiling {served.name} done")
        partial.write()
    sections = set(args.sections)
    fallbacks = report["fallbacks"]
    auto_missing = await auto_accepted(next(iter(nets.values()))[1])
    if auto_missing:
        fallbacks.append(f"FALLBACK max_batch_size: {auto_missing}; fixed sizes only")
    many_gpus = cuda and torch.cuda.device_count() > 1
    if many_gpus and not serve_takes("devices"):
        fallbacks.append("FALLBACK multi_device: serve(devices=...) is not in this tree "
                         "yet; one GPU used")
    peer = "handwritten_torch" in sections and args.framework == "torch"
    for name, (kind, served) in nets.items():
        work = Workload(kind, served, args)
        measured: Dict[tuple, List[dict]] = {}

        async def measure(section: str, key: Any, run: Callable[[], Any]) -> None:
            record = await run()
            measured.setdefault((section, str(key)), []).append(record)
            partial.add(name, section, str(key), record)
            progress(f"{name} {section} {key}: {record['nodes_per_s']}/s")

        # Rounds: every variant once a round, in turn, so that the machine's spells of
        # load touch them all; each figure is the round with the median nodes/s.
        for _ in range(args.rounds):
            for n in sorted(set(args.concurrency) | set(args.peer_concurrency)):
                if n in args.concurrency and "in_process" in sections:
                    await measure("in_process", n, lambda: in_process(work, n))
                if n in args.peer_concurrency and peer:
                    await measure("handwritten_torch", n, lambda: handwritten(work, n))
            if "max_batch_size" in sections:
                for size in args.fixed_batch_sizes + ([] if auto_missing else ["auto"]):
                    await measure("max_batch_size", size, lambda: in_process(
                        work, args.auto_searches, max_batch_size=size))
            if many_gpus and serve_takes("devices") and "multi_device" in sections:
                devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
                await measure("multi_device", ",".join(devices), lambda: in_process(
                    work, max(args.concurrency), devices=devices))
            if "process_backend" in sections:
                for s in args.servers:
                    for k in args.clients:
                        await measure("process_backend", k if s == 1 else f"{k}x{s}",
                                      lambda: process_backend(work, k, s))
            if "clients_alone" in sections:
                for k in args.clients:
                    await measure("clients_alone", k, lambda: clients_alone(work, k))
        runs: Dict[str, Any] = {"in_process": {}, "handwritten_torch": {},
                                "process_backend": {}, "clients_alone": {},
                                "max_batch_size": {}}
        for (section, key), records in measured.items():
            runs.setdefault(section, {})[key] = median_record(records)
        if auto_missing and "max_batch_size" in sections:
            runs["max_batch_size"]["auto"] = {"skipped": auto_missing}
        if many_gpus and not serve_takes("devices"):
            runs["multi_device"] = {"skipped": "serve(devices=...) is not in this tree yet"}
        report["runs"][name] = runs
        # The ceiling again, now that the runs are done: the faster of the two stays
        # (the machine's load varies), and the runs' vs_ceiling is read against it.
        report["ceiling"][served.name] = measure_ceiling(served, args.min_s)
        for section in runs.values():
            for record in section.values():
                if isinstance(record, dict) and "sizes" in record:
                    refresh_vs_ceiling(served, record)
        if kind == "mcts" and "mctx" in sections:
            missing = [m for m in ("jax", "mctx") if importlib.util.find_spec(m) is None]
            if missing:
                runs["mctx"] = {"skipped": f"not importable here: {', '.join(missing)}"}
            elif args.no_mctx:
                runs["mctx"] = {"skipped": "--no-mctx"}
            else:
                runs["mctx"] = mctx_peer(served.net, args)
                progress(f"mctx: {runs['mctx']['nodes_per_s']}/s")
        partial.write()


def refresh_vs_ceiling(served: Served, record: dict) -> None:
    """Reads a run's ``vs_ceiling`` again against the final ceiling; drops its sizes."""
    sizes, active_s = record.pop("sizes"), record["active_s"]
    record["vs_ceiling"] = round(ceiling_seconds(served, sizes, "on_device") / active_s, 3)
    record["vs_ceiling_with_copies"] = round(
        ceiling_seconds(served, sizes, "with_copies") / active_s, 3)


def median_record(records: List[dict]) -> dict:
    """The record of the round with the median nodes/s, with every round's nodes/s (in
    the order of the rounds) and their range."""
    rates = [r["nodes_per_s"] for r in records]
    median = sorted(records, key=lambda r: r["nodes_per_s"])[len(records) // 2]
    return {**median, "rounds": len(records), "nodes_per_s_rounds": rates,
            "nodes_per_s_range": [min(rates), max(rates)]}


def progress(line: str) -> None:
    print(f"[gpu.py {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None, *, cuda: bool) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true",
                   help="a small run: a few minutes on a 2-core CPU")
    p.add_argument("--channels", type=int, help="policy-value net width (GPU 128, CPU 32)")
    p.add_argument("--blocks", type=int, help="policy-value residual blocks (GPU 10, CPU 2)")
    p.add_argument("--value-hidden", type=int, default=64)
    p.add_argument("--first-width", type=int,
                   help="cost-to-go first layer (GPU 5000 as DeepCubeA, CPU 256)")
    p.add_argument("--width", type=int, help="cost-to-go width (GPU 1000, CPU 128)")
    p.add_argument("--dense-blocks", type=int, help="cost-to-go residual blocks (GPU 4, CPU 2)")
    p.add_argument("--max-batch-size", type=int,
                   help="server and adapter batch size (GPU 4096, CPU 512)")
    p.add_argument("--concurrency", type=str, default=None,
                   help="concurrent searches of the in-process runs (default "
                        "1,64,256,1024,4096; smoke 1,64,256)")
    p.add_argument("--peer-concurrency", type=str, default=None,
                   help="concurrent searches of the hand-written peer (default: the "
                        "in-process ones from 64 on)")
    p.add_argument("--fixed-batch-sizes", type=str, default=None,
                   help="server batch sizes set against 'auto' (default 64,256,1024,4096; "
                        "CPU 16,64,256)")
    p.add_argument("--auto-searches", type=int, default=None,
                   help="concurrent searches of the max_batch_size runs (GPU 1024, CPU 256)")
    p.add_argument("--clients", type=str, default=None,
                   help="client processes of the process-backend runs (default 1, 2, 4 "
                        "... cores - 2)")
    p.add_argument("--max-clients", type=int, default=None)
    p.add_argument("--servers", type=str, default=None,
                   help="the process backend's servers, comma-separated (default 1): "
                        "copies of the adapter on the one device, taking batches from "
                        "one queue; runs with k clients and s > 1 servers are 'kxs'")
    p.add_argument("--process-searches", type=int, default=None,
                   help="searches per client process (GPU 256, CPU 64)")
    p.add_argument("--client-waves", type=int, default=1,
                   help="the process backend's client_waves: messages each client has "
                        "in flight at once (default 1)")
    p.add_argument("--astar-evaluations", type=int, default=None,
                   help="evaluations a run's A* searches share (GPU 200000, CPU 60000, "
                        "smoke 4000)")
    p.add_argument("--astar-min-budget", type=int, default=None,
                   help="the fewest evaluations of one A* search (GPU 200, CPU 40)")
    p.add_argument("--astar-max-budget", type=int, default=20000)
    p.add_argument("--buffer-size", type=int, default=4, help="A* nodes per step")
    p.add_argument("--scramble", type=int, default=100, help="moves scrambling a start")
    p.add_argument("--mcts-simulations", type=int, default=None,
                   help="simulations a run's MCTS searches share (GPU 100000, CPU 16000, "
                        "smoke 1500)")
    p.add_argument("--mcts-max-simulations", type=int, default=800)
    p.add_argument("--num-parallel", type=int, default=8, help="MCTS leaves per round")
    p.add_argument("--mctx-batch", type=int, default=None,
                   help="games in one mctx search (GPU 1024, CPU 64)")
    p.add_argument("--mctx-simulations", type=int, default=None,
                   help="simulations of each mctx search (GPU 128, CPU 32)")
    p.add_argument("--no-mctx", action="store_true")
    p.add_argument("--min-s", type=float, default=None,
                   help="seconds of calls per ceiling measurement (default 0.5, smoke 0.2)")
    p.add_argument("--precision", choices=("bfloat16", "float16"), default=None,
                   help="TorchModel's reduced precision (and the ceiling's); off by default")
    p.add_argument("--eager", action="store_true",
                   help="TorchModel without CUDA graphs (its default on CUDA captures one "
                        "per bucket)")
    p.add_argument("--compile", action="store_true", help="torch.compile the net")
    p.add_argument("--script", action="store_true",
                   help="TorchModel(script=True): the adapter runs the net compiled by "
                        "TorchScript, one GIL hand-back a pass (the model alone too)")
    p.add_argument("--peer-script", action="store_true",
                   help="the hand-written peer runs the net compiled by TorchScript too")
    p.add_argument("--channels-last", action="store_true",
                   help="the convolutional net in channels-last memory (NHWC)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="PyTorch's intra-op threads (GPU: its default; CPU 1, which leaves "
                        "a core to the searches, and on a loaded 2-core machine a second "
                        "thread made a batch of one take 100 ms instead of 0.1 ms)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every variant in turn; figures are the median round's "
                        "(default 3 on a CPU, 2 on a GPU, 1 for --smoke)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval for this process (Python's default 0.005 s): "
                        "how soon the device thread gets the GIL back from the searches")
    p.add_argument("--framework", choices=("torch", "jax"), default="torch",
                   help="the adapter serving the nets: TorchModel, or JaxModel on JAX's "
                        "default device (no device busy time then, and no PyTorch peer)")
    p.add_argument("--workloads", type=str, default="astar,mcts",
                   help="which searches, in this order: astar (the 15-puzzle), mcts "
                        "(Connect Four)")
    p.add_argument("--sections", type=str, default=",".join(SECTIONS),
                   help=f"which runs, of {','.join(SECTIONS)} (the ceiling always)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default=None,
                   help="the event loop of this process (the searches in one process, "
                        "the server of the process backend) and of the client processes: "
                        "uvloop when installed")
    p.add_argument("--sample-stacks", action="store_true",
                   help="sample this process's Python stacks during each run in one "
                        "process and each process-backend run (the server's loop and "
                        "device threads; stack_sampler.py), into the run's record")
    p.add_argument("--out", default=None, help="where to write the JSON")
    args = p.parse_args(argv)
    if args.switch_interval is not None and not args.switch_interval > 0:
        p.error(f"--switch-interval takes seconds > 0, not {args.switch_interval}")
    if args.script and args.compile:
        p.error("--script and --compile each compile the net: pick one")
    if (args.script or args.peer_script) and args.framework != "torch":
        p.error("--script and --peer-script compile a PyTorch net: --framework torch")
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.sections = [w for w in args.sections.split(",") if w]
    for flag, given, allowed in (("--workloads", args.workloads, ("astar", "mcts")),
                                 ("--sections", args.sections, SECTIONS)):
        wrong = [w for w in given if w not in allowed]
        if wrong or not given or len(set(given)) != len(given):
            p.error(f"{flag} takes a comma-separated list of {', '.join(allowed)} "
                    f"(each once), not {','.join(given) or 'nothing'}")

    def pick(name: str, gpu: Any, cpu: Any, smoke: Any = None) -> None:
        if getattr(args, name) is None:
            setattr(args, name, gpu if cuda else (cpu if not args.smoke or smoke is None
                                                  else smoke))

    pick("channels", 128, 32)
    pick("blocks", 10, 2)
    pick("first_width", 5000, 256)
    pick("width", 1000, 128)
    pick("dense_blocks", 4, 2)
    pick("max_batch_size", 4096, 512)
    pick("auto_searches", 1024, 256, 64)
    pick("process_searches", 256, 64, 32)
    pick("astar_min_budget", 200, 40)
    pick("mctx_batch", 1024, 64, 16)
    pick("mctx_simulations", 128, 32, 16)
    if args.astar_evaluations is None:
        args.astar_evaluations = 4000 if args.smoke else (200_000 if cuda else 60_000)
    if args.mcts_simulations is None:
        args.mcts_simulations = 1500 if args.smoke else (100_000 if cuda else 16_000)
    if args.torch_threads is None and not cuda:
        args.torch_threads = 1
    if args.min_s is None:
        args.min_s = 0.2 if args.smoke else 0.5
    if args.rounds is None:
        args.rounds = 1 if args.smoke else (2 if cuda else 3)

    def numbers(text: str | None, default: Sequence[int]) -> List[int]:
        if not text:
            return list(default)
        try:
            found = sorted({int(t) for t in text.split(",") if t})
        except ValueError:
            found = []
        if not found or found[0] < 1:
            p.error(f"expected comma-separated integers >= 1, got {text!r}")
        return found

    if args.loop is None:
        args.loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    elif args.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        p.error("--loop uvloop: uvloop is not installed here")
    if args.rounds < 1:
        p.error(f"--rounds takes an integer >= 1, not {args.rounds}")
    # Sizes, budgets and counts: each at least 1 (0 searches a client divides by zero).
    for name in ("channels", "blocks", "value_hidden", "first_width", "width",
                 "dense_blocks", "max_batch_size", "auto_searches", "max_clients",
                 "process_searches", "astar_evaluations", "astar_min_budget",
                 "astar_max_budget", "buffer_size", "mcts_simulations",
                 "mcts_max_simulations", "num_parallel", "mctx_batch", "mctx_simulations",
                 "torch_threads", "client_waves"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} takes an integer >= 1, not {value}")
    if args.scramble < 0:
        p.error(f"--scramble takes an integer >= 0, not {args.scramble}")

    args.concurrency = numbers(args.concurrency, (1, 64, 256) if args.smoke else
                               (1, 64, 256, 1024, 4096))
    args.peer_concurrency = numbers(args.peer_concurrency,
                                    [n for n in args.concurrency if n >= 64] or
                                    args.concurrency[-1:])
    args.fixed_batch_sizes = numbers(args.fixed_batch_sizes,
                                     (64, 256, 1024, 4096) if cuda else (16, 64, 256))
    args.clients = numbers(args.clients, client_counts(os.cpu_count() or 1,
                                                       args.max_clients))
    args.servers = numbers(args.servers, (1,))
    most = max_servers("process")  # each server is a copy of the net, made up front
    if args.servers[-1] > most:
        p.error(f"--servers {args.servers[-1]} is more than the process backend can start "
                f"here (at most {most})")
    if args.out is None:
        name = "gpu" if cuda else "gpu_cpu"
        args.out = os.path.join("results", "benchmarks",
                                f"{name}{'_smoke' if args.smoke else ''}.json")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    args = parse_args(argv, cuda=cuda)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cudnn.benchmark = True  # the buckets repeat a few shapes
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    report: Dict[str, Any] = {
        "benchmark": "benchmarks/gpu.py",
        "smoke": args.smoke,
        "device": {
            "kind": device.type,
            "name": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
            "gpus": torch.cuda.device_count() if cuda else 0,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "jax": importlib.util.find_spec("jax") is not None,
            "mctx": importlib.util.find_spec("mctx") is not None,
            "cpu_count": os.cpu_count(), **cpu_topology(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1min": round(os.getloadavg()[0], 2),
        },
        "note": ("on a GPU" if cuda else
                 "no GPU here: every figure is the CPU's (the model on the CPU, "
                 "device_busy_fraction = time in the model's forward pass); the GPU "
                 "figures come from a run on a GPU machine"),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "fallbacks": [],
        "runs": {},
    }
    began = time.perf_counter()
    with asyncio.Runner(loop_factory=loop_factory(args.loop == "uvloop")) as runner:
        runner.run(bench(args, torch, device, report))
    report["goals"] = goals(report)
    report["total_s"] = round(time.perf_counter() - began, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_file(args.out, text + "\n")
    return report


if __name__ == "__main__":
    main()
