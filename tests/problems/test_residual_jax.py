"""The residual nets in JAX: the NumPy nets' outputs, jitted, and searches."""

import numpy as np
import pytest

from async_search.problems import jax_resnet
from tests.problems.residual_cases import (assert_outputs_close, board_inputs, puzzle_inputs,
                                           searches_run_served_and_immediate,
                                           small_cost_to_go, small_policy_value)

jax = pytest.importorskip("jax")
from async_search.models import JaxModel  # noqa: E402 - after the skip


def call(apply_fn, params, x):
    out = jax.jit(apply_fn)(params, x)
    return tuple(np.asarray(t) for t in out) if isinstance(out, tuple) else np.asarray(out)


@pytest.mark.parametrize("n", [1, 7])
def test_policy_value_fn_computes_the_numpy_net(n):
    net = small_policy_value()
    x = board_inputs(n)
    assert_outputs_close(call(*jax_resnet(net), x), net(x))


@pytest.mark.parametrize("n", [1, 7])
def test_cost_to_go_fn_computes_the_numpy_net(n):
    net = small_cost_to_go()
    x = puzzle_inputs(n)
    assert_outputs_close(call(*jax_resnet(net), x), net(x))


def test_params_are_a_copy_of_the_weights():
    net = small_cost_to_go()
    _, params = jax_resnet(net)
    assert sorted(params) == sorted(net.weights)
    params["out.bias"][:] = 7.0
    assert net.weights["out.bias"][0] != 7.0


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="PolicyValueResNet"):
        jax_resnet(None)


def test_the_adapter_serves_it_and_takes_new_weights():
    net, other = small_policy_value(1), small_policy_value(2)
    model = JaxModel(*jax_resnet(net), input_spec=net.input_spec, device="cpu",
                     max_batch_size=16)
    x = board_inputs(21)
    tolerance = max(model.batch_tolerance, 1e-4)
    assert_outputs_close(model(x), net(x), tolerance)
    assert_outputs_close(model.with_weights(jax_resnet(other)[1])(x), other(x), tolerance)


async def test_searches_run_through_serve_and_immediate():
    pv, h = small_policy_value(), small_cost_to_go()
    await searches_run_served_and_immediate(
        JaxModel(*jax_resnet(pv), input_spec=pv.input_spec, device="cpu"),
        JaxModel(*jax_resnet(h), input_spec=h.input_spec, device="cpu"))
