"""serve(model, devices=[...]): one device worker per device, each with its own copy.

The devices are CPU "devices" with names; the model is a fake ``DeviceModel`` that
records which copy (device) computed each batch in which thread.
"""

import asyncio
import threading

import numpy as np
import pytest

import async_search as asr
from async_search.base import DeviceModel
from async_search.servers import BatchingServer
from tests.helpers import wait_until, within

pytestmark = pytest.mark.timeout(60)


class Placed:
    """``x * weight`` on a named device; copies share one log of what ran where."""

    batch_tolerance = 0.0

    def __init__(self, weight=1.0, device="host", log=None, barrier=None):
        self.input_spec = asr.TensorSpec((1,), np.float32)
        self.weight, self.device = weight, device
        self.log = log if log is not None else []
        self.barrier = barrier  # the first batch on each device waits for the others
        self._lock = threading.Lock()

    def on_device(self, device):
        self.log.append(("copy", self.weight, device))
        return Placed(self.weight, device, self.log, self.barrier)

    def with_weights(self, weight):
        self.log.append(("weights", weight, self.device))
        return Placed(weight, self.device, self.log, self.barrier)

    def load(self):
        self.log.append(("load", self.weight, self.device))

    def unload(self):
        self.log.append(("unload", self.weight, self.device))

    def __call__(self, x):
        if self.barrier is not None:
            barrier, self.barrier = self.barrier, None
            barrier.wait(10)  # every device has a batch at once
        self.log.append(("run", self.weight, self.device, threading.current_thread().name))
        return x * self.weight


def runs(log):
    return [entry for entry in log if entry[0] == "run"]


async def test_each_device_runs_its_own_copy_in_its_own_thread():
    log = []
    model = Placed(2.0, log=log, barrier=threading.Barrier(3))
    assert isinstance(model, DeviceModel)
    devices = ["cpu:0", "cpu:1", "cpu:2"]
    async with asr.serve(model, max_batch_size=2, devices=devices) as evaluate:
        xs = [np.full((1, 1), i, np.float32) for i in range(30)]
        ys = await within(asyncio.gather(*(evaluate(x) for x in xs)), "the answers")
        stats = evaluate.stats
    assert [y.item() for y in ys] == [2.0 * i for i in range(30)]
    assert [e for e in log if e[0] == "copy"] == [("copy", 2.0, d) for d in devices]
    assert stats["workers"] == 3 and stats["devices"] == devices
    by_thread = {}
    for _, _, device, thread in runs(log):
        by_thread.setdefault(thread, set()).add(device)
    assert len(by_thread) == 3 and all(len(d) == 1 for d in by_thread.values())
    assert set().union(*by_thread.values()) == set(devices)  # every device computed
    # Each copy loaded and unloaded once, in its own thread; the original never ran.
    assert sorted(e[2] for e in log if e[0] == "load") == devices
    assert sorted(e[2] for e in log if e[0] == "unload") == devices
    assert "host" not in {e[2] for e in log if e[0] in ("run", "load")}


async def test_update_model_reaches_every_copy():
    log = []
    devices = ["cpu:0", "cpu:1"]
    async with asr.serve(Placed(1.0, log=log), max_batch_size=1,
                         devices=devices) as evaluate:
        x = np.ones((1, 1), np.float32)
        evaluate.update_model(3.0, version="w3")  # weights: each copy's with_weights
        assert sorted(e for e in log if e[0] == "weights") == [
            ("weights", 3.0, d) for d in devices]
        ys = await within(asyncio.gather(*(evaluate.with_version(x)
                                           for _ in range(20))), "answers")
        assert {(y.item(), v) for y, v in ys} == {(3.0, "w3")}

        log.clear()
        new = Placed(5.0, log=log)  # a new model: placed on each device
        evaluate.update_model(new, version="m5")
        assert [e for e in log if e[0] == "copy"] == [("copy", 5.0, d) for d in devices]
        assert evaluate.model.device == "cpu:0" and evaluate.model is not new
        ys = await within(asyncio.gather(*(evaluate.with_version(x)
                                           for _ in range(20))), "answers")
        assert {(y.item(), v) for y, v in ys} == {(5.0, "m5")}
    assert {e[2] for e in runs(log)} <= set(devices)  # never the unplaced new model


async def test_a_model_that_cannot_be_placed_is_refused_and_nothing_is_swapped():
    before = set(threading.enumerate())
    with pytest.raises(TypeError, match="has no on_device"):
        async with asr.serve(lambda x: x, devices=["cpu:0"]):
            pass
    assert set(threading.enumerate()) == before  # no thread started
    async with asr.serve(Placed(1.0), devices=["cpu:0", "cpu:1"]) as evaluate:
        with pytest.raises(TypeError, match="has no on_device"):
            evaluate.update_model(lambda x: x * 7, version=1)
        assert evaluate.version == 0
        y = await within(evaluate(np.ones((1, 1), np.float32)), "an answer")
    assert y.item() == 1.0


async def test_a_worker_added_on_a_device_gets_the_current_models_copy():
    log = []
    async with asr.serve(Placed(2.0, log=log), devices=["cpu:0"]) as evaluate:
        evaluate.update_model(4.0, version=1)
        await evaluate.add_worker(device="cpu:1")
        assert evaluate.num_workers == 2
        assert ("copy", 4.0, "cpu:1") in log
        await evaluate.remove_worker()
        y = await within(evaluate(np.ones((1, 1), np.float32)), "an answer")
    assert y.item() == 4.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(devices=[]), "devices must name at least one device"),
    (dict(devices=[None, None]), r"must name each device \(None is none\)"),
    (dict(devices=["cpu:0", None]), r"must name each device \(None is none\)"),
    (dict(devices=["cpu:0"], num_workers=2), "leave num_workers out"),
    (dict(devices=["cpu:0"], model_thread=False), "devices need device threads"),
])
def test_devices_are_checked_when_the_server_is_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchingServer(Placed(), **kwargs)


async def test_one_device_runs_its_copy_never_the_original():
    """model_thread="auto" with one device: wherever a batch runs, it runs the copy."""
    log = []
    async with asr.serve(Placed(3.0, log=log), devices=["cpu:0"]) as evaluate:
        for i in range(10):
            y = await within(evaluate(np.full((1, 1), i, np.float32)), "an answer")
            assert y.item() == 3.0 * i
        await wait_until(lambda: len(runs(log)) == 10, "ten batches")
    assert {e[2] for e in runs(log)} == {"cpu:0"}


async def test_stats_name_the_devices_of_the_workers_serving_now_and_at_close():
    async with asr.serve(Placed(2.0), devices=["cpu:0", "cpu:1"]) as evaluate:
        await evaluate.add_worker(device="cpu:2")
        assert evaluate.stats["devices"] == ["cpu:0", "cpu:1", "cpu:2"]
        await within(evaluate.remove_worker(), "a removal")
        assert len(evaluate.stats["devices"]) == evaluate.stats["workers"] == 2
    assert len(evaluate.stats["devices"]) == evaluate.stats["workers"] == 2
    async with asr.serve(Placed(2.0), model_thread=True) as evaluate:  # none placed
        assert "devices" not in evaluate.stats


class _Broken(Placed):
    """A ``Placed`` whose copies on ``bad`` (or whose ``with_weights`` given ``bad``)
    come back as ``made`` instead of a model of its input."""

    def __init__(self, made, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made = made

    def on_device(self, device):
        if device == "bad":
            return self.made
        return _Broken(self.made, self.weight, device, self.log)

    def with_weights(self, weight):
        if weight == "bad":
            return self.made
        return _Broken(self.made, weight, self.device, self.log)


def _wider():
    wide = Placed()
    wide.input_spec = asr.TensorSpec((2,), np.float32)
    return wide


@pytest.mark.parametrize("made, error, message", [
    (None, TypeError, r"on_device\('bad'\) must return a model \(a callable\), got NoneType"),
    (_wider(), ValueError, r"takes \[n, 2\] float32, where the model takes \[n, 1\] float32"),
])
async def test_a_copy_that_is_no_model_of_the_input_is_refused_where_it_is_made(
        made, error, message):
    # A copy returning None (or taking other rows) was installed as it was: its device's
    # batches then failed, some requests and not others, with "'NoneType' object is not
    # callable" (or an InputSpecError for rows the server had accepted).
    before = set(threading.enumerate())
    with pytest.raises(error, match=message):
        async with asr.serve(_Broken(made), devices=["cpu:0", "bad"]):
            pass
    assert set(threading.enumerate()) == before  # nothing started
    async with asr.serve(_Broken(made), devices=["cpu:0"]) as evaluate:
        with pytest.raises(error, match=message):
            await evaluate.add_worker(device="bad")
        assert evaluate.num_workers == 1
        evaluate.update_model(3.0, version=1)
        with pytest.raises(error, match=message.replace(r"on_device\('bad'\)", "with_weights")):
            evaluate.update_model("bad", version=2)  # every copy's weights: none swapped
        ys = await within(asyncio.gather(*(evaluate.with_version(np.ones((1, 1), np.float32))
                                           for _ in range(8))), "answers")
    assert {(y.item(), v) for y, v in ys} == {(3.0, 1)}
