import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from async_search.base import TensorSpec
from async_search.errors import ModelOutputError, ProtocolError
from async_search.http import kserve
from async_search.http.kserve import RequestedOutput

pytestmark = pytest.mark.timeout(60)

SPEC = TensorSpec((3,), np.float32)


def body(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


def tensor(data=None, shape=(2, 3), datatype="FP32", name="input", **params):
    t = {"name": name, "shape": list(shape), "datatype": datatype}
    if data is not None:
        t["data"] = data
    if params:
        t["parameters"] = params
    return t


def binary_body(arrays, datatypes=None):
    tensors = [tensor(shape=a.shape, datatype=(datatypes or ["FP32"] * len(arrays))[i],
                      name=f"in{i}", binary_data_size=a.nbytes)
               for i, a in enumerate(arrays)]
    header = body(tensors)
    return header + b"".join(a.tobytes() for a in arrays), str(len(header))


def test_json_tensors_decode_flat_or_nested():
    flat = kserve.decode_request(body([tensor([1, 2, 3, 4, 5, 6])], id="r1"))
    nested = kserve.decode_request(body([tensor([[1, 2, 3], [4, 5, 6]])]))
    for r in (flat, nested):
        np.testing.assert_array_equal(r.inputs[0].array,
                                      np.arange(1, 7, dtype=np.float32).reshape(2, 3))
        assert r.inputs[0].array.dtype == np.float32
    assert flat.id == "r1" and flat.outputs is None and not flat.binary_output


def test_uint64_json_data_past_int64_is_read_exactly_and_out_of_range_refused():
    # NumPy reads [2**63, 0] as float64, which the integer check refused (and which
    # would round): the integers are taken as they are.
    for data in ([2 ** 63, 0], [0, 2 ** 64 - 1], [[2 ** 63 + 1], [7]]):
        array = kserve.decode_request(body([tensor(data, shape=(2,) if len(data) == 2 and
                                                   not isinstance(data[0], list)
                                                   else (2, 1), datatype="UINT64")])
                                      ).inputs[0].array
        assert array.dtype == np.uint64 and array.ravel().tolist() == np.ravel(
            np.array(data, dtype=object)).tolist()
    for bad in ([2 ** 64, 0], [-1, 2 ** 63]):
        with pytest.raises(ProtocolError, match="outside the range of UINT64"):
            kserve.decode_request(body([tensor(bad, shape=(2,), datatype="UINT64")]))
    with pytest.raises(ProtocolError, match="without fractions"):
        kserve.decode_request(body([tensor([2 ** 63, 0.5], shape=(2,), datatype="UINT64")]))


@pytest.mark.parametrize("datatype, dtype", [
    ("FP32", np.float32), ("FP64", np.float64), ("FP16", np.float16), ("INT8", np.int8),
    ("INT64", np.int64), ("UINT16", np.uint16), ("BOOL", np.bool_)])
def test_binary_tensors_decode_every_datatype(datatype, dtype):
    a = (np.arange(12).reshape(4, 3) % 2).astype(dtype)
    b = np.ones((1, 2), np.float32)
    data, length = binary_body([a, b], [datatype, "FP32"])
    r = kserve.decode_request(data, length)
    np.testing.assert_array_equal(r.inputs[0].array, a)
    assert r.inputs[0].array.dtype == dtype
    np.testing.assert_array_equal(r.inputs[1].array, b)


def test_response_round_trips_through_tritonclient_json_and_binary():
    from tritonclient.http import InferResult

    y = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    v = np.array([True, False])
    named = [("output", y), ("flag", v)]
    for binary in (False, True):
        payload, length = kserve.encode_response(
            model_name="m", model_version="3", request_id="abc", outputs=named,
            requested=None, binary_output=binary)
        assert (length is not None) == binary
        result = InferResult.from_response_body(payload, header_length=length)
        np.testing.assert_array_equal(result.as_numpy("output"), y)
        np.testing.assert_array_equal(result.as_numpy("flag"), v)
        response = result.get_response()
        assert response["model_version"] == "3" and response["id"] == "abc"


def test_an_output_requested_twice_is_answered_once_with_its_first_settings():
    # each entry added a copy of the whole tensor to the answer (a 1 MiB request of 100
    # entries: a 100 MB answer); Triton keeps a set of the names
    request = kserve.decode_request(body([GOOD], outputs=[
        {"name": "y", "parameters": {"binary_data": True}}, {"name": "z"},
        {"name": "y", "parameters": {"binary_data": False}}]))
    assert request.outputs == (RequestedOutput("y", True), RequestedOutput("z", False))


def test_requested_outputs_choose_tensors_and_encoding():
    y = np.ones((1, 2), np.float32)
    payload, length = kserve.encode_response(
        model_name="m", model_version="0", request_id=None,
        outputs=[("a", y), ("b", y * 2)], requested=[RequestedOutput("b", True)],
        binary_output=False)
    header = json.loads(payload[:length])
    assert [t["name"] for t in header["outputs"]] == ["b"]
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(payload[length:], np.float32).tolist() == [2, 2]
    with pytest.raises(ProtocolError, match=r"unknown output 'c': the model's outputs "
                                            r"are \['a', 'b'\]"):
        kserve.encode_response(model_name="m", model_version="0", request_id=None,
                               outputs=[("a", y), ("b", y)],
                               requested=[RequestedOutput("c", False)],
                               binary_output=False)


GOOD = tensor([1, 2, 3, 4, 5, 6])
A = np.zeros((2, 3), np.float32)


@pytest.mark.parametrize("data, length, message", [
    (b"", None, "not valid JSON"),
    (b"{\"inputs\": [", None, "not valid JSON"),
    (b"\xff\xfe", None, "not valid JSON"),
    (b"[1, 2]", None, "the request must be a JSON object, got list"),
    (b"{}", None, "must have 'inputs'"),
    (body([]), None, "must have 'inputs'"),
    (body(["x"]), None, "input 0 must be a JSON object, got str"),
    (body([{**GOOD, "name": 7}]), None, "input 0 must have a string 'name'"),
    (body([{**GOOD, "datatype": "FP8"}]), None, "datatype 'FP8'; served datatypes"),
    (body([{**GOOD, "datatype": "BYTES"}]), None, "datatype 'BYTES'"),
    (body([{**GOOD, "shape": "2x3"}]), None, "'shape' must be a list"),
    (body([{**GOOD, "shape": [2, -3]}]), None, "'shape' must be a list"),
    (body([{**GOOD, "shape": [2, True]}]), None, "'shape' must be a list"),
    (body([tensor([1, 2, 3])]), None, r"'data' has 3 values but shape \[2, 3\] needs 6"),
    (body([tensor(["a"] * 6)]), None, "holds the string 'a'; float data may hold "
                                      "numbers and the strings"),
    (body([tensor([1, 2, 3, 4, 5, "nan"])]), None, r"element \[5\] holds the string 'nan'"),
    # Numbers sent as strings: the protocol takes numbers; the element is named.
    (body([tensor(["1"] * 6)]), None, r"'data' element \[0\] holds the string '1'; "
                                      r"float data may hold numbers and the strings"),
    (body([tensor([1, 2, 3, 4, "NaN", "6"])]), None, r"element \[5\] holds the string '6'"),
    (body([tensor([[1, 2, 3], [4, "5.0", "NaN"]])]), None,
     r"element \[1\]\[1\] holds the string '5.0'"),
    (body([tensor(["1e3"] * 6, datatype="FP64")]), None, r"element \[0\] holds the string"),
    (body([tensor(["Infinity", "1"] * 3, datatype="FP16")]), None,
     r"element \[1\] holds the string '1'"),
    (body([tensor([True, "NaN"] * 3)]), None, r"element \[0\] holds the value True"),
    (body([tensor(["a"] * 6, datatype="INT32")]), None,
     "holds <U1 values where the datatype INT32 needs"),
    (body([tensor([None] * 6)]), None, "holds object values"),
    (body([tensor([[1, 2], [3]])]), None, "not a \\(nested\\) list of numbers"),
    (body([tensor([1.5] * 6, datatype="INT32")]), None, "without fractions"),
    (body([tensor([300] * 6, datatype="INT8")]), None, r"outside the range of INT8"),
    # made infinities by the cast, with a warning on the server's stderr only
    (body([tensor([1e300] * 6)]), None, r"outside the range of FP32 .*sent as \"Infinity\""),
    (body([tensor([70000] * 6, datatype="FP16")]), None, r"outside the range of FP16"),
    (body([tensor([1] * 6, datatype="BOOL")]), None, "needs true/false"),
    # NumPy read true and false among numbers as 1 and 0: taken as numbers before
    (body([tensor([True, False, True, 1, 2, 3])]), None,
     "holds true/false among numbers where the datatype FP32 needs numbers"),
    (body([tensor([[1.5, 2, 3], [4, 5, False]])]), None, "holds true/false among numbers"),
    (body([tensor([1, 2, 3, 4, 5, True], datatype="INT32")]), None,
     "holds true/false among numbers where the datatype INT32"),
    (body([tensor([True, False, 1, 1, 0, 1], datatype="BOOL")]), None,
     "holds int64 values where the datatype BOOL needs true/false"),
    # true/false were looked for in the bytes as UTF-8 spells them
    (body([tensor([1, 2, 3, 4, 5, True])]).decode().encode("utf-16"), None,
     "holds true/false among numbers"),
    (body([tensor([1, 2, 3, 4, 5, True])]).decode().encode("utf-32-be"), None,
     "holds true/false among numbers"),
    (body([tensor()]), None, "neither 'data' nor a 'binary_data_size'"),
    (body([{**GOOD, "parameters": []}]), None, "'parameters' must be a JSON object"),
    (body([GOOD], parameters={"binary_data_output": "yes"}), None,
     "'binary_data_output' must be true or false"),
    (body([GOOD], id=5), None, "'id' must be a string"),
    (body([GOOD], outputs={"name": "y"}), None, "'outputs' must be a list"),
    (body([GOOD], outputs=[{"name": "y", "parameters": {"classification": 3}}]), None,
     "classification extension is not supported"),
    (body([tensor(binary_data_size=24)]), "x", "must be an integer, got 'x'"),
    (body([tensor(binary_data_size=24)]), "99999", "Inference-Header-Content-Length is "
                                                   "99999 but the body has"),
    (body([tensor(binary_data_size=24)]) + A.tobytes()[:10], None, "not valid JSON"),
    (body([tensor(binary_data_size=20)]) + A.tobytes(), "-", "must be an integer"),
])
def test_malformed_bodies_raise_protocol_errors_that_say_what_is_wrong(data, length,
                                                                       message):
    with pytest.raises(ProtocolError, match=message) as info:
        kserve.decode_request(data, length)
    assert info.value.status == 400


def test_binary_sizes_must_match_shapes_and_cover_the_body():
    header = body([tensor(binary_data_size=20)])
    with pytest.raises(ProtocolError, match=r"'binary_data_size' is 20 bytes but shape "
                                            r"\[2, 3\] of FP32 needs 24"):
        kserve.decode_request(header + A.tobytes(), str(len(header)))
    header = body([tensor(binary_data_size=24)])
    with pytest.raises(ProtocolError, match="the body is truncated"):
        kserve.decode_request(header + A.tobytes()[:-1], str(len(header)))
    with pytest.raises(ProtocolError, match="4 bytes of binary data that no input claims"):
        kserve.decode_request(header + A.tobytes() + b"junk", str(len(header)))
    header = body([tensor(binary_data_size=-1)])
    with pytest.raises(ProtocolError, match="must be an integer >= 0, got -1"):
        kserve.decode_request(header, str(len(header)))
    header = body([{**tensor(binary_data_size=24), "data": [0] * 6}])
    with pytest.raises(ProtocolError, match="both 'data' and 'binary_data_size'"):
        kserve.decode_request(header + A.tobytes(), str(len(header)))


@pytest.mark.parametrize("inputs, message", [
    ([tensor([0] * 6, shape=(2, 4 - 1)), tensor([0] * 6)], r"the model takes one input "
                                                          r"'input', the request has 2"),
    ([tensor([0] * 6, name="x")], "unknown input 'x': the model's input is 'input'"),
    ([tensor([0] * 8, shape=(2, 4))], r"has shape \[2, 4\]; the model takes shape "
                                      r"\[-1, 3\] and datatype FP32"),
    ([tensor([0] * 6, datatype="FP64")], r"has datatype FP64; the model takes shape "
                                         r"\[-1, 3\] and datatype FP32"),
    ([tensor([0] * 3, shape=(3,))], r"has shape \[3\]"),
    ([tensor([0], shape=())], r"has shape \[\]"),
])
def test_inputs_are_checked_against_the_models_spec(inputs, message):
    request = kserve.decode_request(body(inputs))
    with pytest.raises(ProtocolError, match=message):
        kserve.input_array(request, "input", SPEC)


def test_named_outputs_follow_the_models_structure():
    y = np.zeros((2, 1))
    assert [n for n, _ in kserve.named_outputs(y)] == ["output"]
    assert [n for n, _ in kserve.named_outputs((y, y))] == ["output_0", "output_1"]
    assert [n for n, _ in kserve.named_outputs({"p": y, "v": y})] == ["p", "v"]
    assert [n for n, _ in kserve.named_outputs((y, y), ["p", "v"])] == ["p", "v"]


@pytest.mark.parametrize("names", [["policy"], ["p", "v", "w"]])
def test_output_names_that_do_not_match_the_outputs_fail_rather_than_drop_one(names):
    # zip() cut to the shorter: the value head vanished from every answer.
    y = np.zeros((2, 1))
    with pytest.raises(ModelOutputError, match="gave 2 output tensors but its "
                                               "output_names name"):
        kserve.named_outputs((y, y), names)


def test_an_empty_outputs_list_asks_for_every_output_as_over_grpc():
    body = json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32",
                                   "data": [1]}], "outputs": []}).encode()
    assert kserve.decode_request(body).outputs is None  # was (): no output answered


def test_float_data_may_hold_integers_past_int64():
    def decoded(literal):
        body = (b'{"inputs":[{"name":"input","shape":[2],"datatype":"FP32","data":[1.5,'
                + literal + b']}]}')
        return kserve.decode_request(body).inputs[0].array

    np.testing.assert_array_equal(decoded(b"1" + b"0" * 30), np.float32([1.5, 1e30]))
    with pytest.raises(ProtocolError, match="an integer outside the range of FP32"):
        decoded(b"1" + b"0" * 400)
    with pytest.raises(ProtocolError, match="values outside the range of FP32"):
        decoded(b"1" + b"0" * 300)
    np.testing.assert_array_equal(decoded(b'"Infinity"'), np.float32([1.5, np.inf]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() |
    st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "shape", "datatype", "data", "parameters", "inputs",
                         "outputs", "binary_data_size", "binary_data", "id"]),
        children, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(json_values, st.binary(max_size=64), st.none() | st.integers(-5, 200).map(str))
def test_any_body_decodes_or_raises_a_protocol_error(value, tail, length):
    data = json.dumps({"inputs": [value]} if not isinstance(value, dict) else value,
                      allow_nan=True).encode() + tail
    try:
        request = kserve.decode_request(data, length)
    except ProtocolError as e:
        assert e.status == 400
        return
    for t in request.inputs:
        assert isinstance(t.array, np.ndarray)
        try:
            kserve.input_array(request, "input", SPEC)
        except ProtocolError:
            pass


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.binary(max_size=200), st.none() | st.integers(0, 200).map(str))
def test_random_bytes_never_raise_anything_but_protocol_errors(data, length):
    try:
        kserve.decode_request(data, length)
    except ProtocolError:
        pass


@pytest.mark.parametrize("shape", [[2 ** 63, 0], [10 ** 30, 0], [0, 2 ** 63], [2 ** 63],
                                   [2 ** 31, 2 ** 31, 0], [1, 2 ** 40]])
def test_absurd_shapes_are_refused_before_anything_is_allocated(shape):
    for data, length in [(body([tensor([], shape=shape)]), None),
                         (body([tensor(shape=shape, binary_data_size=0)]), "-")]:
        length = str(len(data)) if length else None
        with pytest.raises(ProtocolError, match=r"'shape' .* is too large: a tensor may "
                                                r"hold at most 4096 values") as info:
            kserve.decode_request(data, length, max_elements=4096)
        assert info.value.status == 400


def test_empty_tensors_keep_their_shape_within_the_element_bound():
    r = kserve.decode_request(body([tensor([], shape=(0, 3))]), max_elements=16)
    assert r.inputs[0].array.shape == (0, 3)
    with pytest.raises(ProtocolError, match="at most 16 values"):
        kserve.decode_request(body([tensor([], shape=(0, 17))]), max_elements=16)


def strict_loads(data):
    def refuse(token):
        raise ValueError(token)
    return json.loads(data, parse_constant=refuse)


def test_non_finite_outputs_are_strings_that_strict_parsers_and_tritonclient_read():
    from tritonclient.http import InferResult

    y = np.array([[1.5, np.nan, np.inf, -np.inf]], np.float32)
    for dtype in (np.float16, np.float32, np.float64):
        payload, length = kserve.encode_response(
            model_name="m", model_version="0", request_id=None,
            outputs=[("output", y.astype(dtype))], requested=None, binary_output=False)
        data = strict_loads(payload)["outputs"][0]["data"]
        assert data == [1.5, "NaN", "Infinity", "-Infinity"]
        got = InferResult.from_response_body(payload).as_numpy("output")
        np.testing.assert_array_equal(got, y.astype(dtype))
    assert kserve.json_data(np.array([1, 2], np.int64)) == [1, 2]


def test_non_finite_inputs_may_be_strings_or_bare_tokens():
    for data in (b'[1.5, "NaN", "Infinity", "-Infinity", 0, 2e3]',
                 b"[1.5, NaN, Infinity, -Infinity, 0, 2e3]"):
        raw = (b'{"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", '
               b'"data": ' + data + b"}]}")
        np.testing.assert_array_equal(
            kserve.decode_request(raw).inputs[0].array,
            np.float32([[1.5, np.nan, np.inf], [-np.inf, 0, 2000]]))


def test_protocol_errors_keep_their_status_across_processes():
    import pickle

    e = pickle.loads(pickle.dumps(ProtocolError("gone", status=503)))
    assert (str(e), e.status) == ("gone", 503)


def test_json_length_is_the_header_or_the_whole_body():
    assert kserve.json_length(100, None) == 100
    assert kserve.json_length(100, "40") == 40
    for bad in ("101", "-1", "x"):
        with pytest.raises(ProtocolError):
            kserve.json_length(100, bad)


def test_versions_are_spelled_as_text_and_an_unknown_one_as_empty():
    assert kserve.version_label(0) == "0"
    assert kserve.version_label("v7") == "v7"
    assert kserve.version_label(None) == ""  # unknown, never "None"


def test_protocol_errors_live_in_errors_and_keep_their_status_across_pickling():
    import pickle

    import async_search.errors as errors

    assert "ProtocolError" not in vars(kserve) or kserve.ProtocolError is errors.ProtocolError
    error = pickle.loads(pickle.dumps(errors.ProtocolError("too large", status=413)))
    assert isinstance(error, ValueError) and error.status == 413
    assert str(error) == "too large"


@pytest.mark.parametrize("size", ["x" * 100_000, list(range(20_000)), 10 ** 4000],
                         ids=["100 KB of text", "20,000 numbers", "4001 digits"])
def test_a_bad_binary_data_size_is_quoted_cut_not_echoed(size):
    # A 100 KB binary_data_size string came back whole in the 400's message.
    header = body([tensor(shape=(1, 4), binary_data_size=size)])
    with pytest.raises(ProtocolError, match="'binary_data_size'") as info:
        kserve.decode_request(header + b"\0" * 16, str(len(header)))
    assert info.value.status == 400 and len(str(info.value)) < 300, len(str(info.value))


@pytest.mark.parametrize("length", ["1_0", "+10", "\u0661\u0660", "10.0", "9" * 5000],
                         ids=["underscore", "sign", "arabic-indic", "fraction", "long"])
def test_inference_header_content_length_is_ascii_digits_only(length):
    # int() read "1_0" as 10, and the digits of other scripts as ASCII ones.
    with pytest.raises(ProtocolError, match="must be an integer") as info:
        kserve.json_length(100, length)
    assert info.value.status == 400 and len(str(info.value)) < 200
    assert kserve.json_length(100, "10") == 10
