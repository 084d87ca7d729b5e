"""JaxModel beyond the shared adapter suite; the GPU paths run only where JAX has one."""

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.errors import DeviceNotFoundError, InputSpecError
from async_search.models import JaxModel

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install -e '.[jax]')")
jnp = jax.numpy

pytestmark = pytest.mark.timeout(300)

SPEC = TensorSpec((6,), np.float32)


def has_gpu():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


needs_gpu = pytest.mark.skipif(not has_gpu(), reason="needs a GPU that JAX sees "
                               "(pip install 'jax[cuda12]')")


def params(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((6, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}


def apply(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def reference(p, x):
    return np.tanh(x @ p["w"] + p["b"])


def rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 6)).astype(np.float32)


def test_compiled_once_per_bucket_and_never_again_on_new_weights():
    model = JaxModel(apply, params(), input_spec=SPEC, max_batch_size=16)
    tol = model.batch_tolerance  # on a GPU, float32 products use TF32: 1e-3 off NumPy
    for n in (1, 3, 4, 5, 9, 16, 40, 2, 7):
        np.testing.assert_allclose(model(rows(n, n)), reference(params(), rows(n, n)),
                                   rtol=tol, atol=tol)
    assert model.trace_count == 5  # buckets 1, 2, 4, 8, 16
    updated = model.with_weights(params(1))
    np.testing.assert_allclose(updated(rows(9)), reference(params(1), rows(9)),
                               rtol=tol, atol=tol)
    assert updated.trace_count == 5


def test_tuple_and_dict_outputs_keep_their_structure():
    pair = JaxModel(lambda p, x: (x @ p["w"], x.sum(axis=1)), params(), input_spec=SPEC)
    first, second = pair(rows(3))
    assert first.shape == (3, 3) and second.shape == (3,)
    named = JaxModel(lambda p, x: {"v": x @ p["w"]}, params(), input_spec=SPEC)
    assert named(rows(2))["v"].shape == (2, 3)


@pytest.mark.parametrize("n", [3, 4])  # padded, and filling a compiled bucket
def test_reduced_float_outputs_come_back_float32_as_from_every_adapter(n):
    # They came back as ml_dtypes' bfloat16 (and float16), where PyTorch gives float32.
    import jax.numpy as jnp

    model = JaxModel(lambda p, x: (x.astype(jnp.bfloat16), x.astype(jnp.float16)), {},
                     input_spec=SPEC, batch_sizes=(4,))
    x = np.random.default_rng(0).standard_normal((n, 6)).astype(np.float32)
    model(x[:4])  # compiled: the exact-bucket path too
    low, half = model(x)
    assert low.dtype == half.dtype == np.float32
    np.testing.assert_allclose(low, x, rtol=1e-2)
    np.testing.assert_allclose(half, x, rtol=1e-3)


def test_outputs_are_the_callers_own_even_when_the_function_returns_its_input():
    model = JaxModel(lambda p, x: x, params(), input_spec=SPEC, max_batch_size=4)
    x = rows(3)
    y = model(x)
    model(rows(3, seed=1))
    np.testing.assert_array_equal(y, x)
    full = rows(4)  # fills its bucket: goes in without a copy
    y = model(full)
    full[:] = 0  # the server reuses its batch buffers
    np.testing.assert_array_equal(y, rows(4))


def test_a_batch_that_fills_a_compiled_bucket_computes_alike_whatever_its_layout():
    # Once a bucket is compiled, its exact batches skip the padding: a strided, Fortran
    # or read-only one goes to jit as it is; another dtype is refused, as by a server.
    model = JaxModel(apply, params(), input_spec=SPEC, batch_sizes=(4,))
    x = rows(8)
    model(x[:3])  # compiles the bucket
    read_only = x[:4].copy()
    read_only.flags.writeable = False
    for batch in (x[:4], x[::2], np.asfortranarray(x[:4]), read_only):
        np.testing.assert_allclose(model(batch), reference(params(), batch),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(InputSpecError, match="float64"):
        model(x[:4].astype(np.float64))
    assert model.trace_count == 1
    pair = JaxModel(lambda p, x: (x @ p["w"], x.sum(axis=1)), params(), input_spec=SPEC,
                    batch_sizes=(4,))
    for _ in range(2):  # compiled, then exact
        first, second = pair(x[:4])
        np.testing.assert_allclose(first, x[:4] @ params()["w"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(second, x[:4].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_exact_batches_after_an_update_see_the_new_weights_and_the_old_model_its_own():
    model = JaxModel(apply, params(), input_spec=SPEC, batch_sizes=(4,))
    x = rows(4)
    model(x)
    updated = model.with_weights(params(1))
    for _ in range(2):  # the update's first batch places the weights, then exact ones
        np.testing.assert_allclose(updated(x), reference(params(1), x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model(x), reference(params(), x), rtol=1e-5, atol=1e-5)


def test_params_are_checked_and_copied_when_staged():
    model = JaxModel(apply, params(), input_spec=SPEC)
    new = params(1)
    updated = model.with_weights(new)
    new["w"][:] = 0  # the caller changes its arrays after the update
    np.testing.assert_allclose(updated(rows(4)), reference(params(1), rows(4)),
                               rtol=1e-5, atol=1e-5)
    as_float64 = {k: v.astype(np.float64) for k, v in params(2).items()}
    assert model.with_weights(as_float64).params["w"].dtype == np.float32
    with pytest.raises(ValueError, match=r"tree differs.*missing \[\"\['b'\]\"\], "
                                         r"unexpected \[\]"):
        model.with_weights({"w": params()["w"]})  # named, not two whole trees printed
    with pytest.raises(ValueError, match=r"missing \[\"\['b'\]\"\], unexpected "
                                         r"\[\"\['bias'\]\"\]"):
        model.with_weights({"w": params()["w"], "bias": params()["b"]})
    paired = JaxModel(lambda p, x: x @ p[0] + p[1], (params()["w"], params()["b"]),
                      input_spec=SPEC)
    with pytest.raises(ValueError, match="tree differs.*PyTreeDef"):  # the same paths
        paired.with_weights([params()["w"], params()["b"]])
    with pytest.raises(ValueError, match=r"shape \(6, 4\) where the model has \(6, 3\)"):
        model.with_weights({**params(), "w": np.zeros((6, 4), np.float32)})
    counted = JaxModel(lambda p, x: x * p["k"], {"k": np.array(2, np.int32)},
                       input_spec=SPEC)
    with pytest.raises(ValueError, match="dtype float64 where the model has int32"):
        counted.with_weights({"k": np.array(2.7)})  # not truncated to 2
    assert counted.with_weights({"k": 3}).params["k"] == 3  # an int is an int


def test_a_weakly_typed_parameter_stays_weak_across_updates_and_copies():
    # A Python number in the params is weakly typed: float16 rows times it stay
    # float16. Placed again as a float32 array, jit would compile anew and promote.
    # (Outputs come back float32: a float16 product's values tell it was computed in
    # float16, where float32's would differ in the last bits.)
    model = JaxModel(lambda p, x: x * p["s"], {"s": 2.0},
                     input_spec=TensorSpec((6,), np.float16), max_batch_size=4)
    x = rows(4).astype(np.float16)

    def in_float16(y, scale):
        return np.array_equal(y, (x * np.float16(scale)).astype(np.float32))

    assert not np.array_equal((x * np.float16(3)).astype(np.float32),
                              x.astype(np.float32) * 3)  # the values can tell
    assert in_float16(model(x), 2) and model.trace_count == 1
    updated = model.with_weights({"s": 3.0})
    assert in_float16(updated(x), 3) and updated.trace_count == 1
    again = model.with_weights({"s": 4.0}).with_weights({"s": 5.0})  # staged, restaged
    assert in_float16(again(x), 5) and again.trace_count == 1
    assert in_float16(model.with_weights({"s": 6.0}).on_device("cpu")(x), 6)


@pytest.mark.parametrize("given", [2 ** 40, -2 ** 31 - 1, 2 ** 70])
def test_a_python_int_past_a_weak_int_parameters_range_gets_value_error(given):
    """A parameter made from a Python int is a weak int32: an int past that range is
    refused (ValueError, not NumPy's OverflowError), and the parameter stays."""
    model = JaxModel(lambda p, x: x * p, 3, input_spec=SPEC, device="cpu")
    with pytest.raises(ValueError, match="the parameter has dtype .* where the model has "
                                         "int32.*would change its values"):
        model.with_weights(given)
    np.testing.assert_allclose(model(rows(2)), 3 * rows(2), rtol=1e-6)
    assert model.with_weights(2 ** 31 - 1).params == 2 ** 31 - 1


def test_a_refused_parameter_is_named_by_its_path_and_stages_nothing():
    model = JaxModel(lambda p, x: x * p["k"][0] + p["b"], {
        "b": np.zeros(6, np.float32), "k": [np.array(2, np.int32)]},
        input_spec=SPEC, device="cpu")
    with pytest.raises(ValueError, match=r"parameter \['k'\]\[0\] has dtype int64 "
                                         r"where the model has int32: it holds 4294967298"):
        model.with_weights({"b": np.ones(6, np.float32), "k": [np.array(2 ** 32 + 2)]})
    np.testing.assert_allclose(model(rows(2)), 2 * rows(2), rtol=1e-6)
    np.testing.assert_array_equal(model.params["b"], np.zeros(6, np.float32))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="64-bit JAX computes int64 as is")
@pytest.mark.parametrize("with_params", [True, False])
def test_int64_inputs_past_int32_fail_instead_of_wrapping_without_x64(with_params):
    params = {"k": np.array(1, np.int32)} if with_params else {}
    model = JaxModel(lambda p, x: x + (p["k"] if p else 1), params,
                     input_spec=TensorSpec((1,), np.int64), max_batch_size=4)
    for _ in range(2):  # the second time through a compiled bucket too
        assert model(np.full((4, 1), 2 ** 30, np.int64)).ravel().tolist() == [2 ** 30 + 1] * 4
    with pytest.raises(InputSpecError, match="outside int32's range"):
        model(np.full((4, 1), 2 ** 40, np.int64))  # would come back as 1
    with pytest.raises(InputSpecError, match="outside int32's range"):
        model(np.full((1, 1), -2 ** 33, np.int64))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="64-bit JAX computes float64 as is")
def test_float64_inputs_past_float32_fail_instead_of_becoming_inf_without_x64():
    # 1e300 came back as inf, silently.
    model = JaxModel(lambda p, x: x * 1.0, {}, input_spec=TensorSpec((2,), np.float64),
                     max_batch_size=4)
    special = np.array([[1.0, np.inf], [np.nan, -np.inf]])
    np.testing.assert_array_equal(model(special), special)  # inf and NaN stay as sent
    with pytest.raises(InputSpecError, match="outside float32's range.*become inf"):
        model(np.array([[1e300, 0.5]]))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="64-bit JAX computes int64 as is")
def test_an_int64_request_past_int32_fails_alone_and_its_batch_mates_are_served():
    import asyncio

    import async_search as asr

    model = JaxModel(lambda p, x: x + p["k"], {"k": np.array(1, np.int32)},
                     input_spec=TensorSpec((1,), np.int64), max_batch_size=8)
    new = model.with_weights({"k": np.array(2, np.int32)})
    assert new.check_values is not None  # weights alone keep the check

    async def main():
        async with asr.serve(model, max_batch_size=8, max_delay=0.05) as evaluate:
            good = [evaluate(np.full((2, 1), i, np.int64)) for i in range(3)]
            with pytest.raises(InputSpecError, match="outside int32's range"):
                evaluate(np.full((2, 1), 2 ** 40, np.int64))
            answers = await asyncio.wait_for(asyncio.gather(*good), 10)
            evaluate.update_model(new.params, version=2)
            with pytest.raises(InputSpecError, match="outside int32's range"):
                evaluate(np.full((1, 1), -2 ** 33, np.int64))
            after = await asyncio.wait_for(evaluate(np.zeros((1, 1), np.int64)), 10)
            return answers, after, evaluate.stats["failed_batches"]

    answers, after, failed = asyncio.run(main())
    assert [a.ravel().tolist() for a in answers] == [[1, 1], [2, 2], [3, 3]]
    assert after.ravel().tolist() == [2] and failed == 0


def test_a_function_without_parameters_runs_on_its_device():
    model = JaxModel(lambda p, x: 2 * x, {}, input_spec=SPEC, device="cpu",
                     batch_sizes=(4,))
    np.testing.assert_array_equal(model(rows(3)), 2 * rows(3))


def test_devices_by_name_or_object():
    cpu = jax.devices("cpu")[0]
    for device in ("cpu", "cpu:0", "CPU", cpu):
        assert JaxModel(apply, params(), input_spec=SPEC, device=device).device == cpu
    with pytest.raises(DeviceNotFoundError, match="this machine has"):
        JaxModel(apply, params(), input_spec=SPEC, device="cpu:99")
    assert JaxModel(apply, params(), input_spec=SPEC, device="cpu").batch_tolerance == 1e-4


@needs_gpu
def test_gpu_is_the_default_and_agrees_with_the_cpu():
    model = JaxModel(apply, params(), input_spec=SPEC, max_batch_size=8)
    assert model.device.platform == "gpu"
    x = rows(11)
    np.testing.assert_allclose(model(x), reference(params(), x), rtol=1e-2, atol=1e-2)
    copy = model.with_weights(params(1)).on_device("cpu")
    np.testing.assert_allclose(copy(x), reference(params(1), x), rtol=1e-4, atol=1e-4)


def test_host_rows_are_copied_only_where_they_share_the_batch():
    # Where JAX's jit handed the input's memory back (_jit_aliases_host_inputs), the
    # rows are copied out of the buffer that the adapter or the server reuses.
    from async_search.models.jax_model import _host_rows, _jit_aliases_host_inputs
    batch = rows(4)
    shared = _host_rows(batch, 3, 4, batch)
    assert shared.shape == (3, 6) and not np.may_share_memory(shared, batch)
    assert np.may_share_memory(_host_rows(batch, 3, 4, None), batch)
    assert isinstance(_jit_aliases_host_inputs(jax, jax.devices("cpu")[0]), bool)


@pytest.mark.parametrize("dtype", [object, "M8[s]", "U3"])
def test_a_spec_dtype_jax_cannot_take_is_refused_when_made(dtype):
    # Accepted, then every batch failed with JAX's "Error interpreting argument".
    with pytest.raises(ValueError, match="JAX has no dtype for the input spec"):
        JaxModel(lambda p, x: x, {}, TensorSpec((2,), dtype))


@pytest.mark.parametrize("device", ["", "  "])
def test_an_empty_device_name_is_refused_not_taken_for_the_default(device):
    with pytest.raises(DeviceNotFoundError, match="None picks JAX's first device"):
        JaxModel(lambda p, x: x, {}, SPEC, device=device)


def test_a_jax_adapter_cannot_be_pickled_and_says_what_to_send_instead():
    import pickle
    with pytest.raises(TypeError, match="JaxModel holds a net on its device"):
        pickle.dumps(JaxModel(lambda p, x: x, {}, SPEC))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="x64 keeps int64 and float64")
@pytest.mark.parametrize("value, said", [(np.array([2**40 + 5]), "outside int32's range"),
                                         (np.array(1e300), "past float32's range"),
                                         (1e300, "past float32's range")])
def test_a_parameter_that_placing_would_change_is_refused_when_the_adapter_is_made(
        value, said):
    # device_put wrapped 2**40 + 5 to 5 (and made 1e300 infinite) without a word,
    # while with_weights refused the same values.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX's own note that int64 is not available
        with pytest.raises(ValueError, match=f"parameter \\['k'\\].*{said}"):
            JaxModel(lambda p, x: x + p["k"], {"k": value}, SPEC, device="cpu")
        fits = JaxModel(lambda p, x: x + p["k"], {"k": np.array([5])}, SPEC, device="cpu")
    assert fits(np.zeros((1, 6), np.float32)).tolist() == [[5.0] * 6]


@jax.tree_util.register_pytree_node_class
class CallableLinear:
    """Parameters that are a pytree and callable, as an Equinox module."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, x):  # one example
        return self.w @ x + self.b

    def tree_flatten(self):
        return (self.w, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


async def test_update_model_takes_callable_parameters_of_the_model_s_tree_as_weights():
    # Callable, they replaced the model: the raw pytree was served on NumPy batches,
    # wrong rows tagged with the new version.
    import async_search as asr

    def apply_fn(net, x):
        return jax.vmap(net)(x)

    first = CallableLinear(np.eye(4, dtype=np.float32), np.zeros(4, np.float32))
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    model = JaxModel(apply_fn, first, TensorSpec((4,), np.float32), device="cpu")
    async with asr.serve(model) as evaluate:
        evaluate.update_model(CallableLinear(w, np.ones(4, np.float32)), version=1)
        for n in (2, 4):
            x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
            out, version = await evaluate.with_version(x)
            assert version == 1
            np.testing.assert_allclose(out, x @ w.T + 1, rtol=1e-6)
    assert not model.takes_as_weights(lambda p, x: x)  # a function still replaces it


def test_a_weakly_typed_array_parameter_is_placed_strong_so_updates_compile_nothing():
    # Placed weak, then strong at the first update: traced again, and int8 * weak int32
    # gave int8 before the update and int32 after (served: every batch failed).
    import jax.numpy as jnp

    params = {"scale": jnp.full((4,), 3)}
    assert params["scale"].weak_type
    model = JaxModel(lambda p, x: x * p["scale"], params, TensorSpec((4,), np.int8),
                     device="cpu")
    x = np.full((2, 4), 100, np.int8)
    before = model(x)
    after = model.with_weights({"scale": np.full((4,), 3, np.int32)})(x)
    assert before.dtype == after.dtype and before.tolist() == after.tolist()
    assert model.trace_count == 1


@pytest.mark.parametrize("value", [1e300, 1e300j])
def test_a_complex128_input_past_complex64_s_range_is_refused_without_x64(value):
    # complex128 was not checked: its parts past float32's range became inf silently.
    if jax.config.jax_enable_x64:
        pytest.skip("with x64 JAX computes complex128")
    import jax.numpy as jnp

    model = JaxModel(lambda p, x: jnp.abs(x) * p["s"], {"s": np.float32(1)},
                     TensorSpec((2,), np.complex128), device="cpu")
    with pytest.raises(InputSpecError, match="outside float32's range"):
        model(np.array([[1, value], [2, 3]], np.complex128))
    assert model(np.array([[3 + 4j, 0]], np.complex128)).tolist() == [[5.0, 0.0]]


def test_the_default_tolerance_follows_reduced_precision_parameters():
    # A bfloat16 net declared the CPU's 1e-4, and its rows moved far more.
    import ml_dtypes

    bf16 = {"w": np.ones((4, 2), ml_dtypes.bfloat16)}
    f16 = {"w": np.ones((4, 2), np.float16)}
    apply = lambda p, x: x @ p["w"].astype(np.float32)  # noqa: E731
    spec = TensorSpec((4,), np.float32)
    assert JaxModel(apply, bf16, spec, device="cpu").batch_tolerance == 5e-2
    assert JaxModel(apply, f16, spec, device="cpu").batch_tolerance == 1e-2
    assert JaxModel(apply, {"w": np.ones((4, 2), np.float32)}, spec,
                    device="cpu").batch_tolerance == 1e-4


def test_a_typed_prng_key_parameter_takes_updates():
    # with_weights raised TypeError ("Cannot interpret 'key<fry>' as a data type").
    w = np.ones((3, 2), np.float32)

    def apply_fn(p, x):
        return x @ p["w"] + jax.random.uniform(p["rng"], (1, 2))

    model = JaxModel(apply_fn, {"w": w, "rng": jax.random.key(0)},
                     TensorSpec((3,), np.float32), device="cpu")
    x = np.ones((2, 3), np.float32)
    updated = model.with_weights({"w": w * 2, "rng": jax.random.key(1)})
    expected = x @ (w * 2) + np.asarray(jax.random.uniform(jax.random.key(1), (1, 2)))
    np.testing.assert_allclose(updated(x), expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"parameter \['rng'\] is a key<fry> key"):
        model.with_weights({"w": w, "rng": np.zeros(2, np.uint32)})


def test_a_dict_output_whose_keys_do_not_sort_gets_model_output_error():
    # JAX's bare ValueError ("Comparator raised exception while sorting pytree
    # dictionary keys"), which callers take for their own bad input.
    from async_search.errors import ModelOutputError

    model = JaxModel(lambda p, x: {"policy": x * p["s"], 0: x.sum(1)},
                     {"s": np.float32(2)}, TensorSpec((3,), np.float32), device="cpu")
    with pytest.raises(ModelOutputError, match="a dict whose keys do not sort"):
        model(np.ones((2, 3), np.float32))


def test_a_python_int_parameter_past_int32_is_a_value_error_as_in_with_weights():
    if jax.config.jax_enable_x64:
        pytest.skip("with x64 JAX places it as int64")
    with pytest.raises(ValueError, match="too large to convert to int32"):
        JaxModel(lambda p, x: x * p["k"], {"k": 2 ** 40}, TensorSpec((2,), np.float32),
                 device="cpu")
