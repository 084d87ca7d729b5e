"""Connected functions: calls that are requests over a connection, answered by futures.

``FifoConnectedFunction`` / ``UnorderedConnectedFunction``: calling one sends a request
and returns a future. With a queue that can be awaited, responses resolve futures by
themselves; otherwise (or with no running loop at all) ``flush()`` resolves those whose
responses have arrived. A ``Notice`` the server sends is handed to the ``listen``
callback instead of being matched to a request. ``get_connected_functions`` makes
several, with the server's end, as the knossos prototype does.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import queue
import warnings
from typing import Any, Callable, Deque, Dict, Protocol, Sequence, Tuple

from async_search.checks import check_int
from async_search.connections.pipes import (Connection, Notice, PassThroughConnection,
                                            forked_pipe, identity, pipe)
from async_search.errors import ConnectionGoneError
from async_search.queues import ClosedConnection, QueueFactory
from async_search.wire import Failure, unpack_error

class Receiver(Protocol):
    """Where a response goes: a future, or anything with its three methods."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class ConnectedFunction(abc.ABC):
    """A function whose calls are requests over a connection: ``fn(x)`` sends
    ``preprocess_fn(x)`` and returns a future for the response.

    A response that is an exception fails its future with it (a ``wire.Failure``, a
    portable server's exception, fails it with the exception it carries; a receiver
    given to ``submit`` gets the Failure as it came). When the connection can
    be awaited and a loop runs, a receiver task resolves futures as responses arrive
    (it runs while any is pending, or while ``listen`` asks it to; if the stream
    closes, every pending future fails with ConnectionGoneError, a ServerDiedError).
    Otherwise ``flush()`` resolves the futures whose responses have arrived; it also
    works with no running loop at all, as the prototype's do. A ``Notice`` the server
    sends is handed to the ``listen`` callback (dropped when there is none), never
    matched to a request.
    """

    def __init__(self, conn: Connection, preprocess_fn: Callable[[Any], Any] = identity):
        self._conn = conn
        self._preprocess_fn = identity if preprocess_fn is None else preprocess_fn
        self._awaitable = conn.awaitable
        self._receiver: asyncio.Task | None = None
        self._wake: asyncio.Future | None = None  # set while the receiver idles
        self._on_notice: Callable[[Notice], None] | None = None
        #: What every call raises once the connection is unusable (None until then).
        self.error: BaseException | None = None
        self._init()

    def _init(self) -> None:
        """Set-up of a subclass, after ``__init__``."""

    @property
    def connection(self) -> Connection:
        """The connection requests go over."""
        return self._conn

    def __call__(self, inputs: Any) -> asyncio.Future:
        future, running = _new_future()
        self.submit(inputs, future, running)
        return future

    def submit(self, inputs: Any, receiver: Receiver, running: bool = True) -> None:
        """Sends a request whose response goes to ``receiver`` instead of a new future:
        any object with a future's ``done``, ``set_result`` and ``set_exception`` (a
        client that fans one response out to many callers saves a future per message).
        ``running``: whether an event loop runs (to start the receiver task)."""
        if self.error is not None:
            raise self.error
        message = self._send(self._preprocess_fn(inputs), receiver)
        try:
            self._conn.send(message)
        except BaseException:  # not sent (it cannot travel, or the way is gone)
            self._forget_last()
            raise
        if running and self._awaitable:
            self._run_receiver()

    def _run_receiver(self) -> None:
        wake = self._wake
        if wake is not None:
            if not wake.done():
                wake.set_result(True)
        elif self._receiver is None or self._receiver.done():
            self._receiver = asyncio.ensure_future(self._receive())

    def listen(self, on_notice: Callable[[Notice], None]) -> None:
        """Hands every ``Notice`` the server sends to ``on_notice``, and (with a running
        loop and a connection that can be awaited) keeps the receiver task reading
        while nothing is pending, so that notices arrive at once, until the stream ends
        or ``aclose``. Without a loop, ``flush`` hands them over."""
        self._on_notice = on_notice
        if self._awaitable and self.error is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return
            self._run_receiver()

    def flush(self) -> int:
        """Resolves the futures whose responses have arrived (and hands notices to the
        ``listen`` callback); returns how many. If the stream of responses has ended,
        every pending future fails with ConnectionGoneError (and every later call)."""
        count = 0
        try:
            # Until the queue is empty, not while poll() says so: a queue may take the
            # end of its stream in without counting it (a socket queue does).
            while True:
                try:
                    received = self._conn.recv(block=False)
                except queue.Empty:
                    break
                if isinstance(received, Notice):
                    self._notice(received)
                    continue
                if not self._matched(received):
                    break
                count += 1
        except ClosedConnection as e:
            self.fail_pending(_gone(e))
        except Exception as e:  # a response that cannot be read: which is unknown, and
            # a later one would answer the wrong request (as _receive decides)
            self.fail_pending(ConnectionGoneError(
                f"a response could not be read ({e!r}); the connection is unusable"))
        return count

    def _notice(self, notice: Notice) -> None:
        if self._on_notice is None:
            return
        try:
            self._on_notice(notice)
        except Exception as e:  # the callback's fault: the responses still come
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise e from None  # flush without a loop: its caller hears of it
            loop.call_exception_handler({
                "message": f"a listen callback raised on {type(notice).__name__}",
                "exception": e})

    def _matched(self, received: Any) -> bool:
        """Resolves the request ``received`` answers; False (and every pending request
        failed) when it cannot be matched: the stream of responses is unusable."""
        try:
            self._on_recv(received)
        except Exception as e:
            self.fail_pending(ConnectionGoneError(
                f"a response could not be matched to a request ({type(e).__name__}: "
                f"{e}); the connection is unusable"))
            return False
        return True

    def run_while(self, cond: Callable[[], bool]) -> None:
        """Flushes while ``cond()`` is true."""
        while cond():
            self.flush()

    def run_until_complete(self, task: "asyncio.Future") -> Any:
        """Runs ``task``'s loop (not running yet) one pass at a time, flushing between
        passes, until ``task`` is done; returns its result."""
        loop = task.get_loop()
        while not task.done():
            loop.stop()
            loop.run_forever()
            self.flush()
        return task.result()

    @property
    def num_pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)


    async def aclose(self) -> None:
        """Stops the receiver task, if one runs (and listening)."""
        self._on_notice = None
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()
            try:
                await self._receiver
            except asyncio.CancelledError:
                pass

    def fail_pending(self, error: BaseException) -> None:
        """Fails every pending request, and every later call, with ``error``."""
        self.error = error
        for future in self._take_all():
            if not future.done():
                future.set_exception(error)

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending and self._on_notice is None:
                # Searches usually ask again within a loop iteration or two: wait a
                # little for that instead of ending (a task per round trip costs).
                wake = self._wake = loop.create_future()
                timer = loop.call_later(_RECEIVER_IDLE_S, _resolve, wake, False)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
                if not self._pending and self._on_notice is None:
                    return
                continue
            try:
                received = await self._conn.recv_async()
            except ClosedConnection as e:
                self.fail_pending(_gone(e))
                return
            except Exception as e:  # a response that cannot be read: which is unknown
                self.fail_pending(ConnectionGoneError(
                    f"a response could not be read ({e!r}); the connection is unusable"))
                return
            if isinstance(received, Notice):
                self._notice(received)
                continue
            if not self._matched(received):
                return

    _pending: Any

    @abc.abstractmethod
    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        """Remembers ``future``; returns the message to send."""

    @abc.abstractmethod
    def _on_recv(self, received: Any) -> None:
        """Resolves the future that ``received`` answers."""

    @abc.abstractmethod
    def _take_all(self) -> Sequence[asyncio.Future]:
        """Forgets and returns every pending future."""

    @abc.abstractmethod
    def _forget_last(self) -> None:
        """Forgets the request registered last (its message was not sent)."""


#: How long a receiver task with nothing pending waits for a new request before ending.
_RECEIVER_IDLE_S = 0.5


def _gone(closed: ClosedConnection) -> ConnectionGoneError:
    return ConnectionGoneError(f"the server's end of the connection closed ({closed}); "
                               f"the request was not answered")


def _resolve(future: asyncio.Future, response: Any) -> None:
    if future.done():  # the caller was cancelled
        return
    if isinstance(response, BaseException):
        future.set_exception(response)
    elif type(response) is Failure and isinstance(future, asyncio.Future):
        future.set_exception(unpack_error(response, "raised by the server"))
    else:
        future.set_result(response)


def _new_future() -> Tuple[asyncio.Future, bool]:
    """A future on the running loop, else on the thread's current loop (as the
    prototype did); and whether a loop runs."""
    try:
        return asyncio.get_running_loop().create_future(), True
    except RuntimeError:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
    return loop.create_future(), False


class FifoConnectedFunction(ConnectedFunction):
    """Matches responses to requests in order: for a connection served in order."""

    def _init(self) -> None:
        self._pending: Deque[asyncio.Future] = collections.deque()

    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        self._pending.append(future)
        return processed_inputs

    def _on_recv(self, received: Any) -> None:
        _resolve(self._pending.popleft(), received)

    def _take_all(self) -> Sequence[asyncio.Future]:
        pending, self._pending = list(self._pending), collections.deque()
        return pending

    def _forget_last(self) -> None:
        self._pending.pop()


class UnorderedConnectedFunction(ConnectedFunction):
    """Sends ``(uid, request)`` and matches ``(uid, response)`` by uid, in whatever
    order they come back: for several servers (each a ``PassThroughConnection``)."""

    def _init(self) -> None:
        self._send_count = 0
        self._pending: Dict[int, asyncio.Future] = {}

    def _send(self, processed_inputs: Any, future: asyncio.Future) -> Any:
        uid = self._send_count
        self._send_count += 1
        self._pending[uid] = future
        return uid, processed_inputs

    def _on_recv(self, received: Tuple[int, Any]) -> None:
        uid, response = received
        future = self._pending.pop(uid, None)
        if future is not None:
            _resolve(future, response)

    def _take_all(self) -> Sequence[asyncio.Future]:
        pending, self._pending = list(self._pending.values()), {}
        return pending

    def _forget_last(self) -> None:
        self._pending.pop(self._send_count - 1, None)


def get_connected_functions(queue_factory: QueueFactory, num_fns: int, ordered: bool,
                            maxsize: int = 0, preprocess_fn: Callable[[Any], Any] = identity,
                            ) -> Tuple[Tuple[ConnectedFunction, ...], Connection]:
    """``num_fns`` connected functions, and the connection that serves them all.

    Args:
        queue_factory: makes the queues: ``queue.Queue`` (threads),
            ``multiprocessing.Manager().Queue`` (processes), ``queues.ray_queue``, or
            any of ``async_search.queues``' (which can be awaited).
        num_fns: how many client functions.
        ordered: FIFO matching (one server); False: matching by uid, and the server
            connection is a ``PassThroughConnection`` (``copy()`` it for more servers).
        maxsize: the bound of each queue (0: unbounded).
        preprocess_fn: applied to each request before it is sent.

    Example:
        >>> from queue import Queue
        >>> (fn,), server = get_connected_functions(Queue, 1, True)
        >>> f = fn(3); server.send(server.recv() ** 2); n = fn.flush(); f.result()
        9
    """
    if check_int("num_fns", num_fns, minimum=1) == 1:
        server, client = pipe(queue_factory, maxsize)
        clients: Sequence[Connection] = (client,)
    else:
        server, clients = forked_pipe(queue_factory, num_fns, maxsize)
    cls = FifoConnectedFunction if ordered else UnorderedConnectedFunction
    if not ordered:
        server = PassThroughConnection(server)
    return tuple(cls(c, preprocess_fn=preprocess_fn) for c in clients), server
