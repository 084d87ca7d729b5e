"""``evaluate`` over the network: searches use a model served by a KServe v2 server.

``RemoteEvaluate`` has the call shape of every evaluate function (``await evaluate(x)``
with ``x[n, ...]``) and talks the KServe v2 / Open Inference Protocol over HTTP, so the
model may be served by this project's front (``python -m async_search.http``), NVIDIA
Triton, or KServe's Python model server. As the process client does, it coalesces: the
requests made in one loop iteration leave as one HTTP request with the binary tensor
extension, and while every connection of its pool is busy, new requests wait and leave
together when one frees, so traffic scales with round trips, not with requests.

Requests are checked when made against the input spec that the server's model metadata
declares (``GET /v2/models/{name}``): a plain ndarray of the spec's dtype, or
InputSpecError, and nothing is sent. A failure that another attempt may cure (the
connection refused or dropped, a truncated answer, 408, 429, 502, 503, 504) is retried
with exponential backoff; inference is idempotent, so a request that the server may have
computed is simply computed again. Every request has a deadline (``timeout`` seconds
from the call, retries and waiting for a connection included, or a shorter
``evaluate(x, timeout=...)``): past it, RequestTimeoutError (a TimeoutError), and a
request not sent by then is dropped, as a cancelled one is.

Versions come from the answers: each response's ``model_version`` is the label of the
model that computed it, so ``version`` is the label of the latest answer (first read from
the model metadata) and ``swap_token`` changes whenever that label does, which is what a
``CachedEvaluate`` in front needs. The protocol pushes no notice of a swap: a cache in
front learns of one with the first answer of the new model, and a swap that keeps the
label is not seen (this project's front numbers a reloaded model 0 again).

What a caller gets back for each status: 200 the outputs (one tensor: an array; tensors
``output_0``, ``output_1``, ...: a tuple, as this project's front names a tuple; other
names: a dict); 404 ModelNotFoundError; another 4xx ProtocolError (its ``status``);
503 once retries are spent ServerClosedError; a connection that cannot be made or kept,
or 408, 429, 502, 504 once retries are spent, ServerDiedError; a redirect (3xx: never
followed, since it would carry the tensors and the headers to another address) or a
transport failure aiohttp names otherwise, ServerDiedError (not retried); 500 and other
5xx (the model failed: not retried) RemoteError; an answer that is not the protocol's,
or longer than ``max_response_bytes`` once inflated (ResponseTooLongError, a
ModelOutputError), ModelOutputError. aiohttp (the
``http`` extra) is imported when the client opens.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import urllib.parse
from typing import Any, Dict, Hashable, List, Mapping, Set, Tuple

import numpy as np

from async_search.base import Outputs, TensorSpec
from async_search.checks import AsyncWithOnly, check_float, check_int
from async_search.coalescing import CoalescedRequests
from async_search.deadlines import Deadline, check_timeout, expire_due, track_deadline
from async_search.delivery import ResultDelivery
from async_search.errors import (InputSpecError, ModelNotFoundError, ModelOutputError,
                                 ProtocolError, RemoteError, RequestTimeoutError,
                                 ResponseTooLongError, ServerClosedError, ServerDiedError)
from async_search.extras import import_extra
from async_search.http.kserve import (DATATYPES, HEADER_LENGTH, datatype_of,
                                      header_integer, tensor_from_json)
from async_search.requests import RequestChecker


#: Statuses worth another attempt: the server is starting, stopping, overloaded or
#: behind a gateway that lost it. Anything else says the same thing the next time.
RETRIED_STATUSES = frozenset({408, 429, 502, 503, 504})
_MAX_BACKOFF_S = 2.0


class _Call:
    """The requests of one HTTP request; ``ResultDelivery`` slices its answer into them
    (``batch`` gives the row count, ``pieces`` each request's rows, ``tags`` their
    futures)."""

    __slots__ = ("batch", "tags", "pieces", "deadline", "seq")
    parts = None  # no request is split across HTTP requests

    def __init__(self, batch, tags, pieces, deadline: float, seq: int):
        self.batch = batch
        self.tags = tags
        self.pieces = pieces
        self.deadline = deadline
        self.seq = seq


def _may_owe_to_one(error: BaseException) -> bool:
    """Whether a failed call may owe its failure to one of the requests it carried:
    the model raised (a 500), the server refused the input (400, 413, 422), or the
    answer was too long (the requests' answers together)."""
    if isinstance(error, ResponseTooLongError):
        return True  # several answers together: halves may each fit
    if isinstance(error, ProtocolError):
        return error.is_callers
    return isinstance(error, RemoteError)


def _split_budget(requests: int) -> int:
    """The HTTP requests that may be sent again to find which of ``requests`` fail:
    enough for two failing ones (2 log2 n each), a few more than that in all."""
    return 4 * max(1, (requests - 1).bit_length()) + 2


def _halves(items: list) -> Tuple[list, list]:
    middle = (len(items) + 1) // 2
    return items[:middle], items[middle:]


class _Retry(Exception):
    """An attempt failed in a way another attempt may cure; ``error`` says how."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class RemoteEvaluate(AsyncWithOnly, CoalescedRequests):
    """An evaluate function whose model is served by a KServe v2 server over HTTP.

    Args:
        url: the server's base address, ``http://host:port``.
        model_name: the served model's name.
        model_version: ask for this version (``/versions/{v}`` in the path); None: the
            one the server serves.
        timeout: seconds each request may take from its call to its answer, waiting for
            a connection and retries included; RequestTimeoutError past it.
        retries: further attempts after a failure that another attempt may cure.
        backoff_s: the wait before the first retry; it doubles at each retry (at most
            2 s), with jitter, and never runs past the deadline.
        max_connections: HTTP requests in flight at once (the pool's size); requests
            made while all are busy leave together when one frees.
        max_request_bytes: tensor bytes of one HTTP request (below the server's body
            limit: the project's front takes 16 MiB); more requests than that leave in
            several. A single larger request is sent alone.
        max_response_bytes: the longest answer taken (its body once inflated; gRPC:
            its tensors, with 64 KiB more for the rest of its message): a longer one
            fails with ModelOutputError before more of it is held, so that a broken or
            hostile server cannot fill the client's memory (default 64 MiB). The
            requests of an HTTP request whose answer was too long are sent again in
            halves first, whose answers may each fit.
        input_spec: the model's input, for a server whose metadata lists none (KServe's
            default); None: the metadata's, else learnt from the first request.
        input_name: the input tensor's name, likewise (default: the metadata's, else
            ``"input"``).
        headers: sent with every request (``Authorization``, say).

    Example:
        A search evaluates with a model served over HTTP as with a local one (it
        needs a running server, so this one is not run in the tests):

        ```python
        # served by: python -m async_search.http --model mynets:heuristic --name h
        # (mynets.heuristic() returns problems.pretrained("15-puzzle"), say)
        async with RemoteEvaluate("http://127.0.0.1:8000", "h") as evaluate:
            puzzle = problems.SlidingPuzzle(4)
            x = puzzle.encode([puzzle.scramble(30, seed=0)])
            y = await evaluate(x)
            y, version = await evaluate.with_version(x)
            r = await search.batched_astar(puzzle, puzzle.scramble(30, seed=1),
                                           evaluate, budget=2000, buffer_size=16)
        ```
    """

    def __init__(self, url: str, model_name: str, *, model_version: str | None = None,
                 timeout: float = 30.0, retries: int = 3, backoff_s: float = 0.05,
                 max_connections: int = 4, max_request_bytes: int = 8 * 2 ** 20,
                 max_response_bytes: int = 64 * 2 ** 20,
                 input_spec: TensorSpec | None = None, input_name: str | None = None,
                 headers: Mapping[str, str] | None = None):
        for name, value in (("model_name", model_name), ("model_version", model_version),
                            ("input_name", input_name)):
            if value is not None and (not isinstance(value, str) or not value
                                      or "/" in value):
                raise ValueError(f"{name} must be a non-empty string without '/', got "
                                 f"{value!r}")
        if model_name is None:
            raise ValueError("model_name must be a non-empty string without '/', got None")
        if input_spec is not None and not isinstance(input_spec, TensorSpec):
            raise TypeError(f"input_spec must be a TensorSpec or None, got "
                            f"{type(input_spec).__name__}")
        self.model_name = model_name
        self.model_version = model_version
        self._set_address(url)
        self.timeout = check_float("timeout", timeout, minimum=0, strict=True)
        self.retries = check_int("retries", retries, minimum=0)
        self.backoff_s = check_float("backoff_s", backoff_s, minimum=0)
        self.max_connections = check_int("max_connections", max_connections, minimum=1)
        self.max_request_bytes = check_int("max_request_bytes", max_request_bytes,
                                           minimum=1)
        self.max_response_bytes = check_int("max_response_bytes", max_response_bytes,
                                            minimum=1)
        self.headers = dict(headers or {})
        self._given_spec = input_spec
        self._input_name = input_name
        self._check = RequestChecker(input_spec, learnable=_sendable, relearns=True)
        self._shape, self._dtype = self._check.shape, self._check.dtype
        self._delivery = ResultDelivery()
        self._deadlines: Dict[asyncio.Future, Deadline] = {}  # requests with a timeout
        self._session: Any = None
        self._aiohttp: Any = None
        self._open = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._xs: List[np.ndarray] = []
        self._futures: List[asyncio.Future] = []
        self._deadline = 0.0    # the earliest deadline of the requests waiting
        self._scheduled = False
        self._sending: Set[asyncio.Task] = set()
        self._calls: Set[_Call] = set()
        self._seq = 0           # HTTP requests sent, numbered
        self._heard = -1        # the number of the latest one whose version was learnt
        self._version: Hashable = None
        self._token: Any = None
        self._stats = {"requests": 0, "elements": 0, "http_requests": 0, "retries": 0,
                       "failed_http_requests": 0, "split_http_requests": 0}

    # -- the transport: what a subclass for another protocol replaces ----------------
    def _set_address(self, url: str) -> None:
        """Checks ``url`` and sets ``url`` and the addresses that requests go to."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// address, got {url!r}")
        try:  # a bad host ("http://[::1") failed every request with aiohttp's own error
            host = urllib.parse.urlsplit(url).hostname
        except ValueError as e:
            raise ValueError(f"url {url!r} is not an address: {e}") from None
        if not host:
            raise ValueError(f"url {url!r} names no host")
        self.url = url.rstrip("/")
        path = f"/v2/models/{self.model_name}" + (
            f"/versions/{self.model_version}" if self.model_version is not None else "")
        self._metadata_url = self.url + path
        self._infer_url = self.url + path + "/infer"
        self._where = f"the inference server at {self._infer_url}"

    async def _open_transport(self) -> None:
        aiohttp = import_extra("aiohttp", "RemoteEvaluate")  # when a client opens

        self._aiohttp = aiohttp
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            headers=self.headers)

    async def _close_transport(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "RemoteEvaluate":
        if self._loop is not None:
            raise RuntimeError(f"a {type(self).__name__} can be entered once")
        self._loop = asyncio.get_running_loop()
        await self._open_transport()
        try:
            await self._read_metadata()
        except BaseException:
            await self._close_transport()
            raise
        self._open = True
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Fails the requests still waiting or in flight with ServerClosedError and
        closes the connections."""
        self._open = False
        error = ServerClosedError(f"the {type(self).__name__} of {self._where} was "
                                  f"closed before the request was answered")
        futures, self._futures, self._xs = self._futures, [], []
        for fut in futures:
            if not fut.done():
                fut.set_exception(error)
        calls, tasks = list(self._calls), list(self._sending)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for call in calls:
            self._delivery.fail(call, error)
        await self._close_transport()

    # -- what a cache and a router read -----------------------------------------------
    @property
    def version(self) -> Hashable:
        """The label of the model version that answered last (from the metadata before
        the first answer); None while unknown or when the server reports none."""
        return self._version

    @property
    def swap_token(self) -> Any:
        """An object that changes whenever the reported version does (None while it is
        unknown): what a ``CachedEvaluate`` in front compares."""
        return self._token

    @property
    def input_spec(self) -> TensorSpec | None:
        """The model's input, as the metadata says, or as the first request said once a
        request of it was answered (None before)."""
        return self._check.spec if self._check.settled else None

    @property
    def num_in_flight(self) -> int:
        """HTTP requests sent and not answered yet."""
        return len(self._calls)

    @property
    def stats(self) -> dict:
        """requests and elements asked for; http_requests sent (retries included);
        retries; failed_http_requests (every attempt spent, or not retryable);
        split_http_requests (a failed request's halves, sent again to find the
        requests that fail); mean_requests_per_http_request (as first sent)."""
        stats = dict(self._stats)
        sent = stats["http_requests"] - stats["retries"] - stats["split_http_requests"]
        stats["mean_requests_per_http_request"] = stats["requests"] / sent if sent else 0.0
        return stats

    def _learn(self, label: Hashable, seq: int) -> None:
        """Takes the version of answer ``seq`` unless a later request's was heard: an
        answer overtaken by a newer one says nothing about the model now."""
        if seq < self._heard:
            return
        self._heard = seq
        if label != self._version or (label is None) != (self._version is None):
            self._version = label
            self._token = None if label is None else object()  # compared by identity

    # -- the evaluate function --------------------------------------------------------
    def __call__(self, x: np.ndarray, timeout: float | None = None,
                 ) -> "asyncio.Future[Outputs]":
        """Queue ``x[n, ...]``; the future resolves with the model's outputs.

        ``timeout`` (seconds > 0) shortens this request's deadline below the client's
        ``timeout``: past it the future fails with RequestTimeoutError, and a request not
        sent by then is dropped, as a cancelled one is.

        Raises:
            InputSpecError: (a ValueError) when ``x`` does not fit the model's input;
                nothing is sent.
            ServerClosedError: when the client is not open (use ``async with``).
            ValueError: for a ``timeout`` that is not a number > 0.
        """
        if type(x) is not np.ndarray or x.shape[1:] != self._shape or (
                x.dtype is not self._dtype and x.dtype != self._dtype) or not x.ndim:
            x = self._check(x)  # raises, or learns the spec from the first request
            self._shape, self._dtype = self._check.shape, self._check.dtype
        if timeout is not None:
            timeout = check_timeout(timeout)
        if not self._open:
            raise ServerClosedError(f"the {type(self).__name__} of {self._where} is not "
                                    f"open: use it inside 'async with'")
        loop = self._loop
        fut = loop.create_future()
        if not self._check.settled:
            self._check.note(fut)
        if timeout is not None and timeout < self.timeout:
            track_deadline(self._deadlines, fut, timeout, note=f" from {self._where}")
        if not self._xs:
            self._deadline = loop.time() + self.timeout
        self._xs.append(x)
        self._futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)  # after every search ready in this iteration
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        if len(self._calls) >= self.max_connections or not self._xs:
            return  # the requests wait for a free connection (see _sent)
        deadline = self._deadline
        xs, futures = self._take_queued()  # cancelled or expired: dropped before they leave
        if not xs:
            return
        start, size = 0, 0
        for i, x in enumerate(xs):  # HTTP requests of at most max_request_bytes each
            if size and size + x.nbytes > self.max_request_bytes:
                self._send(xs[start:i], futures[start:i], deadline)
                start, size = i, 0
            size += x.nbytes
        if start < len(xs):
            self._send(xs[start:], futures[start:], deadline)

    def _encode(self, xs: List[np.ndarray]) -> Tuple[Any, np.ndarray]:
        """The request that carries ``xs`` (what ``_attempt`` sends), and their rows as
        one batch (its length is what the answer's rows are checked against)."""
        body, batch, header_length = _encode_request(xs, self._input_name or "input")
        return (body, header_length), batch

    def _send(self, xs: List[np.ndarray], futures: List[asyncio.Future],
              deadline: float) -> None:
        try:
            request, batch = self._encode(xs)
        except Exception as e:  # noqa: BLE001 - in a loop callback: fail them, never hang
            error = e if isinstance(e, InputSpecError) else InputSpecError(
                f"these requests cannot be sent to {self._where}: {e}")
            for fut in futures:
                if not fut.done():
                    fut.set_exception(error)
            return
        call = _Call(batch, futures, xs, deadline, self._seq)
        self._seq += 1
        self._stats["requests"] += len(xs)
        self._stats["elements"] += len(batch)
        self._calls.add(call)
        task = self._loop.create_task(self._answer(call, request))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _answer(self, call: _Call, request: Any) -> None:
        try:
            if await self._answer_call(call, request) and not self._check.settled:
                self._check.settle_by(call.batch)
        finally:
            self._calls.discard(call)
            if self._xs and self._open and not self._scheduled:
                self._flush()  # a connection is free: what waited leaves now

    async def _answer_call(self, call: _Call, request: Any,
                           splits: List[int] | None = None) -> bool:
        """Sends ``call`` and hands out its answer; True when some of its requests got
        their outputs."""
        try:
            outputs, version = await self._post(call, request, split=splits is not None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - every path ends the futures
            waiting = [(x, fut) for x, fut in zip(call.pieces, call.tags) if not fut.done()]
            if len(waiting) > 1 and _may_owe_to_one(e):
                if splits is None:  # the first failure of this call
                    splits = [_split_budget(len(waiting))]
                return await self._answer_halves(waiting, call, e, splits)
            self._delivery.fail(call, e)
            return False
        self._learn(version, call.seq)
        if self._deadlines:  # rows that came past their request's deadline: discarded
            expire_due(self._deadlines, call.tags)
        error = self._delivery.deliver(call, outputs, version)
        if error is not None:
            self._delivery.fail(call, error)
        return error is None

    async def _answer_halves(self, waiting: List[Tuple[np.ndarray, asyncio.Future]],
                             call: _Call, error: BaseException, splits: List[int]) -> bool:
        """The protocol has no partial answer: a failed call that carried several
        requests is sent again in halves, one after the other on its connection, until
        the requests that fail stand alone (inference is idempotent). One bad request
        among n costs about 2 log2(n) more HTTP requests; ``splits`` (one count shared
        by every half of the call) bounds them, so that a server that fails everything
        costs a few more, not 2n: past it, or past the deadline, what is left fails
        with the error. Answers too long together are halved until each piece's answer
        fits, without spending ``splits``: up to 2n - 1 HTTP requests, one after the
        other, bounded by the deadline. True when some of them got their outputs."""
        answered = False
        # Answers too long together are no bad request to find: halving them until each
        # piece's answer fits may take up to 2n sends, bounded by the deadline alone
        # (the budget is sized to find two bad requests).
        too_long = isinstance(error, ResponseTooLongError)
        for half in _halves(waiting):
            half = [(x, fut) for x, fut in half if not fut.done()]  # while the other ran
            if not half:
                continue
            xs, futures = [x for x, _ in half], [fut for _, fut in half]
            if (splits[0] <= 0 and not too_long) or self._loop.time() >= call.deadline:
                self._delivery.fail(_Call(None, futures, xs, call.deadline, call.seq), error)
                continue
            if not too_long:
                splits[0] -= 1
            request, batch = self._encode(xs)  # they were encoded together already
            answered |= await self._answer_call(
                _Call(batch, futures, xs, call.deadline, call.seq), request, splits)
        return answered

    async def _attempt(self, request: Any, left: float) -> Tuple[Outputs, Hashable]:
        """One attempt at ``request`` within ``left`` seconds: the outputs and the
        answer's version. Raises TimeoutError past ``left``, ``_Retry`` around a failure
        that another attempt may cure, and what a caller gets for any other."""
        aiohttp = self._aiohttp
        body, header_length = request
        headers = {HEADER_LENGTH: str(header_length),
                   "Content-Type": "application/octet-stream"}
        try:
            async with self._session.post(
                    self._infer_url, data=body, headers=headers, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=left)) as response:
                payload = await self._read(response, self._where)
                status = response.status
                answer_header = response.headers.get(HEADER_LENGTH)
                location = response.headers.get("Location")
        except aiohttp.ClientError as e:
            raise self._transport_failure(e, self._where) from None
        if 300 <= status < 400:
            raise self._redirected(status, location, self._where)
        if status == 200:
            return _decode_response(payload, answer_header, self._where)
        self._refusal(status, payload)  # raises, _Retry when worth retrying
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read(self, response: Any, where: str) -> bytes | bytearray:
        """The body of ``response``, inflated, refused with ModelOutputError once it
        passes ``max_response_bytes`` (before more of it is held)."""
        limit = self.max_response_bytes
        declared = response.content_length
        encoded = response.headers.get("Content-Encoding", "identity") != "identity"
        if declared is not None and not encoded and declared <= limit:
            return await response.read()  # (aiohttp reads no more than declared)
        body = bytearray()
        if declared is None or declared <= limit:
            async for chunk in response.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > limit:
                    break
            else:
                return body
        raise ResponseTooLongError(
            f"{where} answered {response.status} with a body longer than "
            f"max_response_bytes={limit} bytes (more inflated, or declared, than the "
            f"client takes): refused unread")

    def _transport_failure(self, error: BaseException, where: str) -> BaseException:
        """What a failure of aiohttp raises: ``_Retry`` around a connection that could
        not be made or kept, ServerDiedError for an answer that is not HTTP or anything
        else aiohttp refused."""
        aiohttp = self._aiohttp
        if isinstance(error, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
            return _Retry(ServerDiedError(
                f"{where} could not be reached or dropped the connection: "
                f"{type(error).__name__}: {error}"))
        if isinstance(error, aiohttp.ClientResponseError):  # an answer that is not HTTP
            return ServerDiedError(f"{where} did not answer in HTTP (is it the inference "
                                   f"server's HTTP port?): {error.message}")
        return ServerDiedError(f"{where} failed: {type(error).__name__}: {error}")

    @staticmethod
    def _redirected(status: int, location: str | None, where: str) -> ServerDiedError:
        """A redirect is never followed: it would carry the tensors and the headers
        (credentials among them) to another address."""
        return ServerDiedError(f"{where} answered {status}, a redirect to "
                               f"{str(location)[:200]!r}, which a RemoteEvaluate does not "
                               f"follow: give it the address the server answers at")

    async def _post(self, call: _Call, request: Any, split: bool = False,
                    ) -> Tuple[Outputs, Hashable]:
        """The answer to ``call``, retried while another attempt may cure a failure;
        ``split``: it is a half of a failed call (counted so once it is sent). Counts
        a failure that ends it."""
        try:
            return await self._attempts(call, request, split)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._stats["failed_http_requests"] += 1
            raise

    async def _attempts(self, call: _Call, request: Any, split: bool,
                        ) -> Tuple[Outputs, Hashable]:
        loop = self._loop
        # The failure before the deadline came says why the deadline was missed, even
        # when the attempt the deadline cut short had not failed yet.
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            left = call.deadline - loop.time()
            if left <= 0:
                raise self._late(attempt, last)
            self._stats["http_requests"] += 1
            if attempt:
                self._stats["retries"] += 1
            elif split:
                self._stats["split_http_requests"] += 1
            try:
                return await self._attempt(request, left)
            except (asyncio.TimeoutError, TimeoutError):
                raise self._late(attempt + 1, last) from None
            except _Retry as e:
                last = e.error
            if attempt == self.retries:
                raise last
            delay = min(self.backoff_s * 2 ** attempt, _MAX_BACKOFF_S) * (
                0.5 + random.random() / 2)
            if loop.time() + delay >= call.deadline:
                raise self._late(attempt + 1, last)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _late(self, attempts: int, last: BaseException | None) -> RequestTimeoutError:
        detail = f"; the last attempt failed: {last}" if last is not None else ""
        return RequestTimeoutError(f"{self._where} did not answer within the deadline of "
                            f"{self.timeout:g} s ({attempts} attempt"
                            f"{'s' if attempts != 1 else ''}){detail}")

    def _refusal(self, status: int, payload: bytes, where: str | None = None) -> None:
        """Raises what an answer of ``status`` means (``_Retry`` around it when another
        attempt may cure it); ``where`` names what answered (default: inference)."""
        message = _error_message(payload)
        where = where or self._where
        said = f"{where} answered {status}: {message}"
        if status == 404:
            raise ModelNotFoundError(said)
        if status == 503:
            raise _Retry(ServerClosedError(said))
        if status in RETRIED_STATUSES:
            raise _Retry(ServerDiedError(said))
        if 400 <= status < 500:
            raise ProtocolError(said, status=status)
        raise RemoteError(f"HTTP {status}", f"{where}: {message}")

    # -- model metadata ---------------------------------------------------------------
    async def _read_metadata(self) -> None:
        """Reads the input's name, spec and the serving version, retried as requests
        are (a server starting up refuses connections for a moment)."""
        loop = self._loop
        deadline = loop.time() + self.timeout
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                self._take_metadata(*await self._metadata_attempt(left))
                return
            except (asyncio.TimeoutError, TimeoutError):
                break
            except _Retry as e:
                last = e.error
            if attempt == self.retries:
                raise last
            await asyncio.sleep(min(self.backoff_s * 2 ** attempt, _MAX_BACKOFF_S))
        detail = f"; the last attempt failed: {last}" if last is not None else ""
        raise TimeoutError(f"the model metadata at {self._metadata_url} did not come "
                           f"within {self.timeout:g} s{detail}")

    async def _metadata_attempt(self, left: float) -> Tuple[list, list]:
        """One attempt at the model metadata within ``left`` seconds: its inputs and
        versions, as the protocol's JSON spells them (raises as ``_attempt``)."""
        aiohttp = self._aiohttp
        where = f"the model metadata at {self._metadata_url}"
        try:
            async with self._session.get(
                    self._metadata_url, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=left)) as response:
                payload = await self._read(response, where)
                status = response.status
                location = response.headers.get("Location")
        except aiohttp.ClientError as e:
            raise self._transport_failure(e, where) from None
        if 300 <= status < 400:
            raise self._redirected(status, location, where)
        if status != 200:
            self._refusal(status, payload, where)
        try:
            metadata = json.loads(payload)
            inputs = metadata.get("inputs") or []
            versions = metadata.get("versions") or []
            if not isinstance(inputs, list) or not isinstance(versions, list):
                raise ValueError("inputs and versions must be lists")
            if not all(isinstance(t, dict) for t in inputs):
                raise ValueError("each input must be an object")
        except (ValueError, AttributeError, RecursionError):
            raise ModelOutputError(f"the model metadata at {self._metadata_url} is not "
                                   f"the protocol's JSON object: {payload[:200]!r}",
                                   ) from None
        return inputs, versions

    def _take_metadata(self, inputs: list, versions: list) -> None:
        """Takes the input's name and spec and the version from the model metadata
        (tensors as the protocol's JSON spells them)."""
        if len(inputs) > 1:
            raise ValueError(f"model {self.model_name!r} takes {len(inputs)} inputs "
                             f"({[t.get('name') for t in inputs][:8]}); a RemoteEvaluate "
                             f"sends one")
        if inputs and isinstance(inputs[0], dict):
            tensor = inputs[0]
            if self._input_name is None and isinstance(tensor.get("name"), str):
                self._input_name = tensor["name"]
            spec = _spec_of(tensor)
            if self._given_spec is None and spec is not None:
                self._check = RequestChecker(spec, learnable=_sendable)
                self._shape, self._dtype = spec.shape, spec.dtype
        if self.model_version is not None:
            self._learn(self.model_version, -1)
        elif len(versions) == 1 and isinstance(versions[0], str) and versions[0]:
            self._learn(versions[0], -1)


def _spec_of(tensor: Mapping[str, Any]) -> TensorSpec | None:
    """The element spec of a batched tensor in model metadata (``[-1, 16]`` FP32: 16
    float32 values), or None when its datatype or shape leaves it open."""
    datatype = tensor.get("datatype")
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    shape = tensor.get("shape")
    if dtype is None or not isinstance(shape, list) or not shape or not all(
            type(d) is int and d >= 0 for d in shape[1:]):
        return None
    return TensorSpec(tuple(shape[1:]), dtype)


def _encode_request(xs: List[np.ndarray], input_name: str,
                    ) -> Tuple[bytearray, np.ndarray, int]:
    """One request body for ``xs``: the JSON header, then their rows as one binary
    tensor (little-endian), written once into the body; the tensor's view; the header's
    length. (The front's codec decodes requests; a client encodes them, so this small
    half lives here, with the client.)"""
    x0 = xs[0]
    rows = sum(map(len, xs)) if len(xs) > 1 else len(x0)
    shape = (rows, *x0.shape[1:])
    wire = x0.dtype.newbyteorder("<")  # the wire's byte order (a no-op for bytes)
    nbytes = math.prod(shape) * x0.dtype.itemsize
    header = json.dumps({
        "inputs": [{"name": input_name, "shape": list(shape),
                    "datatype": datatype_of(x0.dtype),
                    "parameters": {"binary_data_size": nbytes}}],
        "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()
    body = bytearray(len(header) + nbytes)
    body[:len(header)] = header
    batch = np.frombuffer(body, wire, offset=len(header)).reshape(shape)
    if len(xs) == 1:
        batch[...] = x0
    else:
        np.concatenate(xs, out=batch)
    return body, batch, len(header)


def _decode_response(payload: bytes, header_length: str | None, where: str,
                     ) -> Tuple[Outputs, Hashable]:
    """The outputs and the ``model_version`` of a 200 answer (JSON or binary tensors)."""
    def bad(what: str) -> ModelOutputError:
        return ModelOutputError(f"{where} answered 200 with a body that is not the "
                                f"protocol's: {what}")

    length = len(payload) if header_length is None else header_integer(header_length)
    if length is None:  # ASCII digits only: int() would read "1_0" as 10
        raise bad(f"{HEADER_LENGTH} is {header_length[:40]!r}")
    if not 0 <= length <= len(payload):
        raise bad(f"{HEADER_LENGTH} {length} is beyond the body's {len(payload)} bytes")
    try:
        header = json.loads(payload[:length])
        tensors = header["outputs"]
        if not isinstance(tensors, list) or not tensors:
            raise TypeError("no outputs")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise bad(f"no JSON object with 'outputs' ({type(e).__name__}: "
                  f"{str(e)[:80]})") from None
    named, offset = [], length
    for k, tensor in enumerate(tensors):
        try:
            name, shape = tensor["name"], tuple(tensor["shape"])
            dtype = DATATYPES[tensor["datatype"]]
            if not all(type(d) is int and d >= 0 for d in shape) or not shape:
                raise ValueError(f"shape {list(shape)[:8]}")
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            count = math.prod(shape)
            if size is not None:
                if size != count * dtype.itemsize or offset + size > len(payload):
                    raise ValueError(f"binary_data_size {size} for shape {list(shape)}")
                raw = np.uint8 if dtype.kind == "b" else dtype.newbyteorder("<")
                array = np.frombuffer(payload, raw, count, offset).astype(dtype)
                offset += size
            else:
                data = tensor["data"]
                if not isinstance(data, list):
                    raise TypeError(f"'data' is {type(data).__name__}, not a list")
                # As the front takes a request's: numbers ("NaN", "Infinity" too), never
                # "1", null, fractions for integers or true/false among numbers.
                array = tensor_from_json(data, dtype, shape, "its")
            if any(name == seen for seen, _ in named):
                raise ValueError(f"a second output named {str(name)[:40]!r}")
            named.append((name, array.reshape(shape)))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise bad(f"output {k}: {type(e).__name__}: {str(e)[:120]}") from None
    version = header.get("model_version")
    version = version if isinstance(version, str) and version else None
    if len(named) == 1:
        return named[0][1], version
    if [n for n, _ in named] == [f"output_{i}" for i in range(len(named))]:
        return tuple(a for _, a in named), version
    return {n: a for n, a in named}, version


def _error_message(payload: bytes) -> str:
    """The ``error`` of the protocol's error body, else the body's start."""
    try:
        message = json.loads(payload)["error"]
        if isinstance(message, str):
            return message[:500]
    except (ValueError, KeyError, TypeError, RecursionError):  # any body
        pass
    return payload[:200].decode("utf-8", "replace") or "(no body)"


def _sendable(dtype: np.dtype) -> None:
    """Refuses a first request whose dtype the protocol cannot carry, before the client
    learns it as the model's input (its encoding would fail every later request)."""
    try:
        datatype_of(dtype)
    except ProtocolError as e:
        raise InputSpecError(f"request dtype {dtype} cannot be sent: {e}") from None
