import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.errors import DeviceNotFoundError, ModelOutputError
from async_search.models import TensorFlowModel

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def keras_net(tf):
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(16, "relu"),
                                tf.keras.layers.Dense(2)])


def test_tensorflow_adapter_matches_keras_and_traces_once_per_size(keras_net):
    model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), max_batch_size=64)
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.standard_normal((rng.integers(1, 65), 6)).astype(np.float32)
        y = model(x)
        np.testing.assert_allclose(y, keras_net(x).numpy(), atol=1e-5)
        assert y.shape == (len(x), 2)
    assert model.trace_count <= len(model.batch_sizes) == 7


def test_reduced_float_outputs_come_back_float32_as_from_every_adapter(tf):
    # They came back as ml_dtypes' bfloat16 (and float16), where PyTorch gives float32.
    def net(x):
        return tf.cast(x, tf.bfloat16), tf.cast(x, tf.float16)

    model = TensorFlowModel(net, TensorSpec((6,), np.float32), max_batch_size=4)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    low, half = model(x)
    assert low.dtype == half.dtype == np.float32
    np.testing.assert_allclose(low, x, rtol=1e-2)
    np.testing.assert_allclose(half, x, rtol=1e-3)


def test_tensorflow_adapter_runs_large_batches_in_chunks(keras_net):
    model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), max_batch_size=8)
    x = np.random.default_rng(1).standard_normal((21, 6)).astype(np.float32)
    np.testing.assert_allclose(model(x), keras_net(x).numpy(), atol=1e-5)
    assert model.trace_count <= 4


def test_tensorflow_adapter_passes_tuple_outputs_through(tf):
    fn = lambda x: (2.0 * x, tf.reduce_sum(x, axis=1))  # noqa: E731
    model = TensorFlowModel(fn, TensorSpec((3,), np.float32), batch_sizes=(4, 16))
    x = np.ones((5, 3), np.float32)
    doubled, total = model(x)
    np.testing.assert_array_equal(doubled, 2 * x)
    np.testing.assert_array_equal(total, np.full(5, 3.0))
    assert model.device.endswith("CPU:0") or "GPU" in model.device


def test_tensorflow_weights_swap_into_the_same_variables_without_tracing_again(
        tf, keras_net):
    model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), max_batch_size=8)
    x = np.random.default_rng(2).standard_normal((8, 6)).astype(np.float32)
    before = model(x)
    traces = model.trace_count
    other = tf.keras.models.clone_model(keras_net)  # fresh random weights
    updated = model.with_weights(other.get_weights())
    np.testing.assert_allclose(updated(x), other(x).numpy(), atol=1e-5)
    np.testing.assert_array_equal(model(x), before)  # the old model keeps its own
    assert model.trace_count == traces
    assert updated.with_weights(other)(x).shape == (8, 2)  # a Keras model works too


def test_tensorflow_weights_are_checked_when_staged(keras_net, tf):
    model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), max_batch_size=8)
    weights = keras_net.get_weights()
    with pytest.raises(ValueError, match=r"has shape \(6,\)"):
        model.with_weights([np.zeros(6)] + weights[1:])
    with pytest.raises(ValueError, match=r"the 4 arrays of get_weights\(\), got a list of 3$"):
        model.with_weights(weights[:3])
    plain = TensorFlowModel(lambda x: 2.0 * x, TensorSpec((3,), np.float32))
    with pytest.raises(TypeError, match="pass a new model"):
        plain.with_weights([])


def test_tensorflow_devices_are_checked(keras_net):
    for missing in ("/GPU:7", "/CPU:3", "tpu:0"):
        with pytest.raises(DeviceNotFoundError, match="this machine has"):
            TensorFlowModel(keras_net, TensorSpec((6,), np.float32), device=missing)
    model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), device="/CPU:0")
    assert model.batch_tolerance == 1e-4
    assert TensorFlowModel(keras_net, TensorSpec((6,), np.float32),
                           batch_tolerance=0.0).batch_tolerance == 0.0



@pytest.mark.parametrize("how", ["subclassed", "sequential without an Input"])
def test_a_keras_model_not_built_yet_takes_new_weights(tf, how):
    if how == "subclassed":
        class Net(tf.keras.Model):
            def __init__(self):
                super().__init__()
                self.hidden = tf.keras.layers.Dense(4, "relu")
                self.out = tf.keras.layers.Dense(2)

            def call(self, x, training=False):
                return self.out(self.hidden(x))

        make = Net
    else:
        def make():
            return tf.keras.Sequential([tf.keras.layers.Dense(4, "relu"),
                                        tf.keras.layers.Dense(2)])

    tf.keras.utils.set_random_seed(1)
    net, other = make(), make()
    model = TensorFlowModel(net, TensorSpec((6,), np.float32))
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    other(x)  # built: its own weights
    updated = model.with_weights(other.get_weights())
    np.testing.assert_allclose(updated(x), other(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="the 4 arrays of get_weights"):
        model.with_weights([])
    if how == "subclassed":  # Keras cannot clone it: said, with what to do instead
        with pytest.raises(TypeError, match="cannot copy Net.*add_worker"):
            model.on_device("/CPU:0")
    else:
        np.testing.assert_allclose(model.on_device("/CPU:0")(x), model(x), rtol=1e-6)


def shifted_by_int_weight(tf):
    """A Keras model adding an int32 weight of ones to its float32 input."""
    class Shifted(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.shift = self.add_weight(shape=(3,), dtype="int32", initializer="ones",
                                         trainable=False)

        def call(self, x, training=False):
            return x + tf.cast(self.shift, tf.float32)

    return Shifted()


def test_tensorflow_weights_of_another_kind_are_refused_not_truncated(tf):
    model = TensorFlowModel(shifted_by_int_weight(tf), TensorSpec((3,), np.float32))
    with pytest.raises(ValueError, match="float64, the model's is int32"):
        model.with_weights([np.array([1.5, 2.5, 3.5])])
    model.with_weights([np.array([4, 5, 6])])  # int64 into int32: the same kind


@pytest.mark.parametrize("device", [0, "/job:worker/replica:0/task:3/device:CPU:0"])
def test_a_device_of_another_task_or_not_a_name_is_refused_at_construction(keras_net,
                                                                            device):
    with pytest.raises(DeviceNotFoundError):
        TensorFlowModel(keras_net, TensorSpec((6,), np.float32), device=device)


def test_the_full_name_tensorflow_gives_a_local_device_is_accepted(tf, keras_net):
    """TensorFlow names where it placed a tensor with the job, replica and task
    (``/job:localhost/replica:0/task:0/device:CPU:0``): that name, and names that give
    only some of them, are this machine's CPU."""
    x = np.random.default_rng(3).standard_normal((3, 6)).astype(np.float32)
    expected = TensorFlowModel(keras_net, TensorSpec((6,), np.float32),
                               device="/CPU:0")(x)
    placed = tf.constant(1.0).device
    assert placed.startswith("/job:localhost/replica:0/task:0/device:")
    for device in (placed, "/job:localhost/replica:0/task:0/device:CPU:0",
                   "/job:localhost/device:CPU:0", "/task:0/device:CPU:0",
                   "/job:localhost/replica:0/task:0/cpu:0"):
        model = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), device=device)
        np.testing.assert_array_equal(model(x), expected)
        np.testing.assert_array_equal(model.on_device(device)(x), expected)


@pytest.mark.parametrize("device", [
    "/job:localhost/replica:0/task:1/device:CPU:0",
    "/job:localhost/replica:1/task:0/device:CPU:0",
    "/job:worker/replica:0/task:0/device:CPU:0",
    "/job:localhost/replica:0/task:0/device:CPU:3",
    "/job:localhost/replica:0/task:0/device:GPU:7"])
def test_another_task_or_a_missing_device_in_full_is_still_refused(keras_net, device):
    with pytest.raises(DeviceNotFoundError, match="this machine has"):
        TensorFlowModel(keras_net, TensorSpec((6,), np.float32), device=device)


def test_a_list_of_python_ints_past_an_int_weights_range_gets_value_error(tf):
    """NumPy raises OverflowError for a Python int past int32 cast there: a ValueError
    instead, naming the weight and the values, the model's weights unchanged."""
    model = TensorFlowModel(shifted_by_int_weight(tf), TensorSpec((3,), np.float32))
    with pytest.raises(ValueError, match=r"weight 0 \(\S+\) is int64, the model's is "
                                         r"int32: it holds values from 1 to 1099511627776"):
        model.with_weights([[1, 2, 2 ** 40]])
    np.testing.assert_array_equal(model(np.zeros((1, 3), np.float32)), [[1, 1, 1]])
    updated = model.with_weights([[-2 ** 31, 0, 2 ** 31 - 1]])
    np.testing.assert_array_equal(updated(np.zeros((1, 3), np.float32)),
                                  [[-2.0 ** 31, 0, 2.0 ** 31]])


@pytest.mark.parametrize("dtype", [np.longdouble, "M8[s]", "V4"])
def test_a_spec_dtype_tensorflow_cannot_take_is_refused_when_made(tf, dtype):
    with pytest.raises(ValueError, match="TensorFlow has no dtype for the input spec"):
        TensorFlowModel(lambda x: x, TensorSpec((2,), dtype))


def test_an_object_spec_is_refused_when_made_and_fixed_width_strings_are_padded(tf):
    # An object spec was taken (TensorFlow reads object arrays of strings), but its
    # padding rows were the int 0: a batch that needed padding failed, one that filled
    # its bucket did not.
    with pytest.raises(ValueError, match="cannot pad object arrays"):
        TensorFlowModel(lambda x: tf.strings.length(x), TensorSpec((2,), object))
    model = TensorFlowModel(lambda x: tf.strings.length(x), TensorSpec((2,), "U2"),
                            batch_sizes=[1, 4])
    np.testing.assert_array_equal(model(np.array([["a", "bb"]] * 3)), [[1, 2]] * 3)


def test_a_class_given_for_its_instance_is_refused_by_name(tf):
    # A Keras class has layers and predict, as its instances do: it got as far as an
    # AttributeError ("type object 'Sequential' has no attribute 'built'").
    with pytest.raises(TypeError, match=r"got the class Sequential: make one"):
        TensorFlowModel(tf.keras.Sequential, TensorSpec((2,), np.float32))


def test_an_empty_device_name_and_a_jit_compile_that_is_not_a_bool_are_refused(tf):
    with pytest.raises(DeviceNotFoundError, match="None picks"):
        TensorFlowModel(lambda x: x, TensorSpec((2,), np.float32), device="")
    with pytest.raises(TypeError, match="jit_compile must be True or False, got 'yes'"):
        TensorFlowModel(lambda x: x, TensorSpec((2,), np.float32), jit_compile="yes")


def test_a_sparse_output_is_the_nets_model_output_error(tf):
    from async_search.errors import ModelOutputError
    model = TensorFlowModel(tf.sparse.from_dense, TensorSpec((2,), np.float32))
    with pytest.raises(ModelOutputError, match="the net returned a SparseTensor"):
        model(np.ones((1, 2), np.float32))


def test_a_tensorflow_adapter_cannot_be_pickled_and_says_what_to_send_instead(tf):
    import pickle
    with pytest.raises(TypeError, match="TensorFlowModel holds a net on its device"):
        pickle.dumps(TensorFlowModel(lambda x: x, TensorSpec((2,), np.float32)))


def _normalized_net(tf, data):
    norm = tf.keras.layers.Normalization()
    norm.adapt(data)
    return tf.keras.Sequential([tf.keras.Input((4,)), norm, tf.keras.layers.Dense(
        1, kernel_initializer="ones")])


def test_a_normalization_layers_statistics_reach_copies_and_updates(tf):
    # Normalization derives its mean and variance from its weights in finalize_state,
    # which set_weights and assign do not call: a copy on a device normalized with 0
    # and 1, and an update's statistics never reached the outputs (old ones, labelled
    # with the new version).
    rng = np.random.default_rng(0)
    net = _normalized_net(tf, (rng.normal(size=(200, 4)) * 10 + 5).astype(np.float32))
    model = TensorFlowModel(net, TensorSpec((4,), np.float32), max_batch_size=4)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(model(x), net(x).numpy(), rtol=1e-5)
    np.testing.assert_allclose(model.on_device("/CPU:0")(x), net(x).numpy(), rtol=1e-5)

    other = _normalized_net(tf, (rng.normal(size=(200, 4)) * 3 - 40).astype(np.float32))
    updated = model.with_weights(other.get_weights())
    np.testing.assert_allclose(updated(x), other(x).numpy(), rtol=1e-5)
    np.testing.assert_allclose(model(x), net(x).numpy(), rtol=1e-5)  # its own again
    np.testing.assert_allclose(updated(x), other(x).numpy(), rtol=1e-5)


class _BadInput(ValueError):
    pass


def _refusing_net(x):
    raise _BadInput("a row the net refuses")


def test_what_the_net_raises_while_traced_reaches_the_caller_as_itself(tf):
    # AutoGraph wrapped it in a StagingError, which is no ValueError: a net's ValueError
    # for a bad input would have counted as the server's failure.
    model = TensorFlowModel(_refusing_net, TensorSpec((2,), np.float32), max_batch_size=4)
    for _ in range(2):  # traced again at the next batch, and raised again
        with pytest.raises(_BadInput, match="^a row the net refuses$"):
            model(np.ones((3, 2), np.float32))


def _branching(tf):
    def net(x):
        if tf.reduce_sum(x) > 0:  # Python control flow: AutoGraph's to convert
            return x * 2.0
        return x * 3.0
    return net


def test_a_keras_model_is_traced_without_autograph_files_and_a_function_with_them(
        tf, keras_net, tmp_path, monkeypatch):
    # AutoGraph writes each conversion to a temporary file that only a clean exit
    # deletes: a Ray server actor, killed, left them behind at every run.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    keras = TensorFlowModel(keras_net, TensorSpec((6,), np.float32), batch_sizes=(2,))
    keras(np.ones((2, 6), np.float32))
    assert not list(tmp_path.iterdir())
    spec = TensorSpec((4,), np.float32)
    branching = TensorFlowModel(_branching(tf), input_spec=spec, batch_sizes=(2,))
    np.testing.assert_array_equal(branching(-np.ones((2, 4), np.float32)), -3.0)


@pytest.mark.parametrize("keys", [(1, "value"), ("a", 2.5)])
@pytest.mark.parametrize("nested", [False, True])
def test_a_dict_output_whose_keys_do_not_sort_gets_model_output_error(tf, keys, nested):
    # TensorFlow sorts a dict's keys to flatten it: its bare TypeError ("'<' not
    # supported between instances of 'str' and 'int'") came out of its nest utilities.
    from async_search.errors import ModelOutputError

    first, second = keys

    def net(t):
        out = {first: t, second: t[:, :1]}
        return (t, out) if nested else out

    model = TensorFlowModel(net, TensorSpec((2,), np.float32), max_batch_size=4)
    with pytest.raises(ModelOutputError, match="a dict whose keys do not sort"):
        model(np.ones((3, 2), np.float32))
    ints = TensorFlowModel(lambda t: {2: t, 1: t[:, :1]}, TensorSpec((2,), np.float32),
                           max_batch_size=4)
    assert sorted(ints(np.ones((3, 2), np.float32))) == [1, 2]  # keys of one kind


def test_a_keras_model_whose_state_is_not_among_its_weights_is_refused_as_weights(tf):
    # An adapted Discretization keeps its bins outside get_weights(): with_weights of a
    # model with other bins changed nothing, without a word.
    keras = tf.keras

    def discretizing(top):
        net = keras.Sequential([keras.Input((4,)), keras.layers.Discretization(num_bins=3)])
        net.layers[0].adapt(np.linspace(0, top, 100, dtype=np.float32).reshape(25, 4))
        return net

    model = TensorFlowModel(discretizing(1.0), TensorSpec((4,), np.float32),
                            max_batch_size=4)
    x = np.array([[0.1, 0.3, 0.6, 2.5]], np.float32)
    before = model(x)
    with pytest.raises(ValueError, match=r"layers \['discretization.*'\] keep their "
                                         r"state \(bins, a vocabulary\) outside"):
        model.with_weights(discretizing(3.0))
    np.testing.assert_array_equal(model(x), before)
    # the same state (a clone of the served model, say) is no change: taken
    fixed = keras.Sequential([keras.Input((4,)), keras.layers.Discretization(
        bin_boundaries=[0.5]), keras.layers.Embedding(2, 1), keras.layers.Flatten(),
        keras.layers.Dense(1)])
    served = TensorFlowModel(fixed, TensorSpec((4,), np.float32), max_batch_size=4)
    trained = keras.models.clone_model(fixed)
    trained.set_weights([w + 1.0 for w in fixed.get_weights()])
    np.testing.assert_allclose(served.with_weights(trained)(x), trained(x).numpy(),
                               rtol=1e-6)


def test_a_net_returning_a_string_gets_model_output_error(tf):
    # A traced Python string is a 0-d string tensor, whose value is bytes, not an array.
    model = TensorFlowModel(lambda x: "not rows", TensorSpec((3,), np.float32),
                            batch_sizes=(1, 4))
    for n in (1, 3):
        with pytest.raises(ModelOutputError, match="no batch dimension"):
            model(np.ones((n, 3), np.float32))
