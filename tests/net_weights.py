"""Weights as training leaves them, for tests of nets made from a ``NetConfig``."""

import numpy as np

from async_search.problems.nets import NetConfig, Weights, initial_weights


def perturbed_weights(config: NetConfig, seed: int) -> Weights:
    """Off-grid weights with non-zero biases: the seeded initial weights, moved."""
    rng = np.random.default_rng(seed)
    weights = initial_weights(config, seed)
    if config.convolutional:
        return {n: (w + rng.normal(0, 0.05, w.shape)).astype(np.float32)
                for n, w in weights.items()}
    return [(w, rng.normal(0, 0.1, b.shape).astype(np.float32)) for w, b in weights]
