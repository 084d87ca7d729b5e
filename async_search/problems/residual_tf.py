"""The residual nets of ``residual_nets`` in TensorFlow (Keras), with their weights.

``keras_resnet(net)`` builds a Keras model of ``net``'s architecture holding ``net``'s
weights. It takes the same input as the other frameworks (channels first, as the
problems' ``encode`` lays planes out) and transposes to channels last inside, where
TensorFlow's CPU convolutions want them; the policy head transposes back before it
flattens, so its dense layer reads the planes in the order of the PyTorch net. Serve
the model through ``models.TensorFlowModel``.

TensorFlow is imported when a net is built, never when this module is imported.

Example:
    >>> from async_search.models import TensorFlowModel
    >>> from async_search.problems import SlidingPuzzle, CostToGoResNet
    >>> puzzle = SlidingPuzzle(4)
    >>> net = CostToGoResNet(puzzle, first_width=32, width=16, blocks=1)
    >>> model = TensorFlowModel(keras_resnet(net), net.input_spec, max_batch_size=8)
    >>> model(puzzle.encode([puzzle.goal])).shape
    (1, 1)
"""

from __future__ import annotations

from typing import Any, List

import numpy as np

from async_search.extras import import_extra
from async_search.problems.residual_nets import (BATCH_NORM_EPS, CostToGoResNet,
                                                 PolicyValueResNet, ResNetWeights)


_BATCH_NORM = ("weight", "bias", "running_mean", "running_var")


def keras_resnet(net: PolicyValueResNet | CostToGoResNet) -> Any:
    """A Keras model of ``net``'s architecture and weights.

    It takes a float32 batch ``[n, *net.input_spec.shape]`` and returns what ``net``
    returns: ``(logits, value)`` for a ``PolicyValueResNet``, the cost to go ``[n, 1]``
    for a ``CostToGoResNet``.

    Raises:
        TypeError: ``net`` is neither.
    """
    tf = import_extra("tensorflow", "keras_resnet")

    if isinstance(net, PolicyValueResNet):
        return _policy_value(tf.keras, net)
    if isinstance(net, CostToGoResNet):
        return _cost_to_go(tf.keras, net)
    raise TypeError(f"keras_resnet takes a PolicyValueResNet or CostToGoResNet, got "
                    f"{type(net).__name__}")


class _Layers:
    """Makes Keras layers and remembers, for each, the weights it takes from ``net``."""

    def __init__(self, keras: Any, weights: ResNetWeights):
        self.keras = keras
        self.weights = weights
        self.assignments: List[tuple] = []

    def conv(self, name: str, x: Any) -> Any:
        kernel = self.weights[f"{name}.weight"]  # [out, in, kh, kw] -> [kh, kw, in, out]
        layer = self.keras.layers.Conv2D(kernel.shape[0], kernel.shape[-1], padding="same",
                                         use_bias=False)
        self.assignments.append((layer, [kernel.transpose(2, 3, 1, 0)]))
        return layer(x)

    def dense(self, name: str, x: Any) -> Any:
        w = self.weights[f"{name}.weight"]  # [out, in] -> [in, out]
        layer = self.keras.layers.Dense(w.shape[0])
        self.assignments.append((layer, [w.T, self.weights[f"{name}.bias"]]))
        return layer(x)

    def batch_norm(self, name: str, x: Any) -> Any:
        layer = self.keras.layers.BatchNormalization(epsilon=BATCH_NORM_EPS)
        self.assignments.append((layer, [self.weights[f"{name}.{p}"] for p in _BATCH_NORM]))
        return layer(x, training=False)

    def relu(self, x: Any) -> Any:
        return self.keras.layers.ReLU()(x)

    def model(self, inputs: Any, outputs: Any) -> Any:
        model = self.keras.Model(inputs, outputs)
        for layer, values in self.assignments:
            layer.set_weights([np.asarray(v, np.float32) for v in values])
        return model


def _policy_value(keras: Any, net: PolicyValueResNet) -> Any:
    layers = _Layers(keras, net.weights)
    inputs = keras.Input(net.input_spec.shape, dtype="float32")
    h = keras.layers.Permute((2, 3, 1))(inputs)  # NCHW -> NHWC
    h = layers.relu(layers.batch_norm("stem.bn", layers.conv("stem.conv", h)))
    for b in range(net.blocks):
        y = layers.relu(layers.batch_norm(f"blocks.{b}.bn1", layers.conv(f"blocks.{b}.conv1", h)))
        y = layers.batch_norm(f"blocks.{b}.bn2", layers.conv(f"blocks.{b}.conv2", y))
        h = layers.relu(keras.layers.Add()([h, y]))

    def flat_planes(x):  # NHWC -> NCHW, then flatten: PyTorch's order of the features
        return keras.layers.Flatten()(keras.layers.Permute((3, 1, 2))(x))

    p = layers.relu(layers.batch_norm("policy.bn", layers.conv("policy.conv", h)))
    logits = layers.dense("policy.fc", flat_planes(p))
    v = layers.relu(layers.batch_norm("value.bn", layers.conv("value.conv", h)))
    v = layers.relu(layers.dense("value.fc1", flat_planes(v)))
    value = keras.layers.Activation("tanh")(layers.dense("value.fc2", v))
    return layers.model(inputs, (logits, value))


def _cost_to_go(keras: Any, net: CostToGoResNet) -> Any:
    layers = _Layers(keras, net.weights)
    inputs = keras.Input(net.input_spec.shape, dtype="float32")
    h = keras.layers.Flatten()(inputs)
    h = layers.relu(layers.batch_norm("bn1", layers.dense("fc1", h)))
    h = layers.relu(layers.batch_norm("bn2", layers.dense("fc2", h)))
    for b in range(net.blocks):
        y = layers.relu(layers.batch_norm(f"blocks.{b}.bn1", layers.dense(f"blocks.{b}.fc1", h)))
        y = layers.batch_norm(f"blocks.{b}.bn2", layers.dense(f"blocks.{b}.fc2", y))
        h = layers.relu(keras.layers.Add()([h, y]))
    return layers.model(inputs, layers.dense("out", h))
