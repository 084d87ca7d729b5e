"""``evaluate`` over gRPC: searches use a model served with the KServe v2 gRPC protocol.

``GrpcRemoteEvaluate`` is ``RemoteEvaluate`` with gRPC underneath (grpc.aio and the
protocol's stubs from ``tritonclient[grpc]``): the same call shape, the same coalescing
(the requests of one loop iteration leave as one ``ModelInfer``; while
``max_connections`` RPCs are in flight, new requests wait and leave together), the same
input checks, deadlines, retries with backoff, versions from each answer's
``model_version``, and the same errors for the same failures. Its server may be this
project's ``GrpcFront`` (``python -m async_search.http --grpc-port 8001``), NVIDIA
Triton, or KServe's model server with gRPC on.

What a caller gets back for each status: OK the outputs (one tensor: an array; tensors
``output_0``, ``output_1``, ...: a tuple; other names: a dict); NOT_FOUND
ModelNotFoundError; INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION,
PERMISSION_DENIED, UNAUTHENTICATED, ALREADY_EXISTS ProtocolError (its ``status`` the
HTTP twin: 400, 403, 401, 409); UNAVAILABLE (retried) once retries are spent: the
server's own refusal (a model not loaded, a server stopping: ``GrpcFront`` marks it
with the ``REFUSED_KEY`` trailing metadata) ServerClosedError, else (no connection, or
one lost) ServerDiedError; RESOURCE_EXHAUSTED for a message too large ProtocolError
(413: several requests in it are sent again in halves, as over HTTP), else (a server
too busy) and ABORTED (retried) ServerDiedError;
DEADLINE_EXCEEDED RequestTimeoutError; INTERNAL, UNKNOWN and the rest (the model
failed: not retried) RemoteError; an answer that is not the protocol's, or longer than
``max_response_bytes`` (ResponseTooLongError, a ModelOutputError), ModelOutputError.
"""

from __future__ import annotations

import re
from typing import Any, Hashable, List, Mapping, Tuple

import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc

from async_search.base import Outputs, TensorSpec
from async_search.errors import (ModelNotFoundError, ModelOutputError, ProtocolError,
                                 RemoteError, ResponseTooLongError, ServerClosedError,
                                 ServerDiedError)
from async_search.http.client import RemoteEvaluate, _Retry
from async_search.http.grpc_tensors import (REFUSED_KEY, TOO_LARGE_KEY, decode_response,
                                           encode_request, pb)


#: Codes that say the request was wrong, with the HTTP status they stand for.
_REQUEST_CODES = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400,
                  "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401,
                  "PERMISSION_DENIED": 403, "ALREADY_EXISTS": 409}
#: Codes worth another attempt besides UNAVAILABLE: overloaded, or a conflict that
#: passes.
_RETRIED_CODES = frozenset({"RESOURCE_EXHAUSTED", "ABORTED"})


#: Room in an answer's message beside its tensors' bytes (names, shapes, parameters).
_MESSAGE_ROOM = 1 << 16
#: What grpc says when a message passes a receive limit, at either end: the limit is
#: the second number, which tells this client's own from the server's.
_RECEIVED_TOO_LARGE = re.compile(r"Received message larger than max \(\d+ vs\. (\d+)\)")


def _too_large(e: Any) -> bool:
    """Whether a RESOURCE_EXHAUSTED says the message was too large (which another try
    cannot cure), not the server too busy: ``GrpcFront`` marks its own, and grpc's
    transport says "larger than max" (the message-size limits of either end)."""
    marked = any(key == TOO_LARGE_KEY for key, _ in e.trailing_metadata() or ())
    return marked or "larger than max" in (e.details() or "")


class GrpcRemoteEvaluate(RemoteEvaluate):
    """An evaluate function whose model is served by a KServe v2 gRPC server.

    Args:
        target: the server's address, ``host:port`` (grpc's target syntax:
            ``dns:///host:port``, ``unix:/path``... too).
        model_name, model_version, timeout, retries, backoff_s, max_response_bytes,
            input_spec, input_name: as for ``RemoteEvaluate``.
        max_connections: RPCs in flight at once (over one HTTP/2 connection); requests
            made while all are busy leave together when one frees.
        max_request_bytes: tensor bytes of one RPC; more requests than that leave in
            several. A single larger request is sent alone.
        headers: sent as gRPC metadata with every RPC (keys in lower case).
        credentials: ``grpc.ssl_channel_credentials(...)`` for TLS; None: plaintext.

    Example:
        As ``RemoteEvaluate``, over gRPC (it needs a running server, so this one is
        not run in the tests):

        ```python
        async with GrpcRemoteEvaluate("127.0.0.1:8001", "mlp") as evaluate:
            y = await evaluate(x)  # x: float32 [n, 16]
            y, version = await evaluate.with_version(x)
        ```
    """

    def __init__(self, target: str, model_name: str, *, model_version: str | None = None,
                 timeout: float = 30.0, retries: int = 3, backoff_s: float = 0.05,
                 max_connections: int = 4, max_request_bytes: int = 8 * 2 ** 20,
                 max_response_bytes: int = 64 * 2 ** 20,
                 input_spec: TensorSpec | None = None, input_name: str | None = None,
                 headers: Mapping[str, str] | None = None, credentials: Any = None):
        super().__init__(target, model_name, model_version=model_version,
                         timeout=timeout, retries=retries, backoff_s=backoff_s,
                         max_connections=max_connections,
                         max_request_bytes=max_request_bytes,
                         max_response_bytes=max_response_bytes, input_spec=input_spec,
                         input_name=input_name, headers=headers)
        self.credentials = credentials
        self._metadata = tuple((k.lower(), v) for k, v in self.headers.items())
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    @property
    def stats(self) -> dict:
        """requests and elements asked for; rpcs sent (retries included); retries;
        failed_rpcs (every attempt spent, or not retryable); split_rpcs (a failed
        RPC's halves, sent again to find the requests that fail);
        mean_requests_per_rpc (as first sent)."""
        stats = super().stats
        return {"requests": stats["requests"], "elements": stats["elements"],
                "rpcs": stats["http_requests"], "retries": stats["retries"],
                "failed_rpcs": stats["failed_http_requests"],
                "split_rpcs": stats["split_http_requests"],
                "mean_requests_per_rpc": stats["mean_requests_per_http_request"]}

    # -- the transport ----------------------------------------------------------------
    def _set_address(self, target: str) -> None:
        if not isinstance(target, str) or not target or target.lower().startswith(
                ("http:", "https:", "grpc:", "grpcs:")):  # grpc takes host:port
            raise ValueError(f"target must be a gRPC address such as '127.0.0.1:8001', "
                             f"got {target!r}")
        self.url = target
        version = f" version {self.model_version}" if self.model_version else ""
        self._metadata_url = f"{target} (model {self.model_name!r}{version})"
        self._where = f"the gRPC inference server at {target} (model " \
                      f"{self.model_name!r}{version})"

    @property
    def _receive_limit(self) -> int:
        """grpc's limit on an answer's message: the tensors' bytes and some room for the
        rest of the message (grpc takes a C int)."""
        return min(self.max_response_bytes + _MESSAGE_ROOM, 2 ** 31 - 1)

    async def _open_transport(self) -> None:
        options = [("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", self._receive_limit)]
        self._channel = grpc.aio.secure_channel(self.url, self.credentials, options) \
            if self.credentials is not None else grpc.aio.insecure_channel(self.url,
                                                                           options)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def _close_transport(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def _encode(self, xs: List[np.ndarray]) -> Tuple[Any, np.ndarray]:
        return encode_request(xs, input_name=self._input_name or "input",
                              model_name=self.model_name,
                              model_version=self.model_version)

    async def _attempt(self, request: Any, left: float) -> Tuple[Outputs, Hashable]:
        try:
            response = await self._stub.ModelInfer(request, timeout=left,
                                                   metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise self._failure(e) from None
        if not isinstance(response, pb.ModelInferResponse):  # grpc gives None for bytes
            raise ModelOutputError(f"{self._where} answered with a message that is not "
                                   f"a ModelInferResponse")
        try:
            return decode_response(response)
        except ProtocolError as e:
            raise ModelOutputError(f"{self._where} answered with a response that is "
                                   f"not the protocol's: {e}") from None

    async def _metadata_attempt(self, left: float) -> Tuple[list, list]:
        request = pb.ModelMetadataRequest(name=self.model_name,
                                                version=self.model_version or "")
        try:
            metadata = await self._stub.ModelMetadata(request, timeout=left,
                                                      metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise self._failure(e) from None
        if not isinstance(metadata, pb.ModelMetadataResponse):
            raise ModelOutputError(f"the model metadata at {self._metadata_url} is not a "
                                   f"ModelMetadataResponse")
        inputs = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                  for t in metadata.inputs]
        return inputs, list(metadata.versions)

    def _answer_too_large(self, e: Any) -> bool:
        """Whether a RESOURCE_EXHAUSTED is this client's own refusal of a long answer
        (the limit grpc names is this client's), not the server's of a long request."""
        found = _RECEIVED_TOO_LARGE.search(e.details() or "")
        return found is not None and int(found.group(1)) == self._receive_limit

    def _failure(self, e: Any) -> BaseException:
        """What a failed RPC raises: TimeoutError past its deadline, ``_Retry`` around
        what another attempt may cure, else the caller's error."""
        code = e.code().name
        said = f"{self._where} answered {code}: {e.details()}"
        if code == "DEADLINE_EXCEEDED":
            return TimeoutError(said)
        if code == "NOT_FOUND":
            return ModelNotFoundError(said)
        if code in _REQUEST_CODES:
            return ProtocolError(said, status=_REQUEST_CODES[code])
        if code == "UNAVAILABLE":
            refused = any(key == REFUSED_KEY for key, _ in e.trailing_metadata() or ())
            if refused:
                return _Retry(ServerClosedError(said))
            return _Retry(ServerDiedError(f"{self._where} could not be reached or "
                                          f"dropped the connection: {e.details()}"))
        if code == "RESOURCE_EXHAUSTED" and self._answer_too_large(e):
            return ResponseTooLongError(
                f"{self._where} answered with a message longer than max_response_bytes="
                f"{self.max_response_bytes} bytes (and room for the rest of the "
                f"message): refused")
        if code == "RESOURCE_EXHAUSTED" and _too_large(e):
            return ProtocolError(said, status=413)  # split, as HTTP's 413; never retried
        if code in _RETRIED_CODES:
            return _Retry(ServerDiedError(said))
        return RemoteError(f"gRPC {code}", f"{self._where}: {e.details()}")
