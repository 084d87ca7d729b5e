"""The residual nets in TensorFlow (Keras): the NumPy nets' outputs, and searches."""

import pytest

from async_search.problems import keras_resnet
from tests.problems.residual_cases import (assert_outputs_close, board_inputs, puzzle_inputs,
                                           searches_run_served_and_immediate,
                                           small_cost_to_go, small_policy_value)

pytest.importorskip("tensorflow")
from async_search.models import TensorFlowModel  # noqa: E402 - after the skip


def call(model, x):
    out = model(x, training=False)
    return tuple(t.numpy() for t in out) if isinstance(out, (tuple, list)) else out.numpy()


@pytest.mark.parametrize("n", [1, 7])
def test_policy_value_model_computes_the_numpy_net(n):
    """Also checks the layout moves: kernels to HWIO, channels last inside, the policy
    head's planes flattened in PyTorch's order."""
    net = small_policy_value()
    x = board_inputs(n)
    assert_outputs_close(call(keras_resnet(net), x), net(x))


@pytest.mark.parametrize("n", [1, 7])
def test_cost_to_go_model_computes_the_numpy_net(n):
    net = small_cost_to_go()
    x = puzzle_inputs(n)
    assert_outputs_close(call(keras_resnet(net), x), net(x))


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="CostToGoResNet"):
        keras_resnet("a net")


def test_the_adapter_serves_it_within_its_tolerance():
    net = small_cost_to_go()
    model = TensorFlowModel(keras_resnet(net), net.input_spec, max_batch_size=16)
    x = puzzle_inputs(21)
    assert_outputs_close(model(x), net(x), max(model.batch_tolerance, 1e-4))


async def test_searches_run_through_serve_and_immediate():
    pv, h = small_policy_value(), small_cost_to_go()
    await searches_run_served_and_immediate(
        TensorFlowModel(keras_resnet(pv), pv.input_spec, max_batch_size=64),
        TensorFlowModel(keras_resnet(h), h.input_spec, max_batch_size=64))
