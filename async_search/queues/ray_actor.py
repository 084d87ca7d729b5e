"""Queues between Ray tasks and actors, hosted in an actor.

A ``QueueHost`` actor holds named queues; an ``ActorQueue`` is a QueueLike handle on
one of them that travels to any task or actor. Puts made in one loop iteration leave as
one actor call (``put_many``); ``get_async`` is one long-polling call (``get_many``)
that brings back everything queued at once, so a round trip costs one call each way
whatever the number of messages. A model server actor is itself a ``QueueHost``: its
request queue lives where it is served, one call away from every client. When the host
actor dies, a reader gets ``ClosedConnection`` (from Ray's ``RayActorError``).

With Ray running (so not run in the tests):

```python
q = ray_queue()
q.put(1)
q.get(timeout=5)  # 1
```
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import queue
import uuid
from typing import Any, Deque, Dict, List, Tuple

from async_search.queues.local import LocalQueue
from async_search.queues.protocol import ClosedConnection, is_end, wait_timeout


class HostedQueue(LocalQueue):
    """A queue inside a host actor. Besides a LocalQueue's methods, ``get_batch`` takes
    everything queued at once; its waiters are served strictly in the order they came,
    each with items put after those of the waiter before it, so a reader that awaits
    its batches in the order it asked for them gets every item in order."""

    def __init__(self, maxsize: int = 0):
        super().__init__(maxsize)
        self._batch_waiters: Deque[asyncio.Future] = collections.deque()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        while self._batch_waiters and self._items:
            waiter = self._batch_waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._take_batch())

    def _take_batch(self) -> List[Any]:
        """Everything queued; the end-of-stream marker stays, for every other reader."""
        items = []
        while self._items:
            item = self._items.popleft()
            items.append(item)
            if is_end(item):
                self._items.appendleft(item)
                break
        return items

    def batch_waiter(self) -> asyncio.Future:
        """A future for the next batch, registered now: waiters registered earlier get
        earlier items."""
        waiter = asyncio.get_running_loop().create_future()
        if self._items and not self._batch_waiters:
            waiter.set_result(self._take_batch())
        else:
            self._batch_waiters.append(waiter)
        return waiter

    async def get_batch(self, timeout: float | None = None) -> List[Any]:
        """Everything queued, waiting up to ``timeout`` s for the first item (an empty
        list if none came)."""
        return await self._wait_batch(self.batch_waiter(), timeout)

    async def _wait_batch(self, waiter: asyncio.Future, timeout: float | None) -> List[Any]:
        if not waiter.done():
            await asyncio.wait({waiter}, timeout=timeout)
        if waiter.done():
            return waiter.result()
        self._batch_waiters.remove(waiter)
        waiter.cancel()
        return []


class _Sequence:
    """Puts (or gets) of one handle, applied in the order the handle made them: Ray
    does not keep the order of one caller's calls to an async actor."""

    def __init__(self):
        self.next = 0
        self.parked: Dict[int, asyncio.Future] = {}

    async def turn(self, seq: int) -> None:
        """Returns when every call before ``seq`` has had its turn."""
        if seq != self.next:
            gate = asyncio.get_running_loop().create_future()
            self.parked[seq] = gate
            await gate

    def done(self) -> None:
        """The current call is applied: the next one may go."""
        self.next += 1
        gate = self.parked.pop(self.next, None)
        if gate is not None:
            gate.set_result(None)


class QueueHost:
    """Named queues inside an async actor (``ray.remote(QueueHost)``, or a subclass:
    a server actor hosts its own request and answer queues)."""

    def __init__(self):
        self._queues: Dict[str, HostedQueue] = {}
        self._sequences: Dict[Tuple[str, str, str], _Sequence] = {}

    def hosted(self, name: str) -> HostedQueue:
        """The queue named ``name`` (made on first use), for code inside the actor."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = HostedQueue()
        return q

    def _sequence(self, name: str, kind: str, handle: str) -> _Sequence:
        key = (name, kind, handle)
        sequence = self._sequences.get(key)
        if sequence is None:
            sequence = self._sequences[key] = _Sequence()
        return sequence

    async def put_many(self, name: str, items: List[Any], sender: str | None = None,
                       seq: int = 0) -> None:
        """Puts ``items`` on queue ``name``, in order; with ``sender``, after the
        sender's calls numbered below ``seq``. Returns once they are queued."""
        sequence = None if sender is None else self._sequence(name, "put", sender)
        if sequence is not None:
            await sequence.turn(seq)
        q = self.hosted(name)
        for item in items:
            q.put(item)
        if sequence is not None:
            sequence.done()

    async def get_many(self, name: str, timeout: float | None = None,
                       reader: str | None = None, seq: int = 0) -> List[Any]:
        """Everything queued on ``name`` (waiting up to ``timeout`` s for the first item;
        an empty list if none came). Calls are answered in the order they registered;
        with ``reader``, a reader's calls register in the order of their ``seq``."""
        q = self.hosted(name)
        if reader is None:
            return await q.get_batch(timeout)
        sequence = self._sequence(name, "get", reader)
        await sequence.turn(seq)
        waiter = q.batch_waiter()
        sequence.done()
        return await q._wait_batch(waiter, timeout)

    async def exchange(self, call: Tuple[str, List[Any], str, int, str, str, int],
                       ) -> List[Any]:
        """For ``call = (name, items, sender, seq, reply_name, reader, reply_seq)``:
        ``put_many(name, items, sender, seq)``, then ``get_many(reply_name, None, reader,
        reply_seq)``: a request and the wait for its answers in one call. (One argument:
        Ray serializes each argument of a call on its own, at a cost per argument.)"""
        name, items, sender, seq, reply_name, reader, reply_seq = call
        await self.put_many(name, items, sender, seq)
        return await self.get_many(reply_name, None, reader, reply_seq)

    def queue_size(self, name: str) -> int:
        return self.hosted(name).qsize()


class ActorQueue:
    """A QueueLike handle on the queue ``name`` of a ``QueueHost`` actor.

    Not thread-safe; one reader per handle (its buffer is local). Pickles to its host
    and name, so it can be passed to any Ray task or actor.
    """

    def __init__(self, host: Any, name: str):
        self._host = host
        self._name = name
        self._setup()

    def _setup(self) -> None:
        self._buffer: Deque[Any] = collections.deque()
        self._outgoing: List[Any] = []
        self._scheduled = False
        self._last_put: Any = None
        self._eof = False
        self._replies: ActorQueue | None = None
        self._coming: Deque[Any] = collections.deque()  # refs that will bring our items
        self._id = uuid.uuid4().hex  # this handle's puts and gets are applied in order
        self._put_seq = itertools.count()
        self._get_seq = itertools.count()

    def __getstate__(self) -> dict:
        return {"host": self._host, "name": self._name, "replies": self._replies}

    def __setstate__(self, state: dict) -> None:
        self._host, self._name = state["host"], state["name"]
        self._setup()
        self._replies = state["replies"]

    def with_replies(self, replies: "ActorQueue") -> "ActorQueue":
        """Sends each batch of puts with a wait for ``replies`` (a queue on the same
        host that this process reads) in one call, ``QueueHost.exchange``: for a
        request queue whose every message is answered on ``replies``, a round trip
        costs one call. Returns self."""
        if replies._host != self._host:
            raise ValueError("a queue's replies must be on the same host actor")
        self._replies = replies
        return self

    # -- putting ------------------------------------------------------------------------
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        timeout = wait_timeout(timeout)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            import ray

            ray.get(self._host.put_many.remote(self._name, [item], self._id,
                                              next(self._put_seq)), timeout=timeout)
            return
        self._outgoing.append(item)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def send_pending(self) -> None:
        """Sends this iteration's puts now, as one call, instead of at the end of the
        iteration (for a caller that has put its last message of the iteration)."""
        if self._outgoing:
            self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        items, self._outgoing = self._outgoing, []
        if not items:
            return
        seq = next(self._put_seq)
        replies = self._replies
        if replies is None or replies._eof:
            self._last_put = self._host.put_many.remote(self._name, items, self._id, seq)
        else:
            ref = self._host.exchange.remote((self._name, items, self._id, seq,
                                              replies._name, replies._id,
                                              next(replies._get_seq)))
            replies._coming.append(ref)
            self._last_put = ref

    async def drain(self) -> None:
        """Returns once every put has reached the host (or the host is gone)."""
        if self._outgoing:  # send what waits for the end of this iteration now
            self._flush()
        if self._last_put is None:
            return
        try:  # a sequenced empty put returns once every put before it is queued
            await self._host.put_many.remote(self._name, [], self._id, next(self._put_seq))
        except Exception:  # the host died: nothing to drain to
            pass

    # -- getting ------------------------------------------------------------------------
    def _take(self) -> Any:
        item = self._buffer.popleft()
        if is_end(item):
            self._eof = True
            self._buffer.clear()
            raise ClosedConnection("the stream was closed by its sender")
        return item

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        import ray

        timeout = wait_timeout(timeout)
        if not self._buffer and not self._eof:
            wait = timeout if block else 0.0
            try:
                if self._coming:  # a call made for this reader takes the next items
                    try:
                        batch = ray.get(self._coming[0], timeout=wait)
                    except ray.exceptions.GetTimeoutError:
                        raise queue.Empty from None
                    self._coming.popleft()
                    self._buffer.extend(batch)
                else:
                    self._buffer.extend(ray.get(self._host.get_many.remote(
                        self._name, wait, self._id, next(self._get_seq))))
            except ray.exceptions.RayActorError as e:
                raise ClosedConnection(f"the actor hosting queue {self._name!r} died: "
                                       f"{type(e).__name__}") from e
        if self._eof:
            raise ClosedConnection("the stream was closed by its sender")
        if not self._buffer:
            raise queue.Empty
        return self._take()

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        import ray

        return len(self._buffer) + ray.get(self._host.queue_size.remote(self._name))

    async def get_async(self) -> Any:
        while not self._buffer and not self._eof:
            import ray

            # Items come by the exchanges made for them (in order), else by a long poll.
            ref = self._coming.popleft() if self._coming else (
                self._host.get_many.remote(self._name, None, self._id,
                                           next(self._get_seq)))
            try:
                batch = await ref
            except asyncio.CancelledError:
                # The call goes on in the actor and will take the next items: the next
                # get (or this reader's next exchange) must read them from it.
                self._coming.appendleft(ref)
                raise
            except ray.exceptions.RayActorError as e:
                self._eof = True
                raise ClosedConnection(f"the actor hosting queue {self._name!r} died: "
                                       f"{type(e).__name__}") from e
            self._buffer.extend(batch)
        if self._eof:
            raise ClosedConnection("the stream was closed by its sender")
        return self._take()


def ray_queue(maxsize: int = 0) -> ActorQueue:
    """A queue in a new ``QueueHost`` actor (unbounded: ``maxsize`` must be 0).
    Starts Ray on this machine if it is not running."""
    if maxsize:
        raise ValueError(f"a Ray actor queue is unbounded: maxsize must be 0, got "
                         f"{maxsize!r}")
    from async_search.ray_init import ensure_ray

    ray = ensure_ray()
    host = ray.remote(QueueHost).options(num_cpus=0, max_concurrency=10_000).remote()
    return ActorQueue(host, "queue")
