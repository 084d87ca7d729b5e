"""Checkpoints: a net's weights (npz) and its config and metadata (JSON), versioned.

A checkpoint is a folder holding ``weights.npz`` (the ``(w, b)`` layers as ``w0, b0,
w1, ...``, dtypes kept, so a round trip is bitwise) and ``config.json`` (the format
version, the ``NetConfig``, the caller's metadata, and the SHA-256 of the weights file).
It is written to a temporary folder and renamed into place, so a crash never leaves a
half-written checkpoint under the name. Loading checks the format, the digest and the
layer shapes, and names the file and the problem when any is off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import zipfile
from typing import Any, Dict

import numpy as np

from async_search.training.nets import (NetConfig, Weights, check_weights, config_of,
                                        to_model, weights_of)

__all__ = ["Checkpoint", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "read_checkpoint", "FORMAT"]

FORMAT = "async_search.checkpoint/1"
_WEIGHTS, _CONFIG = "weights.npz", "config.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or of another format or net."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds."""

    config: NetConfig
    """The net's configuration."""
    weights: Weights
    """The ``(w, b)`` layers as saved (bitwise)."""
    metadata: Dict[str, Any]
    """The caller's JSON metadata (iteration, scores, ...)."""

    def model(self) -> Any:
        """The NumPy model (``training.nets.to_model``)."""
        return to_model(self.config, self.weights)


def save_checkpoint(path: str | os.PathLike, model: Any, config: Any = None,
                    metadata: Dict[str, Any] | None = None) -> str:
    """Saves ``model`` (a model ``to_model`` made, or its ``(w, b)`` layers) to the
    folder ``path``, replacing what was there atomically. Returns the path.

    ``config`` is the net's ``NetConfig`` or its JSON dict; None reads it from the model
    (it must then be a model, not bare layers).

    Example:
        >>> import tempfile
        >>> from async_search.training.nets import NetConfig, initial_weights
        >>> config = NetConfig("policy_value", "connect_four", (8,))
        >>> path = save_checkpoint(tempfile.mkdtemp() + "/ckpt",
        ...                        initial_weights(config, 0), config, {"iteration": 0})
        >>> read_checkpoint(path).metadata
        {'iteration': 0}
    """
    path = os.fspath(path)
    bare = isinstance(model, (list, tuple))
    if bare and config is None:
        raise ValueError("save_checkpoint: bare (w, b) layers need their NetConfig")
    config = config_of(None if bare else model, config)
    weights = model if bare else weights_of(model)
    check_weights(config, weights)
    buffer = io.BytesIO()
    arrays = {}
    for i, (w, b) in enumerate(weights):
        arrays[f"w{i}"], arrays[f"b{i}"] = np.asarray(w), np.asarray(b)
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    header = {"format": FORMAT, "config": config.to_json(),
              "metadata": metadata if metadata is not None else {},
              "weights_sha256": hashlib.sha256(data).hexdigest(), "layers": len(weights)}
    try:  # refuses non-JSON metadata (and NaN, which strict JSON readers reject) early
        text = json.dumps(header, indent=1, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"save_checkpoint({path!r}): metadata must be JSON (strings, "
                         f"finite numbers, lists, dicts): {e}") from e
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, content in ((_WEIGHTS, data), (_CONFIG, text.encode())):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
    old = f"{path}.old-{os.getpid()}"
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The config, weights and metadata of the checkpoint at ``path``.

    Raises:
        CheckpointError: naming the file and what is wrong with it.
    """
    path = os.fspath(path)
    config_file, weights_file = os.path.join(path, _CONFIG), os.path.join(path, _WEIGHTS)
    for file in (config_file, weights_file):
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path!r}: {file!r} is missing (is it a "
                                  f"checkpoint folder written by save_checkpoint?)")
    try:
        with open(config_file, "rb") as f:
            header = json.loads(f.read().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {config_file!r} is not valid JSON (truncated "
                              f"or corrupt): {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise CheckpointError(f"checkpoint {config_file!r} has format {got!r}; this "
                              f"version of async_search reads {FORMAT!r}")
    try:
        config = NetConfig.from_json(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {config_file!r} has an invalid net config: "
                              f"{e}") from e
    with open(weights_file, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != header.get("weights_sha256"):
        raise CheckpointError(f"checkpoint {weights_file!r} does not match the digest in "
                              f"{_CONFIG} (truncated or corrupt)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            weights = [(arrays[f"w{i}"], arrays[f"b{i}"])
                       for i in range(int(header["layers"]))]
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError) as e:
        raise CheckpointError(f"checkpoint {weights_file!r} cannot be read: {e}") from e
    try:
        check_weights(config, weights)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {weights_file!r}: {e}") from e
    metadata = header.get("metadata", {})
    return Checkpoint(config, weights, metadata if isinstance(metadata, dict) else {})


def load_checkpoint(path: str | os.PathLike) -> Any:
    """The NumPy model saved at ``path`` (``read_checkpoint(path).model()``); the model
    carries ``checkpoint_metadata`` and ``net_config`` attributes.

    Raises:
        CheckpointError: naming the file and what is wrong with it.
    """
    checkpoint = read_checkpoint(path)
    model = checkpoint.model()
    model.checkpoint_metadata = checkpoint.metadata
    model.net_config = checkpoint.config
    return model
