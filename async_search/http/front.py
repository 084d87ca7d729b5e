"""An HTTP front that speaks the KServe v2 / Open Inference Protocol, with aiohttp.

Network requests call the very evaluate functions that in-process searches call, so an
HTTP client's elements join the same batches as everybody else's. Endpoints:

    GET  /v2                                    server metadata
    GET  /v2/health/live, /v2/health/ready      liveness, readiness
    GET  /v2/models/{name}[/versions/{v}]       model metadata: inputs, outputs
    GET  /v2/models/{name}[/versions/{v}]/ready model readiness
    POST /v2/models/{name}[/versions/{v}]/infer inference: JSON or binary tensors
    POST /v2/repository/index                   every model and its state
    POST /v2/repository/models/{name}/load      load (optionally {"parameters":
                                                {"num_workers": k}}); off by default
    POST /v2/repository/models/{name}/unload    unload (requests in flight finish);
                                                off by default
    GET  /metrics                               Prometheus text format

Every error is the protocol's JSON ``{"error": "..."}`` with a fitting status, whatever
layer refuses the request: 400 for a request that is not HTTP/1.1 (aiohttp's parser
refuses it: see ``error_responses``) or a body that breaks the protocol or does not fit the
model, 403 for the repository's load and unload while they are off (or without the
token), 404 for an unknown model or version, 408 for a body that took longer than
``read_timeout``, 409 for a load or unload while another of that model is under way,
413 for a body over ``max_body_bytes`` or a JSON part over
``max_json_bytes``, 431 for headers over aiohttp's bounds, 503 for a model that is not
loaded (or whose servers are all failing), for connections over the cap, for an answer
over ``max_unsent_bytes`` and while the front stops, 500 only when the model raised.
No request, however malformed, ends the server, gets a 500 or has its bytes echoed;
each error is counted (``ServingMetrics.observe_error``).

Stopping (leaving the ``async with``; SIGTERM for ``python -m async_search.http``) is a
drain, as Triton and KServe do it: readiness turns 503 at once and the listening socket
closes (new connections are refused); bodies still arriving and requests that arrive
on open connections get 503 "the server is stopping"; every request already in the
handlers gets its answer within ``shutdown_timeout``, or that 503 when the grace ends.
No connection with a request in the handlers is closed without an answer.

Load and unload change what the server runs, so they are off until the front is made
with ``enable_repository=True`` or a ``repository_token`` (then each such request must
carry ``Authorization: Bearer <token>``). The front binds 127.0.0.1 unless told
otherwise. Connections, timeouts and body sizes are bounded by ``HttpLimits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time
import weakref
from typing import Any, Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from async_search.base import evaluate_with_version
from async_search.errors import (CircuitOpenError, InputSpecError, LoadParametersError,
                                 ModelBusyError, ModelLoadError, ModelNotFoundError,
                                 ModelNotReadyError,
                                 ProtocolError, RequestTimeoutError, ServerClosedError,
                                 ServerDiedError)
from async_search.http import kserve
from async_search.http.codec_pool import CodecPool
from async_search.http.error_responses import (CONNECTION_LAYER, error_handler_class,
                                               error_response, payload_error)
from async_search.http.front_lifetime import (FrontLifetime, cut_message,
                                              until_answered)
from async_search.http.inflate import inflate
from async_search.http.kserve import HEADER_LENGTH
from async_search.http.limits import (ConnectionLimiter, HttpLimits, LimitedSite,
                                      connection_cap, refusal_cap)
from async_search.http.metrics import ServingMetrics
from async_search.http.repository import (ModelEntry, ModelRepository, ModelSource,
                                          answered_as_asked)


_JSON = "application/json"
# How long aiohttp keeps reading (and dropping) a body left unread after an error
# response, so that the client sees the response rather than a reset.
_LINGERING_S = 2.0
# On exit, after the grace: how long the last answers (and 503s) get to be written
# before the connections are closed.
_FLUSH_S = 0.5
# Answers at least this large are checked against max_unsent_bytes before they are
# written; smaller ones fit in a socket's buffer.
_CHECKED_ANSWER_BYTES = 64 * 2 ** 10
_HTTP_VERSIONS = ((1, 1), (1, 0))
_MAX_HEADERS = 128  # as aiohttp's parser allows from 3.10 on
_STOPPING = "the server is stopping"
#: The status the metrics count for an inference whose client hung up before its
#: answer (nginx's "client closed request"; never sent).
CLIENT_GONE = 499


#: The status of each error that is the request's or the repository's, not the
#: front's: every error handler asks ``http_status``.
_STATUSES = ((ModelNotFoundError, 404), (ModelNotReadyError, 503),
             (LoadParametersError, 400), (ModelLoadError, 500), (ModelBusyError, 409))


def http_status(error: BaseException) -> int | None:
    """The HTTP status that answers ``error``: its own ``status`` (ProtocolError, aiohttp's
    HTTPException), the repository's errors' (unknown model or version 404, not loaded
    503, bad load parameters 400, failed load 500, a load or unload under way 409), or
    None for an error the front did
    not expect (answered 500 as an internal error)."""
    if isinstance(error, (ProtocolError, web.HTTPException)):
        return error.status
    for kind, status in _STATUSES:
        if isinstance(error, kind):
            return status
    return None


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload, allow_nan=False).encode(),
                        status=status, content_type=_JSON)


_error = error_response


def _weakly(method: Any) -> Any:
    """``method`` of a front, as a handler that does not keep the front alive: aiohttp
    keeps each handler and middleware with its app in a process-wide cache (up to 1024
    entries), which kept every closed front, and the models it served, alive."""
    ref = weakref.WeakMethod(method)

    async def handle(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        if bound is None:  # a request that outlived its front
            raise web.HTTPServiceUnavailable(text="the server is stopping")
        return await bound(*args, **kwargs)

    return handle


class HttpFront(FrontLifetime):
    """Serves models over HTTP with the KServe v2 protocol; an async context manager
    that binds on entry and, on exit, stops taking connections and closes what it owns.

    Args:
        models: a ``ModelRepository`` (served as is, its owner closes it), or name ->
            ``ModelSource`` or evaluate function (the front makes and owns a repository).
        host: the address to bind; 127.0.0.1 unless told otherwise.
        port: the port; 0 picks a free one (read it from ``port`` once entered).
        max_body_bytes: larger request bodies are refused with 413 (16 MiB).
        limits: connection cap, timeouts, JSON bound and offloading; see
            ``HttpLimits`` for the defaults.
        enable_repository: serve load and unload to anyone who can connect.
        repository_token: serve load and unload to requests that carry
            ``Authorization: Bearer <repository_token>``. With neither, load and unload
            answer 403.
        metrics: where to count requests and read server stats; a fresh
            ``ServingMetrics`` (with its own registry) by default.

    Example:
        A running server behind the front; clients POST to
        ``{front.url}/v2/models/mlp/infer`` (a network server, so not run in the
        tests):

        ```python
        async with asr.serve(MLP((16,), output_size=4)) as evaluate:
            async with HttpFront({"mlp": evaluate}) as front:
                print(front.url)  # http://127.0.0.1:PORT
        ```
    """

    def __init__(self, models: ModelRepository | Mapping[str, ModelSource | Any], *,
                 host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 16 * 2 ** 20,
                 limits: HttpLimits | None = None,
                 enable_repository: bool = False,
                 repository_token: str | None = None,
                 metrics: ServingMetrics | None = None):
        if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be an integer >= 1, got "
                             f"{max_body_bytes!r}")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        if limits is not None and not isinstance(limits, HttpLimits):
            raise TypeError(f"limits must be an HttpLimits, got {type(limits).__name__}")
        if repository_token is not None and (not isinstance(repository_token, str) or
                                             not repository_token):
            raise ValueError("repository_token must be a non-empty string or None")
        self._models = models
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.limits = limits if limits is not None else HttpLimits()
        self.enable_repository = bool(enable_repository)
        self.repository_token = repository_token
        self.metrics = metrics if metrics is not None else ServingMetrics()
        self._repository: ModelRepository | None = None
        workers = self.limits.offload_workers  # their pipes are kept out of the cap
        self.connections = ConnectionLimiter(
            connection_cap(self.limits.max_connections, workers),
            first_request_timeout=self.limits.keepalive_timeout,
            write_timeout=self.limits.write_timeout,
            max_unsent_bytes=self.limits.max_unsent_bytes,
            handler_class=error_handler_class(self.metrics.observe_error),
            max_lingering=refusal_cap(self.limits.max_connections, workers),
            on_event=self._connection_event)
        self._codec = CodecPool(self.limits.offload_workers)
        self._owns_repository = not isinstance(models, ModelRepository)
        self._runner: web.AppRunner | None = None
        self._site: LimitedSite | None = None
        self._exit: contextlib.AsyncExitStack | None = None  # what __aexit__ closes
        self._closing = False
        self._reading: set = set()   # body reads in progress: cut short on exit
        self._handling: set = set()  # tasks of the requests in the handlers
        self._cut: set = set()       # tasks the drain cancelled: they answer 503
        self._grace_ended: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests_in_progress(self) -> int:
        """Requests in the front's handlers now (read, not yet answered)."""
        return len(self._handling)

    def _gauges(self) -> dict:
        return {"requests_in_progress": len(self._handling),
                "open_connections": self.connections.open,
                "stalled_connections": self.connections.stalled_connections,
                "unsent_bytes": self.connections.unsent_bytes}

    @property
    def closing(self) -> bool:
        """Whether the front is stopping (readiness answers 503 from then on)."""
        return self._closing

    @property
    def addresses(self) -> list:
        """The (host, port) pairs of the bound sockets."""
        return [tuple(a[:2]) for a in self._runner.addresses] if self._runner else []

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "HttpFront":
        if self._runner is not None:
            raise RuntimeError("an HttpFront can be entered once")
        # Each step pushes its undoing: on exit (or when a later step fails) they run
        # in reverse: stop serving, close the codec pool, unwatch, close the repository.
        async with contextlib.AsyncExitStack() as stack:
            if self._owns_repository:
                # An unload waits for the model's batch a grace at most, as the exit.
                repository = await stack.enter_async_context(ModelRepository(
                    self._models, max_workers=self.limits.max_workers,
                    close_timeout=self.limits.shutdown_timeout))
                # Runs after the drain, just before the repository closes: a model that
                # never returns holds the exit a grace at most (none after a second
                # signal), then its requests fail and its thread is left to end.
                stack.callback(self._bound_close, repository)
            else:
                repository = self._models  # its owner closes it
            self._repository = repository
            for name in repository.names:
                entry = repository.entry(name)
                self.metrics.watch(name, provider=lambda e=entry: e.evaluate)
                stack.callback(self.metrics.unwatch, name)
            self.metrics.watch_front(self._gauges)
            stack.callback(self.metrics.watch_front, None)
            stack.push_async_callback(self._codec.aclose, self.limits.shutdown_timeout)
            app = web.Application(client_max_size=self.max_body_bytes,
                                  middlewares=[web.middleware(_weakly(self._errors))])
            self._routes(app)
            # aiohttp's own shutdown only writes out the answers the drain left (the
            # drain answers every request first): its timeout is the flush, not the
            # grace, or the exit would take twice the grace.
            self._runner = web.AppRunner(
                app, access_log=None, handle_signals=False,
                shutdown_timeout=min(_FLUSH_S, self.limits.shutdown_timeout),
                keepalive_timeout=self.limits.keepalive_timeout, auto_decompress=False,
                lingering_time=min(_LINGERING_S, self.limits.read_timeout))
            stack.callback(self.connections.close)
            # Closes idle connections, writes out the last answers, closes the rest.
            stack.push_async_callback(self._runner.cleanup)
            stack.push_async_callback(self._drain)  # first: see _drain
            await self._runner.setup()
            self._site = LimitedSite(self._runner, self.host, self.port,
                                     limiter=self.connections, backlog=1024)
            await self._site.start()
            self.port = self._runner.addresses[0][1]
            self._exit = stack.pop_all()
        return self

    async def _drain(self) -> None:
        """Stop as Triton and KServe do: unready at once, no new connections, bodies
        still arriving cut short (503), every request in the handlers answered within
        ``shutdown_timeout`` or, when the grace ends, with a 503 saying the server is
        stopping; then the last answers get ``_FLUSH_S`` to be written."""
        self._closing = True
        if self._grace_ended is None:
            self._grace_ended = asyncio.Event()
        if self._site is not None:  # closes the listening socket: connections refused
            site, self._site = self._site, None
            await site.stop()
        for read in list(self._reading):
            read.cancel()
        loop = asyncio.get_running_loop()
        ended = asyncio.ensure_future(self._grace_ended.wait())
        try:
            # Requests that arrive meanwhile are answered 503 at once, so this only
            # waits for the ones that were in the handlers, or until the grace ends.
            await until_answered(self._handling, ended, self.limits.shutdown_timeout)
        finally:
            ended.cancel()
        self._cut.update(self._handling)
        for task in list(self._handling):
            task.cancel()  # the middleware answers 503 (the task is in _cut)
        # Requests pipelined behind those reach the middleware once the answer before
        # them is out, and get 503 there at once: wait for them too, briefly.
        deadline = loop.time() + _FLUSH_S
        while (self._handling or self._queued()) and loop.time() < deadline:
            if self._handling:
                await asyncio.wait(list(self._handling), timeout=deadline - loop.time())
            else:
                await asyncio.sleep(0.005)

    def _queued(self) -> int:
        """Requests read and parsed but not yet in the handlers (pipelined)."""
        server = self._runner.server if self._runner is not None else None
        return sum(len(getattr(handler, "_messages", ()))
                   for handler in (server.connections if server is not None else ()))

    def _grace_is_over(self) -> bool:
        return self._grace_ended is not None and self._grace_ended.is_set()

    def _bound_close(self, repository: ModelRepository) -> None:
        repository.close_timeout = (0.0 if self._grace_is_over()
                                    else self.limits.shutdown_timeout)

    def end_grace(self) -> None:
        """End the shutdown grace now (a second SIGTERM or Ctrl-C): requests still in
        the handlers get 503 "the server is stopping" at once."""
        if self._grace_ended is None:
            self._grace_ended = asyncio.Event()
        self._grace_ended.set()

    def _connection_event(self, kind: str) -> None:
        if kind == "refused":
            self.metrics.observe_error(503, CONNECTION_LAYER)
        else:
            self.metrics.observe_dropped(kind)

    def _routes(self, app: web.Application) -> None:
        model = "/v2/models/{name}"
        versioned = "/v2/models/{name}/versions/{version}"
        get, post = app.router.add_get, app.router.add_post
        get("/v2", _weakly(self._server_metadata))
        get("/v2/health/live", _weakly(self._live))
        get("/v2/health/ready", _weakly(self._ready))
        for prefix in (model, versioned):
            get(prefix, _weakly(self._model_metadata))
            get(prefix + "/ready", _weakly(self._model_ready))
            post(prefix + "/infer", _weakly(self._infer))
        post("/v2/repository/index", _weakly(self._index))
        post("/v2/repository/models/{name}/load", _weakly(self._load))
        post("/v2/repository/models/{name}/unload", _weakly(self._unload))
        get("/metrics", _weakly(self._metrics))

    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        # Busy from here (the limiter counted it so from its arrival) to its answer.
        connection = self.connections.busy(request.transport)
        task = asyncio.current_task()
        try:
            if request.version not in _HTTP_VERSIONS:  # HTTP/0.9 (llhttp), 1.2 (Python's)
                return _error("the front speaks HTTP/1.0 and HTTP/1.1", 400)
            if len(request.raw_headers) > _MAX_HEADERS:  # aiohttp < 3.10 has no bound
                return _error(f"the request has more than {_MAX_HEADERS} headers", 431)
            if self._closing and request.method != "GET":  # GETs (readiness) answered
                return self._stopping(request)
            self._handling.add(task)
            response = await handler(request)
        except web.HTTPException as e:  # no such route, wrong method, body too large
            if e.status < 400:
                raise
            response = _error(self._http_error_message(e), e.status)
            if "Allow" in e.headers:
                response.headers["Allow"] = e.headers["Allow"]
        except asyncio.CancelledError:
            if task not in self._cut or _cancelled_elsewhere(task):
                raise  # not the drain's doing: the connection or the loop is going
            return self._stopping(request, cut_message(
                _STOPPING, self._grace_is_over(), self.limits.shutdown_timeout))
        except Exception as e:  # noqa: BLE001 - a bad request must never end the server
            status = http_status(e)
            if status is None:
                response = _error(f"internal error: {type(e).__name__}: {e}", 500)
            else:
                response = _error(str(e), status)
            if request.content.exception() is not None:  # a broken body: the stream's
                response.force_close()                    # state is unknown
        finally:
            self._handling.discard(task)
            self.connections.idle(connection)
        body = getattr(response, "body", None)
        size = len(body) if isinstance(body, (bytes, bytearray)) else 0
        if size >= _CHECKED_ANSWER_BYTES and not self.connections.admit_answer(size):
            response = self._unsent_refusal(size)
            size = 0
        self.connections.answering(connection, size)
        if self._closing:
            self._close_after(request, response)
        return response

    def _http_error_message(self, e: web.HTTPException) -> str:
        """Words of the front's own (aiohttp's texts may quote the request)."""
        if e.status == 413:
            return (f"the request body is larger than the front's limit of "
                    f"{self.max_body_bytes} bytes")
        if e.status == 404:
            return "Not Found: no such route; see GET /v2 and GET /v2/models/{name}"
        if e.status == 405:
            return f"Method Not Allowed: this route takes {e.headers.get('Allow', '')}"
        return e.reason

    def _stopping(self, request: web.Request, message: str = _STOPPING) -> web.Response:
        response = _error(message, 503)
        self._close_after(request, response)
        return response

    @staticmethod
    def _close_after(request: web.Request, response: web.StreamResponse) -> None:
        """While stopping, answers say ``Connection: close``, unless requests that the
        client pipelined wait behind this one: those get their answers (503) first."""
        if not getattr(request.protocol, "_messages", None):
            response.force_close()

    def _unsent_refusal(self, size: int) -> web.Response:
        bound = self.limits.max_unsent_bytes
        if 2 * size > bound:  # never admitted (the answer and its copy being written)
            return _error(f"the answer has {size} bytes, over half the front's "
                          f"max_unsent_bytes of {bound}: ask for fewer rows", 503)
        # (it said the server held the whole bound: the number was the limit's)
        held = self.connections.unsent_bytes
        response = _error(f"the server holds {held} bytes of answers that clients have "
                          f"not taken; this answer of {size} bytes, counted twice while "
                          f"it is written, would pass max_unsent_bytes of {bound}; retry "
                          f"shortly", 503)
        response.headers["Retry-After"] = "1"
        return response

    # -- health and metadata ----------------------------------------------------------
    async def _server_metadata(self, request: web.Request) -> web.Response:
        extensions = ["binary_tensor_data"]
        if self.enable_repository or self.repository_token:
            extensions.append("model_repository")
        return _json({"name": "async_search", "version": "0.1.0",
                      "extensions": extensions})

    async def _live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def _ready(self, request: web.Request) -> web.Response:
        ready = not self._closing and any(
            self._repository.entry(n).ready for n in self._repository.names)
        return _json({"ready": ready}, 200 if ready else 503)

    def _entry(self, request: web.Request) -> ModelEntry:
        return self._repository.entry(request.match_info["name"],
                                     request.match_info.get("version"))

    async def _model_metadata(self, request: web.Request) -> web.Response:
        return _json(self._entry(request).metadata())

    async def _model_ready(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        return _json({"name": entry.name, "ready": entry.ready},
                     200 if entry.ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": self.metrics.content_type})

    # -- bodies -----------------------------------------------------------------------
    async def _read(self, request: web.Request) -> bytes:
        """The body, within read_timeout (else 408), cut short on exit (503)."""
        read = asyncio.ensure_future(request.read())
        self._reading.add(read)
        try:
            done, _ = await asyncio.wait({read}, timeout=self.limits.read_timeout)
        finally:
            self._reading.discard(read)
            if not read.done():
                read.cancel()
        if not done:
            raise ProtocolError(f"the request body did not arrive within the front's "
                                f"read_timeout of {self.limits.read_timeout:g} s",
                                status=408)
        if read.cancelled():
            raise ProtocolError(f"{_STOPPING}: the request body was still arriving",
                                status=503)
        try:
            body = read.result()
        except ConnectionError:
            raise ProtocolError("the client closed the connection before the whole body "
                                "arrived") from None
        except (RequestPayloadError, HttpProcessingError) as e:  # framing or encoding
            # The rest of the body cannot be read: no lingering read of it after the
            # answer (it would only raise again), and the connection closes after it.
            request.content.feed_eof()
            status, message = payload_error(e)
            raise ProtocolError(message, status=status) from None
        encoding = request.headers.get("Content-Encoding")
        # Decoded here, within the body limit (aiohttp's own decoding is turned off: it
        # inflated each chunk that arrived whole)
        return body if encoding is None else inflate(body, encoding, self.max_body_bytes)

    # -- repository -------------------------------------------------------------------
    def _repository_allowed(self, request: web.Request) -> None:
        if self.enable_repository:
            return
        if self.repository_token is None:
            raise ProtocolError("the repository endpoints (load, unload) are off: start "
                                "the front with enable_repository=True "
                                "(--enable-repository) or a repository_token "
                                "(--repository-token)", status=403)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        # A header's bytes that are not text come in as surrogates: such a token is
        # wrong, not an error of the front's.
        given = token.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given, self.repository_token.encode()):
            raise ProtocolError("load and unload need the header 'Authorization: Bearer "
                                "<repository token>'; it is missing or wrong", status=403)

    async def _parameters(self, request: web.Request) -> Mapping[str, Any]:
        # Checked before the read when the length is sent, and on what was read (a
        # chunked body has no Content-Length; a compressed one inflates).
        length = request.content_length
        if length is None or length <= self.limits.max_json_bytes:
            body = await self._read(request)
            length = len(body)
        if length > self.limits.max_json_bytes:
            raise ProtocolError(f"the body has {length} bytes, over the front's "
                                f"max_json_bytes of {self.limits.max_json_bytes}",
                                status=413)
        if not body.strip():
            return {}
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            raise ProtocolError("the body must be empty or a JSON object "
                                "{\"parameters\": {...}}") from None
        if not isinstance(payload, dict) or not isinstance(
                payload.get("parameters", {}), dict):
            raise ProtocolError("the body must be a JSON object {\"parameters\": {...}}")
        return payload.get("parameters", {})

    async def _index(self, request: web.Request) -> web.Response:
        return _json(self._repository.index())

    async def _load(self, request: web.Request) -> web.Response:
        self._repository_allowed(request)
        name = request.match_info["name"]
        parameters = await self._parameters(request)
        # wait=False: a load under way (a factory that hangs) answers 409 at once,
        # rather than gather requests behind it that nobody cancels.
        await self._repository.load(name, parameters, wait=False)
        entry = self._repository.entry(name)
        return _json({"name": name, "version": entry.version, "state": "READY"})

    async def _unload(self, request: web.Request) -> web.Response:
        self._repository_allowed(request)
        name = request.match_info["name"]
        parameters = dict(await self._parameters(request))
        parameters.pop("unload_dependents", None)  # sent by tritonclient; none here
        if parameters:  # named as a load names them: cut to 40 characters, 10 at most
            unknown = sorted(str(k)[:40] for k in parameters)
            raise ProtocolError(f"unknown unload parameters {unknown[:10]}: the only "
                                f"unload parameter is unload_dependents")
        await self._repository.unload(name, wait=False)
        return _json({"name": name, "state": "UNAVAILABLE"})

    # -- inference --------------------------------------------------------------------
    async def _infer(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        name = request.match_info["name"]
        version = ""
        try:
            entry = self._entry(request)
            asked = request.match_info.get("version")
            self._repository.serving(name, asked)  # refused before the body is read
            header_length = request.headers.get(HEADER_LENGTH)
            length = request.content_length
            if length is not None and length > self.max_body_bytes:
                raise ProtocolError(f"the request's Content-Length is over the front's "
                                    f"limit of {self.max_body_bytes} bytes", status=413)
            if length is not None and "Content-Encoding" not in request.headers:
                # Refuse an oversized JSON part before reading it (of a compressed body,
                # the header gives the inflated length: checked once it is read).
                self._check_json(kserve.json_length(length, header_length))
            body = await self._read(request)
            json_length = kserve.json_length(len(body), header_length)
            self._check_json(json_length)
            decode = functools.partial(kserve.decode_request, body, header_length,
                                       max_elements=self.max_body_bytes)
            decoded = await self._codec.run(decode) if (
                json_length >= self.limits.offload_bytes) else decode()
            x = kserve.input_array(decoded, entry.input_name, entry.input_spec)
            # What serves the model now: it may have been unloaded and loaded again
            # while the body came in.
            evaluate = self._repository.serving(name, asked)
            outputs, version = await self._evaluate(evaluate, name, x)
            version = kserve.version_label(version)  # the protocol's versions are text
            answered_as_asked(name, asked, version)
            named = kserve.named_outputs(outputs, entry.output_names)
            if not entry.outputs:
                entry.outputs = kserve.output_metadata(named)
            encode = functools.partial(
                kserve.encode_response, model_name=name, model_version=version,
                request_id=decoded.id, outputs=named, requested=decoded.outputs,
                binary_output=decoded.binary_output)
            payload, header_length = await self._codec.run(encode) if (
                _json_values(named, decoded) * 16 >= self.limits.offload_bytes) \
                else encode()
        except Exception as e:
            # None: an error the front did not expect, which the middleware answers 500
            status = http_status(e) or 500
            if name in self._repository.names:  # never a label per unknown name sent
                self.metrics.observe_request(name, version, status,
                                             time.perf_counter() - start)
            raise
        size = len(payload)
        if size >= _CHECKED_ANSWER_BYTES and not self.connections.admit_answer(size):
            # Refused here, not by the middleware, so that the request counts as a 503.
            self.metrics.observe_request(name, version, 503, time.perf_counter() - start)
            return self._unsent_refusal(size)
        transport = request.transport
        # A client that hung up while its batch ran is no 200: 499, nginx's "client
        # closed request" (aiohttp runs the handler on; its answer goes nowhere).
        gone = transport is None or transport.is_closing()
        self.metrics.observe_request(name, version, CLIENT_GONE if gone else 200,
                                     time.perf_counter() - start)
        answer = _LetGo if size >= _CHECKED_ANSWER_BYTES else web.Response
        if header_length is None:
            return answer(body=payload, content_type=_JSON)
        return answer(body=payload, content_type="application/octet-stream",
                      headers={HEADER_LENGTH: str(header_length)})

    def _check_json(self, length: int) -> None:
        if length > self.limits.max_json_bytes:
            raise ProtocolError(
                f"the request's JSON has {length} bytes, over the front's max_json_bytes "
                f"of {self.limits.max_json_bytes}: send large tensors with the binary "
                f"tensor extension (parameters.binary_data_size and the "
                f"{HEADER_LENGTH} header), up to {self.max_body_bytes} bytes",
                status=413)

    @staticmethod
    async def _evaluate(evaluate: Any, name: str, x):
        try:
            return await evaluate_with_version(evaluate, x)
        except InputSpecError as e:
            raise ProtocolError(str(e), status=400) from e
        except (ServerClosedError, ServerDiedError, CircuitOpenError) as e:
            # what serves the model is gone or refusing, not the model failing: a
            # status clients retry (a 500 they would not)
            raise ProtocolError(f"model {name!r} is unavailable: {e}", status=503) from e
        except RequestTimeoutError as e:  # an upstream's deadline, not the model
            raise ProtocolError(f"model {name!r} did not answer in time: {e}",
                                status=504) from e
        except Exception as e:  # noqa: BLE001 - the model's failure, not the front's
            raise ProtocolError(f"model {name!r} failed: {type(e).__name__}: {e}",
                                status=500) from e


class _LetGo(web.Response):
    """A large answer that lets go of its bytes once they are written: aiohttp keeps a
    kept-alive connection's last response until its next request, which would hold
    an answer per idle client."""

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await super().write_eof(data)
        finally:
            self.body = None


def _cancelled_elsewhere(task: asyncio.Task) -> bool:
    """Undo the drain's cancellation of ``task``; True if something else cancelled it
    too (Python 3.11+ counts cancellations; 3.10 cannot tell, and says no)."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel is not None and uncancel() > 0


def _json_values(named, decoded: kserve.InferRequest) -> int:
    """How many output values the response will write as JSON numbers."""
    if decoded.outputs is None:
        return 0 if decoded.binary_output else sum(a.size for _, a in named)
    sizes = dict((n, a.size) for n, a in named)
    return sum(sizes.get(out.name, 0) for out in decoded.outputs if not out.binary)
