"""The models the front and client tests serve: an MLP, one that waits on a gate, one
that raises."""

import threading

import numpy as np

from async_search.models import MLP

MODEL = MLP((16,), hidden_sizes=(32,), output_size=4, seed=0)
X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


class Gated:
    """Blocks its device thread on each batch until the test opens the gate."""

    input_spec = MODEL.input_spec

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, x):
        self.started.set()
        assert self.gate.wait(30)
        return MODEL(x)


class Raising:
    input_spec = MODEL.input_spec

    def __call__(self, x):
        raise RuntimeError("the model broke")
