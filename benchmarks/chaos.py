"""Chaos at scale: random faults through every layer, counting what each request got.

    python benchmarks/chaos.py [--requests 10000] [--starts 400] [--seed 0] [--no_ray]

Prints one JSON object and writes it to results/benchmarks/chaos.json: for each
scenario, ``sent``, ``answered_exactly``, ``failed_clearly``, ``hung`` and ``wrong``
(and a few figures of its own). ``hung`` and ``wrong`` must be 0: every request ends,
with its exact result or with an error that says what went wrong. Every wait is
bounded (``--bound_s`` a request, ``--run_bound_s`` a run of searches); everything runs
on this machine (loopback only).

Scenarios:

- ``serve_random_faults``: ``--requests`` requests from 64 coroutines through
  ``asr.serve``: a model that raises at random (3% of batches), poison inputs that make
  it raise ValueError, bad inputs (wrong shape, dtype, not an array), and callers that
  cancel their request mid-flight. A request batched with a poison one, or in a batch
  whose model call raised, fails with that exception (the documented batch semantics):
  that is a clear failure, counted apart as ``failed_with_batch``.
- ``cache_dtypes_and_swaps`` (class 4): a CachedEvaluate in front of a server that takes
  float32 and int32 elements; waves of concurrent requests mixing elements with the
  same bytes as float32 and as int32, with model swaps between waves whose labels compare
  equal (1, 1.0, True, numpy 1, and the same label again).
- ``router_poison`` (class 6): a Router over three healthy servers and a flaky one (its
  model raises RuntimeError at random); 2% poison requests. Healthy requests must never
  see CircuitOpenError; the healthy servers' breakers must never open.
- ``process_faults_and_sigkill`` (classes 1, 12): ``--starts`` searches on the process
  backend with ``return_exceptions=True``: searches that raise exceptions that do not
  pickle or do not load, return results that cannot travel, send inputs that make the
  model raise such exceptions; and one client process SIGKILLed mid-run: its starts fail
  clearly, the others finish. A good search whose request travelled in the same batch,
  or in the same message (a client sends one message per loop iteration), as one that
  made the model raise fails with that exception: ``failed_with_batch``.
- ``ray_actor_kill``: searches on the Ray backend with three server actors, two of which
  are killed (``ray.kill``) mid-run: every request is rerouted to the survivor.
- ``http_hostile``: hostile HTTP traffic mixed with normal inference requests against
  ``python -m async_search.http`` (``benchmarks/http_load.py``'s ``hostile_counts``):
  malformed JSON, absurd shapes, wrong datatypes, mismatched data, truncated
  binary-extension headers, oversized bodies, bad routes, idle and slowloris
  connections; at most ``--requests`` requests in 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import async_search as asr  # noqa: E402
from async_search.errors import InputSpecError, RemoteError  # noqa: E402
from async_search.files import write_file  # noqa: E402
from async_search.routing import CachedEvaluate, Router  # noqa: E402
from async_search.routing.breaker import BreakerPolicy  # noqa: E402

WIDTH = 3
POISON, UNPICKLABLE, UNLOADABLE = -1.0, -2.0, -3.0


def tally(**extra) -> dict:
    return {"sent": 0, "answered_exactly": 0, "failed_clearly": 0, "hung": 0, "wrong": 0,
            **extra}


# -- faults that cannot travel ---------------------------------------------------------
class UnpicklableError(Exception):
    """Holds a lock: pickle and cloudpickle refuse it."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class UnloadableError(Exception):
    """Pickles, but its pickle does not load (a required ``__init__`` argument)."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")


def _refuse():
    raise RuntimeError("this object refuses to be loaded")


class UnloadableResult:
    def __reduce__(self):
        return (_refuse, ())


class UnpicklableResult:
    def __init__(self):
        self.lock = threading.Lock()


# -- models ----------------------------------------------------------------------------
class ChaosModel:
    """``2 * x[:, :1] + x[:, 1:2]``; raises for cue values in column 0 (ValueError for
    POISON, exceptions that cannot travel for the others) and, with probability
    ``fault_rate`` a batch, a RuntimeError."""

    def __init__(self, fault_rate=0.0, seed=0):
        self.fault_rate = fault_rate
        self._rng = np.random.default_rng(seed)

    def __call__(self, x):
        column = x[:, 0]
        if (column == UNPICKLABLE).any():
            raise UnpicklableError("the model raised an exception holding a lock")
        if (column == UNLOADABLE).any():
            raise UnloadableError(7, "the model raised an exception that cannot load")
        if (column == POISON).any():
            raise ValueError("the model cannot take a poison input")
        if self.fault_rate and self._rng.random() < self.fault_rate:
            raise RuntimeError("random model fault")
        return 2.0 * x[:, :1] + x[:, 1:2]


def chaos_model():
    return ChaosModel()


def expected_rows(x):
    return 2.0 * x[:, :1] + x[:, 1:2]


# -- 1. serve: random faults, bad inputs, cancellations ---------------------------------
async def serve_random_faults(requests: int, seed: int, bound_s: float) -> dict:
    rng = np.random.default_rng(seed)
    counts = tally(cancelled=0, failed_with_batch=0)
    model = ChaosModel(fault_rate=0.03, seed=seed)
    plan = rng.choice(["good", "poison", "shape", "dtype", "list", "cancel"],
                      size=requests, p=[0.82, 0.01, 0.04, 0.04, 0.02, 0.07])
    sizes = rng.integers(1, 5, size=requests)
    delays = rng.uniform(0, 0.002, size=requests)
    queue = list(range(requests))

    async def one(evaluate, i):
        kind = plan[i]
        n = int(sizes[i])
        x = np.random.default_rng(seed * 1_000_003 + i).uniform(0, 1, (n, WIDTH)).astype(
            np.float32)
        if kind == "poison":
            x[0, 0] = POISON
        elif kind == "shape":
            x = np.zeros((n, WIDTH + 1), np.float32)
        elif kind == "dtype":
            x = x.astype(np.float64)
        elif kind == "list":
            x = x.tolist()
        counts["sent"] += 1
        try:
            fut = asyncio.ensure_future(evaluate(x))
            if kind == "cancel":
                await asyncio.sleep(float(delays[i]))
                fut.cancel()
            y = await asyncio.wait_for(fut, bound_s)
        except asyncio.CancelledError:
            if kind == "cancel":
                counts["cancelled"] += 1
                counts["failed_clearly"] += 1
            else:
                counts["wrong"] += 1
            return
        except asyncio.TimeoutError:
            counts["hung"] += 1
            return
        except Exception as e:
            batch_fault = isinstance(e, RuntimeError) and "random model fault" in str(e)
            poisoned = type(e) is ValueError and "poison" in str(e)
            if kind in ("shape", "dtype", "list") and isinstance(e, (InputSpecError,
                                                                     TypeError)):
                counts["failed_clearly"] += 1
            elif kind == "poison" and (poisoned or batch_fault):
                counts["failed_clearly"] += 1
            elif kind in ("good", "cancel") and (poisoned or batch_fault):
                counts["failed_clearly"] += 1  # its batch failed: the model raised
                counts["failed_with_batch"] += 1
            else:
                counts["wrong"] += 1
            return
        if kind in ("good", "cancel") and np.array_equal(y, expected_rows(x)):
            counts["answered_exactly"] += 1
        else:
            counts["wrong"] += 1

    async def worker(evaluate):
        while queue:
            await one(evaluate, queue.pop())

    async with asr.serve(model, max_batch_size=16) as evaluate:
        await asyncio.gather(*(worker(evaluate) for _ in range(64)))
        counts["batches"] = evaluate.stats["batches"]
        # The server still serves after all that.
        model.fault_rate = 0.0
        x = np.ones((2, WIDTH), np.float32)
        counts["serves_after"] = bool(np.array_equal(
            await asyncio.wait_for(evaluate(x), bound_s), expected_rows(x)))
        counts["wrong"] += not counts["serves_after"]
    return counts


# -- 4. the cache: same bytes as two dtypes, swaps with labels that compare equal -------
class Scaled:
    """A model: each element's values (as float64) summed, times ``factor``."""

    def __init__(self, factor, version):
        self.factor = factor
        self.version = version

    def __call__(self, x):
        return x.astype(np.float64).sum(axis=1, keepdims=True) * self.factor


class TwoDtypes:
    """An evaluate function over two servers: float32 elements go to one, int32 to the
    other; ``version`` and ``swap_token`` tell a cache about swaps."""

    def __init__(self, f32, i32):
        self.f32, self.i32 = f32, i32

    async def __call__(self, x):
        return await (self.f32 if x.dtype == np.float32 else self.i32)(x)

    @property
    def version(self):
        return self.f32.version

    @property
    def swap_token(self):
        return (self.f32.model, self.i32.model)

    def update_model(self, factor, version):
        self.f32.update_model(Scaled(factor, version), version)
        self.i32.update_model(Scaled(factor, version), version)


async def cache_dtypes_and_swaps(waves: int, per_wave: int, seed: int,
                                 bound_s: float) -> dict:
    rng = np.random.default_rng(seed)
    counts = tally(swaps=0)
    pool = rng.uniform(-4, 4, (64, WIDTH)).astype(np.float32)
    labels = [1, 1.0, True, np.int64(1), 1]
    factor = 1.0
    async with asr.serve(Scaled(factor, 1)) as f32, \
            asr.serve(Scaled(factor, 1)) as i32:
        cached = CachedEvaluate(TwoDtypes(f32, i32), capacity=48)

        async def one(x, want):
            counts["sent"] += 1
            try:
                y = await asyncio.wait_for(cached(x), bound_s)
            except asyncio.TimeoutError:
                counts["hung"] += 1
                return
            except Exception:
                counts["wrong"] += 1
                return
            ok = np.array_equal(y, want) and y.dtype == want.dtype
            counts["answered_exactly" if ok else "wrong"] += 1

        for wave in range(waves):
            picks = rng.integers(0, len(pool), size=(per_wave, 2))
            xs = []
            for a, b in picks:
                x = pool[[a, b]]
                xs.append(x if rng.random() < 0.5 else x.view(np.int32))
            await asyncio.gather(*(one(x, x.astype(np.float64).sum(axis=1, keepdims=True)
                                       * factor) for x in xs))
            if wave % 5 == 4:  # between waves: a swap whose label compares equal
                factor += 1.0
                cached.evaluate.update_model(factor, labels[counts["swaps"] % len(labels)])
                counts["swaps"] += 1
        counts["cache"] = {k: cached.stats[k] for k in ("hits", "misses", "invalidations")}
    return counts


# -- 6. the router: poison requests beside a flaky server --------------------------------
async def router_poison(requests: int, seed: int, bound_s: float) -> dict:
    rng = np.random.default_rng(seed)
    counts = tally(failed_with_batch=0, circuit_open_for_healthy=0)
    model = ChaosModel()
    async with asr.serve(model) as a, asr.serve(model) as b, asr.serve(model) as c, \
            asr.serve(ChaosModel(fault_rate=0.3, seed=seed)) as flaky:
        router = Router({"a": a, "b": b, "c": c, "flaky": flaky},
                        breaker=BreakerPolicy(failure_threshold=3, reset_timeout=0.5))
        plan = rng.random(requests) < 0.02
        queue = list(range(requests))

        async def one(i):
            poison = bool(plan[i])
            x = np.random.default_rng(seed + 7 * i).uniform(0, 1, (1 + i % 3, WIDTH)
                                                            ).astype(np.float32)
            if poison:
                x[0, 0] = POISON
            counts["sent"] += 1
            try:
                y = await asyncio.wait_for(router(x), bound_s)
            except asyncio.TimeoutError:
                counts["hung"] += 1
                return
            except Exception as e:
                poisoned = type(e) is ValueError and "poison" in str(e)
                flaky_fault = isinstance(e, RuntimeError) and "random model fault" in str(e)
                if poison and poisoned:
                    counts["failed_clearly"] += 1
                elif not poison and (poisoned or flaky_fault):
                    counts["failed_clearly"] += 1
                    counts["failed_with_batch"] += 1
                else:
                    if isinstance(e, asr.CircuitOpenError):
                        counts["circuit_open_for_healthy"] += 1
                    counts["wrong"] += 1
                return
            ok = not poison and np.array_equal(y, expected_rows(x))
            counts["answered_exactly" if ok else "wrong"] += 1

        async def worker():
            while queue:
                await one(queue.pop())

        await asyncio.gather(*(worker() for _ in range(32)))
        counts["breakers_opened"] = {n: br.opened for n, br in router.breakers.items()}
        healthy_opened = sum(router.breakers[n].opened for n in "abc")
        counts["wrong"] += healthy_opened  # a healthy server's breaker must never open
    return counts


# -- 1 and 12: the process and Ray backends ---------------------------------------------
FAULTS = ["raise_unpicklable", "raise_unloadable", "raise_plain", "return_unpicklable",
          "return_unloadable", "model_unpicklable", "model_unloadable", "model_poison"]


async def chaos_search(start, evaluate):
    """``start = (kind, value, steps)``: ``steps`` requests, then the fault ``kind``."""
    kind, value, steps = start
    total = 0.0
    for i in range(steps):
        y = await evaluate(np.full((1, WIDTH), value + i, np.float32))
        total += float(y[0, 0])
        await asyncio.sleep(0.005)
    if kind.startswith("model_"):
        cue = {"model_unpicklable": UNPICKLABLE, "model_unloadable": UNLOADABLE,
               "model_poison": POISON}[kind]
        await evaluate(np.full((1, WIDTH), cue, np.float32))
    elif kind == "raise_unpicklable":
        raise UnpicklableError(f"search {value} raised an exception holding a lock")
    elif kind == "raise_unloadable":
        raise UnloadableError(value, "an exception that cannot load")
    elif kind == "raise_plain":
        raise ArithmeticError(f"search {value} is cursed")
    elif kind == "return_unpicklable":
        return UnpicklableResult()
    elif kind == "return_unloadable":
        return UnloadableResult()
    return total


def search_expected(value, steps):
    return sum(float(np.float32(3 * (value + i))) for i in range(steps))


def chaos_starts(count: int, seed: int, fault_rate: float):
    rng = np.random.default_rng(seed)
    starts = []
    for i in range(count):
        kind = str(rng.choice(FAULTS)) if rng.random() < fault_rate else "ok"
        starts.append((kind, int(rng.integers(0, 50)), int(rng.integers(3, 12))))
    return starts


def count_searches(starts, out, counts: dict) -> None:
    """An ok start: its exact result, or a clear failure (a batch-mate's model fault, or
    its client died). A faulty start: a clear failure. Clear: it names its start and
    carries the remote traceback, or says its client process or task died."""
    for i, ((kind, value, steps), got) in enumerate(zip(starts, out)):
        counts["sent"] += 1
        if not isinstance(got, BaseException):
            ok = kind == "ok" and got == search_expected(value, steps)
            counts["answered_exactly" if ok else "wrong"] += 1
            continue
        notes = " ".join(getattr(got, "__notes__", ()))
        died = isinstance(got, asr.SearchError) and "did not finish" in str(got)
        traced = (f"start {i}" in notes
                  and "Traceback (most recent call last)" in getattr(
                      got, "remote_traceback", ""))
        if died:
            counts["failed_clearly"] += 1
            counts["lost_with_their_client"] += 1
        elif traced and kind != "ok":
            counts["failed_clearly"] += 1
        elif traced and isinstance(got, (RemoteError, ValueError)):
            # A good search whose request shared a batch (or, in a client, a loop
            # iteration's message) with a cue that made the model raise.
            counts["failed_clearly"] += 1
            counts["failed_with_batch"] += 1
        else:
            counts["wrong"] += 1


async def process_faults_and_sigkill(count: int, seed: int, run_bound_s: float) -> dict:
    counts = tally(lost_with_their_client=0, failed_with_batch=0, killed_pid=None)
    starts = chaos_starts(count, seed, fault_rate=0.15)
    killed = []
    served = [0]

    def kill_one_client(elements: int) -> None:
        """Once ``count`` elements were served (mid-run), SIGKILL client process 1."""
        served[0] += elements
        if killed or served[0] < count:
            return
        for child in multiprocessing.active_children():
            if child.name == "async_search-client-1" and child.pid:
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)
                return

    try:
        out = await asyncio.wait_for(asr.run_searches_async(
            chaos_search, starts, chaos_model, backend="process", num_procs=3,
            max_batch_size=16, return_exceptions=True, progress=kill_one_client),
            run_bound_s)
    except asyncio.TimeoutError:
        counts["sent"] = counts["hung"] = len(starts)
        return counts
    count_searches(starts, out, counts)
    counts["killed_pid"] = killed[0] if killed else None
    counts["faulty_starts"] = sum(kind != "ok" for kind, _, _ in starts)
    return counts


async def ray_actor_kill(count: int, seed: int, run_bound_s: float) -> dict:
    try:
        import ray
    except ImportError:
        return {"skipped": "ray is not installed"}
    from async_search.backends.ray_backend import SERVER_NAME_PREFIX
    from async_search.ray_init import ensure_ray

    ensure_ray()
    counts = tally(lost_with_their_client=0, failed_with_batch=0, actors_killed=0)
    starts = chaos_starts(count, seed, fault_rate=0.05)
    starts = [(kind, value, steps + 20) for kind, value, steps in starts]  # longer runs

    async def killer():
        killed = set()
        deadline = time.monotonic() + run_bound_s
        while len(killed) < 2 and time.monotonic() < deadline:
            names = sorted(n for n in ray.util.list_named_actors()
                           if n.startswith(SERVER_NAME_PREFIX) and n not in killed)
            for name in names[:1]:
                try:
                    actor = ray.get_actor(name)
                    if await actor.elements.remote() > 50 * (len(killed) + 1):
                        ray.kill(actor)
                        killed.add(name)
                except Exception:  # it ended meanwhile
                    pass
            await asyncio.sleep(0.05)
        return len(killed)

    kill = asyncio.ensure_future(killer())
    try:
        out = await asyncio.wait_for(asr.run_searches_async(
            chaos_search, starts, chaos_model, backend="ray", num_procs=2,
            num_servers=3, max_batch_size=16, return_exceptions=True), run_bound_s)
    except asyncio.TimeoutError:
        kill.cancel()
        counts["sent"] = counts["hung"] = len(starts)
        return counts
    kill.cancel()
    try:
        counts["actors_killed"] = await kill
    except asyncio.CancelledError:
        counts["actors_killed"] = out.stats.get("servers_died", 0)
    count_searches(starts, out, counts)
    counts["servers_died"] = out.stats.get("servers_died")
    return counts


# -- HTTP: another helper's; a marked place ----------------------------------------------
def http_hostile(requests: int, seconds: float) -> dict:
    """HOSTILE HTTP TRAFFIC GOES HERE. Calls ``benchmarks/http_load.py``'s
    ``hostile_counts(requests=..., seconds=...)`` (which must return the same five
    counts) when that function exists; otherwise the scenario is skipped with a note."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import http_load
    except Exception as e:  # aiohttp missing, or the script moved
        return {"skipped": f"benchmarks/http_load.py could not be imported: {e!r}"}
    hostile = getattr(http_load, "hostile_counts", None)
    if hostile is None:
        return {"skipped": "benchmarks/http_load.py has no hostile_counts(requests, "
                           "seconds) function yet: hostile HTTP traffic not run"}
    return hostile(requests=requests, seconds=seconds)


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the HTTP server of its
    # hostile stage ends with it (it outlived the run, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--starts", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bound_s", type=float, default=10.0)
    parser.add_argument("--run_bound_s", type=float, default=180.0)
    parser.add_argument("--no_ray", action="store_true")
    args = parser.parse_args()
    for name in ("requests", "starts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        parser.error(f"--seed must be an integer >= 0, got {args.seed}")
    if not all(0 < v < float("inf") for v in (args.bound_s, args.run_bound_s)):
        parser.error(f"--bound_s and --run_bound_s must be finite and more than 0 s, "
                     f"got {args.bound_s} and {args.run_bound_s}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    report = {}
    began = time.perf_counter()

    def timed(name, coro):
        start = time.perf_counter()
        report[name] = asyncio.run(coro)
        report[name]["seconds"] = round(time.perf_counter() - start, 2)

    timed("serve_random_faults", serve_random_faults(args.requests, args.seed,
                                                     args.bound_s))
    timed("cache_dtypes_and_swaps", cache_dtypes_and_swaps(
        waves=max(args.requests // 200, 5), per_wave=50, seed=args.seed,
        bound_s=args.bound_s))
    timed("router_poison", router_poison(max(args.requests // 2, 100), args.seed,
                                         args.bound_s))
    timed("process_faults_and_sigkill", process_faults_and_sigkill(
        args.starts, args.seed, args.run_bound_s))
    if args.no_ray:
        report["ray_actor_kill"] = {"skipped": "--no_ray"}
    else:
        timed("ray_actor_kill", ray_actor_kill(max(args.starts // 4, 20), args.seed,
                                               args.run_bound_s))
    report["http_hostile"] = http_hostile(args.requests, 10.0)
    keys = ("sent", "answered_exactly", "failed_clearly", "hung", "wrong")
    report["total"] = {k: sum(r.get(k, 0) for r in report.values() if isinstance(r, dict))
                       for k in keys}
    report["wall_s"] = round(time.perf_counter() - began, 2)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "results", "benchmarks", "chaos.json")
    write_file(out, text + "\n")


if __name__ == "__main__":
    main()
