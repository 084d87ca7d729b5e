"""The model at the bottom of the pipeline: NumPy models and framework adapters.

A model is any callable from a NumPy batch ``[n, ...]`` to outputs with first dimension
``n`` (``base.Model``), with an ``input_spec`` that servers check requests against.

- ``SpecModel``/``with_spec`` declare the spec of a plain function; ``MLP`` is a seeded
  NumPy net whose rows are exact whatever the batch (the reference model).
- ``TensorFlowModel``, ``TorchModel`` and ``JaxModel`` adapt a framework's net: device
  placement, a few padded bucket sizes so that shapes repeat (``buckets``), weights
  swapped in place by ``update_model`` (``with_weights``), a copy per device
  (``on_device``) and a documented ``batch_tolerance``. Each framework is imported when
  its adapter is made, never by importing this package.

Example:
    >>> import numpy as np
    >>> from async_search.models import MLP
    >>> MLP((4,), output_size=2)(np.zeros((3, 4), np.float32)).shape
    (3, 2)
"""

from async_search.models.buckets import PaddedBatches, bucket_sizes, power_of_two_sizes
from async_search.models.jax_model import JaxModel
from async_search.models.numpy_models import (GRID_BOUND, GRID_SCALE, MLP, WEIGHT_QUANTUM,
                                              SpecModel, with_spec)
from async_search.models.tensorflow_model import TensorFlowModel
from async_search.models.torch_model import PRECISIONS, TorchModel

__all__ = [
    "SpecModel", "with_spec", "MLP", "GRID_SCALE", "GRID_BOUND", "WEIGHT_QUANTUM",
    "TensorFlowModel", "TorchModel", "JaxModel", "PRECISIONS", "power_of_two_sizes",
    "bucket_sizes", "PaddedBatches",
]
