"""``CodecPool``: worker processes that decode large JSON bodies and encode large JSON
responses.

A thread would not help: ``json`` and NumPy's list conversion hold the GIL for the whole
call (a large body holds it for a long while), so only another process keeps the event
loop free for small requests meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import os
import pickle
import signal
import struct
import subprocess
import sys
from typing import Any, Callable, Dict, Mapping

from async_search.errors import ProtocolError
from async_search.machine import open_file_limit


def worker_environment(root: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """The codec worker's environment: ``root`` (the folder holding the package) first on
    its PYTHONPATH, unless the worker's Python finds it there anyway (an installed
    package's site-packages: put on PYTHONPATH, it would come before the standard
    library, and a module there could shadow one of the library's)."""
    import site

    sites = site.getsitepackages() + [site.getusersitepackages()]
    if os.path.abspath(root) in {os.path.abspath(p) for p in sites}:
        return dict(environ)
    path = environ.get("PYTHONPATH")
    return {**environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class _Worker:
    """One codec process, started on its first call: calls go in on its stdin, answers
    come back on a private pipe, each as an 8-byte length and a pickle."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self._stdin: asyncio.StreamWriter | None = None
        self._stdout: asyncio.StreamReader | None = None
        self._stdout_transport: asyncio.ReadTransport | None = None

    async def _start(self) -> None:
        import async_search

        # The worker imports this package from where the parent found it.
        root = os.path.dirname(os.path.dirname(os.path.abspath(async_search.__file__)))
        env = worker_environment(root, os.environ)
        # Popen, not the loop's subprocess_exec: a start that fails (EMFILE under a low
        # ulimit -n) closes every descriptor it opened, where uvloop's left two socket
        # pairs open for good, until no worker could start at all.
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True, env=env)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        self._stdout_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self.process.stdout)
        self._stdout = reader
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, self.process.stdin)
        self._stdin = asyncio.StreamWriter(transport, protocol, None, loop)

    async def call(self, fn: Callable, args: tuple) -> tuple[bool, Any]:
        if self.process is None:
            await self._start()
        message = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self._stdin.write(_LENGTH.pack(len(message)))
        self._stdin.write(message)
        await self._stdin.drain()
        (size,) = _LENGTH.unpack(await self._stdout.readexactly(_LENGTH.size))
        return pickle.loads(await self._stdout.readexactly(size))

    def close_input(self) -> None:
        """Close its stdin: the worker exits once its call in progress is answered."""
        if self._stdin is not None:
            self._stdin.close()
        elif self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()

    def kill(self) -> None:
        """Kill it and close its pipes; its exit is collected without blocking."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            # Its exit collected (a zombie otherwise), off the loop: SIGKILL ends it
            # at once.
            asyncio.get_running_loop().run_in_executor(None, process.wait)
        self.close_input()
        if self._stdout_transport is not None:  # it closes the file it was given
            self._stdout_transport.close()
        elif process.stdout is not None:
            process.stdout.close()

    async def exited(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.wait)


def _failure(error: Exception) -> ProtocolError:
    """The 503 that answers a call whose worker failed or could not start."""
    if isinstance(error, OSError) and error.errno == errno.ENFILE:
        return ProtocolError("a codec worker process could not start: the system's "
                             "table of open files is full; retry the request or send "
                             "the tensor as binary data", status=503)
    if isinstance(error, OSError) and error.errno == errno.EMFILE:
        return ProtocolError(
            f"a codec worker process could not start: the server is out of file "
            f"descriptors (its open-file limit, ulimit -n, is {open_file_limit()}); retry "
            f"the request, send the tensor as binary data, or raise ulimit -n",
            status=503)
    return ProtocolError(f"a codec worker process failed ({type(error).__name__}); "
                         f"retry the request", status=503)


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
            answer = (False, _failure(e))
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
            worker.close_input()
        if workers:
            exits = [asyncio.ensure_future(w.exited()) for w in workers]
            _, pending = await asyncio.wait(exits, timeout=timeout)
            for worker in workers:
                worker.kill()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self._all.clear()
        self._idle.clear()


if __name__ == "__main__":  # pragma: no cover
    _worker_main()
