"""The residual nets of ``residual_nets`` in PyTorch, with their weights.

``torch_resnet(net)`` builds a ``torch.nn.Module`` of ``net``'s architecture holding
``net``'s weights (its ``state_dict`` has the names and layouts of ``net.weights``);
``torch_resnet_weights(module)`` reads them back as NumPy, for the NumPy reference or
another framework. Serve the module through ``models.TorchModel``.

PyTorch is imported when a net is built, never when this module is imported.

Example:
    >>> from async_search.models import TorchModel
    >>> from async_search.problems import ConnectFour, PolicyValueResNet
    >>> game = ConnectFour()
    >>> net = PolicyValueResNet(game, channels=8, blocks=1)
    >>> model = TorchModel(torch_resnet(net), input_spec=net.input_spec, device="cpu")
    >>> logits, value = model(game.encode([game.initial_state()]))
    >>> logits.shape, value.shape
    ((1, 7), (1, 1))
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from async_search.extras import import_extra
from async_search.problems.residual_nets import (BATCH_NORM_EPS, CostToGoResNet,
                                                 PolicyValueResNet, ResNetWeights)


def torch_resnet(net: PolicyValueResNet | CostToGoResNet) -> Any:
    """A ``torch.nn.Module`` of ``net``'s architecture and weights, in eval mode, on the
    CPU (``TorchModel`` moves it to its device).

    Its forward pass takes a float32 tensor ``[n, *net.input_spec.shape]`` and returns
    what ``net`` returns: ``(logits, value)`` for a ``PolicyValueResNet``, the cost to
    go ``[n, 1]`` for a ``CostToGoResNet``.

    Raises:
        TypeError: ``net`` is neither.
    """
    torch = import_extra("torch", "torch_resnet")

    classes = _classes()
    if isinstance(net, PolicyValueResNet):
        module = classes.PolicyValue(net.planes, net.rows * net.columns, net.num_actions,
                                     **net.sizes)
    elif isinstance(net, CostToGoResNet):
        module = classes.CostToGo(net.input_size, **net.sizes)
    else:
        raise TypeError(f"torch_resnet takes a PolicyValueResNet or CostToGoResNet, got "
                        f"{type(net).__name__}")
    state = {name: torch.from_numpy(np.array(value, np.float32))
             for name, value in net.weights.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.endswith("num_batches_tracked")]
    if missing or unexpected:  # the two layouts were written apart: say where
        raise RuntimeError(f"torch_resnet: the module and the weights disagree: missing "
                           f"{missing[:5]}, unexpected {unexpected[:5]}")
    return module.eval()


def torch_resnet_weights(module: Any) -> ResNetWeights:
    """A module's weights (from ``torch_resnet``, maybe trained since) as NumPy, in
    the layout of ``residual_nets``: ``net.with_weights(torch_resnet_weights(module))``."""
    return {name: value.detach().float().cpu().numpy().copy()
            for name, value in module.state_dict().items()
            if not name.endswith("num_batches_tracked")}


@functools.lru_cache(maxsize=None)
def _classes() -> Any:
    """The module classes, defined once PyTorch is imported (not at import time)."""
    import torch
    from torch import nn

    def batch_norm(kind, size):
        return kind(size, eps=BATCH_NORM_EPS)

    class ConvBatchNorm(nn.Module):
        def __init__(self, inp: int, out: int, kernel: int):
            super().__init__()
            self.conv = nn.Conv2d(inp, out, kernel, padding=kernel // 2, bias=False)
            self.bn = batch_norm(nn.BatchNorm2d, out)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class ConvBlock(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn1 = batch_norm(nn.BatchNorm2d, channels)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn2 = batch_norm(nn.BatchNorm2d, channels)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(x + self.bn2(self.conv2(y)))

    class PolicyHead(nn.Module):
        def __init__(self, channels: int, cells: int, num_actions: int):
            super().__init__()
            self.conv = nn.Conv2d(channels, 2, 1, bias=False)
            self.bn = batch_norm(nn.BatchNorm2d, 2)
            self.fc = nn.Linear(2 * cells, num_actions)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))

    class ValueHead(nn.Module):
        def __init__(self, channels: int, cells: int, hidden: int):
            super().__init__()
            self.conv = nn.Conv2d(channels, 1, 1, bias=False)
            self.bn = batch_norm(nn.BatchNorm2d, 1)
            self.fc1 = nn.Linear(cells, hidden)
            self.fc2 = nn.Linear(hidden, 1)

        def forward(self, x):
            v = torch.relu(self.bn(self.conv(x))).flatten(1)
            return torch.tanh(self.fc2(torch.relu(self.fc1(v))))

    class PolicyValue(nn.Module):
        """AlphaZero's policy-value net: see ``residual_nets.PolicyValueResNet``."""

        def __init__(self, planes: int, cells: int, num_actions: int, *, channels: int,
                     blocks: int, value_hidden: int):
            super().__init__()
            self.stem = ConvBatchNorm(planes, channels, 3)
            self.blocks = nn.Sequential(*(ConvBlock(channels) for _ in range(blocks)))
            self.policy = PolicyHead(channels, cells, num_actions)
            self.value = ValueHead(channels, cells, value_hidden)

        def forward(self, x):
            h = self.blocks(self.stem(x))
            return self.policy(h), self.value(h)

    class DenseBlock(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.fc1 = nn.Linear(width, width)
            self.bn1 = batch_norm(nn.BatchNorm1d, width)
            self.fc2 = nn.Linear(width, width)
            self.bn2 = batch_norm(nn.BatchNorm1d, width)

        def forward(self, x):
            y = torch.relu(self.bn1(self.fc1(x)))
            return torch.relu(x + self.bn2(self.fc2(y)))

    class CostToGo(nn.Module):
        """DeepCubeA's cost-to-go net: see ``residual_nets.CostToGoResNet``."""

        def __init__(self, input_size: int, *, first_width: int, width: int, blocks: int):
            super().__init__()
            self.fc1 = nn.Linear(input_size, first_width)
            self.bn1 = batch_norm(nn.BatchNorm1d, first_width)
            self.fc2 = nn.Linear(first_width, width)
            self.bn2 = batch_norm(nn.BatchNorm1d, width)
            self.blocks = nn.Sequential(*(DenseBlock(width) for _ in range(blocks)))
            self.out = nn.Linear(width, 1)

        def forward(self, x):
            h = torch.relu(self.bn1(self.fc1(x.flatten(1))))
            h = torch.relu(self.bn2(self.fc2(h)))
            return self.out(self.blocks(h))

    return types.SimpleNamespace(PolicyValue=PolicyValue, CostToGo=CostToGo)
