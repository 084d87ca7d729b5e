"""The KServe v2 gRPC protocol's tensors: protobuf messages to arrays and back.

The gRPC form of the Open Inference Protocol (package ``inference``, service
``GRPCInferenceService``) carries tensors in ``ModelInferRequest`` and
``ModelInferResponse``: each tensor's name, datatype and shape, and its values either
as raw little-endian bytes (``raw_input_contents`` / ``raw_output_contents``, one entry
per tensor, in order) or as typed lists (``contents.fp32_contents``, ...). The messages
come from the maintained stubs that ``tritonclient[grpc]`` ships
(``tritonclient.grpc.service_pb2``), so this module is imported only by the gRPC front
and client.

These are pure functions, as ``servers.kserve`` is for the HTTP form, so that every
malformed message can be tested without a server: the server side decodes requests
into ``kserve.InferRequest`` (what the HTTP front decodes too) and encodes responses;
the client side encodes requests and decodes responses. Every way a request is wrong
raises ``ProtocolError`` naming the field; shapes are checked before anything is
allocated, as ``servers.kserve`` checks them.
"""

from __future__ import annotations

import math
from typing import Any, Hashable, List, Sequence, Tuple

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from async_search.base import Outputs
from async_search.errors import ProtocolError
from async_search.http.kserve import (DATATYPES, MAX_ELEMENTS, MAX_RANK, InferRequest,
                                      InputTensor, RequestedOutput, datatype_of, quoted,
                                      requested_once, requested_outputs)


#: The trailing metadata key that marks an UNAVAILABLE status as the server's own refusal
#: (a model not loaded, the server stopping: the HTTP front's 503), so that a client
#: tells it from a connection that could not be made or was lost (grpc's own
#: UNAVAILABLE), as the HTTP client tells a 503 from a refused connection.
REFUSED_KEY = "async-search-refused"
#: Trailing metadata that marks a RESOURCE_EXHAUSTED as a request too large (HTTP's
#: 413: a client splits it), not a server too busy (retried).
TOO_LARGE_KEY = "async-search-too-large"

#: The typed list of ``InferTensorContents`` that holds each datatype (FP16 has none:
#: it travels as raw bytes only).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents"}


def _shape(shape: Sequence[int], what: str, max_elements: int) -> Tuple[int, ...]:
    if len(shape) > MAX_RANK or not all(d >= 0 for d in shape):
        raise ProtocolError(f"{what} 'shape' must be at most {MAX_RANK} integers >= 0, "
                            f"got {list(shape)[:8]}")
    # the zeros are left out, so that an empty tensor cannot claim absurd dimensions
    if math.prod(d for d in shape if d) > max_elements:
        raise ProtocolError(f"{what} 'shape' {list(shape)[:8]} is too large: a tensor "
                            f"may hold at most {max_elements} values (the product of "
                            f"its nonzero dimensions)")
    return tuple(shape)


def tensor_array(tensor, raw: bytes | None, what: str,
                 max_elements: int = MAX_ELEMENTS) -> np.ndarray:
    """The values of a request's or a response's ``tensor``: from ``raw`` (its entry of
    the raw contents) when given, else from its typed ``contents``; shaped, in the
    native byte order. A raw tensor is a read-only view of ``raw``.

    Raises:
        ProtocolError: for an unknown datatype, a bad shape, or values that do not fill
            the shape exactly.
    """
    dtype = DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise ProtocolError(f"{what} has datatype {tensor.datatype[:40]!r}; served "
                            f"datatypes are {sorted(DATATYPES)}")
    shape = _shape(tensor.shape, what, max_elements)
    count = math.prod(shape)
    if raw is not None:
        need = count * dtype.itemsize
        if len(raw) != need:
            raise ProtocolError(f"{what} has {len(raw)} bytes of raw contents but shape "
                                f"{list(shape)} of {tensor.datatype} needs {need}")
        if dtype.kind == "b":
            return np.frombuffer(raw, np.uint8).astype(bool).reshape(shape)
        return np.frombuffer(raw, dtype.newbyteorder("<")).astype(
            dtype, copy=False).reshape(shape)
    field = _CONTENTS.get(tensor.datatype)
    values = getattr(tensor.contents, field) if field else ()
    if len(values) != count:
        typed = f"'contents.{field}'" if field else "typed contents (send raw contents)"
        raise ProtocolError(f"{what} has {len(values)} values in {typed} but shape "
                            f"{list(shape)} needs {count}")
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)
        array = np.array(values, np.int64 if dtype.kind == "i" else np.uint64)
        if array.min() < info.min or array.max() > info.max:
            raise ProtocolError(f"{what} has values outside the range of "
                                f"{tensor.datatype} [{info.min}, {info.max}]")
        return array.astype(dtype).reshape(shape)
    return np.array(values, dtype).reshape(shape)


def _parameter_value(parameter: Any) -> Any:
    """An ``InferParameter``'s value (None when it holds none)."""
    which = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, which) if which else None


def decode_request(request: "pb.ModelInferRequest", *,
                   max_elements: int = MAX_ELEMENTS) -> InferRequest:
    """A ``ModelInferRequest`` as the front's ``InferRequest`` (every output binary:
    gRPC answers carry raw contents).

    Raises:
        ProtocolError: for a request that breaks the protocol.
    """
    if not request.inputs:
        raise ProtocolError("the request must have 'inputs': a non-empty list of tensors")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(f"the request has {len(raw)} raw_input_contents for "
                            f"{len(request.inputs)} inputs: send one per input, or none")
    inputs: List[InputTensor] = []
    for k, tensor in enumerate(request.inputs):
        what = f"input {quoted(tensor.name)}"
        if raw and tensor.HasField("contents"):
            raise ProtocolError(f"{what} has 'contents' beside raw_input_contents: send "
                                f"one")
        array = tensor_array(tensor, raw[k] if raw else None, what, max_elements)
        inputs.append(InputTensor(tensor.name, tensor.datatype, tuple(tensor.shape),
                                  array))
    outputs = None
    if request.outputs:
        outputs = []
        for out in request.outputs:
            if "classification" in out.parameters and _parameter_value(
                    out.parameters["classification"]):  # (0, as over HTTP, asks none)
                raise ProtocolError(f"output {quoted(out.name)}: the classification "
                                    f"extension is not supported; ask for the raw tensor")
            outputs.append(RequestedOutput(out.name, True))
        outputs = tuple(requested_once(outputs))
    return InferRequest(request.id or None, tuple(inputs), outputs, True)


def encode_response(*, model_name: str, model_version: str, request_id: str | None,
                    outputs: Sequence[Tuple[str, np.ndarray]],
                    requested: Sequence[RequestedOutput] | None,
                    ) -> "pb.ModelInferResponse":
    """The ``ModelInferResponse`` of named outputs, as raw contents.

    Raises:
        ProtocolError: when ``requested`` names an output the model lacks.
    """
    if requested is None:
        chosen = list(outputs)
    else:
        chosen = [(out.name, array) for out, array in requested_outputs(outputs, requested)]
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version,
                                     id=request_id or "")
    for name, array in chosen:
        response.outputs.add(name=name, datatype=datatype_of(array.dtype),
                             shape=array.shape)
        response.raw_output_contents.append(
            np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
    return response


def encode_request(xs: List[np.ndarray], *, input_name: str, model_name: str,
                   model_version: str | None) -> Tuple["pb.ModelInferRequest", np.ndarray]:
    """One ``ModelInferRequest`` that carries the rows of every array of ``xs`` as one
    raw tensor, and those rows as one array (the client's batch)."""
    batch = xs[0] if len(xs) == 1 else np.concatenate(xs)
    request = pb.ModelInferRequest(model_name=model_name,
                                   model_version=model_version or "")
    request.inputs.add(name=input_name, datatype=datatype_of(batch.dtype),
                       shape=batch.shape)
    request.raw_input_contents.append(
        batch.astype(batch.dtype.newbyteorder("<"), copy=False).tobytes())
    return request, batch


def decode_response(response: "pb.ModelInferResponse") -> Tuple[Outputs, Hashable]:
    """The outputs and the ``model_version`` of a ``ModelInferResponse``: one tensor as
    an array, tensors ``output_0``, ``output_1``, ... as a tuple, others as a dict.
    Every array is the caller's own (writable).

    Raises:
        ProtocolError: for a response that is not the protocol's.
    """
    raw = response.raw_output_contents
    if not response.outputs:
        raise ProtocolError("the response has no outputs")
    if raw and len(raw) != len(response.outputs):
        raise ProtocolError(f"the response has {len(raw)} raw_output_contents for "
                            f"{len(response.outputs)} outputs")
    named = []
    for k, tensor in enumerate(response.outputs):
        if any(tensor.name == seen for seen, _ in named):
            raise ProtocolError(f"the response has a second output named "
                                f"{quoted(tensor.name)[:40]}")
        array = tensor_array(tensor, raw[k] if raw else None,
                             f"output {quoted(tensor.name)}")
        named.append((tensor.name, array if array.flags.writeable else array.copy()))
    version = response.model_version or None
    if len(named) == 1:
        return named[0][1], version
    if [n for n, _ in named] == [f"output_{i}" for i in range(len(named))]:
        return tuple(a for _, a in named), version
    return {n: a for n, a in named}, version
