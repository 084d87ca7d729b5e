"""The evaluate function of searches far from their server: one message per loop iteration.

Requests made in one loop iteration are checked when made, then travel together as one
message (one array) over a connection; the answer is sliced back into each request's
future. Traffic scales with loop iterations, not with requests, and the server sees one
request per message. Used by every backend whose searches are in another process.

Versions come from the server: the client subscribes (``VersionSubscription``) and its
``version`` and ``swap_token`` follow the server's notices, each acknowledged at once, so
that a ``CachedEvaluate`` inside the client sees every swap before the swap returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any, Callable, ClassVar, Dict, Hashable, List, Tuple

import numpy as np

from async_search import rows
from async_search.base import Outputs, TensorSpec
from async_search.checks import check_int
from async_search.coalescing import CoalescedRequests
from async_search.connections import ConnectedFunction, Connection, FifoConnectedFunction
from async_search.deadlines import Deadline, check_timeout, expire_due, track_deadline
from async_search.delivery import ResultDelivery
from async_search.errors import (InputSpecError, ModelOutputError, ServerClosedError,
                                 ServerDiedError)
from async_search.queues import ClosedConnection
from async_search.requests import RequestChecker
from async_search.wire import (Failure, RowsFailed, VersionAck, VersionedRequest,
                               VersionNotice, VersionSubscription, unpack_error)


@dataclasses.dataclass
class Message:
    """The requests of one loop iteration, sent as one array; the receiver of its answer.

    ``pieces[i]`` is request ``tags[i]``'s array (the futures are the tags); ``batch``
    is their concatenation. A message is never split, so its first request never
    continues an earlier one and its last never goes on in a later one. Its answer is
    ``(outputs, version)``, a ``wire.Failure`` or an exception; ``set_result`` and
    ``set_exception`` hand it straight to the requests' futures (a connected function
    resolves a message as it would a future: no future, no callback per message).
    """

    batch: np.ndarray
    tags: List[asyncio.Future]
    pieces: List[np.ndarray]
    on_answer: Callable[["Message", Any], None]
    parts: ClassVar[None] = None  # every request whole (a base.BatchParts)

    def done(self) -> bool:
        return False  # a cancelled caller is skipped when its rows are delivered

    def set_result(self, answer: Any) -> None:
        self.on_answer(self, answer)

    def set_exception(self, error: BaseException) -> None:
        self.on_answer(self, error)

    @classmethod
    def empty(cls) -> "Message":
        """A message to gather some of another's requests in."""
        return cls(np.empty(0), [], [], _no_answer)


def _no_answer(message: Message, answer: Any) -> None:
    raise AssertionError("a message made to gather requests is never sent")


class _Ignored:
    """The receiver of an answer nobody waits for (an acknowledgement's)."""

    __slots__ = ()

    def done(self) -> bool:
        return False

    def set_result(self, result: Any) -> None:
        pass

    def set_exception(self, exception: BaseException) -> None:
        pass


class _Subscribed:
    """The receiver of the answer to the client's ``VersionSubscription``."""

    __slots__ = ("client",)

    def __init__(self, client: "CoalescingClient"):
        self.client = client

    def done(self) -> bool:
        return False

    def set_result(self, answer: Any) -> None:
        if isinstance(answer, tuple) and len(answer) == 2:
            self.client._learn(*answer)
        # else: a server that knows no subscriptions (its answer is an error): the
        # version stays unknown, and a cache in front passes every request through

    def set_exception(self, exception: BaseException) -> None:
        pass


class CoalescingClient(CoalescedRequests):
    """An evaluate function whose requests of one loop iteration leave as one message.

    Args:
        connection: a client end served by ``serve_connection`` (answers in order), or
            a connected function to send messages with (an ``UnorderedConnectedFunction``
            for several servers on one stream).
        input_spec: the model's input spec, to check requests when made (None: learn it
            from the first request).
        where: names the server in errors (``"the serving process"``).
        message_requests: a message leaves as soon as it holds this many requests,
            before the iteration ends (None: one message an iteration). With ``n``
            searches, ``ceil(n / 2)`` sends them in two waves: the server evaluates one
            while this process computes the other, instead of waiting on each round
            trip (``RunConfig.client_waves``).

    Example:
        >>> import async_search as asr
        >>> from async_search.connections import pipe
        >>> from async_search.queues import local_queue
        >>> async def main():
        ...     server_end, client_end = pipe(local_queue)
        ...     serving = asyncio.ensure_future(
        ...         asr.serve_connection(lambda x: 2 * x, server_end))
        ...     client = CoalescingClient(client_end)
        ...     # three requests of one loop iteration: one message
        ...     ys = await asyncio.gather(*(client(np.ones((1, 2))) for _ in range(3)))
        ...     y, version = await client.with_version(np.ones((1, 2)))
        ...     client_end.close()
        ...     await serving
        ...     return ys[0].tolist(), version, client.version  # the server's, as it says
        >>> asyncio.run(main())
        ([[2.0, 2.0]], 0, 0)
    """

    def __init__(self, connection: Connection | ConnectedFunction,
                 input_spec: TensorSpec | None = None, *, where: str = "the server",
                 message_requests: int | None = None):
        self._messages = connection if isinstance(connection, ConnectedFunction) else (
            FifoConnectedFunction(connection))
        self._connection = self._messages.connection
        self._check = RequestChecker(input_spec, relearns=True)
        self._shape, self._dtype = self._check.shape, self._check.dtype
        self._delivery = ResultDelivery()
        self._deadlines: Dict[asyncio.Future, Deadline] = {}  # requests with a timeout
        self._where = where
        #: Requests that make a message leave at once (no limit: sys.maxsize, so that
        #: the hot path compares without a test for None).
        self._message_requests = sys.maxsize if message_requests is None else (
            check_int("message_requests", message_requests, minimum=1))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._xs: List[np.ndarray] = []
        self._futures: List[asyncio.Future] = []
        self._scheduled = False
        self._in_flight = 0
        self._version: Hashable = None  # unknown until the server says
        self._token: Any = None
        self._swaps = -1                # the server's swaps, as last heard
        self._subscribed = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # subscribes with its first message instead
            pass
        else:
            self._subscribe()

    @property
    def num_in_flight(self) -> int:
        """Messages sent and not answered yet."""
        return self._in_flight

    @property
    def version(self) -> Hashable:
        """The version of the model that will answer this client's next request, as
        the server last said (None until its first word: unknown)."""
        return self._version

    @property
    def input_spec(self) -> TensorSpec | None:
        """The spec requests are checked against here: the server's, or the first
        request's once a request of it was answered (None before)."""
        return self._check.spec if self._check.settled else None

    @property
    def swap_token(self) -> Any:
        """An object that changes at every swap the server reports (None while the
        version is unknown): what a cache in front compares, besides the label."""
        return self._token

    async def aclose(self) -> None:
        """Stops listening to the server (the receiver task ends). Requests still
        waiting for an answer, and every later call, fail with ServerClosedError: no
        answer reaches a client that stopped listening."""
        await self._messages.aclose()
        error = ServerClosedError("the client was closed (aclose) before an answer came")
        if self._messages.error is None:
            self._messages.fail_pending(error)  # and refuses every later call
        _, futures = self._take_queued()  # not sent yet
        for fut in futures:
            if not fut.done():
                fut.set_exception(error)

    def _subscribe(self) -> None:
        """Asks the server for its version and for a notice at each swap."""
        self._subscribed = True
        self._messages.listen(self._on_notice)
        try:
            self._messages.submit(VersionSubscription(), _Subscribed(self))
        except Exception:  # the way is gone: the first request will say so
            pass

    def _learn(self, version: Hashable, swaps: int) -> None:
        if swaps > self._swaps:  # a later word than the last one heard
            self._swaps = swaps
            self._version = version
            self._token = object()  # compared by identity: every swap is new

    def _on_notice(self, notice: Any) -> None:
        if not isinstance(notice, VersionNotice):
            return
        self._learn(notice.version, notice.swaps)
        try:  # the swap returns once every client has said that it knows
            self._messages.submit(VersionAck(notice.swaps), _IGNORED)
            self._connection.send_pending()
        except Exception:  # closed or gone: it makes no more requests anyway
            pass

    def __call__(self, x: np.ndarray, timeout: float | None = None,
                 ) -> "asyncio.Future[Outputs]":
        """Queue ``x[n, ...]`` for this iteration's message. ``timeout`` (seconds > 0):
        the request's deadline, kept on this side: past it the future fails with
        RequestTimeoutError and the request's rows are discarded when the answer comes
        (the message left in the iteration it was made; its server computes them)."""
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim:
            x = self._check(x)  # raises, or learns the spec from the first request
            self._shape, self._dtype = self._check.shape, self._check.dtype
        if self._messages.error is not None:
            raise self._messages.error
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._check.settled:
            self._check.note(fut)
        if timeout is not None:
            track_deadline(self._deadlines, fut, check_timeout(timeout),
                           note="; its rows are discarded when they come")
        self._xs.append(x)
        self._futures.append(fut)
        if len(self._futures) >= self._message_requests:
            self._send_queued()  # a wave: it leaves now, the iteration's rest later
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)  # after every search ready in this iteration
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        self._send_queued()

    def _send_queued(self) -> None:
        xs, futures = self._take_queued()  # cancelled or timed-out requests dropped
        if not futures:
            return
        if not self._subscribed:
            self._subscribe()
        message = Message(xs[0] if len(xs) == 1 else np.concatenate(xs), futures, xs,
                          self._answered)
        try:  # several requests: a failing batch of the server fails only its rows
            self._messages.submit(VersionedRequest(message.batch, len(xs) > 1), message)
            self._connection.send_pending()  # this iteration's one message: no wait
        except ServerDiedError as e:
            self._delivery.fail(message, e)
            return
        except ClosedConnection as e:  # the way to the server is gone
            self._delivery.fail(message, ServerDiedError(
                f"could not send a request to {self._where}: {e}"))
            return
        except Exception as e:  # the requests cannot travel (object arrays, say)
            self._delivery.fail(message, InputSpecError(
                f"these requests cannot be sent to {self._where}: "
                f"{type(e).__name__}: {e}"))
            return
        self._in_flight += 1

    def _answered(self, message: Message, answer: Any) -> None:
        self._in_flight -= 1
        try:
            if self._answer(message, answer) and not self._check.settled:
                self._check.settle_by(message.batch)
        except Exception as e:  # a bug here: the message's requests still end, with it
            self._delivery.fail(message, e)

    def _answer(self, message: Message, answer: Any) -> bool:
        """Hands out ``answer``; True when every request of the message got its rows."""
        if self._deadlines:  # rows that came past their request's deadline: discarded
            expire_due(self._deadlines, message.tags)
        if isinstance(answer, RowsFailed):
            self._answered_in_part(message, answer)
            return False
        if isinstance(answer, BaseException):
            error: BaseException | None = answer
        elif isinstance(answer, Failure):  # the model raised, or the request was bad
            error = unpack_error(answer, f"raised in {self._where}")
        elif isinstance(answer, tuple) and len(answer) == 2:
            outputs, version = answer
            error = self._delivery.deliver(message, rows.owned(outputs), version)
        else:
            error = ModelOutputError(f"{self._where} sent a malformed answer "
                                     f"({type(answer).__name__}), not (outputs, version)")
        if error is not None:
            self._delivery.fail(message, error)
        return error is None

    def _answered_in_part(self, message: Message, answer: RowsFailed) -> None:
        """Some of the server's batches that held ``message`` failed (or rows of it
        were refused): the requests with a row in one of them fail, with the error of
        the first failed range they touch; the others get their rows."""
        problem = answer.inconsistency(len(message.batch))
        if problem is not None:  # a broken server: slicing would misplace rows
            self._delivery.fail(message, ModelOutputError(
                f"{self._where} answered a request of {len(message.batch)} rows in "
                f"part, inconsistently: {problem}"))
            return
        # Each row's failed range (its index in answer.failed), -1 for computed rows.
        range_of = np.full(len(message.batch), -1)
        for k, (offset, count) in enumerate(answer.failed):
            range_of[offset:offset + count] = k
        failed = range_of >= 0
        # A computed row's place among the computed ones: its row less the failed before
        failed_before = np.concatenate([[0], np.cumsum(failed)])
        ok, positions, start = Message.empty(), [], 0
        bad: Dict[int, Tuple[Any, Message]] = {}  # by error: it, and the requests it fails
        for tag, piece in zip(message.tags, message.pieces):
            end = start + len(piece)
            touched = range_of[start:end][failed[start:end]]
            if len(touched):
                packed = answer.error_of(int(touched[0]))
                side = bad.setdefault(id(packed), (packed, Message.empty()))[1]
            else:
                side = ok
            side.tags.append(tag)
            side.pieces.append(piece)
            if side is ok:  # its rows' places among the computed ones
                positions.append(np.arange(start, end) - failed_before[start])
            start = end
        for packed, requests in bad.values():
            self._delivery.fail(requests, unpack_error(packed, f"raised in {self._where}"))
        if ok.tags:
            if not answer.computed:  # only 0-row requests are left: as when the whole
                # message fails, they fail with its first error (no outputs to slice)
                self._delivery.fail(ok, unpack_error(answer.error_of(0),
                                                     f"raised in {self._where}"))
                return
            computed = rows.owned(rows.concatenate(
                [outputs for _, outputs in answer.computed]))
            ok.batch = np.concatenate(ok.pieces)
            outputs = rows.take(computed, np.concatenate(positions))
            problem = self._delivery.deliver(ok, outputs, answer.version)
            if problem is not None:
                self._delivery.fail(ok, problem)


_IGNORED = _Ignored()
