"""``CodecPool``: worker processes that decode large JSON bodies and encode large JSON
responses.

A thread would not help: ``json`` and NumPy's list conversion hold the GIL for the whole
call (a large body holds it for a long while), so only another process keeps the event
loop free for small requests meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import sys
from typing import Any, Callable

from async_search.errors import ProtocolError


class _Worker:
    """One codec process, started on its first call: calls go in on its stdin, answers
    come back on a private pipe, each as an 8-byte length and a pickle."""

    def __init__(self):
        self.process: asyncio.subprocess.Process | None = None

    async def call(self, fn: Callable, args: tuple) -> tuple[bool, Any]:
        if self.process is None:
            import async_search

            # The worker imports this package from where the parent found it.
            root = os.path.dirname(os.path.dirname(os.path.abspath(
                async_search.__file__)))
            path = os.environ.get("PYTHONPATH")
            env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, start_new_session=True, env=env)
        message = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.write(_LENGTH.pack(len(message)))
        self.process.stdin.write(message)
        await self.process.stdin.drain()
        (size,) = _LENGTH.unpack(await self.process.stdout.readexactly(_LENGTH.size))
        return pickle.loads(await self.process.stdout.readexactly(size))

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


_LENGTH = struct.Struct("<Q")
#: Added to the codec workers' niceness: parsing megabytes must not starve the loop.
_WORKER_NICENESS = 10


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """Serve calls from stdin until it closes; stray prints go to stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:  # on a busy machine, the event loop's small requests go first
        os.nice(_WORKER_NICENESS)
    except (AttributeError, OSError):
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        head = inp.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        fn, args = pickle.loads(inp.read(_LENGTH.unpack(head)[0]))
        try:
            result = (True, fn(*args))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
            result = (False, e)
        try:
            message = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            message = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        out.write(_LENGTH.pack(len(message)) + message)
        out.flush()


class CodecPool:
    """Worker processes for CPU-heavy codec calls (``python -m`` this module), started
    on first use. Plain subprocesses rather than ``multiprocessing``: nothing re-imports
    the caller's ``__main__`` script, and nothing forks a process that runs threads.

    Args:
        workers: the most processes at once.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._free: asyncio.Condition | None = None
        self._closed = False

    async def run(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` in a worker process (``fn`` and ``args`` must pickle).

        Raises:
            ProtocolError: (503) when the pool is closed or a worker died.
            Whatever ``fn`` raises.
        """
        if self._free is None:
            self._free = asyncio.Condition()
        async with self._free:
            while not self._idle and len(self._all) >= self.workers and not self._closed:
                await self._free.wait()
            if self._closed:
                raise ProtocolError("the server is shutting down", status=503)
            worker = self._idle.pop() if self._idle else _Worker()
            self._all.add(worker)
        # The call runs to its end even if the caller is cancelled: a worker with an
        # unread answer must not take the next call.
        ok, result = await asyncio.shield(asyncio.ensure_future(
            self._call(worker, fn, args)))
        if not ok:
            raise result
        return result

    async def _call(self, worker: _Worker, fn: Callable, args: tuple) -> tuple[bool, Any]:
        try:
            answer = await worker.call(fn, args)
        except Exception as e:  # noqa: BLE001 - a dead or garbled worker is replaced
            worker.kill()
            self._all.discard(worker)
            answer = (False, ProtocolError(
                f"a codec worker process failed ({type(e).__name__}); retry the request",
                status=503))
        else:
            self._idle.append(worker)
        async with self._free:
            self._free.notify()
        return answer

    async def aclose(self, timeout: float) -> None:
        """Stop the workers: idle ones at once, busy ones after at most ``timeout``."""
        self._closed = True
        if self._free is not None:
            async with self._free:
                self._free.notify_all()
        workers = [w for w in self._all if w.process is not None]
        for worker in workers:
            if worker.process.stdin is not None:
                worker.process.stdin.close()
        if workers:
            exits = [asyncio.ensure_future(w.process.wait()) for w in workers]
            _, pending = await asyncio.wait(exits, timeout=timeout)
            for worker in workers:
                worker.kill()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self._all.clear()
        self._idle.clear()


if __name__ == "__main__":  # pragma: no cover
    _worker_main()
