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


@pytest.mark.parametrize("make, message", [
    (lambda: with_spec(lambda x: x, (4,), np.float32, output_spec=(3,)),
     "output_spec must be a TensorSpec or None"),
    (lambda: with_spec(None, (4,), np.float32), "SpecModel wraps a function"),
    (lambda: with_spec(lambda x: x, 4, np.float32), "shape is a sequence of integers"),
])
def test_with_spec_refuses_what_is_not_a_spec_when_made(make, message):
    # Accepted, then serve failed with "'tuple' object has no attribute 'empty'".
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_spec_model_refuses_a_shape_for_its_input_spec():
    from async_search.models.numpy_models import SpecModel
    with pytest.raises(TypeError, match="input_spec must be a TensorSpec"):
        SpecModel(lambda x: x, (4,))


@pytest.mark.parametrize("kwargs, message", [
    (dict(input_shape=4), "input_shape is a sequence"),
    (dict(input_shape=(4,), hidden_sizes=8), "hidden_sizes is a sequence"),
    (dict(input_shape=(4,), hidden_sizes=(-3,)), "hidden size must be an integer >= 1"),
    (dict(input_shape=(4,), output_size=0), "output_size must be an integer >= 1"),
    (dict(input_shape=(4,), dtype=np.int32), "must be a float dtype"),
])
def test_mlp_refuses_nonsense_arguments_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MLP(**kwargs)


@pytest.mark.parametrize("spoil", [lambda w: w.astype(complex) * 1j,
                                   lambda w: np.full(w.shape, np.inf),
                                   lambda w: w.astype(str)])
def test_mlp_with_weights_refuses_values_that_are_not_finite_real_numbers(spoil):
    model = MLP((4,), hidden_sizes=(8,), output_size=2)
    with pytest.raises(ValueError, match="layer 0's w must be finite real numbers"):
        model.with_weights([(spoil(w), b) for w, b in model.weights])
