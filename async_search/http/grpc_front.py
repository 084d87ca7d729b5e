"""A gRPC front that speaks the KServe v2 / Open Inference Protocol, with grpc.aio.

The gRPC twin of ``http.front.HttpFront``: it serves a ``ModelRepository``
(its own, or the very one an HTTP front serves, so that both protocols' requests join
the same batches) through the protocol's ``inference.GRPCInferenceService``, with the
stubs that ``tritonclient[grpc]`` ships. Methods served:

    ServerLive, ServerReady, ServerMetadata    liveness, readiness, name and extensions
    ModelReady, ModelMetadata                  a model's readiness, inputs and outputs
    ModelInfer                                 inference: raw_input_contents (or typed
                                               contents) in, raw_output_contents out

Every other method of the service answers UNIMPLEMENTED, naming it. Errors are
gRPC status codes with a message: INVALID_ARGUMENT for a request that breaks the
protocol or does not fit the model (the HTTP front's 400), NOT_FOUND for an unknown
model or version (404), UNAVAILABLE for a model that is not loaded, one whose servers
are closed, and while the front stops (503), INTERNAL when the model raised (500),
RESOURCE_EXHAUSTED past ``max_concurrent_rpcs`` or for a message over
``max_message_bytes`` (grpc's own), and for an answer that would bring the answers
clients have not taken over ``max_unsent_bytes`` (HTTP's 503). No request, however
malformed, ends the server.

Answers clients do not take: grpc holds a returned answer (about three copies of its
serialized bytes) until HTTP/2 flow control lets it all out, for as long as the client
stays connected; the RPC stays counted in ``max_concurrent_rpcs`` till then. The front
counts each answer's bytes from the handler's return to the RPC's end (done callback:
delivered, cancelled, connection lost, server stopped) and refuses one that would pass
``max_unsent_bytes``: a bound on memory, not on time (grpc gives no write timeout: a
client that never reads keeps its share, and its RPC slots, until it disconnects or the
front stops).

Stopping (leaving the ``async with``) drains as the HTTP front does: readiness turns
false at once and new RPCs get UNAVAILABLE "the server is stopping"; every RPC in
progress gets its answer within ``shutdown_timeout`` seconds, or UNAVAILABLE when the
grace ends; then the server stops. A client's deadline cancels its RPC, and so its
request, on the server too.

Example:
    Both fronts on one repository; clients connect with
    ``GrpcRemoteEvaluate(grpc.address, "mlp")`` (network servers, so not run in the
    tests):

    ```python
    async with HttpFront(models) as http, GrpcFront(http.repository) as grpc:
        print(grpc.address)  # 127.0.0.1:PORT
    ```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Mapping

import grpc
from tritonclient.grpc import service_pb2_grpc

from async_search.base import evaluate_with_version
from async_search.checks import check_float, check_int
from async_search.errors import (CircuitOpenError, InputSpecError, ModelNotFoundError,
                                 ModelNotReadyError, ProtocolError, RequestTimeoutError,
                                 ServerClosedError, ServerDiedError)
from async_search.http import kserve
from async_search.http.front_lifetime import (FrontLifetime, cut_message,
                                              until_answered)
from async_search.http.grpc_tensors import (REFUSED_KEY, TOO_LARGE_KEY, decode_request,
                                           encode_response, pb)
from async_search.http.repository import ModelRepository, ModelSource, answered_as_asked


_STOPPING = "the server is stopping"
# After the grace: how long grpc gets to write the last answers before it closes.
_FLUSH_S = 0.5
# What the process holds of an answer not yet taken, in multiples of its serialized
# size: grpc keeps the response message, its serialized bytes and core's copy of them
# (measured: 2.9 times the answer in RSS per stalled RPC).
_HELD_COPIES = 3
# Answers smaller than this are not counted against max_unsent_bytes (as over HTTP).
_COUNTED_ANSWER_BYTES = 64 * 2 ** 10

#: The status code of each error that is the request's or the repository's.
_CODES = ((ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
          (ModelNotReadyError, grpc.StatusCode.UNAVAILABLE),
          (InputSpecError, grpc.StatusCode.INVALID_ARGUMENT))
_HTTP_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
               413: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL,
               503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.UNAVAILABLE}
#: What serves a model is gone, refusing or late (not the model failing): UNAVAILABLE,
#: which clients retry, as HTTP's 503 and 504.
_UNAVAILABLE = (ServerClosedError, ServerDiedError, RequestTimeoutError, CircuitOpenError)


def grpc_status(error: BaseException) -> grpc.StatusCode:
    """The status code that answers ``error``: the gRPC twin of the HTTP status a
    ``ProtocolError`` carries, the repository's errors' (unknown model or version
    NOT_FOUND, not loaded UNAVAILABLE), INVALID_ARGUMENT for input that does not fit
    the model, INTERNAL for anything else (the model failed)."""
    if isinstance(error, ProtocolError):
        return _HTTP_CODES.get(error.status, grpc.StatusCode.INVALID_ARGUMENT
                               if 400 <= error.status < 500 else grpc.StatusCode.INTERNAL)
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    if isinstance(error, _UNAVAILABLE):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class _Refusal(Exception):
    """What a handler answers instead of a response: a status code and a message."""

    def __init__(self, code: grpc.StatusCode, message: str, trailing: tuple | None = None):
        super().__init__(message)
        self.code = code
        self.trailing = trailing  # None: the code's usual trailing metadata


class GrpcFront(FrontLifetime):
    """Serves models over gRPC with the KServe v2 protocol; an async context manager
    that binds on entry and, on exit, drains and closes what it owns.

    Args:
        models: a ``ModelRepository`` (served as is: its owner closes it, as an
            ``HttpFront``'s ``repository``), or name -> ``ModelSource`` or evaluate
            function (the front makes and owns a repository).
        host: the address to bind; 127.0.0.1 unless told otherwise.
        port: the port; 0 picks a free one (read it from ``port`` once entered).
        max_message_bytes: the largest request message; larger ones get
            RESOURCE_EXHAUSTED (16 MiB, as the HTTP front's body limit). An answer of
            64 KiB or more over a third of ``max_unsent_bytes`` gets
            RESOURCE_EXHAUSTED, marked too large (``GrpcRemoteEvaluate`` splits its
            request).
        max_concurrent_rpcs: RPCs in progress at once; more get RESOURCE_EXHAUSTED. An
            RPC whose answer the client has not taken all of is still in progress.
        max_unsent_bytes: the most bytes of answers that clients have not taken yet,
            over all connections, each counted three times (the copies grpc holds);
            an answer beyond gets RESOURCE_EXHAUSTED (256 MiB, as the HTTP front's).
            Answers under 64 KiB are not counted (``max_concurrent_rpcs`` bounds them).
        shutdown_timeout: seconds the RPCs in progress get on exit before they are
            answered UNAVAILABLE.

    Example:
        A front that makes and owns its repository (a network server, so not run in
        the tests):

        ```python
        async with GrpcFront({"mlp": ModelSource(lambda: MLP((16,)))}) as front:
            print(front.address)  # 127.0.0.1:PORT
        ```
    """

    def __init__(self, models: ModelRepository | Mapping[str, ModelSource | Any], *,
                 host: str = "127.0.0.1", port: int = 0,
                 max_message_bytes: int = 16 * 2 ** 20, max_concurrent_rpcs: int = 1024,
                 max_unsent_bytes: int = 256 * 2 ** 20, shutdown_timeout: float = 5.0):
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        self._models = models
        self.host = host
        self.port = port
        self.max_message_bytes = check_int("max_message_bytes", max_message_bytes,
                                           minimum=1)
        self.max_concurrent_rpcs = check_int("max_concurrent_rpcs", max_concurrent_rpcs,
                                             minimum=1)
        self.max_unsent_bytes = check_int("max_unsent_bytes", max_unsent_bytes,
                                          minimum=1)
        self.unsent_bytes = 0        # of answers returned whose RPC is not done
        self.shutdown_timeout = check_float("shutdown_timeout", shutdown_timeout,
                                            minimum=0)
        self._repository: ModelRepository | None = None
        self._server: grpc.aio.Server | None = None
        self._exit: contextlib.AsyncExitStack | None = None
        self._closing = False
        self._grace_ended = False    # a second signal: the RPCs in progress are cut now
        self._grace_wake: asyncio.Future | None = None  # the drain's wait, to end it
        self._handling: set = set()  # tasks of the RPCs in progress
        self._cut: set = set()       # tasks the drain cancelled: they answer UNAVAILABLE

    @property
    def address(self) -> str:
        """``host:port``, what a gRPC client dials (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def closing(self) -> bool:
        """Whether the front is stopping (readiness is false from then on)."""
        return self._closing

    @property
    def requests_in_progress(self) -> int:
        """RPCs in the handlers now."""
        return len(self._handling)

    # -- lifetime ---------------------------------------------------------------------
    async def __aenter__(self) -> "GrpcFront":
        if self._exit is not None or self._server is not None:
            raise RuntimeError("a GrpcFront can be entered once")
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(self._models, ModelRepository):
                self._repository = self._models  # its owner closes it
            else:
                # An unload waits for the model's batch a grace at most, as the exit.
                self._repository = await stack.enter_async_context(
                    ModelRepository(self._models, close_timeout=self.shutdown_timeout))
                # After the drain, before the repository closes: as HttpFront's.
                stack.callback(self._bound_close, self._repository)
            self._server = grpc.aio.server(
                options=[("grpc.max_receive_message_length", self.max_message_bytes),
                         ("grpc.max_send_message_length", -1),
                         ("grpc.so_reuseport", 0)],
                maximum_concurrent_rpcs=self.max_concurrent_rpcs)
            handlers = _method_handlers(_Servicer(self))
            self._server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(_SERVICE, handlers),))
            self._server.add_registered_method_handlers(_SERVICE, handlers)
            try:
                port = self._server.add_insecure_port(self.address)
            except RuntimeError as e:  # grpc's way of saying the port is taken
                raise OSError(f"the gRPC front cannot bind {self.address}: {e}") from None
            if not port:
                raise OSError(f"the gRPC front cannot bind {self.address}")
            self.port = port
            await self._server.start()
            # A client that leaves before its answer is sent is not the server's
            # error: grpc logged each with a traceback.
            quiet = _ClientGoneFilter()
            _GRPC_LOG.addFilter(quiet)
            stack.callback(_GRPC_LOG.removeFilter, quiet)
            stack.push_async_callback(self._drain)
            self._exit = stack.pop_all()
        return self

    async def _drain(self) -> None:
        """Unready at once, new RPCs refused (UNAVAILABLE), the RPCs in progress
        answered within ``shutdown_timeout`` or UNAVAILABLE when it ends; then grpc
        stops, giving the last answers ``_FLUSH_S`` to be written."""
        self._closing = True
        wake = self._grace_wake = asyncio.get_running_loop().create_future()
        if self._grace_ended:
            wake.set_result(None)
        try:  # until every RPC in progress is answered, the grace ends, or its time
            await until_answered(self._handling, wake, self.shutdown_timeout)
        finally:
            self._grace_wake = None
        self._cut.update(self._handling)
        for task in list(self._handling):
            task.cancel()  # the handler answers UNAVAILABLE (the task is in _cut)
        await self._server.stop(_FLUSH_S)

    def _bound_close(self, repository: ModelRepository) -> None:
        repository.close_timeout = 0.0 if self._grace_ended else self.shutdown_timeout

    def end_grace(self) -> None:
        """End the shutdown grace now (a second SIGTERM or Ctrl-C): the RPCs still in
        progress get UNAVAILABLE at once, as ``HttpFront.end_grace`` does for HTTP."""
        self._grace_ended = True
        if self._grace_wake is not None and not self._grace_wake.done():
            self._grace_wake.set_result(None)

    # -- what the handlers share ------------------------------------------------------
    async def _answer(self, context: grpc.aio.ServicerContext, handler, *args,
                      drained: bool = False):
        """The reply of ``handler(*args)``; its errors become status codes. A
        ``drained`` handler (inference) is refused while the front stops and is waited
        for by the drain; the others (metadata, readiness) are answered throughout, as
        the HTTP front answers its GETs."""
        task = asyncio.current_task()
        trailing = None
        try:
            if not drained:
                return await handler(*args)
            if self._closing:
                raise _Refusal(grpc.StatusCode.UNAVAILABLE, _STOPPING)
            self._handling.add(task)
            try:
                return await handler(*args)
            finally:
                self._handling.discard(task)
        except asyncio.CancelledError:
            if task not in self._cut:
                raise  # the client went (or its deadline passed): nobody to answer
            code, message = grpc.StatusCode.UNAVAILABLE, cut_message(
                _STOPPING, self._grace_ended, self.shutdown_timeout)
        except _Refusal as e:
            code, message, trailing = e.code, str(e), e.trailing
        except Exception as e:  # noqa: BLE001 - a bad request must never end the server
            code, message = grpc_status(e), str(e)
            if code is grpc.StatusCode.INTERNAL and not isinstance(e, ProtocolError):
                message = f"internal error: {type(e).__name__}: {e}"
        refused = trailing if trailing is not None else \
            ((REFUSED_KEY, "1"),) if code is grpc.StatusCode.UNAVAILABLE else \
            ((TOO_LARGE_KEY, "1"),) if code is grpc.StatusCode.RESOURCE_EXHAUSTED else ()
        # raises: grpc ends the RPC with the status
        await context.abort(code, message, trailing_metadata=refused)

    # -- the methods ------------------------------------------------------------------
    async def server_ready(self) -> bool:
        return not self._closing and any(
            self._repository.entry(n).ready for n in self._repository.names)

    async def model_metadata(self, name: str, version: str) -> "pb.ModelMetadataResponse":
        metadata = self._repository.entry(name, version or None).metadata()
        response = pb.ModelMetadataResponse(name=metadata["name"],
                                            versions=metadata["versions"],
                                            platform=metadata["platform"])
        for kind in ("inputs", "outputs"):
            for tensor in metadata[kind]:
                getattr(response, kind).add(name=tensor["name"],
                                            datatype=tensor["datatype"],
                                            shape=tensor["shape"])
        return response

    async def model_ready(self, name: str, version: str) -> bool:
        return self._repository.entry(name, version or None).ready

    def _hold(self, context: grpc.aio.ServicerContext, response: Any) -> None:
        """Counts ``response`` among the answers clients have not taken until its RPC
        ends, or refuses it (RESOURCE_EXHAUSTED) when it would pass
        ``max_unsent_bytes``. Answers under ``_COUNTED_ANSWER_BYTES`` are not counted,
        as the HTTP front's: what they can hold is bounded by ``max_concurrent_rpcs``,
        and a done callback per RPC cost the small ones 6 % of their rate."""
        size = response.ByteSize()
        if size < _COUNTED_ANSWER_BYTES:
            return
        held = _HELD_COPIES * size
        bound = self.max_unsent_bytes
        if held > bound:  # never admitted: marked too large, so that clients split it
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the answer has {held // _HELD_COPIES} bytes, over a third "
                           f"of the front's max_unsent_bytes of {bound} (grpc holds "
                           f"three copies until it is sent): ask for fewer rows")
        if self.unsent_bytes + held > bound:  # not marked: clients retry
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the server holds {self.unsent_bytes} bytes of answers that "
                           f"clients have not taken; this answer of "
                           f"{held // _HELD_COPIES} bytes, counted {_HELD_COPIES} times, "
                           f"would pass max_unsent_bytes of {bound}; retry shortly",
                           trailing=())
        if context.done():  # cancelled meanwhile: no done callback to come
            return
        self.unsent_bytes += held

        def release(_: Any) -> None:
            self.unsent_bytes -= held
        context.add_done_callback(release)

    async def infer(self, request: "pb.ModelInferRequest",
                    context: grpc.aio.ServicerContext | None = None
                    ) -> "pb.ModelInferResponse":
        name, version = request.model_name, request.model_version or None
        entry = self._repository.entry(name, version)
        evaluate = self._repository.serving(name, version)
        if len(request.inputs) > 1:  # refused before hundreds of thousands are decoded
            raise ProtocolError(f"the model takes one input "
                                f"{kserve.quoted(entry.input_name)}, the request has "
                                f"{len(request.inputs)}")
        decoded = decode_request(request, max_elements=self.max_message_bytes)
        x = kserve.input_array(decoded, entry.input_name, entry.input_spec)
        try:
            outputs, label = await evaluate_with_version(evaluate, x)
        except (InputSpecError, *_UNAVAILABLE):
            raise
        except Exception as e:  # noqa: BLE001 - the model's failure, not the front's
            raise _Refusal(grpc.StatusCode.INTERNAL,
                           f"model {name!r} failed: {type(e).__name__}: {e}") from e
        label = kserve.version_label(label)
        answered_as_asked(name, version, label)
        named = kserve.named_outputs(outputs, entry.output_names)
        if not entry.outputs:
            entry.outputs = kserve.output_metadata(named)
        response = encode_response(model_name=name, model_version=label,
                                   request_id=decoded.id, outputs=named,
                                   requested=decoded.outputs)
        if context is not None:
            self._hold(context, response)
        return response


_SERVICE = "inference.GRPCInferenceService"
#: Where grpc.aio logs a servicer's answer that could not be sent.
_GRPC_LOG = logging.getLogger("grpc._cython.cygrpc")


class _ClientGoneFilter(logging.Filter):
    """Drops grpc's ERROR, with a traceback, for an answer it could not send because
    the client had gone (an ``ExecuteBatchError`` from one of the service's methods):
    a client leaving is no server error. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (type(error).__name__ == "ExecuteBatchError"
                    and _SERVICE in record.getMessage())


class _Malformed:
    """A request whose bytes are not its protobuf message (what parsing raised)."""

    def __init__(self, error: Exception):
        self.error = error


def _lenient(parse):
    """``parse``, keeping what it raises as a ``_Malformed`` request: raised inside
    grpc's deserializer it would answer UNKNOWN and log a traceback."""
    def parse_or_keep(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as e:  # noqa: BLE001 - DecodeError, UnicodeDecodeError...
            return _Malformed(e)
    return parse_or_keep


def _checked(method):
    """``method``, answering a malformed request INVALID_ARGUMENT (HTTP's 400)."""
    async def handle(request, context):
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request is not a valid protobuf message: "
                                f"{type(request.error).__name__}: {request.error}")
        return await method(request, context)
    return handle


def _unimplemented(name: str):
    """The handler of a method the front does not serve: UNIMPLEMENTED with a short
    message (the stubs' own raise NotImplementedError, which grpc logged with a
    traceback at each call, telling the client "Unexpected <class ...>")."""
    async def refuse(request_or_requests, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not served by this front over gRPC")
    return refuse


def _method_handlers(servicer: Any) -> dict:
    """The service's handlers, as grpc's generated ``add_..._to_server`` makes them,
    but with unary requests parsed leniently (``_checked``), and the methods that
    ``servicer`` leaves to the stubs answered UNIMPLEMENTED (``_unimplemented``)."""
    handlers = {}
    stubs = service_pb2_grpc.GRPCInferenceServiceServicer
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        behaviour = getattr(servicer, method.name)
        if getattr(type(servicer), method.name) is getattr(stubs, method.name, None):
            behaviour = _unimplemented(method.name)
        if method.client_streaming or method.server_streaming:
            make = {(True, True): grpc.stream_stream_rpc_method_handler,
                    (True, False): grpc.stream_unary_rpc_method_handler,
                    (False, True): grpc.unary_stream_rpc_method_handler}[
                (method.client_streaming, method.server_streaming)]
            handlers[method.name] = make(behaviour, request_deserializer=request.FromString,
                                         response_serializer=response.SerializeToString)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _checked(behaviour), request_deserializer=_lenient(request.FromString),
                response_serializer=response.SerializeToString)
    return handlers


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The service's methods, each a thin call into the front."""

    def __init__(self, front: GrpcFront):
        self._front = front

    async def ServerLive(self, request, context):  # noqa: N802 - the protocol's names
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return pb.ServerReadyResponse(ready=await self._front.server_ready())

    async def ServerMetadata(self, request, context):  # noqa: N802
        return pb.ServerMetadataResponse(name="async_search", version="0.1.0",
                                         extensions=[])

    async def ModelReady(self, request, context):  # noqa: N802
        ready = await self._front._answer(context, self._front.model_ready,
                                          request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request, context):  # noqa: N802
        return await self._front._answer(context, self._front.model_metadata,
                                         request.name, request.version)

    async def ModelInfer(self, request, context):  # noqa: N802
        return await self._front._answer(context, self._front.infer, request, context,
                                         drained=True)
