"""The residual nets of ``residual_nets`` in JAX: a pure ``apply_fn(params, x)`` and params.

``jax_resnet(net)`` returns ``(apply_fn, params)``: ``params`` is ``net.weights`` (a
dict of arrays, the layout of ``residual_nets``), and ``apply_fn`` computes ``net``'s forward
pass with ``jax.lax`` convolutions (channels first, as the problems' ``encode`` lays
planes out). It can be jitted, vmapped or called inside another jitted function (mctx's
search does). Serve it through ``models.JaxModel``.

JAX is imported when a net is built, never when this module is imported.

Example:
    >>> from async_search.models import JaxModel
    >>> from async_search.problems import ConnectFour, PolicyValueResNet
    >>> game = ConnectFour()
    >>> net = PolicyValueResNet(game, channels=8, blocks=1)
    >>> model = JaxModel(*jax_resnet(net), input_spec=net.input_spec, device="cpu")
    >>> logits, value = model(game.encode([game.initial_state()]))
    >>> logits.shape, value.shape
    ((1, 7), (1, 1))
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import numpy as np

from async_search.extras import import_extra
from async_search.problems.residual_nets import (BATCH_NORM_EPS, CostToGoResNet,
                                                 PolicyValueResNet, ResNetWeights)


def jax_resnet(net: PolicyValueResNet | CostToGoResNet
               ) -> Tuple[Callable[[Any, Any], Any], ResNetWeights]:
    """``(apply_fn, params)`` computing ``net``'s forward pass in JAX.

    ``apply_fn(params, x)`` takes float32 ``x [n, *net.input_spec.shape]`` and returns
    what ``net`` returns: ``(logits, value)`` for a ``PolicyValueResNet``, the cost to
    go ``[n, 1]`` for a ``CostToGoResNet``. ``params`` is a copy of ``net.weights``.

    Raises:
        TypeError: ``net`` is neither.
    """
    jax = import_extra("jax", "jax_resnet")
    import jax.numpy as jnp

    if isinstance(net, PolicyValueResNet):
        apply_fn = _policy_value(jax, jnp, net.blocks)
    elif isinstance(net, CostToGoResNet):
        apply_fn = _cost_to_go(jnp, net.blocks)
    else:
        raise TypeError(f"jax_resnet takes a PolicyValueResNet or CostToGoResNet, got "
                        f"{type(net).__name__}")
    return apply_fn, {name: np.array(value, np.float32) for name, value in net.weights.items()}


def _batch_norm(jnp: Any, p: Any, name: str, x: Any) -> Any:
    scale = p[f"{name}.weight"] * jnp.reciprocal(jnp.sqrt(p[f"{name}.running_var"]
                                                          + BATCH_NORM_EPS))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x - p[f"{name}.running_mean"].reshape(shape)) * scale.reshape(shape)
            + p[f"{name}.bias"].reshape(shape))


def _linear(p: Any, name: str, x: Any) -> Any:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _policy_value(jax: Any, jnp: Any, blocks: int) -> Callable[[Any, Any], Any]:
    relu = jax.nn.relu

    def conv(p, name, x):
        kernel = p[f"{name}.weight"]
        pad = kernel.shape[-1] // 2
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), [(pad, pad), (pad, pad)],
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def apply_fn(p, x):
        h = relu(_batch_norm(jnp, p, "stem.bn", conv(p, "stem.conv", x)))
        for b in range(blocks):
            y = relu(_batch_norm(jnp, p, f"blocks.{b}.bn1", conv(p, f"blocks.{b}.conv1", h)))
            y = _batch_norm(jnp, p, f"blocks.{b}.bn2", conv(p, f"blocks.{b}.conv2", y))
            h = relu(h + y)
        n = h.shape[0]
        planes = relu(_batch_norm(jnp, p, "policy.bn", conv(p, "policy.conv", h)))
        logits = _linear(p, "policy.fc", planes.reshape(n, -1))
        v = relu(_batch_norm(jnp, p, "value.bn", conv(p, "value.conv", h)))
        v = relu(_linear(p, "value.fc1", v.reshape(n, -1)))
        return logits, jnp.tanh(_linear(p, "value.fc2", v))

    return apply_fn


def _cost_to_go(jnp: Any, blocks: int) -> Callable[[Any, Any], Any]:
    def relu(x):
        return jnp.maximum(x, 0.0)

    def apply_fn(p, x):
        h = x.reshape(x.shape[0], -1)
        h = relu(_batch_norm(jnp, p, "bn1", _linear(p, "fc1", h)))
        h = relu(_batch_norm(jnp, p, "bn2", _linear(p, "fc2", h)))
        for b in range(blocks):
            y = relu(_batch_norm(jnp, p, f"blocks.{b}.bn1", _linear(p, f"blocks.{b}.fc1", h)))
            y = _batch_norm(jnp, p, f"blocks.{b}.bn2", _linear(p, f"blocks.{b}.fc2", y))
            h = relu(h + y)
        return _linear(p, "out", h)

    return apply_fn
