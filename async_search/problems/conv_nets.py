"""A small convolutional policy-value net for board games, trainable by the project's
trainer and served in NumPy with rows exact whatever the batch.

The net (``PolicyValueConvNet``): a 3x3 convolution stem, ``blocks`` blocks of two 3x3
convolutions (residual blocks, ``h = relu(h + conv(relu(conv(h))))``, or plain ones,
``h = relu(conv(relu(conv(h))))``), a policy head (1x1 convolution to 2 planes, dense to
the logits) and a value head (1x1 convolution to ``value_planes`` planes, dense
``value_hidden``, dense to one value), ReLU, biases and no batch norm. AlphaZero's shape
(whose value head reads 1 plane), small enough to train on two cores in half an hour.
With ``value_net="mlp"`` the value is instead a tower of dense layers on the input
itself (``models.MLP``'s value), and the trunk serves the policy alone.

Its rows are exact as ``models.MLP``'s are: weights on multiples of ``WEIGHT_QUANTUM``
and activations on the grid of ``GRID_SCALE`` within ``GRID_BOUND`` (constants of
``models.numpy_models``), in float64, where
every product and partial sum is exact. So a row's outputs are bitwise the same whatever
its batch-mates, and self-play is a deterministic function of the seed, as with the MLP.
The value is the last output clipped to [-1, 1], as ``PolicyValueMLP``'s (a piecewise-
linear squashing keeps rows exact; the trainer fits the raw output).

Weights are a dict of float32 arrays named and laid out as a PyTorch ``state_dict``
(convolutions ``[out, in, kh, kw]``, dense layers ``[out, in]``).

Example:
    >>> from async_search.problems import ConnectFour
    >>> game = ConnectFour()
    >>> net = PolicyValueConvNet(game, channels=8, blocks=1, seed=0)
    >>> logits, value = net(game.encode([game.initial_state()]))
    >>> logits.shape, value.shape
    ((1, 7), (1, 1))
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import check_int
from async_search.models.numpy_models import MLP, float64_rows, on_grid, on_weight_grid
from async_search.problems.base import Game, board_planes
from async_search.problems.residual_nets import with_named_weights


#: name -> float32 array, laid out as a PyTorch ``state_dict``.
ConvWeights = Dict[str, np.ndarray]


#: How the value is computed: ``head``, AlphaZero's head on the shared trunk; ``mlp``,
#: a tower of dense layers that reads the input itself and shares nothing with the
#: trunk (issue 22: the MLP's value judged UCT's positions better than any conv head).
VALUE_NETS = ("head", "mlp")


def conv_weight_shapes(planes: int, rows: int, columns: int, num_actions: int, *,
                       channels: int, blocks: int, value_hidden: int,
                       value_planes: int = 1, value_net: str = "head",
                       value_hidden_sizes: Tuple[int, ...] = (256, 256)
                       ) -> Dict[str, Tuple[int, ...]]:
    """The name and shape of every weight of a ``PolicyValueConvNet``, in order."""
    if value_net not in VALUE_NETS:
        raise ValueError(f"value_net must be one of {VALUE_NETS}, got {value_net!r}")
    cells = rows * columns
    shapes: Dict[str, Tuple[int, ...]] = {
        "stem.weight": (channels, planes, 3, 3), "stem.bias": (channels,)}
    for b in range(blocks):
        for i in (1, 2):
            shapes[f"blocks.{b}.conv{i}.weight"] = (channels, channels, 3, 3)
            shapes[f"blocks.{b}.conv{i}.bias"] = (channels,)
    shapes.update({
        "policy.conv.weight": (2, channels, 1, 1), "policy.conv.bias": (2,),
        "policy.fc.weight": (num_actions, 2 * cells), "policy.fc.bias": (num_actions,)})
    if value_net == "mlp":
        widths = [planes * cells, *value_hidden_sizes, 1]
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            shapes[f"value.mlp.{i}.weight"] = (fan_out, fan_in)
            shapes[f"value.mlp.{i}.bias"] = (fan_out,)
        return shapes
    shapes.update({
        "value.conv.weight": (value_planes, channels, 1, 1),
        "value.conv.bias": (value_planes,),
        "value.fc1.weight": (value_hidden, value_planes * cells),
        "value.fc1.bias": (value_hidden,),
        "value.fc2.weight": (1, value_hidden), "value.fc2.bias": (1,)})
    return shapes


def initial_conv_weights(shapes: Dict[str, Tuple[int, ...]], seed: int, *,
                         residual: bool = True) -> ConvWeights:
    """He-normal kernels and zero biases, seeded (float32). In a residual net the second
    convolution of each block starts at a tenth of its scale, so that the sum of the
    blocks does not grow with their number; a plain net keeps the full scale, so that
    its signal does not shrink block by block."""
    rng = np.random.default_rng(seed)
    weights: ConvWeights = {}
    # The value tower's output layer is linear, as the heads' last layers are.
    last_value = max((name for name in shapes if name.startswith("value.mlp.")
                      and name.endswith(".weight")), default=None,
                     key=lambda name: int(name.split(".")[2]))
    for name, shape in shapes.items():
        if name.endswith(".bias"):
            weights[name] = np.zeros(shape, np.float32)
            continue
        fan_in = int(np.prod(shape[1:]))
        gain = 1.0 if name in ("policy.fc.weight", "value.fc2.weight", last_value) else 2.0
        scale = 0.1 if residual and name.endswith("conv2.weight") else 1.0
        weights[name] = (rng.standard_normal(shape) * scale * np.sqrt(gain / fan_in)
                         ).astype(np.float32)
    return weights


class PolicyValueConvNet:
    """A convolutional (residual or plain) policy-value net for a board game, in NumPy,
    with rows exact whatever the batch.

    Args:
        game: gives the input planes (``game.input_spec.shape`` is ``(planes, rows,
            columns)``) and ``game.num_actions``.
        channels: the width of the stem and of every block.
        blocks: blocks of two 3x3 convolutions (0: the stem and the heads only).
        value_hidden: the hidden width of the value head.
        value_planes: the planes the value head's 1x1 convolution makes (AlphaZero: 1;
            a narrow trunk loses what the value needs in one plane).
        residual: residual blocks (True) or plain ones.
        value_net: ``head`` (AlphaZero's value head on the trunk) or ``mlp`` (dense
            layers of ``value_hidden_sizes`` on the input itself, ReLU between, the last
            linear: ``models.MLP``'s value, beside the convolutional policy).
        value_hidden_sizes: the widths of the ``mlp`` value's hidden layers.
        seed: seeds the weights (``initial_conv_weights``).

    Raises:
        ValueError: a size below 1 (blocks below 0), or a game whose input is not planes.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> net = PolicyValueConvNet(ConnectFour(), channels=8, blocks=1)
        >>> net.weights["stem.weight"].shape
        (8, 2, 3, 3)
    """

    def __init__(self, game: Game, *, channels: int = 16, blocks: int = 2,
                 value_hidden: int = 64, value_planes: int = 1, residual: bool = True,
                 value_net: str = "head",
                 value_hidden_sizes: Tuple[int, ...] = (256, 256), seed: int = 0):
        shape = board_planes(game, "PolicyValueConvNet")
        self.channels = check_int("channels", channels, minimum=1)
        self.blocks = check_int("blocks", blocks, minimum=0)
        self.value_hidden = check_int("value_hidden", value_hidden, minimum=1)
        self.value_planes = check_int("value_planes", value_planes, minimum=1)
        self.residual = bool(residual)
        if value_net not in VALUE_NETS:
            raise ValueError(f"value_net must be one of {VALUE_NETS}, got {value_net!r}")
        self.value_net = value_net
        if isinstance(value_hidden_sizes, (str, bytes)) or not hasattr(
                value_hidden_sizes, "__iter__"):
            raise ValueError(f"value_hidden_sizes must be a sequence of widths, got "
                             f"{value_hidden_sizes!r}")
        self.value_hidden_sizes = tuple(check_int("value_hidden_sizes", w, minimum=1)
                                        for w in value_hidden_sizes)
        if not self.value_hidden_sizes:
            raise ValueError("value_hidden_sizes must hold at least one width")
        self.num_actions = check_int("num_actions", game.num_actions, minimum=1)
        self.input_spec = TensorSpec(shape, np.float32)
        self.planes, self.rows, self.columns = shape
        self.shapes = conv_weight_shapes(*shape, self.num_actions, channels=channels,
                                         blocks=blocks, value_hidden=value_hidden,
                                         value_planes=self.value_planes,
                                         value_net=value_net,
                                         value_hidden_sizes=self.value_hidden_sizes)
        self._set(initial_conv_weights(self.shapes, check_int("seed", seed, minimum=0),
                                       residual=self.residual))

    def _set(self, weights: ConvWeights) -> None:
        self.weights = {name: np.asarray(weights[name], np.float32) for name in self.shapes}
        # The trunk and heads on the grid; an MLP value is models.MLP's (below).
        q = {name: on_weight_grid(w) for name, w in self.weights.items()
             if not name.startswith("value.mlp.")}
        # 3x3 kernels as [9 * in, out] (the taps stacked); 1x1 and dense ones as [in, out].
        self._taps: Dict[str, np.ndarray] = {}
        self._mats: Dict[str, np.ndarray] = {}
        for name, w in q.items():
            if not name.endswith(".weight"):
                continue
            layer = name[:-len(".weight")]
            if w.ndim == 4 and w.shape[-1] == 3:
                self._taps[layer] = np.ascontiguousarray(  # [9 * in, out], tap-major
                    w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0]))
            else:
                self._mats[layer] = np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
        self._bias = {name[:-len(".bias")]: w for name, w in q.items()
                      if name.endswith(".bias")}
        self.value_mlp = (MLP(self.input_spec.shape, self.value_hidden_sizes, 1)
                          .with_weights(self.value_mlp_layers())
                          if self.value_net == "mlp" else None)

    def value_mlp_layers(self) -> list:
        """The ``mlp`` value's weights as ``models.MLP`` takes them: ``[(w [in, out], b),
        ...]``."""
        return [(self.weights[f"value.mlp.{i}.weight"].T,
                 self.weights[f"value.mlp.{i}.bias"])
                for i in range(len(self.value_hidden_sizes) + 1)]

    def with_weights(self, weights: ConvWeights) -> "PolicyValueConvNet":
        """A copy with other weights of the same names and shapes (trained ones); they
        are rounded onto the exact grid when used, and kept as float32 in ``weights``.

        Raises:
            ValueError: a missing or unexpected name, or a shape that does not fit.
        """
        copy = with_named_weights(self, weights)
        copy._set(copy.weights)
        return copy

    def grid_layers(self) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray],
                                   Dict[str, np.ndarray]]:
        """The weights on the grid as the forward pass uses them (float64): ``(taps,
        matrices, biases)`` by layer name; 3x3 kernels as ``[9 * in, out]`` (tap-major),
        1x1 and dense ones as ``[in, out]``. What a twin in another framework computes
        with (``problems.tf_twin``)."""
        return dict(self._taps), dict(self._mats), dict(self._bias)

    # -- the forward pass: every intermediate on the grid ---------------------------------

    def _conv3(self, h: np.ndarray, layer: str) -> np.ndarray:
        """A 'same' 3x3 convolution of ``h [n, rows, columns, in]`` plus bias, on the
        grid: the nine shifted windows side by side, times the taps, in one matrix
        product (every product and partial sum exact)."""
        n, rows, columns, channels = h.shape
        padded = np.zeros((n, rows + 2, columns + 2, channels))
        padded[:, 1:-1, 1:-1] = h
        windows = np.empty((n, rows, columns, 9, channels))
        for k in range(9):
            i, j = divmod(k, 3)
            windows[:, :, :, k] = padded[:, i:i + rows, j:j + columns]
        taps = self._taps[layer]
        out = windows.reshape(n * rows * columns, 9 * channels) @ taps
        out += self._bias[layer]
        return on_grid(out.reshape(n, rows, columns, taps.shape[1]))

    def _head_planes(self, h: np.ndarray, layer: str) -> np.ndarray:
        """A 1x1 convolution and ReLU, flattened channels first (PyTorch's order)."""
        n, rows, columns, channels = h.shape
        mat = self._mats[layer]
        planes = h.reshape(n * rows * columns, channels) @ mat + self._bias[layer]
        planes = on_grid(np.maximum(planes, 0.0)).reshape(n, rows, columns, mat.shape[1])
        return planes.transpose(0, 3, 1, 2).reshape(n, mat.shape[1] * rows * columns)

    def __call__(self, batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        x = float64_rows(batch, self.input_spec.shape)
        h = np.maximum(self._conv3(on_grid(x.transpose(0, 2, 3, 1)), "stem"), 0.0)
        for b in range(self.blocks):
            y = np.maximum(self._conv3(h, f"blocks.{b}.conv1"), 0.0)
            y = self._conv3(y, f"blocks.{b}.conv2")
            h = on_grid(np.maximum(h + y if self.residual else y, 0.0))
        p = self._head_planes(h, "policy.conv")
        logits = p @ self._mats["policy.fc"] + self._bias["policy.fc"]
        if self.value_mlp is not None:  # models.MLP on the flattened input, same grid
            value = self.value_mlp(x)
        else:
            v = self._head_planes(h, "value.conv")
            v = on_grid(np.maximum(v @ self._mats["value.fc1"] + self._bias["value.fc1"],
                                   0.0))
            value = v @ self._mats["value.fc2"] + self._bias["value.fc2"]
        return logits.astype(np.float32), np.clip(value, -1.0, 1.0).astype(np.float32)

