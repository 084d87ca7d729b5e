import subprocess
import sys

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.models import MLP, TensorFlowModel, power_of_two_sizes, with_spec

pytestmark = pytest.mark.timeout(120)


def test_mlp_rows_do_not_depend_on_batch_mates():
    model = MLP((4, 4), hidden_sizes=(32, 32), output_size=3, seed=5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((257, 4, 4)).astype(np.float32) * 3
    full = model(x)
    for size in (1, 2, 7, 64):
        parts = np.concatenate([model(x[i:i + size]) for i in range(0, len(x), size)])
        np.testing.assert_array_equal(parts, full)
    np.testing.assert_array_equal(model(x[::-1]), full[::-1])


def test_mlp_is_seeded():
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(MLP((3,), seed=2)(x), MLP((3,), seed=2)(x))
    assert not np.array_equal(MLP((3,), seed=2)(x), MLP((3,), seed=3)(x))


def test_mlp_declares_specs_and_handles_empty_batches():
    model = MLP((2, 3), output_size=5)
    assert model.input_spec == TensorSpec((2, 3), np.float32)
    assert model(np.zeros((0, 2, 3), np.float32)).shape == (0, 5)


def test_with_spec_describes_the_input():
    model = with_spec(np.negative, (3,), np.int32)
    assert model.input_spec.describe() == "[n, 3] int32"
    assert model(np.ones((1, 3), np.int32)).tolist() == [[-1, -1, -1]]


def test_power_of_two_sizes_end_at_the_maximum():
    assert power_of_two_sizes(1) == (1,)
    assert power_of_two_sizes(8) == (1, 2, 4, 8)
    assert power_of_two_sizes(12) == (1, 2, 4, 8, 12)
    with pytest.raises(ValueError, match="got 0"):
        power_of_two_sizes(0)
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, got True"):
        power_of_two_sizes(True)


def test_core_imports_with_numpy_alone():
    code = ("import sys, async_search, async_search.models, async_search.connections; "
            "bad = [m for m in ('tensorflow', 'ray', 'aiohttp', 'matplotlib') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


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
