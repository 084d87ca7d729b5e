"""The KServe v2 / Open Inference Protocol tensor codec: JSON tensors and binary tensors.

Pure functions from request bodies to arrays and from arrays to response bodies, with
no HTTP in them, so that every malformed body can be tested without a server. A request
body is a JSON object, optionally followed by raw tensor bytes (the binary tensor data
extension): the ``Inference-Header-Content-Length`` header gives the JSON's length and
each binary input gives its ``binary_data_size`` in its ``parameters``; the bytes follow
in the order of the inputs. Responses use the same layout when binary outputs are asked
for (``"binary_data": true`` on an output, or ``"binary_data_output": true`` on the
request). Tensors are row-major and little-endian on the wire.

Every way a body can be wrong raises ``ProtocolError`` with the HTTP status to answer
and a message naming the bad field and what it should be. Shapes are checked before
anything is allocated: entries are integers >= 0, at most ``MAX_RANK`` of them, and a
tensor holds at most ``max_elements`` values, counting every nonzero dimension even when
another is zero (the front passes its body limit: every value takes at least one byte on
the wire; ``[2**63, 0]`` is refused, ``[0, 16]`` is not).

Non-finite numbers: JSON has no NaN or Infinity. Triton writes them as the bare tokens
``NaN``, ``Infinity``, ``-Infinity`` (rapidjson's kWriteNanAndInfFlag), which strict
parsers (browsers, Go, Rust, ``json.loads(..., parse_constant=...)``) reject. Here they
are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, as the
protobuf JSON mapping (the protocol's gRPC form) spells them: every response parses with
a strict parser, and ``numpy.array(data, dtype)`` (what tritonclient's ``as_numpy``
does) reads them back exactly. Requests may send either spelling for float tensors.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from typing import Any, Dict, Hashable, List, Mapping, Sequence, Tuple

import numpy as np

from async_search import rows
from async_search.base import UNKNOWN_VERSION, Outputs, TensorSpec
from async_search.errors import ModelOutputError, ProtocolError


#: v2 datatype -> NumPy dtype (BYTES and BF16 are not served: models here take numbers).
DATATYPES: Dict[str, np.dtype] = {name: np.dtype(t) for name, t in [
    ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16),
    ("UINT32", np.uint32), ("UINT64", np.uint64), ("INT8", np.int8),
    ("INT16", np.int16), ("INT32", np.int32), ("INT64", np.int64),
    ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64)]}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
#: The header that gives the JSON part's length when binary tensor data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: The most dimensions a tensor may have.
MAX_RANK = 32
#: The default bound on the values of one tensor (the product of its nonzero dimensions).
MAX_ELEMENTS = 2 ** 31 - 1
#: The JSON strings that stand for non-finite floats (the protobuf JSON mapping's).
NONFINITE = ("NaN", "Infinity", "-Infinity")


_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = _QUOTE.maxlong = 60
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = 6
_QUOTE.maxlevel = 2


def quoted(value: Any) -> str:
    """``repr(value)`` for an error message, at most about 60 characters: a message
    names what a client sent without echoing kilobytes of it back.

    Example:
        >>> quoted("input"), len(quoted("x" * 10_000)) <= 64
        ("'input'", True)
    """
    if type(value) is str and len(value) <= 56:  # the usual case, on every request
        return repr(value)
    text = _QUOTE.repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def version_label(version: Hashable) -> str:
    """A model version as the protocol (and a Prometheus label) spells it: a string.

    The protocol's versions are strings, so the conversion happens here, at the edge,
    and nowhere inside: ``str(version)``, and the empty string for a version that is
    unknown (``base.UNKNOWN_VERSION``, None: a function that reports none), never
    ``"None"``, which a client could take for a version named so. A server's first
    model is version 0 (``base.FIRST_VERSION``), spelled ``"0"``.

    Example:
        >>> version_label(0), version_label("v2"), version_label(None)
        ('0', 'v2', '')
    """
    return "" if version is UNKNOWN_VERSION else str(version)


def datatype_of(dtype: Any) -> str:
    """The v2 datatype name of a NumPy dtype.

    Example:
        >>> datatype_of(np.float32)
        'FP32'
    """
    name = _NAMES.get(np.dtype(dtype).newbyteorder("="))
    if name is None:
        raise ProtocolError(f"dtype {np.dtype(dtype)} has no v2 datatype; use one of "
                            f"{sorted(_NAMES.values())}", status=500)
    return name


@dataclasses.dataclass(frozen=True)
class TensorMetadata:
    """A tensor as model metadata lists it: name, datatype, shape (-1: any size)."""

    name: str
    datatype: str
    shape: Tuple[int, ...]

    def as_json(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def of_spec(cls, name: str, spec: TensorSpec) -> "TensorMetadata":
        """A batched tensor of ``spec`` elements: the batch dimension reads -1."""
        return cls(name, datatype_of(spec.dtype), (-1, *spec.shape))


@dataclasses.dataclass(frozen=True)
class InputTensor:
    """One decoded input: its name, datatype, shape and data (shaped, native dtype)."""

    name: str
    datatype: str
    shape: Tuple[int, ...]
    array: np.ndarray


@dataclasses.dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A decoded inference request.

    Attributes:
        id: the request's ``id``, echoed in the response (None when absent).
        inputs: the input tensors, in request order.
        outputs: the outputs asked for, or None for every output.
        binary_output: the default for outputs not listed (``binary_data_output``).
    """

    id: str | None
    inputs: Tuple[InputTensor, ...]
    outputs: Tuple[RequestedOutput, ...] | None
    binary_output: bool


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(holder: dict, what: str) -> dict:
    params = holder.get("parameters", {})
    if params is None:
        return {}
    return _object(params, f"{what} 'parameters'")


def _flag(params: dict, key: str, what: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(
            f"{what} parameter {key!r} must be true or false, got {quoted(value)}")
    return value


def header_integer(text: str) -> int | None:
    """An integer header's value, as HTTP spells one (``1*DIGIT``): ASCII digits only,
    else None. ``int`` alone would take ``1_0`` for 10, signs, spaces and the digits of
    other scripts.

    Example:
        >>> header_integer("10"), header_integer("1_0"), header_integer("\u0661")
        (10, None, None)
    """
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


def json_length(body_length: int, header_length: str | None) -> int:
    """How many bytes of a body are JSON: all of it, or the binary extension's header.

    Raises:
        ProtocolError: (400) for an ``Inference-Header-Content-Length`` that is not an
            integer in [0, body_length] written in ASCII digits.
    """
    if header_length is None:
        return body_length
    length = header_integer(header_length)
    if length is None:
        raise ProtocolError(f"Inference-Header-Content-Length must be an integer, got "
                            f"{header_length[:40]!r}: ASCII digits only")
    if length > body_length:
        raise ProtocolError(f"Inference-Header-Content-Length is {quoted(length)} but "
                            f"the body has {body_length} bytes: it must be the JSON "
                            f"header's length, at most the body's")
    return length


def _header(body: bytes, header_length: str | None) -> Tuple[dict, memoryview]:
    if header_length is None:
        json_bytes, binary = body, memoryview(b"")
    else:
        length = json_length(len(body), header_length)
        json_bytes, binary = body[:length], memoryview(body)[length:]
    try:
        header = json.loads(json_bytes)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"the request body is not valid JSON: {str(e)[:200]}") from None
    return _object(header, "the request"), binary


def _shape(tensor: dict, what: str, max_elements: int) -> Tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            type(d) is int and d >= 0 for d in shape):
        raise ProtocolError(f"{what} 'shape' must be a list of at most {MAX_RANK} "
                            f"integers >= 0, got {str(shape)[:80]}")
    # Python integers: exact however large, so [2**63, 0] or [10**30, 0] cannot wrap.
    # The zeros are left out so that an empty tensor cannot claim absurd dimensions.
    if math.prod(d for d in shape if d) > max_elements:
        raise ProtocolError(f"{what} 'shape' {str(shape)[:80]} is too large: a tensor "
                            f"may hold at most {max_elements} values (the product of "
                            f"its nonzero dimensions)", status=400)
    return tuple(shape)


def _elements(data: Any, path: Tuple[int, ...] = ()):
    """``(path, value)`` of each element of nested lists, in row-major order."""
    if isinstance(data, list):
        for i, item in enumerate(data):
            yield from _elements(item, (*path, i))
    else:
        yield path, data


def _holds_bool(data: Any) -> bool:
    """Whether nested lists hold a JSON true or false (one pass, each list's types
    gathered by ``map``: a megabyte of numbers takes milliseconds)."""
    lists = [data]
    while lists:
        items = lists.pop()
        if type(items) is not list:
            if type(items) is bool:
                return True
            continue
        kinds = set(map(type, items))
        if bool in kinds:
            return True
        if list in kinds:
            lists.extend(item for item in items if type(item) is list)
    return False


def _nonfinite_strings(values: np.ndarray, data: Any, what: str) -> np.ndarray:
    """Float data that holds strings, as float64: numbers, and the strings "NaN",
    "Infinity", "-Infinity". NumPy turned every element into a string, so the elements
    are checked as they came: a number sent as a string (``"1"``) fails, naming it."""
    for path, value in _elements(data):
        if type(value) is str and value in NONFINITE:
            continue
        if type(value) in (int, float):
            continue
        where = "".join(f"[{i}]" for i in path)
        kind = "the string" if type(value) is str else "the value"
        raise ProtocolError(f"{what} 'data' element {where} holds {kind} "
                            f"{quoted(value)[:40]}; float data may hold numbers and the "
                            f"strings {list(NONFINITE)}")
    return np.where(values == "NaN", "nan", np.where(
        values == "Infinity", "inf", np.where(values == "-Infinity", "-inf", values))
    ).astype(np.float64)


def _exact_integers(data: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """``data``, Python integers all, as an array of ``dtype`` (ProtocolError when one is
    out of its range)."""
    info = np.iinfo(dtype)
    if any(not info.min <= v <= info.max for _, v in _elements(data)):
        raise ProtocolError(f"{what} 'data' has values outside the range of "
                            f"{_NAMES[dtype]} [{info.min}, {info.max}]")
    return np.array(data, dtype=dtype)


def tensor_from_json(data: Any, dtype: np.dtype, shape: Tuple[int, ...], what: str,
                     maybe_bools: bool = True) -> np.ndarray:
    """A tensor's JSON ``data`` as an array of ``dtype`` and ``shape``: numbers only
    (no numbers sent as strings, no true/false among numbers, no fractions for
    integers, each in its type's range), float data also the strings of
    ``NONFINITE``. Raises ProtocolError naming ``what`` otherwise."""
    try:
        values = np.asarray(data)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise ProtocolError(f"{what} 'data' is not a (nested) list of numbers: "
                            f"{str(e)[:120]}") from None
    kind = values.dtype.kind
    if kind == "U" and dtype.kind == "f" and values.size:
        values, kind = _nonfinite_strings(values, data, what), "f"
    if kind in "fO" and dtype.kind in "iu" and values.size and all(
            type(v) is int for _, v in _elements(data)):
        # Integers past int64's range (a UINT64 of 2**63 or more beside others) made
        # NumPy choose floats, which would round them: taken as the integers they are.
        values, kind = _exact_integers(data, dtype, what), dtype.kind
    if kind == "O" and dtype.kind == "f" and values.size and all(
            type(v) in (int, float) for _, v in _elements(data)):
        # An integer past int64's range made NumPy keep Python objects: still a number.
        try:
            values, kind = np.array(data, dtype=np.float64), "f"
        except OverflowError:
            raise ProtocolError(f"{what} 'data' has an integer outside the range of "
                                f"{_NAMES[dtype]}") from None
    if maybe_bools and dtype.kind in "iuf" and kind in "iuf" and values.size and (
            _holds_bool(data)):
        # NumPy took true and false among numbers as 1 and 0 (a list of them alone is
        # refused below): a numeric datatype takes numbers only.
        raise ProtocolError(f"{what} 'data' holds true/false among numbers where the "
                            f"datatype {_NAMES[dtype]} needs numbers")
    if values.size and not (kind == "b" if dtype.kind == "b" else
                            kind in "iu" if dtype.kind in "iu" else kind in "iuf"):
        raise ProtocolError(f"{what} 'data' holds {values.dtype} values where the "
                            f"datatype {_NAMES[dtype]} needs "
                            f"{'true/false' if dtype.kind == 'b' else 'numbers'}"
                            f"{' without fractions' if dtype.kind in 'iu' else ''}")
    if values.size != math.prod(shape):
        raise ProtocolError(f"{what} 'data' has {values.size} values but shape "
                            f"{list(shape)} needs {math.prod(shape)}")
    if dtype.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise ProtocolError(f"{what} 'data' has values outside the range of "
                                f"{_NAMES[dtype]} [{info.min}, {info.max}]")
    if dtype.kind == "f" and values.size and values.dtype.kind in "iuf" and (
            values.dtype.itemsize > dtype.itemsize):
        # The cast made them infinities with a warning on the server's stderr only
        # (1e300 as FP32, 70000 as FP16): an infinity is sent as "Infinity".
        top = float(np.finfo(dtype).max)
        finite = values[np.isfinite(values)]
        if finite.size and np.abs(finite).max() > top:
            raise ProtocolError(f"{what} 'data' has values outside the range of "
                                f"{_NAMES[dtype]} [-{top}, {top}] (an infinity "
                                f"is sent as \"Infinity\" or \"-Infinity\")")
    return values.astype(dtype, copy=False).reshape(shape)


def _from_binary(binary: memoryview, offset: int, size: Any, dtype: np.dtype,
                 shape: Tuple[int, ...], what: str) -> Tuple[np.ndarray, int]:
    if type(size) is not int or size < 0:
        raise ProtocolError(f"{what} 'binary_data_size' must be an integer >= 0, got "
                            f"{quoted(size)}")
    need = math.prod(shape) * dtype.itemsize
    if size != need:
        raise ProtocolError(f"{what} 'binary_data_size' is {quoted(size)} bytes but shape "
                            f"{list(shape)} of {_NAMES[dtype]} needs {need}")
    if offset + size > len(binary):
        raise ProtocolError(f"the body is truncated: {what} needs bytes {offset} to "
                            f"{offset + size} of the binary data, which has {len(binary)}")
    chunk = binary[offset:offset + size]
    if dtype.kind == "b":
        array = np.frombuffer(chunk, np.uint8).astype(bool)
    else:
        array = np.frombuffer(chunk, dtype.newbyteorder("<")).astype(dtype, copy=False)
    return array.reshape(shape), offset + size


def decode_request(body: bytes, header_length: str | None = None, *,
                   max_elements: int = MAX_ELEMENTS) -> InferRequest:
    """Decode an inference request body.

    Args:
        body: the whole HTTP body.
        header_length: the ``Inference-Header-Content-Length`` header, if sent.
        max_elements: the most values one tensor may hold (the product of its nonzero
            dimensions); a server passes its body limit, since every value takes at
            least one byte, as JSON or as binary.

    Raises:
        ProtocolError: (status 400) for any body that breaks the protocol.

    Example:
        >>> r = decode_request(b'{"inputs": [{"name": "input", "shape": [1, 2], '
        ...                    b'"datatype": "FP32", "data": [1, 2]}]}')
        >>> r.inputs[0].array
        array([[1., 2.]], dtype=float32)
    """
    header, binary = _header(body, header_length)
    # Where the body spells neither, no data holds true or false: not looked for (a
    # body not in UTF-8, which JSON allows too, is looked through: NUL or BOM bytes).
    head = body[:4]
    maybe_bools = (b"true" in body or b"false" in body or b"\x00" in head
                   or not head.isascii())
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError(f"the request 'id' must be a string, got {quoted(request_id)}")
    binary_output = _flag(_parameters(header, "the request"), "binary_data_output",
                          "the request")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("the request must have 'inputs': a non-empty list of tensors")
    inputs: List[InputTensor] = []
    offset = 0
    for k, raw in enumerate(raw_inputs):
        tensor = _object(raw, f"input {k}")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f"input {k} must have a string 'name', got {quoted(name)}")
        what = f"input {quoted(name)}"
        datatype = tensor.get("datatype")
        dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
        if dtype is None:
            raise ProtocolError(f"{what} has datatype {str(datatype)[:40]!r}; served "
                                f"datatypes are {sorted(DATATYPES)}")
        shape = _shape(tensor, what, max_elements)
        params = _parameters(tensor, what)
        if "binary_data_size" in params:
            if "data" in tensor:
                raise ProtocolError(f"{what} has both 'data' and 'binary_data_size': "
                                    f"send one")
            array, offset = _from_binary(binary, offset, params["binary_data_size"],
                                         dtype, shape, what)
        elif "data" in tensor:
            array = tensor_from_json(tensor["data"], dtype, shape, what, maybe_bools)
        else:
            raise ProtocolError(f"{what} has neither 'data' nor a 'binary_data_size' "
                                f"parameter")
        inputs.append(InputTensor(name, datatype, shape, array))
    if offset != len(binary):
        raise ProtocolError(f"the body has {len(binary) - offset} bytes of binary data "
                            f"that no input claims (binary_data_size total {offset})")
    outputs = None
    if "outputs" in header:
        raw_outputs = header["outputs"]
        if not isinstance(raw_outputs, list):
            raise ProtocolError("the request 'outputs' must be a list of {\"name\": ...}")
        outputs = []
        for k, raw in enumerate(raw_outputs):
            tensor = _object(raw, f"output {k}")
            name = tensor.get("name")
            if not isinstance(name, str):
                raise ProtocolError(f"output {k} must have a string 'name', got "
                                    f"{quoted(name)}")
            params = _parameters(tensor, f"output {quoted(name)}")
            if params.get("classification"):
                raise ProtocolError(f"output {quoted(name)}: the classification "
                                    f"extension is not supported; ask for the raw "
                                    f"tensor")
            binary_flag = _flag(params, "binary_data", f"output {quoted(name)}") \
                if "binary_data" in params else binary_output
            outputs.append(RequestedOutput(name, binary_flag))
        outputs = tuple(requested_once(outputs)) or None  # none: every output, as gRPC
    return InferRequest(request_id, tuple(inputs), outputs, binary_output)


def input_array(request: InferRequest, name: str, spec: TensorSpec | None) -> np.ndarray:
    """The request's one input, checked against the model's input ``spec``.

    Raises:
        ProtocolError: (400) for a wrong number or name of inputs, or a shape or
            datatype that does not match ``[n, *spec.shape]`` of ``spec.dtype``.
    """
    if len(request.inputs) != 1:
        raise ProtocolError(f"the model takes one input {name!r}, the request has "
                            f"{len(request.inputs)}: "
                            f"{quoted([t.name for t in request.inputs])}")
    tensor = request.inputs[0]
    if tensor.name != name:
        raise ProtocolError(f"unknown input {quoted(tensor.name)}: the model's input is "
                            f"{name!r}")
    array = tensor.array
    if spec is None:
        if array.ndim == 0:
            raise ProtocolError(f"input {name!r} needs a batch dimension: shape [n, ...], "
                                f"got []")
        return array
    expected = f"shape {[-1, *spec.shape]} and datatype {datatype_of(spec.dtype)}"
    if array.ndim == 0 or array.shape[1:] != spec.shape:
        raise ProtocolError(f"input {name!r} has shape {list(tensor.shape)}; the model "
                            f"takes {expected} (-1: any batch size)")
    if array.dtype.newbyteorder("=") != spec.dtype.newbyteorder("="):
        # (a byte order is no datatype: the server's request check turns it into the
        # spec's, as for an in-process request)
        raise ProtocolError(f"input {name!r} has datatype {tensor.datatype}; the model "
                            f"takes {expected}")
    return array


def named_outputs(outputs: Outputs, names: Sequence[str] | None = None,
                  ) -> List[Tuple[str, np.ndarray]]:
    """A model's outputs as named tensors: ``output`` for one array, ``output_0``, ...
    for a tuple, the keys for a dict (``names`` overrides the first two).

    Raises:
        ModelOutputError: ``names`` names more or fewer tensors than the model gave
            (a dropped output or a name left over would mislead every client).
    """
    labelled = rows.labelled_leaves(outputs)
    if isinstance(outputs, dict):
        names = [str(key) for key, _ in labelled]
    elif names is None:
        names = ["output" if index is None else f"output_{index}" for index, _ in labelled]
    elif len(names) != len(labelled):
        raise ModelOutputError(f"the model gave {len(labelled)} output tensor"
                               f"{'s' if len(labelled) != 1 else ''} but its output_names "
                               f"name {len(names)}: {list(names)}")
    return [(name, np.asarray(leaf)) for name, (_, leaf) in zip(names, labelled)]


def output_metadata(named: Sequence[Tuple[str, np.ndarray]]) -> Tuple[TensorMetadata, ...]:
    """Metadata of named output tensors (the batch dimension reads -1)."""
    return tuple(TensorMetadata(name, datatype_of(a.dtype), (-1, *a.shape[1:]))
                 for name, a in named)


def requested_once(requested: Sequence[RequestedOutput]) -> List[RequestedOutput]:
    """The outputs asked for, each once, its first entry's settings kept (as Triton
    takes them: a set of names): each entry added a copy of the whole tensor to the
    answer, and a 16 MiB request could ask for a million.

    Example:
        >>> [out.binary for out in requested_once([RequestedOutput("v", True),
        ...                                        RequestedOutput("v", False)])]
        [True]
    """
    first: Dict[str, RequestedOutput] = {}
    for out in requested:
        first.setdefault(out.name, out)
    return list(first.values())


def requested_outputs(outputs: Sequence[Tuple[str, np.ndarray]],
                      requested: Sequence[RequestedOutput],
                      ) -> List[Tuple[RequestedOutput, np.ndarray]]:
    """The named outputs a request asks for, in its order, each with what it asked
    (the JSON and the gRPC responses alike).

    Raises:
        ProtocolError: (400) when ``requested`` names an output the model lacks.

    Example:
        >>> x = np.zeros(2)
        >>> [(out.name, array is x) for out, array in requested_outputs(
        ...     [("policy", x), ("value", x)], [RequestedOutput("value", True)])]
        [('value', True)]
    """
    available = dict(outputs)
    chosen = []
    for out in requested:
        if out.name not in available:
            raise ProtocolError(f"unknown output {quoted(out.name)}: the model's outputs "
                                f"are {list(available)}")
        chosen.append((out, available[out.name]))
    return chosen


def encode_response(*, model_name: str, model_version: str, request_id: str | None,
                    outputs: Sequence[Tuple[str, np.ndarray]],
                    requested: Sequence[RequestedOutput] | None, binary_output: bool,
                    ) -> Tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it.

    Raises:
        ProtocolError: (400) when ``requested`` names an output the model lacks.
    """
    if requested is None:
        chosen = [(name, array, binary_output) for name, array in outputs]
    else:
        chosen = [(out.name, array, out.binary)
                  for out, array in requested_outputs(outputs, requested)]
    tensors, blobs = [], []
    for name, array, binary in chosen:
        tensor: Dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype),
                                  "shape": list(array.shape)}
        if binary:
            blob = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = json_data(array)
        tensors.append(tensor)
    response: Dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = tensors
    header = json.dumps(response, separators=(",", ":"), allow_nan=False).encode()
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def json_data(array: np.ndarray) -> list:
    """A tensor's values as a flat JSON list: NaN and infinities as the strings
    "NaN", "Infinity" and "-Infinity" (see the module's docstring)."""
    flat = array.ravel()
    data = flat.tolist()
    if flat.dtype.kind == "f":
        for i in np.flatnonzero(~np.isfinite(flat)).tolist():
            value = data[i]
            data[i] = "NaN" if value != value else "Infinity" if value > 0 else (
                "-Infinity")
    return data


def error_body(message: str) -> bytes:
    """The protocol's error JSON: ``{"error": message}``."""
    return json.dumps({"error": message}).encode()


def model_metadata(name: str, versions: Sequence[str], inputs: Sequence[TensorMetadata],
                   outputs: Sequence[TensorMetadata], platform: str = "async_search",
                   ) -> Mapping[str, Any]:
    """The body of ``GET /v2/models/{name}``."""
    return {"name": name, "versions": list(versions), "platform": platform,
            "inputs": [t.as_json() for t in inputs],
            "outputs": [t.as_json() for t in outputs]}
