"""The residual nets in PyTorch: the NumPy nets' outputs, weights both ways, searches."""

import numpy as np
import pytest

from async_search.problems import torch_resnet, torch_resnet_weights
from tests.problems.residual_cases import (GAME, assert_outputs_close, board_inputs,
                                           puzzle_inputs, searches_run_served_and_immediate,
                                           small_cost_to_go, small_policy_value)

torch = pytest.importorskip("torch")
from async_search.models import TorchModel  # noqa: E402 - after the skip


def call(module, x):
    with torch.inference_mode():
        out = module(torch.from_numpy(x))
    return tuple(t.numpy() for t in out) if isinstance(out, tuple) else out.numpy()


@pytest.mark.parametrize("n", [1, 7])
def test_policy_value_module_computes_the_numpy_net(n):
    net = small_policy_value()
    x = board_inputs(n)
    assert_outputs_close(call(torch_resnet(net), x), net(x))


@pytest.mark.parametrize("n", [1, 7])
def test_cost_to_go_module_computes_the_numpy_net(n):
    net = small_cost_to_go()
    x = puzzle_inputs(n)
    assert_outputs_close(call(torch_resnet(net), x), net(x))


def test_the_state_dict_is_the_nets_weights():
    net = small_policy_value()
    state = torch_resnet(net).state_dict()
    names = [n for n in state if not n.endswith("num_batches_tracked")]
    assert sorted(names) == sorted(net.weights)
    for name in names:
        np.testing.assert_array_equal(state[name].numpy(), net.weights[name])


def test_weights_come_back_from_a_changed_module():
    """A net trained in PyTorch goes back to NumPy (and so to TensorFlow or JAX)."""
    net = small_cost_to_go(1)
    module = torch_resnet(net)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(1.5)
        module.bn1.running_var.fill_(3.0)
    back = net.with_weights(torch_resnet_weights(module))
    x = puzzle_inputs(4)
    assert_outputs_close(call(module, x), back(x))
    assert not np.allclose(back(x), net(x))


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="PolicyValueResNet"):
        torch_resnet(object())


def test_the_adapter_serves_it_within_its_tolerance():
    net = small_policy_value()
    model = TorchModel(torch_resnet(net), input_spec=net.input_spec, device="cpu",
                       max_batch_size=16)
    x = board_inputs(21)  # padded to 16 + 8
    assert_outputs_close(model(x), net(x), max(model.batch_tolerance, 1e-4))


async def test_searches_run_through_serve_and_immediate():
    pv, h = small_policy_value(), small_cost_to_go()
    await searches_run_served_and_immediate(
        TorchModel(torch_resnet(pv), input_spec=pv.input_spec, device="cpu"),
        TorchModel(torch_resnet(h), input_spec=h.input_spec, device="cpu"))


def test_the_value_is_squashed_into_minus_one_one():
    net = small_policy_value()
    module = torch_resnet(net)
    with torch.no_grad():
        module.value.fc2.bias.fill_(50.0)
    _, value = call(module, board_inputs(3))
    assert np.all(value <= 1.0) and np.all(value > 0.99)
    assert GAME.num_actions == call(module, board_inputs(1))[0].shape[1]
