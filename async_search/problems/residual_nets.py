"""Residual nets of the published shapes, framework-neutral: AlphaZero's policy-value
net for board games and DeepCubeA's cost-to-go net for puzzles.

A net here is its architecture and its weights in NumPy, with a NumPy forward pass (the
reference: float64, slow). ``residual_torch``, ``residual_tf`` and ``residual_jax``
build the same net in PyTorch, TensorFlow and JAX from these weights, so the same net
gives the same outputs (within float32 rounding) in every framework, and weights move
between frameworks as this dict. The weights are named and laid out as PyTorch's
``state_dict`` (convolutions ``[out, in, kh, kw]``, dense layers ``[out, in]``, batch
norm as ``weight``, ``bias``, ``running_mean``, ``running_var``).

- ``PolicyValueResNet`` (AlphaZero): a 3x3 convolution stem, ``blocks`` residual blocks
  of two 3x3 convolutions, a policy head (1x1 convolution to 2 planes, dense to the
  logits) and a value head (1x1 convolution to 1 plane, dense ``value_hidden``, dense
  to one value, tanh); batch norm after every convolution, ReLU. Input: a game's
  planes ``[n, planes, rows, columns]`` (``ConnectFour.encode``). Output: the tuple
  ``(policy_logits [n, num_actions], value [n, 1])``, float32, as ``search.mcts``
  expects.
- ``CostToGoResNet`` (DeepCubeA): the one-hot state flattened, two dense layers
  (``first_width``, ``width``), ``blocks`` residual blocks of two dense layers, a dense
  layer to one value; batch norm after every hidden dense layer, ReLU. Input: a
  problem's encoding (``SlidingPuzzle.encode``: one-hot ``[n, cells, cells]``). Output:
  float32 ``[n, 1]``, the estimated cost to go, as the A* searches expect.

The published sizes are 256 channels and 19 or 39 blocks (AlphaZero) and 5000, 1000
and 4 blocks (DeepCubeA); the defaults here are small enough for a CPU. Batch norm
runs in inference form (running statistics), so a row's output does not depend on its
batch-mates beyond float rounding. The weights are seeded, untrained.

Example:
    >>> from async_search.problems import ConnectFour, SlidingPuzzle
    >>> game = ConnectFour()
    >>> net = PolicyValueResNet(game, channels=8, blocks=1, seed=0)
    >>> logits, value = net(game.encode([game.initial_state()]))
    >>> logits.shape, value.shape
    ((1, 7), (1, 1))
    >>> puzzle = SlidingPuzzle(4)
    >>> CostToGoResNet(puzzle, first_width=32, width=16)(puzzle.encode([puzzle.goal])).shape
    (1, 1)
"""

from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import check_int
from async_search.models.numpy_models import float64_rows
from async_search.models.weight_casts import host_copy
from async_search.problems.base import Game, SearchProblem, board_planes


#: name -> float32 array, laid out as a PyTorch ``state_dict``.
ResNetWeights = Dict[str, np.ndarray]

#: Batch norm's epsilon in every framework (PyTorch's default; Keras is told).
BATCH_NORM_EPS = 1e-5

_BATCH_NORM = ("weight", "bias", "running_mean", "running_var")


class PolicyValueResNet:
    """AlphaZero's residual policy-value net for a board game, in NumPy (the reference).

    Args:
        game: gives the input planes (``game.input_spec.shape`` is ``(planes, rows,
            columns)``) and ``game.num_actions``.
        channels: the width of the stem and of every residual block.
        blocks: residual blocks (two 3x3 convolutions each).
        value_hidden: the hidden width of the value head.
        seed: seeds the weights (He-normal convolutions and hidden layers; batch norm
            starts as the identity).

    Raises:
        ValueError: a size below 1 (blocks below 0), or a game whose input is not
            planes.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> net = PolicyValueResNet(ConnectFour(), channels=8, blocks=1)
        >>> net.weights["stem.conv.weight"].shape
        (8, 2, 3, 3)
    """

    def __init__(self, game: Game, *, channels: int = 32, blocks: int = 2,
                 value_hidden: int = 64, seed: int = 0):
        shape = board_planes(game, "PolicyValueResNet")
        self.channels = check_int("channels", channels, minimum=1)
        self.blocks = check_int("blocks", blocks, minimum=0)
        self.value_hidden = check_int("value_hidden", value_hidden, minimum=1)
        self.num_actions = check_int("num_actions", game.num_actions, minimum=1)
        self.input_spec = TensorSpec(shape, np.float32)
        self.planes, self.rows, self.columns = shape
        self.weights: ResNetWeights = self._init(np.random.default_rng(
            check_int("seed", seed, minimum=0)))

    def _init(self, rng: np.random.Generator) -> ResNetWeights:
        c, cells = self.channels, self.rows * self.columns
        weights: ResNetWeights = {}
        _conv(weights, rng, "stem", c, self.planes, 3)
        for b in range(self.blocks):
            _conv(weights, rng, f"blocks.{b}.conv1", c, c, 3, batch_norm=f"blocks.{b}.bn1")
            _conv(weights, rng, f"blocks.{b}.conv2", c, c, 3, batch_norm=f"blocks.{b}.bn2")
        _conv(weights, rng, "policy", 2, c, 1)
        _dense(weights, rng, "policy.fc", self.num_actions, 2 * cells, gain=1.0)
        _conv(weights, rng, "value", 1, c, 1)
        _dense(weights, rng, "value.fc1", self.value_hidden, cells)
        _dense(weights, rng, "value.fc2", 1, self.value_hidden, gain=1.0)
        return weights

    @property
    def sizes(self) -> Dict[str, int]:
        """The size arguments: ``channels``, ``blocks``, ``value_hidden``."""
        return {"channels": self.channels, "blocks": self.blocks,
                "value_hidden": self.value_hidden}

    def with_weights(self, weights: ResNetWeights) -> "PolicyValueResNet":
        """A copy with other weights of the same names and shapes (trained ones, or
        another framework's, as a ``state_dict`` of arrays)."""
        return with_named_weights(self, weights)

    def __call__(self, batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        w = self.weights
        x = float64_rows(batch, self.input_spec.shape)
        h = _relu(_batch_norm(w, "stem.bn", _conv2d(x, w["stem.conv.weight"])))
        for b in range(self.blocks):
            y = _relu(_batch_norm(w, f"blocks.{b}.bn1",
                                  _conv2d(h, w[f"blocks.{b}.conv1.weight"])))
            y = _batch_norm(w, f"blocks.{b}.bn2", _conv2d(y, w[f"blocks.{b}.conv2.weight"]))
            h = _relu(h + y)
        p = _relu(_batch_norm(w, "policy.bn", _conv2d(h, w["policy.conv.weight"])))
        logits = _linear(w, "policy.fc", _flat(p))
        v = _relu(_batch_norm(w, "value.bn", _conv2d(h, w["value.conv.weight"])))
        v = _relu(_linear(w, "value.fc1", _flat(v)))
        value = np.tanh(_linear(w, "value.fc2", v))
        return logits.astype(np.float32), value.astype(np.float32)


class CostToGoResNet:
    """DeepCubeA's residual cost-to-go net for a search problem, in NumPy (the
    reference).

    Args:
        problem: gives the input (``problem.input_spec``, flattened).
        first_width: the width of the first dense layer (DeepCubeA: 5000).
        width: the width of the second layer and of the residual blocks (1000).
        blocks: residual blocks of two dense layers each (4).
        seed: seeds the weights (He-normal hidden layers; batch norm starts as the
            identity).

    Raises:
        ValueError: a size below 1 (blocks below 0).

    Example:
        >>> from async_search.problems import SlidingPuzzle
        >>> net = CostToGoResNet(SlidingPuzzle(4), first_width=32, width=16, blocks=1)
        >>> net.weights["fc1.weight"].shape
        (32, 256)
    """

    def __init__(self, problem: SearchProblem, *, first_width: int = 256, width: int = 128,
                 blocks: int = 2, seed: int = 0):
        self.first_width = check_int("first_width", first_width, minimum=1)
        self.width = check_int("width", width, minimum=1)
        self.blocks = check_int("blocks", blocks, minimum=0)
        self.input_spec = TensorSpec(tuple(problem.input_spec.shape), np.float32)
        self.output_spec = TensorSpec((1,), np.float32)
        self.input_size = int(np.prod(self.input_spec.shape))
        self.weights: ResNetWeights = self._init(np.random.default_rng(
            check_int("seed", seed, minimum=0)))

    def _init(self, rng: np.random.Generator) -> ResNetWeights:
        weights: ResNetWeights = {}
        _dense(weights, rng, "fc1", self.first_width, self.input_size, batch_norm="bn1")
        _dense(weights, rng, "fc2", self.width, self.first_width, batch_norm="bn2")
        for b in range(self.blocks):
            for i in (1, 2):
                _dense(weights, rng, f"blocks.{b}.fc{i}", self.width, self.width,
                       batch_norm=f"blocks.{b}.bn{i}")
        _dense(weights, rng, "out", 1, self.width, gain=1.0)
        return weights

    @property
    def sizes(self) -> Dict[str, int]:
        """The size arguments: ``first_width``, ``width``, ``blocks``."""
        return {"first_width": self.first_width, "width": self.width, "blocks": self.blocks}

    def with_weights(self, weights: ResNetWeights) -> "CostToGoResNet":
        """A copy with other weights of the same names and shapes."""
        return with_named_weights(self, weights)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        w = self.weights
        h = float64_rows(batch, self.input_spec.shape, flat=True)
        h = _relu(_batch_norm(w, "bn1", _linear(w, "fc1", h)))
        h = _relu(_batch_norm(w, "bn2", _linear(w, "fc2", h)))
        for b in range(self.blocks):
            y = _relu(_batch_norm(w, f"blocks.{b}.bn1", _linear(w, f"blocks.{b}.fc1", h)))
            y = _batch_norm(w, f"blocks.{b}.bn2", _linear(w, f"blocks.{b}.fc2", y))
            h = _relu(h + y)
        return _linear(w, "out", h).astype(np.float32)


# -- weights ---------------------------------------------------------------------------
def _conv(weights: ResNetWeights, rng: np.random.Generator, name: str, out: int, inp: int,
          kernel: int, batch_norm: str | None = None) -> None:
    """A convolution without bias (batch norm follows) and its batch norm: ``name.conv``
    and ``name.bn``, or ``name`` and ``batch_norm`` when the latter is given."""
    conv = name if batch_norm is not None else f"{name}.conv"
    std = np.sqrt(2.0 / (inp * kernel * kernel))
    weights[f"{conv}.weight"] = (rng.standard_normal((out, inp, kernel, kernel)) * std
                                 ).astype(np.float32)
    _identity_batch_norm(weights, batch_norm if batch_norm is not None else f"{name}.bn", out)


def _dense(weights: ResNetWeights, rng: np.random.Generator, name: str, out: int, inp: int,
           gain: float = 2.0, batch_norm: str | None = None) -> None:
    std = np.sqrt(gain / inp)
    weights[f"{name}.weight"] = (rng.standard_normal((out, inp)) * std).astype(np.float32)
    weights[f"{name}.bias"] = np.zeros(out, np.float32)
    if batch_norm is not None:
        _identity_batch_norm(weights, batch_norm, out)


def _identity_batch_norm(weights: ResNetWeights, name: str, size: int) -> None:
    for part, value in zip(_BATCH_NORM, (1.0, 0.0, 0.0, 1.0)):
        weights[f"{name}.{part}"] = np.full(size, value, np.float32)


def with_named_weights(net, weights: ResNetWeights):
    """A copy of ``net`` (a net whose ``weights`` are a dict of named arrays) with other
    arrays of the same names and shapes, as float32; ValueError naming the first
    missing, unexpected or misshapen one, or one the cast to float32 would change (of
    another kind, a complex; a finite float past float32's range), as the adapters
    refuse them."""
    if not isinstance(weights, Mapping):
        raise ValueError(f"{type(net).__name__}.with_weights takes named arrays (a dict "
                         f"of the names and shapes of the net's weights), got "
                         f"{type(weights).__name__}")
    given = {name: np.asarray(value) for name, value in weights.items()}
    missing = sorted(set(net.weights) - set(given))
    unexpected = sorted((str(name) for name in set(given) - set(net.weights)))
    if missing or unexpected:
        raise ValueError(f"{type(net).__name__}.with_weights: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, value in given.items():
        if value.shape != net.weights[name].shape:
            raise ValueError(f"{type(net).__name__}.with_weights: {name!r} has shape "
                             f"{value.shape}, the net's has {net.weights[name].shape}")
    float32 = np.dtype(np.float32)
    cast = {name: host_copy(given[name], float32, lambda kind, name=name: (
        f"{type(net).__name__}.with_weights: {name!r} is {kind}, the net's is float32"))
        for name in net.weights}
    copy = object.__new__(type(net))
    copy.__dict__.update(net.__dict__)
    copy.weights = cast
    return copy


# -- the NumPy forward pass --------------------------------------------------------------
def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def _linear(weights: ResNetWeights, name: str, x: np.ndarray) -> np.ndarray:
    return x @ weights[f"{name}.weight"].T.astype(np.float64) + weights[f"{name}.bias"]


def _batch_norm(weights: ResNetWeights, name: str, x: np.ndarray) -> np.ndarray:
    """Inference batch norm over axis 1 (channels or features)."""
    gamma, beta, mean, var = (weights[f"{name}.{part}"].astype(np.float64)
                              for part in _BATCH_NORM)
    scale = gamma / np.sqrt(var + BATCH_NORM_EPS)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) * scale.reshape(shape) + beta.reshape(shape)


def _conv2d(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """A 'same' convolution, stride 1: ``x [n, c, h, w]``, ``kernel [o, c, k, k]``."""
    k = kernel.shape[-1]
    pad = k // 2
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, kernel.astype(np.float64), optimize=True)


def _flat(x: np.ndarray) -> np.ndarray:
    """``x`` as rows ``[n, features]`` (zero rows too, which ``reshape(n, -1)`` refuses)."""
    return x.reshape(len(x), int(np.prod(x.shape[1:])))
