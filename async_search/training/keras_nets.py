"""The trainer's Keras nets: for each ``NetConfig`` architecture, the Keras model that
computes what ``problems.nets.to_model`` serves (without its exact grid), and the
moves of weights between the two layouts.

- ``mlp``: dense layers, the last linear; weights ``[(w [in, out], b [out]), ...]``.
- ``conv`` / ``residual``: ``problems.conv_nets.PolicyValueConvNet``'s architecture;
  the input arrives channels first (``[n, planes, rows, columns]``) and is transposed to
  channels last, where TensorFlow's CPU convolutions want it; the heads transpose back
  before they flatten, so the dense layers read the planes in the NumPy net's order.
  The output is ``[n, num_actions + 1]``: the logits, then the raw value, as the MLP's.
  An ``mlp`` value (``NetConfig.value_net``) reads the input, flattened channels first.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from async_search.problems.nets import NetConfig, Weights


class KerasNet:
    """A Keras model of ``config`` and the layers its named weights live in.

    Args:
        tf: the TensorFlow module.
        config: the net.

    Attributes:
        model: the Keras model (a float32 batch ``[n, *config.body_input_shape]`` in, one
            float32 ``[n, config.output_size]`` array out).
        kernels: the weight matrices and convolution kernels the L2 penalty covers.
    """

    def __init__(self, tf: Any, config: NetConfig):
        self.config = config
        self._dense: Dict[str, Any] = {}  # name -> Dense layer (conv nets)
        self._conv: Dict[str, Any] = {}   # name -> Conv2D layer
        keras = tf.keras
        if config.convolutional:
            self.model = self._conv_net(keras, config)
            self._layers: List[Any] = []
        else:
            widths = [width for _, width in config.layer_shapes]
            self._layers = [keras.layers.Dense(width, activation="relu")
                            for width in widths[:-1]] + [keras.layers.Dense(widths[-1])]
            self.model = keras.Sequential(
                [keras.Input((int(np.prod(config.body_input_shape)),)), *self._layers])
        self.kernels = [layer.kernel for layer in
                        (*self._layers, *self._conv.values(), *self._dense.values())]

    def _conv_net(self, keras: Any, config: NetConfig) -> Any:
        layers = keras.layers

        def conv(name: str, h: Any, channels: int, size: int, relu: bool) -> Any:
            self._conv[name] = layers.Conv2D(channels, size, padding="same",
                                             activation="relu" if relu else None)
            return self._conv[name](h)

        def dense(name: str, h: Any, width: int, relu: bool) -> Any:
            self._dense[name] = layers.Dense(width, activation="relu" if relu else None)
            return self._dense[name](h)

        def flat_planes(h: Any) -> Any:  # NHWC -> NCHW, flattened: the NumPy net's order
            return layers.Flatten()(layers.Permute((3, 1, 2))(h))

        inputs = keras.Input(config.body_input_shape, dtype="float32")
        h = conv("stem", layers.Permute((2, 3, 1))(inputs), config.channels, 3, True)
        for b in range(config.blocks):
            y = conv(f"blocks.{b}.conv1", h, config.channels, 3, True)
            y = conv(f"blocks.{b}.conv2", y, config.channels, 3, False)
            h = layers.ReLU()(layers.Add()([h, y]) if config.architecture == "residual"
                              else y)
        p = flat_planes(conv("policy.conv", h, 2, 1, True))
        logits = dense("policy.fc", p, config.num_actions, False)
        if config.value_net == "mlp":  # the input itself, channels first, as the MLP's
            v = layers.Flatten()(inputs)
            for i, width in enumerate(config.hidden_sizes):
                v = dense(f"value.mlp.{i}", v, width, True)
            value = dense(f"value.mlp.{len(config.hidden_sizes)}", v, 1, False)
        else:
            v = flat_planes(conv("value.conv", h, config.value_planes, 1, True))
            v = dense("value.fc1", v, config.value_hidden, True)
            value = dense("value.fc2", v, 1, False)
        return keras.Model(inputs, layers.Concatenate()([logits, value]))

    @property
    def weights(self) -> Weights:
        """The weights in ``config``'s layout (float32 copies)."""
        if not self.config.convolutional:
            return [(layer.kernel.numpy().copy(), layer.bias.numpy().copy())
                    for layer in self._layers]
        out: Dict[str, np.ndarray] = {}
        for name, layer in self._conv.items():  # [kh, kw, in, out] -> [out, in, kh, kw]
            out[f"{name}.weight"] = layer.kernel.numpy().transpose(3, 2, 0, 1).copy()
            out[f"{name}.bias"] = layer.bias.numpy().copy()
        for name, layer in self._dense.items():  # [in, out] -> [out, in]
            out[f"{name}.weight"] = layer.kernel.numpy().T.copy()
            out[f"{name}.bias"] = layer.bias.numpy().copy()
        return {name: out[name] for name in self.config.conv_shapes}

    def set_weights(self, weights: Weights) -> None:
        """Assigns checked weights (``problems.nets.check_weights``) to the layers."""
        if not self.config.convolutional:
            for layer, (w, b) in zip(self._layers, weights):
                layer.kernel.assign(w)
                layer.bias.assign(b)
            return
        for name, layer in self._conv.items():
            layer.kernel.assign(weights[f"{name}.weight"].transpose(2, 3, 1, 0))
            layer.bias.assign(weights[f"{name}.bias"])
        for name, layer in self._dense.items():
            layer.kernel.assign(weights[f"{name}.weight"].T)
            layer.bias.assign(weights[f"{name}.bias"])
