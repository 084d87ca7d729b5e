"""The gRPC protocol's tensors: messages to arrays and back, and every malformed
request refused with a message that names the field."""

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from async_search.errors import ProtocolError  # noqa: E402
from async_search.http.grpc_tensors import (decode_request, decode_response,  # noqa: E402
                                       encode_request, encode_response, pb)
from async_search.http.kserve import RequestedOutput  # noqa: E402

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def request(*tensors, raw=None, **fields):
    message = pb.ModelInferRequest(model_name="m", **fields)
    for name, datatype, shape in tensors:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
    for blob in raw or ():
        message.raw_input_contents.append(blob)
    return message


def test_a_client_request_decodes_to_the_rows_it_carries():
    xs = [X[:1], X[1:], X[:0]]
    message, batch = encode_request(xs, input_name="input", model_name="m",
                                    model_version="3")
    np.testing.assert_array_equal(batch, X)
    decoded = decode_request(message)
    assert message.model_version == "3" and decoded.outputs is None
    assert decoded.inputs[0].name == "input" and decoded.inputs[0].shape == (3, 4)
    np.testing.assert_array_equal(decoded.inputs[0].array, X)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint16, np.int64,
                                   np.bool_])
def test_raw_contents_are_little_endian_whatever_the_caller_s_byte_order(dtype):
    x = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    swapped = x.astype(x.dtype.newbyteorder())
    message, _ = encode_request([swapped], input_name="input", model_name="m",
                                model_version=None)
    assert message.raw_input_contents[0] == x.astype(x.dtype.newbyteorder("<")).tobytes()
    array = decode_request(message).inputs[0].array
    assert array.dtype == np.dtype(dtype) and array.dtype.isnative
    np.testing.assert_array_equal(array, x)


def test_typed_contents_are_read_as_well_as_raw_ones():
    message = request(("input", "FP32", [2, 2]))
    message.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    np.testing.assert_array_equal(decode_request(message).inputs[0].array,
                                  [[1, 2], [3, 4]])
    message = request(("input", "INT8", [2]))
    message.inputs[0].contents.int_contents.extend([1, 300])
    with pytest.raises(ProtocolError, match=r"outside the range of INT8 \[-128, 127\]"):
        decode_request(message)


@pytest.mark.parametrize("tensors, raw, match", [
    ((), None, "must have 'inputs'"),
    ((("input", "FP32", [3, 4]),), [b"\0" * 47], "47 bytes of raw contents but shape "
                                                 r"\[3, 4\] of FP32 needs 48"),
    ((("input", "FP32", [3, 4]),), [b"", b""], "2 raw_input_contents for 1 inputs"),
    ((("input", "FP32", [3, 4]),), None, r"0 values in 'contents.fp32_contents' but "
                                         r"shape \[3, 4\] needs 12"),
    ((("input", "FP16", [1]),), None, "typed contents .send raw contents"),
    ((("input", "BYTES", [1]),), [b"x"], "datatype 'BYTES'; served datatypes"),
    ((("input", "FP32", [-1, 4]),), [b""], "integers >= 0"),
    ((("input", "FP32", [1] * 33),), [b""], "at most 32 integers"),
    ((("input", "UINT8", [2 ** 40, 2 ** 20, 0]),), [b""], "too large"),
])
def test_a_malformed_request_is_refused_naming_what_is_wrong(tensors, raw, match):
    with pytest.raises(ProtocolError, match=match) as info:
        decode_request(request(*tensors, raw=raw))
    assert info.value.status == 400


def test_an_empty_tensor_may_not_claim_absurd_dimensions_but_zero_rows_pass():
    assert decode_request(request(("input", "FP32", [0, 16]), raw=[b""])).inputs[
        0].array.shape == (0, 16)
    with pytest.raises(ProtocolError, match="too large"):
        decode_request(request(("input", "FP32", [0, 2 ** 62, 4])), max_elements=100)


def test_raw_and_typed_contents_together_are_refused():
    message = request(("input", "FP32", [1]), raw=[b"\0" * 4])
    message.inputs[0].contents.fp32_contents.append(1.0)
    with pytest.raises(ProtocolError, match="'contents' beside raw_input_contents"):
        decode_request(message)


def test_requested_outputs_and_the_classification_extension():
    message = request(("input", "FP32", [0]), raw=[b""])
    message.outputs.add(name="b")
    assert decode_request(message).outputs == (RequestedOutput("b", True),)
    message.outputs[0].parameters["classification"].int64_param = 0  # asks none: as
    assert decode_request(message).outputs == (RequestedOutput("b", True),)  # HTTP
    message.outputs[0].parameters["classification"].int64_param = 3
    with pytest.raises(ProtocolError, match="classification extension"):
        decode_request(message)


def test_an_output_requested_twice_is_answered_once():
    # each entry added a copy of the whole tensor to the answer: 100 entries of a
    # 1 MiB request made a 100 MB answer, a million blocked the loop for 5 s (Triton
    # keeps a set of the names)
    message = request(("input", "FP32", [0]), raw=[b""])
    for name in "bab":
        message.outputs.add(name=name)
    assert decode_request(message).outputs == (RequestedOutput("b", True),
                                               RequestedOutput("a", True))


def test_a_response_holds_the_asked_outputs_and_decodes_to_the_model_s_structure():
    a, b = X * 2, (X > 3)
    named = [("output_0", a), ("output_1", b)]
    response = encode_response(model_name="m", model_version="7", request_id="r1",
                               outputs=named, requested=None)
    assert response.id == "r1" and [t.datatype for t in response.outputs] == ["FP32",
                                                                              "BOOL"]
    outputs, version = decode_response(response)
    assert version == "7" and isinstance(outputs, tuple)
    np.testing.assert_array_equal(outputs[0], a)
    np.testing.assert_array_equal(outputs[1], b)
    outputs[0][0, 0] = 99  # the caller's own arrays
    only_b = encode_response(model_name="m", model_version="", request_id=None,
                             outputs=[("p", a), ("v", b)],
                             requested=[RequestedOutput("v", True)])
    outputs, version = decode_response(only_b)
    assert version is None and isinstance(outputs, np.ndarray) and outputs.dtype == bool
    both = encode_response(model_name="m", model_version="", request_id=None,
                           outputs=[("p", a), ("v", b)], requested=None)
    assert set(decode_response(both)[0]) == {"p", "v"}
    with pytest.raises(ProtocolError, match="unknown output 'z'"):
        encode_response(model_name="m", model_version="", request_id=None,
                        outputs=named, requested=[RequestedOutput("z", True)])


def test_a_response_that_is_not_the_protocol_s_is_refused():
    with pytest.raises(ProtocolError, match="no outputs"):
        decode_response(pb.ModelInferResponse())
    response = pb.ModelInferResponse()
    response.outputs.add(name="y", datatype="FP32", shape=[2, 4])
    response.raw_output_contents.append(b"\0" * 8)
    with pytest.raises(ProtocolError, match="8 bytes of raw contents"):
        decode_response(response)
