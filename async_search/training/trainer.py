"""The trainer: a Keras net (an MLP, or a convolutional net for Connect Four) fitted to
replay-buffer minibatches with one loss.

Loss = cross-entropy of the policy logits against the visit distribution (policy-value
nets) + squared error of the value + ``l2`` times the sum of squared kernel weights.
Heuristic nets with ``residual=True`` fit ``target - manhattan``: the NumPy model adds
the Manhattan distance back. After training, ``model()`` is the NumPy net on the exact
grid (``problems.nets.to_model``), which ``serve`` and the searches take, and
``problems.tf_twin`` its TensorFlow twin.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import numpy as np

from async_search.checks import check_float, check_int
from async_search.extras import import_extra
from async_search.problems.heuristics import ManhattanHeuristic
from async_search.problems.nets import (NetConfig, Weights, check_weights, initial_weights,
                                        to_model)
from async_search.training.keras_nets import KerasNet
from async_search.training.replay import Minibatch, ReplayBuffer


@dataclasses.dataclass(frozen=True)
class LossTerms:
    """Mean loss terms over the steps of one ``train_steps`` call."""

    policy: float
    """Cross-entropy of the policy against the targets (nats); 0 for heuristic nets."""
    value: float
    """Mean squared error of the value (heuristics: in moves squared)."""
    l2: float
    """``l2`` times the sum of squared kernel weights."""
    total: float
    """policy + value + l2: what the optimizer minimises."""
    steps: int
    """Optimizer steps taken."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Trainer:
    """Trains a policy-value or heuristic net in TensorFlow (Adam on minibatches).

    Args:
        config: the net (``NetConfig``).
        weights: initial weights (``(w, b)`` layers, or a convolutional net's named
            arrays); default ``problems.nets.initial_weights`` from ``seed``.
        learning_rate: Adam's step size (> 0).
        l2: weight of the L2 penalty on kernels (>= 0).
        batch_size: minibatch size (>= 1).
        value_weight: weight of the value term (> 0).
        seed: seeds the initial weights.

    Example:
        >>> from async_search.training import ReplayBuffer, NetConfig
        >>> config = NetConfig("policy_value", "connect_four", (32,))
        >>> trainer = Trainer(config, batch_size=8)
        >>> game = config.make_problem()
        >>> buf = ReplayBuffer(64)
        >>> buf.add(game.encode([game.initial_state()] * 4), np.ones((4, 7)), np.zeros(4))
        >>> trainer.train_steps(buf, 2).steps
        2
    """

    def __init__(self, config: NetConfig, *, weights: Weights | None = None,
                 learning_rate: float = 1e-3, l2: float = 1e-4, batch_size: int = 256,
                 value_weight: float = 1.0, seed: int = 0):
        tf = import_extra("tensorflow", "training a net")  # the training package's extra

        self._tf = tf
        self.config = config
        self.learning_rate = check_float("learning_rate", learning_rate, minimum=0.0,
                                         strict=True)
        self.l2 = check_float("l2", l2, minimum=0.0)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.value_weight = check_float("value_weight", value_weight, minimum=0.0,
                                        strict=True)
        weights = check_weights(config, weights if weights is not None else
                                initial_weights(config, check_int("seed", seed, minimum=0)))
        self._base = (ManhattanHeuristic(config.make_problem())
                      if config.kind == "heuristic" and config.residual else None)
        self._net = KerasNet(tf, config)
        self.keras_model = self._net.model
        self.set_weights(weights)
        self.optimizer = tf.keras.optimizers.Adam(self.learning_rate)
        self.optimizer.build(self.keras_model.trainable_variables)
        self.steps_taken = 0
        # No autograph: the step has no tensor-dependent Python control flow, and
        # converting its source costs about a second in every new process (a resumed run).
        self._step = tf.function(self._train_step, reduce_retracing=True, autograph=False)

    # -- weights --------------------------------------------------------------------------

    @property
    def weights(self) -> Weights:
        """The current weights (``(w, b)`` layers or named arrays), float32 copies."""
        return self._net.weights

    def set_weights(self, weights: Weights) -> None:
        """Replaces the weights (shapes must fit the config)."""
        self._net.set_weights(check_weights(self.config, weights))

    def reset_optimizer(self) -> None:
        """Zeroes Adam's moments and step count: as if the optimizer were new (the
        commander does this each iteration, so a resumed run continues the same way)."""
        keep = self.optimizer.learning_rate  # a variable too: zeroing it stops training
        for variable in self.optimizer.variables:
            if variable is not keep and variable.path != keep.path:
                variable.assign(self._tf.zeros_like(variable))

    def model(self) -> Any:
        """The NumPy model with the current weights on the exact grid."""
        return to_model(self.config, self.weights)

    # -- training -------------------------------------------------------------------------

    def _targets(self, batch: Minibatch) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(batch.x)
        # A convolutional net takes the planes as they are (no copy when float32).
        x = self.config.featurize(batch.x)
        x = np.asarray(x, np.float32) if self.config.convolutional else x.reshape(n, -1)
        value = batch.value.astype(np.float32)
        if self._base is not None:
            value = value - self._base(batch.x)[:, 0]
        if self.config.kind == "policy_value":
            if batch.policy is None:
                raise ValueError("a policy-value net needs a buffer with policy targets")
            policy = batch.policy.astype(np.float32)
        else:
            policy = np.zeros((n, 0), np.float32)
        return x, policy, value

    def _losses(self, x, policy, value):
        tf = self._tf
        out = self.keras_model(x, training=True)
        if self.config.kind == "policy_value":
            num_actions = self.config.num_actions
            logits, predicted = out[:, :num_actions], out[:, num_actions]
            policy_loss = tf.reduce_mean(
                tf.nn.softmax_cross_entropy_with_logits(labels=policy, logits=logits))
        else:
            predicted = out[:, 0]
            policy_loss = tf.constant(0.0)
        value_loss = tf.reduce_mean(tf.square(predicted - value))
        l2 = self.l2 * tf.add_n([tf.reduce_sum(tf.square(kernel))
                                 for kernel in self._net.kernels])
        return policy_loss, value_loss, l2

    def _train_step(self, x, policy, value):
        tf = self._tf
        with tf.GradientTape() as tape:
            policy_loss, value_loss, l2 = self._losses(x, policy, value)
            total = policy_loss + self.value_weight * value_loss + l2
        variables = self.keras_model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(total, variables), variables))
        return tf.stack([policy_loss, value_loss, l2, total])

    def train_steps(self, buffer: ReplayBuffer, n: int) -> LossTerms:
        """Takes ``n`` optimizer steps on minibatches sampled from ``buffer``.

        Returns:
            The mean loss terms over the ``n`` steps.

        Raises:
            ValueError: for ``n`` < 1, an empty buffer, or a buffer whose samples do not
                fit the net; nothing is trained then.
        """
        n = check_int("n", n, minimum=1)
        if len(buffer) == 0:
            raise ValueError("train_steps: the replay buffer is empty; add samples first")
        if buffer.state_shape != self.config.input_shape:
            raise ValueError(f"train_steps: the buffer holds states {buffer.state_shape}, "
                             f"the net takes {self.config.input_shape}")
        if (self.config.kind == "policy_value"
                and buffer.num_actions != self.config.num_actions):
            held = ("no policy" if buffer.num_actions is None
                    else f"{buffer.num_actions} policy columns")
            raise ValueError(f"train_steps: the buffer holds {held}, the net takes "
                             f"{self.config.num_actions} policy columns")
        tf = self._tf
        totals = np.zeros(4)
        for _ in range(n):
            x, policy, value = self._targets(buffer.sample(self.batch_size))
            totals += self._step(tf.constant(x), tf.constant(policy),
                                 tf.constant(value)).numpy()
        self.steps_taken += n
        p, v, l2, total = (totals / n).tolist()
        return LossTerms(p, v, l2, total, n)

    def loss(self, batch: Minibatch) -> LossTerms:
        """The loss terms on ``batch`` without training (e.g. a held-out set)."""
        x, policy, value = self._targets(batch)
        p, v, l2 = (float(t) for t in self._losses(x, policy, value))
        return LossTerms(p, v, l2, p + self.value_weight * v + l2, 0)
