"""TensorFlow versions of the problems' networks, bitwise equal to the NumPy ones.

BLAS and TensorFlow kernels sum in an order that depends on the batch size, so a plain
float32 network gives a row slightly different answers in different batches. These nets
use the dyadic-grid arithmetic of ``models.MLP`` instead: weights on multiples of 2**-10,
activations rounded to multiples of 2**-8 and clipped to [-256, 256] after every layer,
matrix products in float64. Every product and partial sum is then exactly representable,
so any summation order gives the same bits: outputs are row-independent, and equal to the
NumPy reference built from the same seed.

TensorFlow is imported when a net is built, never when this module is imported.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from async_search.extras import import_extra
from async_search.models import TensorFlowModel
from async_search.models import GRID_BOUND, GRID_SCALE
from async_search.problems.base import Game, SearchProblem
from async_search.problems.connect_four_threats import (COLUMNS, LINE_CELLS, ROWS,
                                                        FeaturedNet)
from async_search.problems.conv_nets import PolicyValueConvNet
from async_search.problems.heuristics import heuristic_mlp
from async_search.problems.policy_value import PolicyValueMLP


# The grid of models.MLP: activations are multiples of 1/_SCALE within [-_BOUND, _BOUND].
# tests/problems/test_tf_nets.py checks bitwise equality with the NumPy MLP.
_SCALE = GRID_SCALE
_BOUND = GRID_BOUND


def _on_grid(tf: Any, h: Any) -> Any:
    # tf.round, like np.round, rounds half to even.
    return tf.clip_by_value(tf.round(h * _SCALE), -_BOUND * _SCALE,
                            _BOUND * _SCALE) / _SCALE


def _grid_forward(tf: Any, weights: Sequence[tuple]) -> Callable[[Any], Any]:
    """A TensorFlow function computing ``models.MLP``'s forward pass for ``weights``."""
    layers = [(tf.constant(w, tf.float64), tf.constant(b, tf.float64)) for w, b in weights]
    last = len(layers) - 1

    def forward(x):
        h = tf.reshape(tf.cast(x, tf.float64), [tf.shape(x)[0], -1])
        h = _on_grid(tf, h)
        for i, (w, b) in enumerate(layers):
            h = tf.matmul(h, w) + b
            if i < last:
                h = _on_grid(tf, tf.nn.relu(h))
        return tf.cast(h, tf.float32)

    return forward


def _conv_grid_forward(tf: Any, net: PolicyValueConvNet) -> Callable[[Any], Any]:
    """A TensorFlow function computing ``PolicyValueConvNet``'s forward pass, step for
    step (the nine shifted windows times the taps, as one matrix product per 3x3
    convolution), so that every intermediate is the NumPy net's, bit for bit."""
    taps, mats, bias = ({name: tf.constant(w, tf.float64) for name, w in layers.items()}
                        for layers in net.grid_layers())
    rows, columns = net.rows, net.columns
    # The MLP's weights on its grid, as models.MLP holds them.
    value_mlp = (None if net.value_mlp is None
                 else _grid_forward(tf, net.value_mlp.weights))

    def conv3(h, layer):
        n, channels = tf.shape(h)[0], h.shape[-1]
        padded = tf.pad(h, [[0, 0], [1, 1], [1, 1], [0, 0]])
        windows = tf.stack([padded[:, i:i + rows, j:j + columns]
                            for i in range(3) for j in range(3)], axis=3)
        out = tf.matmul(tf.reshape(windows, [-1, 9 * channels]), taps[layer]) + bias[layer]
        return _on_grid(tf, tf.reshape(out, [n, rows, columns, taps[layer].shape[1]]))

    def head_planes(h, layer):  # a 1x1 convolution and ReLU, flattened channels first
        n, channels = tf.shape(h)[0], h.shape[-1]
        planes = tf.matmul(tf.reshape(h, [-1, channels]), mats[layer]) + bias[layer]
        planes = tf.reshape(_on_grid(tf, tf.nn.relu(planes)),
                            [n, rows, columns, mats[layer].shape[1]])
        return tf.reshape(tf.transpose(planes, [0, 3, 1, 2]), [n, -1])

    def forward(x):
        x = tf.reshape(tf.cast(x, tf.float64), [tf.shape(x)[0], *net.input_spec.shape])
        h = tf.nn.relu(conv3(_on_grid(tf, tf.transpose(x, [0, 2, 3, 1])), "stem"))
        for b in range(net.blocks):
            y = conv3(tf.nn.relu(conv3(h, f"blocks.{b}.conv1")), f"blocks.{b}.conv2")
            h = _on_grid(tf, tf.nn.relu(h + y if net.residual else y))
        logits = tf.matmul(head_planes(h, "policy.conv"), mats["policy.fc"]) + bias[
            "policy.fc"]
        if value_mlp is not None:  # models.MLP's pass on the flattened input
            value = value_mlp(x)
        else:
            v = head_planes(h, "value.conv")
            v = _on_grid(tf, tf.nn.relu(tf.matmul(v, mats["value.fc1"])
                                        + bias["value.fc1"]))
            value = tf.matmul(v, mats["value.fc2"]) + bias["value.fc2"]
        return (tf.cast(logits, tf.float32),
                tf.cast(tf.clip_by_value(value, -1.0, 1.0), tf.float32))

    return forward


def _threat_planes(tf: Any, x: Any) -> Any:
    """``connect_four_threats.threat_planes`` in TensorFlow: the same cells, the same
    bits (counts of stones are exact in any arithmetic)."""
    stones = tf.cast(x > 0, tf.int32)                    # [n, 2, rows, columns]
    near = tf.zeros_like(stones)
    for cells in LINE_CELLS:
        count = tf.add_n([stones[:, :, r, c] for r, c in cells])
        three = tf.cast((count == 3) & (tf.reverse(count, [1]) == 0), tf.int32)
        for r, c in cells:  # back onto the board, at the k-th cell of each line
            near += tf.pad(three, [[0, 0], [0, 0], [r.start, ROWS - r.stop],
                                   [c.start, COLUMNS - c.stop]])
    empty = tf.expand_dims(stones[:, 0] + stones[:, 1] == 0, 1)
    threats = tf.cast((near > 0) & empty, tf.float32)
    return tf.concat([tf.cast(x, tf.float32), threats], axis=1)


def heuristic_tf_net(problem: SearchProblem, *, hidden_sizes: Sequence[int] = (64,),
                     seed: int = 0, max_batch_size: int | None = None,
                     batch_sizes: Sequence[int] | None = None,
                     jit_compile: bool = False) -> TensorFlowModel:
    """A TensorFlow heuristic net: ``heuristic_mlp(problem, ...)`` on TensorFlow.

    Output: float32 ``[n, 1]``, bitwise equal to the NumPy MLP with the same
    ``hidden_sizes`` and ``seed``, whatever the batch.

    Args:
        problem: gives the input spec (``problem.input_spec``).
        hidden_sizes: widths of the ReLU hidden layers.
        seed: seeds the weights (those of the NumPy MLP).
        max_batch_size, batch_sizes, jit_compile: passed to ``models.TensorFlowModel``,
            which pads each batch to an allowed size.

    Example:
        >>> from async_search.problems import SlidingPuzzle
        >>> puzzle = SlidingPuzzle(4)
        >>> net = heuristic_tf_net(puzzle, hidden_sizes=(64,), seed=0)
        >>> net(puzzle.encode([puzzle.goal])).shape
        (1, 1)
    """
    tf = import_extra("tensorflow", "heuristic_tf_net")

    reference = heuristic_mlp(problem, hidden_sizes=hidden_sizes, seed=seed)
    forward = _grid_forward(tf, reference.weights)
    return TensorFlowModel(forward, problem.input_spec, max_batch_size=max_batch_size,
                           batch_sizes=batch_sizes, jit_compile=jit_compile)


def policy_value_tf_net(game: Game, *, hidden_sizes: Sequence[int] = (64,), seed: int = 0,
                        max_batch_size: int | None = None,
                        batch_sizes: Sequence[int] | None = None,
                        jit_compile: bool = False) -> TensorFlowModel:
    """A TensorFlow policy-value net: ``PolicyValueMLP(game, ...)`` on TensorFlow.

    Output: the tuple ``(policy_logits [n, num_actions], value [n, 1])``, float32,
    bitwise equal to the NumPy net with the same ``hidden_sizes`` and ``seed``.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> logits, value = policy_value_tf_net(game)(game.encode([game.initial_state()]))
        >>> logits.shape, value.shape
        ((1, 7), (1, 1))
    """
    tf = import_extra("tensorflow", "policy_value_tf_net")

    reference = PolicyValueMLP(game, hidden_sizes=hidden_sizes, seed=seed)
    body = _grid_forward(tf, reference.body.weights)
    num_actions = reference.num_actions

    def forward(x):
        out = body(x)
        return out[:, :num_actions], tf.clip_by_value(out[:, num_actions:], -1.0, 1.0)

    return TensorFlowModel(forward, game.input_spec, max_batch_size=max_batch_size,
                           batch_sizes=batch_sizes, jit_compile=jit_compile)


def tf_twin(model: Any, *, max_batch_size: int | None = None,
            batch_sizes: Sequence[int] | None = None,
            jit_compile: bool = False) -> TensorFlowModel:
    """The TensorFlow twin of a NumPy net (seeded or trained): bitwise the same outputs.

    Takes a ``models.MLP``, a ``PolicyValueMLP`` or ``PolicyValueConvNet`` (also one
    that reads Connect Four's threat planes, a ``FeaturedNet``) or a
    ``LearnedHeuristic`` (what
    ``training.Trainer.model()`` and ``problems.pretrained`` return) and returns a
    ``TensorFlowModel`` that computes the same forward pass on the same exact grid, so
    serving the twin on an accelerator gives the searches the same results.

    Example:
        >>> from async_search.problems import ConnectFour
        >>> game = ConnectFour()
        >>> net = PolicyValueMLP(game, seed=1)
        >>> x = game.encode([game.initial_state()])
        >>> bool((tf_twin(net)(x)[0] == net(x)[0]).all())
        True
    """
    tf = import_extra("tensorflow", "tf_twin")

    from async_search.models import MLP
    from async_search.problems.heuristics import LearnedHeuristic

    options = dict(max_batch_size=max_batch_size, batch_sizes=batch_sizes,
                   jit_compile=jit_compile)
    if isinstance(model, FeaturedNet) and isinstance(model.body, PolicyValueConvNet):
        body = _conv_grid_forward(tf, model.body)
        return TensorFlowModel(lambda x: body(_threat_planes(tf, x)), model.input_spec,
                               **options)
    if isinstance(model, PolicyValueConvNet):
        return TensorFlowModel(_conv_grid_forward(tf, model), model.input_spec, **options)
    if isinstance(model, FeaturedNet) and isinstance(model.body, PolicyValueMLP):
        body = _grid_forward(tf, model.body.body.weights)
        num_actions = model.body.num_actions

        def forward(x):
            out = body(_threat_planes(tf, x))
            return out[:, :num_actions], tf.clip_by_value(out[:, num_actions:], -1.0, 1.0)

        return TensorFlowModel(forward, model.input_spec, **options)
    if isinstance(model, PolicyValueMLP):
        body = _grid_forward(tf, model.body.weights)
        num_actions = model.num_actions

        def forward(x):
            out = body(x)
            return out[:, :num_actions], tf.clip_by_value(out[:, num_actions:], -1.0, 1.0)

        return TensorFlowModel(forward, model.input_spec, **options)
    if isinstance(model, LearnedHeuristic):
        body = _grid_forward(tf, model.mlp.weights)
        table = (tf.constant(model.base.table, tf.float64) if model.residual else None)

        def forward(x):
            h = tf.cast(body(x), tf.float64)
            if table is not None:
                flat = tf.reshape(tf.cast(x, tf.float64), [tf.shape(x)[0], -1])
                h = h + tf.cast(tf.cast(tf.matmul(flat, table), tf.float32), tf.float64)
            return tf.cast(tf.maximum(h, 0.0), tf.float32)

        return TensorFlowModel(forward, model.input_spec, **options)
    if isinstance(model, MLP):
        return TensorFlowModel(_grid_forward(tf, model.weights), model.input_spec, **options)
    what = type(model).__name__
    if isinstance(model, FeaturedNet):
        what += f" of a {type(model.body).__name__}"
    raise TypeError(f"tf_twin takes a models.MLP, PolicyValueMLP or PolicyValueConvNet "
                    f"(threat planes or not) or LearnedHeuristic, got {what}")
