import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.models import MLP, with_spec

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
