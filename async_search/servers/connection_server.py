"""Serving connections: requests from clients elsewhere, batched by one BatchingServer.

Every payload received on a connection gets exactly one answer, sent back in the order
received (so FIFO clients, forked pipes and pass-through keys all match them):

- ``x`` (an array ``[n, ...]``): answered with the outputs, or with the exception when
  the request failed (a bad request, a model that raised).
- ``VersionedRequest(x)``: answered with ``(outputs, version)``, the model version that
  computed them (None when the request was split across batches while the model was
  swapped). A ``rowwise`` one (several callers' rows) split across batches of which
  some failed is answered with a ``wire.RowsFailed``: the rows computed, and the
  row ranges that failed with the error.
- ``ModelUpdate(model, version)``: swaps the model; answered with ``version`` once
  swapped and every subscribed client has learned it, or with the exception (serving
  goes on with the old model).
- ``VersionSubscription()``: the client wants to hear of every swap; answered with
  ``(version, swaps)``, the version that answers its next request and the number of
  swaps so far. From then on each swap sends it a ``VersionNotice(version, swaps)``
  (a ``connections.Notice``: outside the order of answers), which it acknowledges with
  ``VersionAck(swaps)`` (answered with None).

A connection is served until its stream ends: its clients closed it, or the process at
the other end is gone; then the server closes its own end (its client's calls fail at
once instead of waiting for an answer that cannot come). Every request received after
an update runs on the new model; requests received before it may run on either (a
batch that a device thread has started finishes on the old one).

Versions across processes: a client in another process (``backends.CoalescingClient``)
reports the version that will answer its next request, and a cache inside it must never
serve an older version's result once a swap has returned. So a swap made through
``ConnectionServer.update_model`` (or a ``ModelUpdate`` message) returns only once every
subscribed client has acknowledged its notice: a request made after it returned, in any
process, is made by a client that knows. A client that does not acknowledge within
``ack_timeout`` seconds (stopped, or its loop blocked) has its stream of answers closed:
its requests fail with ``ConnectionGoneError`` rather than risk an older version's
answer. A swap made on the BatchingServer directly reaches no client: swap through the
ConnectionServer.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import pickle
from typing import Any, Callable, Deque, Dict, Hashable, List, Sequence, Set, Tuple, Union

import numpy as np

from async_search.batchers import Batcher
from async_search.checks import check_float
from async_search.connections import Connection, ForkedConnection, PassThroughConnection
from async_search.errors import MalformedMessageError, ModelOutputError, ServerClosedError
from async_search.queues import ClosedConnection
from async_search.servers.batching import BatchingServer
from async_search.servers.policy import DispatchPolicy
from async_search.wire import (Control, ModelUpdate, RowsFailed, VersionAck,
                               VersionedRequest, VersionNotice, VersionSubscription,
                               pack_error, plain_outputs, round_trips)


#: Seconds a swap waits for a subscribed client to acknowledge it before closing that
#: client's stream of answers.
ACK_TIMEOUT_S = 30.0


#: What a queue's put raises for an answer that does not pickle (nothing is sent).
_UNSENDABLE = (pickle.PicklingError, TypeError, AttributeError)


async def serve_connection(model: Union[Any, BatchingServer],
                           connection: Union[Connection, Sequence[Connection]], *,
                           policy: DispatchPolicy = DispatchPolicy(),
                           batcher: Batcher | None = None, portable: bool = False) -> dict:
    """Serves the payloads received on ``connection`` (or on each of several) until
    every stream has ended; returns the server's stats.

    Every request joins the batches of one BatchingServer in this loop, whichever
    connection it came on; each answer goes back on its own connection, in order (see
    the module docstring for the messages and their answers).

    Args:
        model: the model to serve (a BatchingServer is made and closed here), or a
            running BatchingServer to serve with (its owner closes it).
        connection: a server end (``forked_pipe``'s, a ``PassThroughConnection``...), or
            several, served together.
        policy, batcher: how batches are made (when a model is given).
        portable: make every answer travel to another process: an exception becomes a
            ``wire.Failure`` (which always pickles), and outputs holding objects that
            do not survive pickling fail with ModelOutputError.

    Example:
        >>> from async_search.connections import get_connected_functions
        >>> from async_search.queues import local_queue
        >>> async def main():
        ...     fns, server_end = get_connected_functions(local_queue, 4, ordered=True)
        ...     serving = asyncio.ensure_future(serve_connection(lambda x: 2 * x,
        ...                                                      server_end))
        ...     ys = await asyncio.gather(*(fn(np.ones((1, 3))) for fn in fns))
        ...     for fn in fns:
        ...         fn.connection.close()
        ...     stats = await serving                 # until every client closed
        ...     return ys[0].tolist(), stats["elements"]
        >>> asyncio.run(main())
        ([[2.0, 2.0, 2.0]], 4)
    """
    if not isinstance(connection, Connection):  # several: each a server end
        if isinstance(connection, (str, bytes)) or not hasattr(connection, "__iter__"):
            connection = [connection]
        connection = list(connection)
    for end in [connection] if isinstance(connection, Connection) else connection:
        if not isinstance(end, Connection):
            raise TypeError(f"serve_connection serves a server end (forked_pipe's, "
                            f"get_connected_functions'), or a list of them; got "
                            f"{end!r}"[:300])
        if not end.awaitable:  # its recv_async would raise at once, again and again
            raise TypeError("serve_connection awaits its messages, and this end's "
                            "queue cannot be awaited: make the pipe with one of "
                            "async_search.queues' factories (local_queue, thread_queue, "
                            "process_queue, socket_queue, ray_queue), not queue.Queue")
    if not isinstance(policy, DispatchPolicy):
        raise TypeError(f"policy must be a DispatchPolicy, got {policy!r}")
    if isinstance(model, BatchingServer):
        await ConnectionServer(model, portable=portable).serve(connection)
        return model.stats
    async with BatchingServer(model, policy, batcher) as evaluate:
        await ConnectionServer(evaluate, portable=portable).serve(connection)
    return evaluate.stats


class _Subscriber:
    """A client that hears of swaps: a connection, and the client's key on it."""

    __slots__ = ("connection", "client", "acked")

    def __init__(self, connection: Connection, client: Any):
        self.connection = connection
        self.client = client  # a forked server end's key; None on other ends
        self.acked = -1       # the most swaps it has acknowledged


class _Swap:
    """A swap waiting for its subscribers' acknowledgements."""

    __slots__ = ("swaps", "waiting", "done", "timer")

    def __init__(self, swaps: int, waiting: Set[Tuple[int, Any]], done: asyncio.Future):
        self.swaps = swaps
        self.waiting = waiting
        self.done = done
        self.timer: asyncio.TimerHandle | None = None


class ConnectionServer:
    """Serves connections with one running BatchingServer, and tells the clients that
    subscribed (``VersionSubscription``) of every swap (see the module docstring).

    Args:
        server: the BatchingServer every request joins (its owner starts and closes it).
        portable: make every answer travel to another process (see
            ``serve_connection``).
        ack_timeout: seconds a swap waits for each subscribed client's acknowledgement;
            a client that has not acknowledged by then has its stream of answers closed.

    Example:
        >>> from async_search.connections import get_connected_functions
        >>> from async_search.queues import local_queue
        >>> from async_search.servers.policy import DispatchPolicy
        >>> async def main():
        ...     (fn,), server_end = get_connected_functions(local_queue, 1, ordered=True)
        ...     async with BatchingServer(lambda x: 2 * x, DispatchPolicy()) as server:
        ...         connections = ConnectionServer(server, portable=True)
        ...         serving = asyncio.ensure_future(connections.serve(server_end))
        ...         await connections.update_model(lambda x: 3 * x, 3)
        ...         y, version = await fn(VersionedRequest(np.ones((1, 2))))
        ...         fn.connection.close()
        ...         await serving
        ...     return y.tolist(), version
        >>> asyncio.run(main())
        ([[3.0, 3.0]], 3)
    """

    def __init__(self, server: BatchingServer, *, portable: bool = False,
                 ack_timeout: float = ACK_TIMEOUT_S):
        self._server = server
        self._portable = portable
        self._ack_timeout = check_float("ack_timeout", ack_timeout, minimum=0.0,
                                        strict=True)
        self._swaps = 0
        self._subscribers: Dict[Tuple[int, Any], _Subscriber] = {}
        self._pending: List[_Swap] = []

    @property
    def server(self) -> BatchingServer:
        """The BatchingServer that answers every connection."""
        return self._server

    @property
    def swaps(self) -> int:
        """Swaps made through this object so far."""
        return self._swaps

    @property
    def num_subscribers(self) -> int:
        """Clients that hear of swaps now."""
        return len(self._subscribers)

    async def serve(self, connection: Union[Connection, Sequence[Connection]]) -> None:
        """Serves ``connection`` (or each of several) until every stream has ended; each
        server end is closed once its stream has ended and its answers are sent."""
        connections = [connection] if isinstance(connection, Connection) else list(
            connection)
        serving = [asyncio.ensure_future(self._serve(c)) for c in connections]
        try:
            await asyncio.gather(*serving)
        except BaseException:  # one failed (or serve was cancelled): stop the others
            for task in serving:
                task.cancel()
            await asyncio.wait(serving)
            raise

    async def update_model(self, model_or_weights: Any, version: Hashable) -> None:
        """Swaps the model (``BatchingServer.update_model``) and returns once every
        subscribed client has learned ``version`` (or was cut off, see
        ``ack_timeout``): every request made after this returns, in any process, runs
        on the new model and no cache of a client serves an older version's result.

        Raises:
            what ``BatchingServer.update_model`` raises (nothing is swapped);
            TypeError: a portable server's ``version`` does not pickle (it could not
                reach the clients); nothing is swapped.
        """
        await asyncio.shield(self._swap(model_or_weights, version))

    def _swap(self, model_or_weights: Any, version: Hashable) -> asyncio.Future:
        """Swaps now and tells every subscriber; a future done once each acknowledged."""
        if self._portable:
            try:
                pickle.loads(pickle.dumps(version))
            except Exception as e:
                raise TypeError(f"the version label {version!r} must pickle to reach "
                                f"clients in other processes: {type(e).__name__}: {e}"
                                ) from None
        self._server.update_model(model_or_weights, version)
        self._swaps += 1
        notice = VersionNotice(version, self._swaps)
        waiting = set()
        for sid, subscriber in list(self._subscribers.items()):
            try:
                subscriber.connection.notify(notice, subscriber.client)
            except Exception:  # its client is gone: it makes no more requests
                self._drop(sid)
                continue
            waiting.add(sid)
        done = asyncio.get_running_loop().create_future()
        swap = _Swap(self._swaps, waiting, done)
        if not waiting:
            done.set_result(None)
            return done
        self._pending.append(swap)
        swap.timer = asyncio.get_running_loop().call_later(
            self._ack_timeout, self._expire, swap)
        return done

    def _expire(self, swap: _Swap) -> None:
        """The clients that have not acknowledged ``swap`` in time are cut off."""
        for sid in list(swap.waiting):
            subscriber = self._subscribers.get(sid)
            if subscriber is not None:
                _cut_off(subscriber)
            self._drop(sid)
        self._settle()

    def _subscribe(self, connection: Connection) -> Tuple[Hashable, int]:
        sid = (id(connection), connection.sender)
        if sid not in self._subscribers:
            self._subscribers[sid] = _Subscriber(connection, connection.sender)
            if isinstance(connection, ForkedConnection):
                connection.on_client_closed(
                    lambda key, c=connection: self._drop((id(c), key)))
        return self._server.version, self._swaps

    def _acknowledged(self, connection: Connection, swaps: int) -> None:
        subscriber = self._subscribers.get((id(connection), connection.sender))
        if subscriber is not None and swaps > subscriber.acked:
            subscriber.acked = swaps
            self._settle()

    def _drop(self, sid: Tuple[int, Any]) -> None:
        """``sid`` hears of no more swaps (its client closed, is gone, or was cut off)."""
        if self._subscribers.pop(sid, None) is not None:
            for swap in self._pending:
                swap.waiting.discard(sid)
            self._settle()

    def _settle(self) -> None:
        """Ends the waits of the swaps every remaining subscriber has acknowledged."""
        subscribers = self._subscribers
        still = []
        for swap in self._pending:
            swap.waiting = {sid for sid in swap.waiting if sid in subscribers
                            and subscribers[sid].acked < swap.swaps}
            if swap.waiting:
                still.append(swap)
                continue
            if swap.timer is not None:
                swap.timer.cancel()
            if not swap.done.done():
                swap.done.set_result(None)
        self._pending = still

    async def _serve(self, connection: Connection) -> None:
        replies = _OrderedReplies(connection, _portable if self._portable else _as_is)
        connection.acquire()
        try:
            try:
                await self._answer_stream(connection, replies)
            finally:
                for sid in [sid for sid, s in self._subscribers.items()
                            if s.connection is connection]:
                    self._drop(sid)  # its clients are gone: no swap waits for them
            await replies.finished()
        finally:
            # Released once the answers taken are out: at once after the stream ended.
            # Cancelled or with its transport failed, serving does not wait for them:
            # nothing reads this end any more, and its clients' later calls fail at once.
            replies.when_finished(functools.partial(_release, connection))

    async def _answer_stream(self, connection: Connection,
                             replies: _OrderedReplies) -> None:
        """Hands each message of ``connection``'s stream to the server, its answer to
        ``replies``, until the stream ends."""
        evaluate = self._server
        loop = asyncio.get_running_loop()
        while True:
            try:
                message = await connection.recv_async()
            except ClosedConnection:
                break
            except MalformedMessageError as e:  # no key to answer it with: dropped
                loop.call_exception_handler({
                    "message": "serve_connection dropped a message it cannot "
                               "answer", "exception": e})
                continue
            except (OSError, EOFError):  # the transport itself: not a message
                raise
            except Exception as e:  # noqa: BLE001 - whatever loading it raised
                # A message that cannot be loaded (a class the sender has and this
                # process lacks, a __setstate__ that raises). Answers go in the order
                # of messages, so one left unanswered would shift every later answer
                # onto the wrong request.
                if not _answers_by_key(connection):
                    fut = loop.create_future()  # answered in its turn, with why
                    fut.set_exception(_unloadable(e))
                    replies.add(fut, False)
                    continue
                # A forked or pass-through end answers by the key of each message,
                # and the key was inside what failed to load: no caller can be told
                # which answer is missing, so the connection ends (their calls fail).
                loop.call_exception_handler({
                    "message": "serve_connection ended a keyed connection: a message "
                               "with an unknown key could not be loaded",
                    "exception": e})
                if isinstance(connection, ForkedConnection):
                    for key in connection.clients:
                        connection.close_client(key)
                break
            versioned = False
            try:
                if isinstance(message, VersionedRequest):
                    versioned = True
                    fut = evaluate.call_with_version(message.x, message.rowwise)
                elif isinstance(message, Control):
                    fut = self._control(connection, message, loop)
                else:
                    fut = evaluate(message)
            except Exception as e:  # a bad request (or update) fails alone
                fut = loop.create_future()
                fut.set_exception(e)
            replies.add(fut, versioned)

    def _control(self, connection: Connection, message: Control,
                 loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        fut = loop.create_future()
        if isinstance(message, VersionAck):
            self._acknowledged(connection, message.swaps)
            fut.set_result(None)
        elif isinstance(message, VersionSubscription):
            fut.set_result(self._subscribe(connection))
        elif isinstance(message, ModelUpdate):
            acknowledged = self._swap(message.model, message.version)  # swapped now
            version = message.version
            acknowledged.add_done_callback(
                lambda _: fut.done() or fut.set_result(version))
        else:
            raise TypeError(f"unknown control message {type(message).__name__}")
        return fut


def _cut_off(subscriber: _Subscriber) -> None:
    """Ends a subscriber's stream of answers, so that it cannot keep serving results of
    a version it was not told has been replaced."""
    connection = subscriber.connection
    try:
        if isinstance(connection, ForkedConnection):
            connection.close_client(subscriber.client)
        else:
            connection.close()
    except Exception:  # gone already
        pass


def _answers_by_key(connection: Connection) -> bool:
    """Whether ``connection`` sends each answer with the key of the message it answers
    (a forked pipe's server end, a pass-through end), not to whoever reads next."""
    return isinstance(connection, (ForkedConnection, PassThroughConnection))


def _unloadable(e: BaseException) -> MalformedMessageError:
    said = " ".join(str(e).split())[:200]
    return MalformedMessageError(
        f"the server could not load this request ({type(e).__name__}: {said}); what a "
        f"client sends must unpickle in the server's process (its classes importable "
        f"there)")


def _as_is(answer: Any, versioned: bool) -> Any:
    return answer


def _portable(answer: Any, versioned: bool) -> Any:
    """``answer`` as something that loads in another process (see ``wire``);
    ``versioned``: it answers a VersionedRequest (it is ``(outputs, version)``)."""
    if isinstance(answer, RowsFailed):  # the computed rows travel, the error packed
        computed = [(offset, outputs) for offset, outputs in answer.computed]
        ok, why = round_trips((computed, answer.version))
        if not ok:  # as for a whole answer that cannot travel
            return _portable(ModelOutputError(
                f"the model's outputs cannot be sent to the client process: "
                f"{type(why).__name__}: {why}"), versioned)
        errors = None
        if answer.errors is not None:  # each error packed once: it stays one error
            packed = {id(e): pack_error(e) for e in answer.errors}
            errors = [packed[id(e)] for e in answer.errors]
        return RowsFailed(pack_error(answer.error), answer.failed, computed,
                          answer.version, errors)
    if isinstance(answer, BaseException):
        return pack_error(answer)
    outputs, version = answer if versioned else (answer, None)
    if not plain_outputs(outputs, version):  # objects in them: check the trip
        ok, why = round_trips(answer)
        if not ok:
            return pack_error(ModelOutputError(
                f"the model's outputs ({type(outputs).__name__}) cannot be sent to the "
                f"client process: {type(why).__name__}: {why}"))
    return answer


def _release(connection: Connection) -> None:
    """The last server of this end closes it: its clients' calls fail at once."""
    try:
        connection.release()
    except Exception:  # its transport is gone already
        pass


class _OrderedReplies:
    """Sends answers in the order the requests came, so that FIFO clients match them:
    a request that fails at once (or has no elements) must not overtake earlier ones.
    Nothing raised while answering escapes into a callback."""

    def __init__(self, connection: Connection, prepare: Callable[[Any, bool], Any]):
        self._connection = connection
        self._prepare = prepare
        self._waiting: Deque[Tuple[asyncio.Future, bool]] = collections.deque()
        self._gone = False  # the other end cannot be reached: answers are dropped
        self._done: asyncio.Future | None = None
        self._then: Callable[[], None] | None = None

    def add(self, fut: asyncio.Future, versioned: bool) -> None:
        """Answers ``fut``'s message once it and every earlier one are done;
        ``versioned``: it answers a VersionedRequest."""
        self._waiting.append((fut, versioned))
        if fut.done():
            self._send_ready()
        else:
            fut.add_done_callback(self._send_ready)

    async def finished(self) -> None:
        """Returns once every answer has been sent (or dropped, its client gone)."""
        if self._waiting:
            self._done = asyncio.get_running_loop().create_future()
            await self._done

    def when_finished(self, then: Callable[[], None]) -> None:
        """Calls ``then`` once every answer has been sent (now, if none waits)."""
        if self._waiting:
            self._then = then
        else:
            then()

    def _send_ready(self, _=None) -> None:
        waiting, connection = self._waiting, self._connection
        while waiting and waiting[0][0].done():
            fut, versioned = waiting.popleft()
            if fut.cancelled():
                answer: Any = ServerClosedError(
                    "the server dropped this request (it is stopping)")
            else:
                error = fut.exception()
                answer = error if error is not None else fut.result()
            if self._gone:
                continue
            try:
                connection.send(self._prepare(answer, versioned))
            except _UNSENDABLE as e:  # the answer cannot travel (it does not pickle:
                # the queue refused it, nothing sent): its request fails alone
                try:
                    connection.send(pack_error(ModelOutputError(
                        f"the answer cannot be sent to the client: "
                        f"{type(e).__name__}: {e}")))
                except Exception:  # the client is gone after all
                    self._gone = True
            except Exception:  # the client is gone (its process died): nobody waits
                self._gone = True
        if not self._gone:
            try:  # the answers ready now leave together, without waiting for the
                connection.send_pending()  # end of the loop iteration
            except Exception:
                self._gone = True
        if not waiting:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            then, self._then = self._then, None
            if then is not None:
                then()
