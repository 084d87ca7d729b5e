"""Queues between Ray tasks and actors: hosted in an actor, puts batched per iteration.

A ``QueueHost`` actor holds named queues; an ``ActorQueue`` is a QueueLike handle on
one of them that travels to any task or actor. Puts made in one loop iteration leave as
one actor call (``put_many``); ``get_async`` is one long-polling call (``get_many``)
that brings back everything queued at once, so a round trip costs one call each way
whatever the number of messages. A model server actor is itself a ``QueueHost``: its
request queue lives where it is served, one call away from every client.

When the host actor dies, a reader gets ``ClosedConnection``.

    >>> q = ray_queue()                      # doctest: +SKIP
    >>> q.put(1); q.get(timeout=5)           # doctest: +SKIP
    1
"""

from __future__ import annotations

import asyncio
import collections
import queue
from typing import Any, Deque, Dict, List

from async_search.queues.local import LocalQueue
from async_search.queues.protocol import ClosedConnection, is_end

__all__ = ["QueueHost", "ActorQueue", "ray_queue"]


class QueueHost:
    """Named queues inside an async actor (``ray.remote(QueueHost)``, or a subclass:
    a server actor hosts its own request and answer queues)."""

    def __init__(self):
        self._queues: Dict[str, LocalQueue] = {}

    def hosted(self, name: str) -> LocalQueue:
        """The queue named ``name`` (made on first use), for code inside the actor."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = LocalQueue()
        return q

    def put_many(self, name: str, items: List[Any]) -> None:
        """Puts ``items`` on queue ``name``, in order."""
        q = self.hosted(name)
        for item in items:
            q.put(item)

    async def get_many(self, name: str, timeout: float | None = None) -> List[Any]:
        """Everything queued on ``name`` (waiting up to ``timeout`` s for the first item;
        an empty list if none came). The end-of-stream marker stays queued, so that
        every reader sees it."""
        q = self.hosted(name)
        try:
            items = [await asyncio.wait_for(q.get_async(), timeout)]
        except asyncio.TimeoutError:
            return []
        while q.qsize() and not is_end(items[-1]):
            items.append(q.get_nowait())
        if is_end(items[-1]):
            q.put(items[-1])
        return items

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

    def __getstate__(self) -> dict:
        return {"host": self._host, "name": self._name}

    def __setstate__(self, state: dict) -> None:
        self._host, self._name = state["host"], state["name"]
        self._setup()

    # -- putting ------------------------------------------------------------------------
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            import ray

            ray.get(self._host.put_many.remote(self._name, [item]), timeout=timeout)
            return
        self._outgoing.append(item)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def _flush(self) -> None:
        self._scheduled = False
        items, self._outgoing = self._outgoing, []
        if items:
            self._last_put = self._host.put_many.remote(self._name, items)

    async def drain(self) -> None:
        """Returns once every put has reached the host (or the host is gone)."""
        while self._scheduled:
            await asyncio.sleep(0)
        if self._last_put is not None:
            try:
                await self._last_put
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

        if not self._buffer and not self._eof:
            wait = (timeout if timeout is not None else None) if block else 0.0
            try:
                self._buffer.extend(ray.get(self._host.get_many.remote(self._name, wait)))
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
        if not self._buffer and not self._eof:
            import ray

            try:
                self._buffer.extend(await self._host.get_many.remote(self._name))
            except ray.exceptions.RayActorError as e:
                self._eof = True
                raise ClosedConnection(f"the actor hosting queue {self._name!r} died: "
                                       f"{type(e).__name__}") from e
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
