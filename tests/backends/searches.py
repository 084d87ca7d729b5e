"""Module-level search functions and model factories, picklable for every backend."""

import asyncio
import itertools
import sys

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.errors import InputSpecError
from async_search.models import MLP, with_spec

PUZZLE = problems.SlidingPuzzle(3)


def manhattan():
    return problems.ManhattanHeuristic(PUZZLE)


def mlp_heuristic():
    return problems.heuristic_mlp(PUZZLE, seed=0)


async def astar(start, evaluate):
    return await search.batched_astar(PUZZLE, start, evaluate, budget=300, buffer_size=4)


def starts(count, moves=12):
    return [PUZZLE.scramble(moves, seed=s) for s in range(count)]


def small_mlp():
    return MLP((3,), hidden_sizes=(8,), output_size=1, seed=0)


#: Seconds ``slow_to_build`` takes to make its model.
BUILD_S = 0.5


def slow_to_build():
    """small_mlp, made in BUILD_S seconds (a net traced for every bucket)."""
    import time

    time.sleep(BUILD_S)
    return small_mlp()


async def echo_sum(start, evaluate):
    """Sequential single-element requests: returns the sum of outputs."""
    total = 0.0
    for i in range(start):
        y = await evaluate(np.full((1, 3), i, np.float32))
        total += float(y[0, 0])
    return total


async def fails_on_three(start, evaluate):
    await evaluate(np.zeros((1, 3), np.float32))
    if start == 3:
        raise ArithmeticError("start 3 is cursed")
    return start


async def wrong_shape_on_two(start, evaluate):
    """echo_sum, except that start 2 asks with rows of 4 values (the model takes 3)."""
    if start == 2:
        await evaluate(np.zeros((1, 4), np.float32))
    return await echo_sum(start, evaluate)


async def outputs_and_version(start, evaluate):
    """One request of ``start`` rows through ``evaluate.with_version``: (rows, version)."""
    y, version = await evaluate.with_version(np.zeros((start, 3), np.float32))
    return y.tolist(), version


def row_sum(x):
    return x.sum(axis=1, keepdims=True)


def sum_model():
    """A model whose output row is the sum of its input row: exact for small integers,
    so that an answer shows which request it was computed for."""
    return with_spec(row_sum, (3,), np.float32)


async def own_answers(start, evaluate, steps=100):
    """``steps`` requests of 1 to 3 rows, each row naming its search and step (``sum_model``
    answers 3 * (1000 * start + step)), made in different loop iterations so that a
    client has several messages in flight. Returns (answers that were not computed
    for their own request, rows requested)."""
    wrong = rows = 0
    for step in range(steps):
        for _ in range((start + step) % 3):
            await asyncio.sleep(0)
        x = np.full((1 + (start + step) % 3, 3), 1000 * start + step, np.float32)
        y = await evaluate(x)
        wrong += not np.array_equal(y, row_sum(x))
        rows += len(x)
    return wrong, rows


async def sequential(search_fn, items, model):
    ev = __import__("async_search").immediate(model)
    return [await search_fn(s, ev) for s in items]


def baseline(search_fn, items, model):
    return asyncio.run(sequential(search_fn, items, model))


async def kill_self_on_two(start, evaluate):
    """Kills its own process (SIGKILL) when given start 2, after one request."""
    import os
    import signal
    await evaluate(np.zeros((1, 3), np.float32))
    if start == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return start


async def slow_echo_sum(start, evaluate):
    """echo_sum, slowed down so that a test can act while it runs."""
    total = 0.0
    for i in range(start):
        y = await evaluate(np.full((1, 3), i, np.float32))
        total += float(y[0, 0])
        await asyncio.sleep(0.05)
    return total


class VersionModel:
    """A model whose every output row is its version: ``model(x) == [[version]] * n``;
    ``with_weights(w)`` is ``VersionModel(w)`` (the weights are the version)."""

    def __init__(self, version=0):
        self.version = version

    def __call__(self, x):
        return np.full((len(x), 1), self.version, np.float32)

    def with_weights(self, weights):
        return VersionModel(weights)


def version_model():
    return VersionModel(0)


class RefusesNegativeWeights(VersionModel):
    """VersionModel whose ``with_weights`` refuses a negative version (weights that do
    not fit the model)."""

    def with_weights(self, weights):
        if weights < 0:
            raise ValueError(f"weights {weights} do not fit")
        return RefusesNegativeWeights(weights)


def refuses_negative_weights():
    return RefusesNegativeWeights(0)


class SwapTimesOut(VersionModel):
    """VersionModel whose ``with_weights`` raises TimeoutError (a weights fetch that
    timed out): the swap fails in the server, which is alive and answering."""

    def with_weights(self, weights):
        raise TimeoutError("fetching the weights timed out")


def swap_times_out():
    return SwapTimesOut(0)


def without_with_weights():
    """A callable model with no ``with_weights``: it cannot take weights, only models."""
    return VersionModel(0).__call__


async def until_version(start, evaluate, stop_version=3, deadline_s=120.0):
    """Requests of 1 to 3 rows through ``evaluate.with_version``, one after another,
    until a result has a row of ``stop_version`` (or ``deadline_s`` passed). Returns a
    record per request: (began, ended, version, lowest row, highest row), the times
    from ``time.monotonic`` (one clock for every process of a machine)."""
    import time

    records = []
    deadline = time.monotonic() + deadline_s
    i = start
    while time.monotonic() < deadline:
        x = np.zeros((1 + i % 3, 3), np.float32)
        i += 1
        began = time.monotonic()
        y, version = await evaluate.with_version(x)
        ended = time.monotonic()
        records.append((began, ended, version, float(y.min()), float(y.max())))
        if y.max() >= stop_version:
            break
    return records


async def die_once(start, evaluate, marker_dir, victim=2):
    """echo_sum, except that start ``victim`` kills its own process (SIGKILL) after one
    request on its first attempt only (a file in ``marker_dir`` remembers it)."""
    import os
    import signal
    await evaluate(np.zeros((1, 3), np.float32))
    marker = os.path.join(marker_dir, f"died-{victim}")
    if start == victim and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return await echo_sum(start, evaluate)


async def endless_on_two(start, evaluate):
    """echo_sum, except that start 2 waits forever (yielding to its loop)."""
    if start == 2:
        await evaluate(np.zeros((1, 3), np.float32))
        await asyncio.Event().wait()
    return await echo_sum(start, evaluate)


async def stuck_on_two(start, evaluate, pid_dir, how="sleep"):
    """echo_sum, except that start 2 writes its process id to ``pid_dir`` and then blocks
    its process: ``how="sleep"`` in a call that never returns, ``"stop"`` by SIGSTOP."""
    import os
    import signal
    import time
    if start == 2:
        await evaluate(np.zeros((1, 3), np.float32))
        with open(os.path.join(pid_dir, "pid"), "w") as f:
            f.write(str(os.getpid()))
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    return await echo_sum(start, evaluate)


async def versions_seen(start, evaluate, requests=40):
    """The model versions that answered ``requests`` one-row requests, one at a time,
    0.05 s apart: a list without repeats, in the order first seen."""
    seen = []
    for _ in range(requests):
        _, version = await evaluate.with_version(np.zeros((1, 3), np.float32))
        if version not in seen:
            seen.append(version)
        await asyncio.sleep(0.05)
    return seen


async def spin_or_wait(start, evaluate):
    """``("spin", s)`` computes for ``s`` seconds of CPU; ``("wait", s)`` sleeps them
    (a client waiting on its round trips); either returns ``s`` after one request."""
    import time

    how, seconds = start
    await evaluate(np.zeros((1, 3), np.float32))
    if how == "spin":
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    else:
        await asyncio.sleep(seconds)
    return seconds


async def returns_an_exception(start, evaluate):
    """Returns (does not raise) an exception: a result like any other."""
    await evaluate(np.zeros((1, 3), np.float32))
    return ValueError(f"a value, not a failure: {start}")


class NoProblems(Exception):
    """An exception that is false: it has a length (its problems), here none."""

    def __len__(self):
        return 0


async def raises_a_false_exception(start, evaluate):
    """Raises ``NoProblems`` (false as a truth value) for start 1, else returns it."""
    await evaluate(np.zeros((1, 3), np.float32))
    if start == 1:
        raise NoProblems("no problems, still raised")
    return start


class Sleepy:
    """``x + 1`` after 20 ms a batch (a model that keeps its device busy)."""

    def __call__(self, x):
        import time

        time.sleep(0.02)
        return x + 1


def sleepy():
    return Sleepy()


async def stuck_in_a_thread(start, evaluate):
    """Blocks 30 s in a thread of its own (asyncio.to_thread): a search timeout stops
    the search, not the thread."""
    import time

    await evaluate(np.zeros((1, 3), np.float32))
    await asyncio.to_thread(time.sleep, 30)
    return start


async def one_request(start, evaluate):
    """One request of its start's value (13's comes half a second after the others',
    in a batch of its own); returns the output."""
    if start == 13:
        await asyncio.sleep(0.5)
    y = await evaluate(np.full((1, 3), start, np.float32))
    return float(y[0, 0])


class StuckOn13:
    """``2 * x``, but a batch holding 13 waits for ``release`` (a model stuck in it)."""

    def __init__(self, release):
        self.release = release

    def __call__(self, x):
        if (x[:, 0] == 13).any():
            self.release.wait(60)
        return 2 * x


class RaisesOnNegative:
    """``2 * x``, but a batch holding a negative value raises (a poisoned input)."""

    def __call__(self, x):
        if (x < 0).any():
            raise ArithmeticError("a negative input")
        return 2 * x


def raises_on_negative():
    return with_spec(RaisesOnNegative(), (3,), np.float32)


class RefusesNegative:
    """``2 * x``; its ``check_values`` refuses negative values (as a JaxModel without
    x64 refuses int64 past int32), so such a request fails when it is made; a batch
    holding 99 fails in the model."""

    input_spec = asr.TensorSpec((3,), np.float32)

    def __call__(self, x):
        assert (x >= 0).all(), "check_values let a negative value through"
        if (x == 99).any():
            raise ArithmeticError("a poisoned input")
        return 2 * x

    def check_values(self, x):
        if (x < 0).any():
            raise InputSpecError("negative values are not taken")


async def exits_on_zero(start, evaluate):
    """echo_sum, except that start 0 calls sys.exit(3) and start 1 raises
    KeyboardInterrupt after a request."""
    import sys

    await evaluate(np.full((1, 3), float(start), np.float32))
    if start == 0:
        sys.exit(3)
    if start == 1:
        raise KeyboardInterrupt
    return await echo_sum(start, evaluate)


async def rows_of_start(start, evaluate):
    """One request of 1 to 3 rows (by the start), each of the start's value; returns the
    first output of each row."""
    rows = abs(start) % 3 + 1
    y = await evaluate(np.full((rows, 3), start, np.float32))
    return y[:, 0].tolist()


class SleepsOn13:
    """``2 * x``, but a batch holding 13 sleeps ``seconds`` (a model stuck in it, in a
    process of its own: nothing to release it but time)."""

    def __init__(self, seconds=60.0):
        self.seconds = seconds

    def __call__(self, x):
        import time

        if (x[:, 0] == 13).any():
            time.sleep(self.seconds)
        return 2 * x


def sleeps_on_13():
    return with_spec(SleepsOn13(), (3,), np.float32)


def raises_when_made():
    raise RuntimeError("no model for you")


class DoesNotLoad:
    """Pickles, but raises when loaded (in the worker that would run it)."""

    def __reduce__(self):
        return (_refuse_to_load, ())


def _refuse_to_load():
    raise RuntimeError("this start cannot be loaded")


async def deaf_on_two(start, evaluate):
    """echo_sum, except that start 2 waits forever and swallows every cancellation."""
    if start == 2:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
    return await echo_sum(start, evaluate)


async def child_then_wait_on_two(start, evaluate, pid_dir):
    """echo_sum, except that start 2 starts a ``sleep`` process, writes its pid to
    ``pid_dir`` and waits forever."""
    import os
    import subprocess
    if start == 2:
        child = subprocess.Popen(["sleep", "3600"])
        with open(os.path.join(pid_dir, "child"), "w") as f:
            f.write(str(child.pid))
        await asyncio.Event().wait()
    return await echo_sum(start, evaluate)


_made = itertools.count()


def inputs_differ():
    """small_mlp, but of 4 inputs for a run's second server: the second model made in
    this process, or the Ray server actor whose name ends in -1."""
    name = None
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        name = sys.modules["ray"].get_runtime_context().get_actor_name()
    second = name.endswith("-1") if name else next(_made) % 2 == 1
    return MLP((4,) if second else (3,), hidden_sizes=(8,), output_size=1, seed=0)
