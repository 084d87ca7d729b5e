"""Pushing new weights to every server of a run while its searches make requests."""

import asyncio
import functools
import time
import weakref

import numpy as np
import pytest

import async_search as asr
from async_search.backends import ModelServers
from async_search.routing.cache import CachedEvaluate
from tests.backends import searches
from tests.backends.searches import VersionModel

pytestmark = pytest.mark.timeout(300)

SEARCHES = 6
MAX_ROWS = 3  # searches.until_version asks for 1 to 3 rows at a time
# Elements computed after a moment of which at least one search made two requests after
# it: each search has at most one request (MAX_ROWS elements) in flight at any moment.
ENOUGH = 2 * SEARCHES * MAX_ROWS + 1


class Computed:
    """The ``progress`` callback: counts elements computed, and waits for more."""

    def __init__(self):
        self.reports = []  # the running total after each call
        self._changed = asyncio.Event()

    def __call__(self, elements: int) -> None:
        self.reports.append((self.reports[-1] if self.reports else 0) + elements)
        self._changed.set()

    async def more_than(self, elements: int, timeout: float = 60) -> None:
        """Returns once ``elements`` elements were computed after this call. Ray reads
        the servers' counts a few times a second, so a report may count elements
        computed before the call: count from the second report after it, whose reading
        began after the first one arrived."""
        first = len(self.reports)

        def enough():
            return (len(self.reports) > first + 2
                    and self.reports[-1] - self.reports[first + 1] >= elements)

        async def wait():
            while not enough():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def at_least(self, elements: int, timeout: float = 60) -> None:
        """Returns once ``elements`` elements were computed in all."""
        async def wait():
            while not self.reports or self.reports[-1] < elements:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    @property
    def total(self) -> int:
        return self.reports[-1] if self.reports else 0


class Trainer:
    """Pushes version 1 (a model), 2 (weights, through ``with_weights``) and 3 (which
    ends the searches), each once ENOUGH elements were computed since the last push;
    keeps when each push began and returned."""

    def __init__(self, computed: Computed):
        self.computed = computed
        self.handle: ModelServers | None = None
        self.began, self.returned = {}, {}

    async def __call__(self, servers: ModelServers) -> None:
        self.handle = servers
        assert servers.version == 0 and servers.num_servers == 2
        for version, model_or_weights in ((1, VersionModel(1)), (2, 2), (3, VersionModel(3))):
            await self.computed.more_than(ENOUGH)
            self.began[version] = time.monotonic()
            await asyncio.wait_for(servers.update_model(model_or_weights, version), 60)
            self.returned[version] = time.monotonic()
            assert servers.version == version


def check_versions(records, trainer: Trainer) -> None:
    """Every request is answered by a version pushed no later than it ended, and by no
    version older than the last push that had returned when it began; its rows are that
    version's outputs."""
    phases = set()
    for began, ended, version, low_row, high_row in records:
        low = max([0] + [v for v, t in trainer.returned.items() if t < began])
        high = max([0] + [v for v, t in trainer.began.items() if t < ended])
        assert low <= low_row <= high_row <= high, (began, ended, version, low, high)
        if version is not None:
            assert low_row == high_row == version
        if low == high:  # no push while it was served: one version computed it all
            assert version == low
        phases.add((low, high) if low == high else "during")
    # The run covered requests before the first push and after each push.
    assert {(0, 0), (1, 1), (2, 2)} <= phases


async def test_no_request_made_after_a_push_is_answered_by_older_weights(backend):
    computed = Computed()
    trainer = Trainer(computed)
    out = await backend.run_async(
        searches.until_version, list(range(SEARCHES)), searches.version_model,
        num_servers=2, max_batch_size=4, progress=computed, on_servers=trainer,
        timeout=240)
    assert trainer.returned.keys() == {1, 2, 3}
    for records in out:  # every search saw the last version, then stopped
        assert records[-1][4] == 3
    check_versions([r for records in out for r in records], trainer)
    assert [server["version"] for server in out.stats["servers"]] == (
        [3, 3] if backend.name == "ray" else [3])
    with pytest.raises(RuntimeError, match="has ended"):
        await trainer.handle.update_model(VersionModel(4), 4)
    assert trainer.handle.closed and trainer.handle.version == 3


def test_on_servers_gets_a_handle_before_the_searches_and_it_closes_after(backend):
    seen = []

    def on_servers(servers):
        seen.append((servers.version, servers.num_servers, servers.backend,
                     servers.closed))
        handles.append(servers)

    handles = []
    out = backend.run(searches.echo_sum, [3] * 4, searches.small_mlp, num_servers=2,
                      on_servers=on_servers)
    assert out == searches.baseline(searches.echo_sum, [3] * 4, searches.small_mlp())
    assert seen == [(0, 2, backend.name, False)]
    assert handles[0].closed


async def test_every_worker_of_a_local_server_takes_the_weights():
    async def search(start, evaluate):
        await servers_pushed.wait()
        ys = await asyncio.gather(*(evaluate.with_version(np.zeros((1, 3), np.float32))
                                    for _ in range(16)))
        return {(float(y.item()), version) for y, version in ys}

    async def push(servers):
        await servers.update_model(7, version=7)  # weights: with_weights on each worker
        servers_pushed.set()

    servers_pushed = asyncio.Event()
    out = await asyncio.wait_for(asr.run_searches_async(
        search, list(range(8)), searches.version_model, num_servers=3, max_batch_size=2,
        on_servers=push), 60)
    assert set().union(*out) == {(7.0, 7)}
    assert out.stats["batches"] >= 3


async def test_an_on_servers_task_that_raises_ends_the_run_with_its_error(backend):
    async def trainer(servers):
        await servers.update_model(VersionModel(1), 1)
        raise KeyError("the trainer broke")

    # The searches would run for two minutes (stop_version is never pushed): the run
    # must end at once with the trainer's error, well before the wait_for.
    with pytest.raises(KeyError, match="the trainer broke"):
        await backend.run_async(searches.until_version, [0, 1], searches.version_model,
                                num_procs=1, on_servers=trainer, timeout=60)


def test_on_servers_that_raises_fails_the_run_before_any_search():
    started = []

    async def search(start, evaluate):
        started.append(start)

    def broken(servers):
        raise ZeroDivisionError("no servers for you")

    with pytest.raises(ZeroDivisionError, match="no servers for you"):
        asr.run_searches(search, [1, 2], searches.small_mlp, on_servers=broken)
    assert started == []
    with pytest.raises(TypeError, match="on_servers must be a callable"):
        asr.run_searches(search, [1], searches.small_mlp, on_servers="trainer")


async def test_weights_the_model_cannot_take_fail_the_push_and_the_run_goes_on(backend):
    errors = []

    async def trainer(servers):
        try:
            await servers.update_model([np.zeros(3)], version=1)
        except TypeError as e:
            errors.append((str(e), servers.version))
        await servers.update_model(VersionModel(3), version=3)

    out = await backend.run_async(searches.until_version, [0, 1],
                                  searches.without_with_weights, on_servers=trainer,
                                  timeout=60)
    assert len(errors) == 1 and "pass a new model instead" in errors[0][0]
    assert errors[0][1] == 0  # the failed push left the version as it was
    assert all(records[-1][4] == 3 for records in out)


# -- a cache inside each client: the two promises on every backend ---------------------
#: One table per client (the evaluate it was given), shared by its searches, so that a
#: search joins another's request in flight as well as hitting the table.
_CLIENT_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
KEYS = 4  # every search asks for the same few elements: hits, and joins in flight


def client_cache(evaluate) -> CachedEvaluate:
    cache = _CLIENT_CACHES.get(evaluate)
    if cache is None:
        cache = _CLIENT_CACHES[evaluate] = CachedEvaluate(evaluate, capacity=64)
    return cache


async def cached_until_version(start, evaluate, stop_version=None, requests=None,
                               after_stop=40, deadline_s=120.0):
    """Requests of one of KEYS elements through the client's cache, one after another,
    until a row shows ``stop_version`` (then ``after_stop`` more: hits, the model no
    longer changing), or until ``requests`` were made. Returns (records, cache stats):
    a record per request, (began, ended, version, row), the times from
    ``time.monotonic`` (one clock for every process of a machine)."""
    cached = client_cache(evaluate)
    records = []
    deadline = time.monotonic() + deadline_s
    i = start
    left = None  # requests left once the stop version was seen
    while time.monotonic() < deadline and (requests is None or len(records) < requests):
        x = np.full((1, 3), i % KEYS, np.float32)
        i += 1
        began = time.monotonic()
        y, version = await cached.with_version(x)
        records.append((began, time.monotonic(), version, float(y[0, 0])))
        if left is None and stop_version is not None and y[0, 0] >= stop_version:
            left = after_stop
        if left is not None:
            if not left:
                break
            left -= 1
        await asyncio.sleep(0)  # a hit never waits: let the others (and pushes) run
    return records, cached.stats


PUSHES = 50


class RapidTrainer:
    """Pushes versions 1 to PUSHES, each a new model, one right after the other: the
    next as soon as the searches had an element computed after the last (their cache
    misses each new version's elements); keeps when each push returned."""

    def __init__(self, computed: Computed):
        self.computed = computed
        self.returned = {}

    async def __call__(self, servers: ModelServers) -> None:
        await self.computed.at_least(1)  # the searches run
        for version in range(1, PUSHES + 1):
            before = self.computed.total
            await asyncio.wait_for(servers.update_model(VersionModel(version), version), 60)
            self.returned[version] = time.monotonic()
            await self.computed.at_least(before + 1)


async def test_a_cache_in_a_client_serves_no_older_version_once_a_push_returned(backend):
    computed = Computed()
    trainer = RapidTrainer(computed)
    out = await backend.run_async(
        functools.partial(cached_until_version, stop_version=PUSHES), list(range(6)),
        searches.version_model, num_servers=2, max_batch_size=4, progress=computed,
        on_servers=trainer, timeout=240)
    assert trainer.returned.keys() == set(range(1, PUSHES + 1))
    records = [r for records, _ in out for r in records]
    for began, ended, version, row in records:
        # Every row (from the table, a request joined, or the server) was computed by
        # a version no older than the last push that had returned when it was asked.
        low = max([0] + [v for v, t in trainer.returned.items() if t < began])
        assert row >= low, (began, ended, version, row, low)
        assert version is None or version == row
    stats = [s for _, s in out]
    assert sum(s["hits"] for s in stats) > 0  # the table served, swaps or not
    assert sum(s["invalidations"] for s in stats) > 0  # and saw the swaps


async def test_a_cache_in_a_client_hits_where_the_local_backend_hits(backend):
    # Before, process clients hit 0 times of 3,200 (the table's label was the client's
    # version, None, while every answer came labelled 0), the local backend 3,158.
    out = await backend.run_async(
        functools.partial(cached_until_version, requests=400), [0, 1],
        searches.version_model, num_servers=2, timeout=120)
    assert all(row == 0 for records, _ in out for *_, row in records)
    for _, stats in out:  # its client's table when the search ended
        # (a client's first request or two go around it: the version is not known yet)
        assert stats["lookups"] >= 390 and stats["hits"] >= 0.9 * stats["lookups"]
