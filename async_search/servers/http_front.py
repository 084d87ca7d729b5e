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
                                                {"num_workers": k}})
    POST /v2/repository/models/{name}/unload    unload (requests in flight finish)
    GET  /metrics                               Prometheus text format

Every error is the protocol's JSON ``{"error": "..."}`` with a fitting status: 400 for a
body that breaks the protocol or does not fit the model, 404 for an unknown model or
version, 413 for a body over ``max_body_bytes``, 503 for a model that is not loaded
(or whose servers are all failing), 500 when the model raised. No body, however
malformed, ends the server.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from aiohttp import web

from async_search.errors import InputSpecError, ServerClosedError
from async_search.servers import kserve
from async_search.servers.breaker import CircuitOpenError
from async_search.servers.kserve import ProtocolError, TensorMetadata
from async_search.servers.metrics import ServingMetrics
from async_search.servers.repository import ModelEntry, ModelRepository, ModelSource

__all__ = ["HttpFront"]

_HEADER_LENGTH = "Inference-Header-Content-Length"
_JSON = "application/json"


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status,
                        content_type=_JSON)


def _error(message: str, status: int) -> web.Response:
    return web.Response(body=kserve.error_body(message), status=status, content_type=_JSON)


class HttpFront:
    """Serves models over HTTP with the KServe v2 protocol; an async context manager
    that binds on entry and, on exit, stops taking connections and closes what it owns.

    Args:
        models: a ``ModelRepository`` (served as is, its owner closes it), or name ->
            ``ModelSource`` or evaluate function (the front makes and owns a repository).
        host: the address to bind; 127.0.0.1 unless told otherwise.
        port: the port; 0 picks a free one (read it from ``port`` once entered).
        max_body_bytes: larger request bodies are refused with 413.
        metrics: where to count requests and read server stats; a fresh
            ``ServingMetrics`` (with its own registry) by default.

    Example:
        >>> # async with asr.serve(MLP((16,), output_size=4)) as evaluate:
        >>> #     async with HttpFront({"mlp": evaluate}) as front:
        >>> #         front.url  # 'http://127.0.0.1:PORT': POST .../v2/models/mlp/infer
    """

    def __init__(self, models: ModelRepository | Mapping[str, ModelSource | Any], *,
                 host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 16 * 2 ** 20,
                 metrics: ServingMetrics | None = None):
        if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be an integer >= 1, got "
                             f"{max_body_bytes!r}")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        self._models = models
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics if metrics is not None else ServingMetrics()
        self.repository: ModelRepository | None = None
        self._owns_repository = not isinstance(models, ModelRepository)
        self._runner: web.AppRunner | None = None
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def addresses(self) -> list:
        """The (host, port) pairs of the bound sockets."""
        return [tuple(a[:2]) for a in self._runner.addresses] if self._runner else []

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "HttpFront":
        if self._runner is not None:
            raise RuntimeError("an HttpFront can be entered once")
        repository = self._models if not self._owns_repository else ModelRepository(
            self._models)
        if self._owns_repository:
            await repository.__aenter__()
        self.repository = repository
        try:
            for name in repository.names:
                entry = repository.entry(name)
                self.metrics.watch(name, provider=lambda e=entry: e.evaluate)
            app = web.Application(client_max_size=self.max_body_bytes,
                                  middlewares=[self._errors])
            self._routes(app)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
            await site.start()
            self.port = self._runner.addresses[0][1]
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closing = True
        try:
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            for name in (self.repository.names if self.repository else []):
                self.metrics.unwatch(name)
            if self._owns_repository and self.repository is not None:
                await self.repository.aclose()

    def _routes(self, app: web.Application) -> None:
        model = "/v2/models/{name}"
        versioned = "/v2/models/{name}/versions/{version}"
        app.router.add_get("/v2", self._server_metadata)
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        for prefix in (model, versioned):
            app.router.add_get(prefix, self._model_metadata)
            app.router.add_get(prefix + "/ready", self._model_ready)
            app.router.add_post(prefix + "/infer", self._infer)
        app.router.add_post("/v2/repository/index", self._index)
        app.router.add_post("/v2/repository/models/{name}/load", self._load)
        app.router.add_post("/v2/repository/models/{name}/unload", self._unload)
        app.router.add_get("/metrics", self._metrics)

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ProtocolError as e:
            return _error(str(e), e.status)
        except web.HTTPException as e:  # no such route, wrong method, body too large
            if e.status < 400:
                raise
            reason = e.text if e.text and not e.text.startswith(f"{e.status}:") else (
                e.reason)
            if e.status == 413:
                reason = (f"the request body is larger than the front's limit of "
                          f"{self.max_body_bytes} bytes")
            return _error(reason, e.status)
        except Exception as e:  # noqa: BLE001 - a bad request must never end the server
            return _error(f"internal error: {type(e).__name__}: {e}", 500)

    # -- health and metadata ----------------------------------------------------------
    async def _server_metadata(self, request: web.Request) -> web.Response:
        return _json({"name": "async_search", "version": "0.1.0",
                      "extensions": ["binary_tensor_data", "model_repository"]})

    async def _live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def _ready(self, request: web.Request) -> web.Response:
        ready = not self._closing and any(
            self.repository.entry(n).ready for n in self.repository.names)
        return _json({"ready": ready}, 200 if ready else 503)

    def _entry(self, request: web.Request) -> ModelEntry:
        entry = self.repository.entry(request.match_info["name"])
        version = request.match_info.get("version")
        if version is not None and entry.ready and version != entry.version:
            raise ProtocolError(f"model {entry.name!r} has no version {version!r}: it "
                                f"serves version {entry.version!r}", status=404)
        return entry

    async def _model_metadata(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        spec, out_spec = entry.input_spec, entry.output_spec
        inputs = [TensorMetadata.of_spec(entry.input_name, spec)] if spec else [
            TensorMetadata(entry.input_name, "", (-1,))]
        if out_spec is not None:
            name = entry.output_names[0] if entry.output_names else "output"
            outputs = (TensorMetadata.of_spec(name, out_spec),)
        else:
            outputs = entry.outputs
        return _json(kserve.model_metadata(
            entry.name, [entry.version] if entry.ready else [], inputs, outputs))

    async def _model_ready(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        return _json({"name": entry.name, "ready": entry.ready},
                     200 if entry.ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": self.metrics.content_type})

    # -- repository -------------------------------------------------------------------
    async def _parameters(self, request: web.Request) -> Mapping[str, Any]:
        body = await request.read()
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
        return _json(self.repository.index())

    async def _load(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        parameters = await self._parameters(request)
        await self.repository.load(name, parameters)
        entry = self.repository.entry(name)
        return _json({"name": name, "version": entry.version, "state": "READY"})

    async def _unload(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        parameters = dict(await self._parameters(request))
        parameters.pop("unload_dependents", None)  # sent by tritonclient; none here
        if parameters:
            raise ProtocolError(f"unknown unload parameters {sorted(parameters)}")
        await self.repository.unload(name)
        return _json({"name": name, "state": "UNAVAILABLE"})

    # -- inference --------------------------------------------------------------------
    async def _infer(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        name = request.match_info["name"]
        version = ""
        try:
            entry = self._entry(request)
            evaluate = entry.evaluate
            if evaluate is None:
                raise ProtocolError(f"model {name!r} is not loaded: load it with POST "
                                    f"/v2/repository/models/{name}/load", status=503)
            length = request.content_length
            if length is not None and length > self.max_body_bytes:
                raise ProtocolError(f"the request body has {length} bytes, over the "
                                    f"front's limit of {self.max_body_bytes}", status=413)
            body = await request.read()
            decoded = kserve.decode_request(body, request.headers.get(_HEADER_LENGTH))
            x = kserve.input_array(decoded, entry.input_name, entry.input_spec)
            outputs, version = await self._evaluate(evaluate, name, x)
            version = str(version)
            named = kserve.named_outputs(outputs, entry.output_names)
            if not entry.outputs:
                entry.outputs = kserve.output_metadata(named)
            payload, header_length = kserve.encode_response(
                model_name=name, model_version=version, request_id=decoded.id,
                outputs=named, requested=decoded.outputs,
                binary_output=decoded.binary_output)
        except (ProtocolError, web.HTTPException) as e:
            if name in self.repository.names:  # never a label per unknown name sent
                self.metrics.observe_request(name, version, e.status,
                                             time.perf_counter() - start)
            raise
        self.metrics.observe_request(name, version, 200, time.perf_counter() - start)
        if header_length is None:
            return web.Response(body=payload, content_type=_JSON)
        return web.Response(body=payload, content_type="application/octet-stream",
                            headers={_HEADER_LENGTH: str(header_length)})

    @staticmethod
    async def _evaluate(evaluate: Any, name: str, x):
        try:
            with_version = getattr(evaluate, "with_version", None)
            if with_version is not None:
                return await with_version(x)
            return await evaluate(x), getattr(evaluate, "version", 0)
        except InputSpecError as e:
            raise ProtocolError(str(e), status=400) from e
        except (ServerClosedError, CircuitOpenError) as e:
            raise ProtocolError(f"model {name!r} is unavailable: {e}", status=503) from e
        except Exception as e:  # noqa: BLE001 - the model's failure, not the front's
            raise ProtocolError(f"model {name!r} failed: {type(e).__name__}: {e}",
                                status=500) from e
