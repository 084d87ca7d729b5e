"""What a trained net is: its configuration, and the NumPy model its weights make.

A ``NetConfig`` names the problem, the kind of net and its architecture; with its
weights it makes the model that ``serve`` and the searches take (``to_model``). An MLP's
weights are a list of ``(w, b)`` layers; a convolutional net's (``architecture`` conv or
residual, ``problems.conv_nets``) a dict of named arrays. Checkpoints store exactly
these two things, so the config must round-trip through JSON.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, NamedTuple, Tuple, Union

import numpy as np

from async_search.base import TensorSpec
from async_search.checks import is_int, plain_fields
from async_search.models import MLP
from async_search.problems.connect_four import ConnectFour
from async_search.problems.connect_four_threats import (THREAT_PLANES, FeaturedNet,
                                                        threat_planes)
from async_search.problems.conv_nets import (VALUE_NETS, ConvWeights,
                                             PolicyValueConvNet, conv_weight_shapes,
                                             initial_conv_weights)
from async_search.problems.heuristics import LearnedHeuristic
from async_search.problems.policy_value import PolicyValueMLP
from async_search.problems.sliding_puzzle import SlidingPuzzle


#: An MLP's ``[(w [fan_in, fan_out], b [fan_out]), ...]``, input layer first, or a
#: convolutional net's named arrays (``conv_nets.ConvWeights``).
Weights = Union[List[Tuple[np.ndarray, np.ndarray]], ConvWeights]

KINDS = ("policy_value", "heuristic")
PROBLEMS = ("connect_four", "sliding_puzzle")
#: ``mlp``: dense layers; ``conv`` and ``residual``: ``conv_nets.PolicyValueConvNet``
#: with plain or residual blocks (policy-value nets of board games).
ARCHITECTURES = ("mlp", "conv", "residual")
#: What the net's body reads: ``planes``, the game's encoding as it is; ``threats``
#: (Connect Four), those planes and the cells where each player would make four
#: (``problems.connect_four_threats``).
FEATURES = ("planes", "threats")


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """A trainable net: what it is for and its shape.

    Attributes:
        kind: ``policy_value`` (outputs ``(logits [n, A], value [n, 1])``) or
            ``heuristic`` (outputs a cost to go ``[n, 1]``).
        problem: ``connect_four`` or ``sliding_puzzle``.
        hidden_sizes: widths of the ReLU hidden layers (``mlp``, or a convolutional
            net's ``mlp`` value).
        size: the sliding puzzle's side (4: the 15-puzzle); ignored for games.
        residual: heuristic nets: learn a correction added to the Manhattan distance.
        architecture: ``mlp``, or ``conv`` / ``residual`` (policy-value nets only): a
            3x3 convolution stem and ``blocks`` plain or residual blocks of two 3x3
            convolutions, ``channels`` wide, with AlphaZero's heads
            (``problems.conv_nets``).
        channels, blocks, value_hidden: the convolutional net's sizes.
        value_planes: the planes of the convolutional net's value head (AlphaZero: 1).
        value_net: the convolutional net's value: ``head`` (AlphaZero's head on the
            trunk) or ``mlp`` (dense layers of ``hidden_sizes`` on the body's input,
            apart from the trunk: ``conv_nets.VALUE_NETS``).
        features: what the body reads: ``planes`` (the game's encoding) or ``threats``
            (Connect Four: the planes and the threat planes of
            ``problems.connect_four_threats``, added inside the net, so the model still
            takes the game's encoding).

    Example:
        >>> config = NetConfig("policy_value", "connect_four", (64,))
        >>> NetConfig.from_json(config.to_json()) == config
        True
        >>> NetConfig("policy_value", "connect_four", architecture="residual",
        ...           channels=16, blocks=2).describe()
        'residual 16x2'
    """

    kind: str
    problem: str
    hidden_sizes: Tuple[int, ...] = (256, 256)
    size: int = 4
    residual: bool = True
    architecture: str = "mlp"
    channels: int = 16
    blocks: int = 2
    value_hidden: int = 64
    features: str = "planes"
    value_planes: int = 1
    value_net: str = "head"

    def __post_init__(self):
        plain_fields(self)
        sizes = self.hidden_sizes  # checked before int(), which would round 1.5 to 1
        if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__") or not (
                sizes := tuple(sizes)) or not all(is_int(h) and h >= 1 for h in sizes):
            raise ValueError(f"NetConfig.hidden_sizes must be integer widths >= 1, got "
                             f"{self.hidden_sizes!r}")
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in sizes))
        if not isinstance(self.residual, (bool, np.bool_)):  # "False" is truthy
            raise ValueError(f"NetConfig.residual must be True or False, got "
                             f"{self.residual!r}")
        object.__setattr__(self, "residual", bool(self.residual))
        if self.kind not in KINDS:
            raise ValueError(f"NetConfig.kind must be one of {KINDS}, got {self.kind!r}")
        if self.problem not in PROBLEMS:
            raise ValueError(f"NetConfig.problem must be one of {PROBLEMS}, got "
                             f"{self.problem!r}")
        if (self.kind == "policy_value") != (self.problem == "connect_four"):
            raise ValueError(f"a {self.kind} net does not fit {self.problem}: connect_four "
                             f"takes policy_value nets, sliding_puzzle heuristic nets")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"NetConfig.architecture must be one of {ARCHITECTURES}, got "
                             f"{self.architecture!r}")
        if self.architecture != "mlp" and self.kind != "policy_value":
            raise ValueError(f"a {self.architecture} net is a policy-value net for "
                             f"connect_four; {self.problem} takes an mlp")
        for name, minimum in (("channels", 1), ("blocks", 0), ("value_hidden", 1),
                              ("value_planes", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < minimum:
                raise ValueError(f"NetConfig.{name} must be an integer >= {minimum}, got "
                                 f"{value!r}")
            object.__setattr__(self, name, int(value))
        if self.value_net not in VALUE_NETS:
            raise ValueError(f"NetConfig.value_net must be one of {VALUE_NETS}, got "
                             f"{self.value_net!r}")
        if self.value_net != "head" and not self.convolutional:
            raise ValueError(f"NetConfig.value_net={self.value_net!r} is a convolutional "
                             f"net's; an mlp computes its value with its own layers")
        if self.features not in FEATURES:
            raise ValueError(f"NetConfig.features must be one of {FEATURES}, got "
                             f"{self.features!r}")
        if self.features != "planes" and self.problem != "connect_four":
            raise ValueError(f"features={self.features!r} are Connect Four's; "
                             f"{self.problem} takes features='planes'")

    @property
    def convolutional(self) -> bool:
        return self.architecture != "mlp"

    def describe(self) -> str:
        """A short name: ``mlp 256x256`` or ``residual 16x2`` (channels x blocks)."""
        if self.convolutional:
            name = f"{self.architecture} {self.channels}x{self.blocks}"
            if self.value_net == "mlp":
                name += " + mlp value " + "x".join(str(h) for h in self.hidden_sizes)
            elif self.value_planes != 1:
                name += f" (value {self.value_planes} planes)"
        else:
            name = "mlp " + "x".join(str(h) for h in self.hidden_sizes)
        return name if self.features == "planes" else f"{name} + {self.features}"

    def make_problem(self) -> Any:
        """The game or puzzle the net is for."""
        return ConnectFour() if self.problem == "connect_four" else SlidingPuzzle(self.size)

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return tuple(self.make_problem().input_spec.shape)

    @property
    def body_input_shape(self) -> Tuple[int, ...]:
        """What the net's body reads: ``input_shape``, or with threat planes
        ``[4, 6, 7]``."""
        if self.features == "threats":
            return (THREAT_PLANES, *self.input_shape[1:])
        return self.input_shape

    def featurize(self, x: np.ndarray) -> np.ndarray:
        """The body's input for a batch of the game's encoding ``x``."""
        return threat_planes(x) if self.features == "threats" else x

    @property
    def num_actions(self) -> int | None:
        return ConnectFour.num_actions if self.kind == "policy_value" else None

    @property
    def output_size(self) -> int:
        return self.num_actions + 1 if self.kind == "policy_value" else 1

    @property
    def layer_shapes(self) -> List[Tuple[int, int]]:
        """An MLP's ``(fan_in, fan_out)`` per layer."""
        sizes = [int(np.prod(self.body_input_shape)), *self.hidden_sizes,
                 self.output_size]
        return list(zip(sizes[:-1], sizes[1:]))

    @property
    def parameter_count(self) -> int:
        """How many numbers the net's weights and biases hold, in Python integers: exact
        for any sizes, before anything is allocated."""
        if self.convolutional:
            return sum(math.prod(shape) for shape in self.conv_shapes.values())
        return sum(fan_in * fan_out + fan_out for fan_in, fan_out in self.layer_shapes)

    @property
    def conv_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """A convolutional net's weight names and shapes (``conv_nets``)."""
        return conv_weight_shapes(*self.body_input_shape, self.num_actions,
                                  channels=self.channels, blocks=self.blocks,
                                  value_hidden=self.value_hidden,
                                  value_planes=self.value_planes,
                                  value_net=self.value_net,
                                  value_hidden_sizes=self.hidden_sizes)

    def to_json(self) -> Dict[str, Any]:
        data = {"kind": self.kind, "problem": self.problem,
                "hidden_sizes": list(self.hidden_sizes), "size": self.size,
                "residual": self.residual}
        if self.convolutional:  # an MLP's JSON stays as earlier versions wrote it
            data.update(architecture=self.architecture, channels=self.channels,
                        blocks=self.blocks, value_hidden=self.value_hidden)
            if self.value_planes != 1:  # nor does AlphaZero's one-plane value head
                data["value_planes"] = self.value_planes
            if self.value_net != "head":  # nor does AlphaZero's head
                data["value_net"] = self.value_net
        if self.features != "planes":  # nor does a net on the planes alone
            data["features"] = self.features
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "NetConfig":
        return cls(data["kind"], data["problem"], tuple(data["hidden_sizes"]),
                   int(data.get("size", 4)), bool(data.get("residual", True)),
                   str(data.get("architecture", "mlp")), data.get("channels", 16),
                   data.get("blocks", 2), data.get("value_hidden", 64),
                   str(data.get("features", "planes")), data.get("value_planes", 1),
                   str(data.get("value_net", "head")))


class _BodyInput(NamedTuple):
    """What a net's body is built for when it reads more than the game's planes."""

    input_spec: TensorSpec
    num_actions: int


def initial_weights(config: NetConfig, seed: int) -> Weights:
    """Glorot-uniform weights and zero biases, seeded (float32); a convolutional net's
    are ``conv_nets.initial_conv_weights``."""
    if config.convolutional:
        return initial_conv_weights(config.conv_shapes, seed,
                                    residual=config.architecture == "residual")
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in config.layer_shapes:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        layers.append((rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32),
                       np.zeros(fan_out, np.float32)))
    return layers


def check_weights(config: NetConfig, weights: Any) -> Weights:
    """``weights`` as float32 arrays; ValueError unless they fit ``config``'s layers."""
    if config.convolutional:
        return _check_conv_weights(config, weights)
    if isinstance(weights, Mapping):
        raise ValueError(f"weights do not fit {config}: an mlp takes a list of (w, b) "
                         f"layers, got named arrays")
    if not isinstance(weights, (list, tuple)) or not all(
            isinstance(layer, (list, tuple)) and len(layer) == 2 for layer in weights):
        raise ValueError(f"weights do not fit {config}: an mlp takes a list of (w, b) "
                         f"layers, got a {type(weights).__name__}")
    want = config.layer_shapes
    got = [(tuple(np.shape(w)), tuple(np.shape(b))) for w, b in weights]
    if got != [((i, o), (o,)) for i, o in want]:
        raise ValueError(f"weights do not fit {config}: expected layers "
                         f"{[((i, o), (o,)) for i, o in want]}, got {got}")
    out = [(_float32(w), _float32(b)) for w, b in weights]
    if not all(np.isfinite(w).all() and np.isfinite(b).all() for w, b in out):
        raise ValueError("weights must be finite (training diverged?)")
    return out


def _check_conv_weights(config: NetConfig, weights: Any) -> ConvWeights:
    want = config.conv_shapes
    if not isinstance(weights, Mapping):
        raise ValueError(f"weights do not fit {config}: a {config.architecture} net takes "
                         f"named arrays, got a {type(weights).__name__}")
    missing = [name for name in want if name not in weights]
    unexpected = sorted(str(name) for name in weights if name not in want)
    wrong = [f"{name} {tuple(np.shape(weights[name]))} (expected {shape})"
             for name, shape in want.items()
             if name in weights and tuple(np.shape(weights[name])) != shape]
    if missing or unexpected or wrong:
        raise ValueError(f"weights do not fit {config}: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}, misshapen {wrong[:4]}")
    out = {name: _float32(weights[name]) for name in want}
    if not all(np.isfinite(w).all() for w in out.values()):
        raise ValueError("weights must be finite (training diverged?)")
    return out


def _float32(array: Any) -> np.ndarray:
    """A weight array as float32; ValueError unless it holds real numbers (a cast would
    drop a complex weight's imaginary part, with only a warning)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":
        raise ValueError(f"weights must be real numbers (float or int arrays), got "
                         f"{array.dtype}")
    return array.astype(np.float32, copy=False)


def to_model(config: NetConfig, weights: Any) -> Any:
    """The NumPy model (``PolicyValueMLP``, ``LearnedHeuristic`` or
    ``PolicyValueConvNet``) with ``weights`` rounded onto ``models.MLP``'s exact grid,
    so its rows are batch-independent."""
    weights = check_weights(config, weights)
    problem = config.make_problem()
    if config.kind == "policy_value":
        body_game = problem if config.features == "planes" else _BodyInput(
            TensorSpec(config.body_input_shape, np.float32), problem.num_actions)
        if config.convolutional:
            net = PolicyValueConvNet(body_game, channels=config.channels,
                                     blocks=config.blocks, value_hidden=config.value_hidden,
                                     value_planes=config.value_planes,
                                     value_net=config.value_net,
                                     value_hidden_sizes=config.hidden_sizes,
                                     residual=config.architecture == "residual")
        else:
            net = PolicyValueMLP(body_game, hidden_sizes=config.hidden_sizes, seed=0)
        net = net.with_weights(weights)
        if config.features == "planes":
            return net
        return FeaturedNet(net, problem.input_spec, config)
    mlp = MLP(problem.input_spec.shape, config.hidden_sizes, 1, seed=0).with_weights(weights)
    return LearnedHeuristic(problem, mlp, residual=config.residual)


def weights_of(model: Any) -> Weights:
    """The ``(w, b)`` layers of a model that ``to_model`` made."""
    if isinstance(model, FeaturedNet):
        return weights_of(model.body)
    if isinstance(model, PolicyValueMLP):
        return [(w, b) for w, b in model.body.weights]
    if isinstance(model, LearnedHeuristic):
        return [(w, b) for w, b in model.mlp.weights]
    if isinstance(model, MLP):
        return [(w, b) for w, b in model.weights]
    if isinstance(model, PolicyValueConvNet):
        return dict(model.weights)
    raise TypeError(f"cannot read weights from a {type(model).__name__}; expected a "
                    f"PolicyValueMLP, LearnedHeuristic, PolicyValueConvNet or models.MLP")


def config_of(model: Any, config: Any = None) -> NetConfig:
    """The ``NetConfig`` of ``model``: ``config`` itself, or its JSON dict, or (None)
    read from the model (a ``PolicyValueMLP`` for Connect Four, a ``LearnedHeuristic``,
    or a model ``load_checkpoint`` returned).

    Raises:
        ValueError: when no config is given and the model does not say what it is for.
    """
    if isinstance(config, NetConfig):
        return config
    if isinstance(config, dict):
        try:
            return NetConfig.from_json(config)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"config must be a NetConfig or its JSON (kind, problem, "
                             f"hidden_sizes, ...), got {config!r}: {e}") from e
    if config is not None:
        raise ValueError(f"config must be a NetConfig, its JSON dict, or None (read "
                         f"from the model), got {type(config).__name__}")
    known = getattr(model, "net_config", None)
    if isinstance(known, NetConfig):
        return known
    if isinstance(model, PolicyValueMLP) and tuple(
            model.input_spec.shape) == tuple(ConnectFour().input_spec.shape):
        return NetConfig("policy_value", "connect_four", model.hidden_sizes)
    if isinstance(model, PolicyValueConvNet) and tuple(
            model.input_spec.shape) == tuple(ConnectFour().input_spec.shape):
        return NetConfig("policy_value", "connect_four",
                         model.value_hidden_sizes if model.value_net == "mlp"
                         else (256, 256),
                         architecture="residual" if model.residual else "conv",
                         channels=model.channels, blocks=model.blocks,
                         value_hidden=model.value_hidden,
                         value_planes=model.value_planes, value_net=model.value_net)
    if isinstance(model, LearnedHeuristic) and isinstance(model.puzzle, SlidingPuzzle):
        hidden = tuple(w.shape[1] for w, _ in model.mlp.weights[:-1])
        return NetConfig("heuristic", "sliding_puzzle", hidden, model.puzzle.size,
                         model.residual)
    raise ValueError(f"cannot tell what a {type(model).__name__} is for: pass its "
                     f"NetConfig (kind, problem, hidden_sizes)")
