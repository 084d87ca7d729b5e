"""Checkpoints: a net's weights (npz) and its config and metadata (JSON), versioned.

A checkpoint is a folder holding ``config.json`` (the format version, the ``NetConfig``,
the caller's metadata, the name and SHA-256 of the weights file, and ``config_sha256``,
which ties the config to those weights) and the weights
file it names, ``weights-<digest>.npz`` (an MLP's ``(w, b)`` layers as ``w0, b0, w1,
...``, a convolutional net's arrays by their names; dtypes kept, so a round trip is
bitwise). Saving over a checkpoint writes the new
weights file beside the old one, then replaces ``config.json`` in one atomic step
(``files.write_file``), then removes the old weights: the folder is never absent under
its name, and holds either the old checkpoint or the new one, whole. Saves over one
folder, from threads or processes, take turns (``files.folder_lock``: the file
``.lock`` is in the folder while a save runs); loads take no lock. A load that meets
the last step (the ``config.json`` it read names weights just removed) reads
``config.json`` again and loads the checkpoint that replaced it. Saving refuses, before
writing anything, what loading would refuse. Loading checks the format, every field,
the digest and the layer shapes, and names the file and the problem when any is off;
last, that the net config is the one the weights were saved with (``config_sha256``:
a residual and a conv net of one size, or a heuristic with and without its Manhattan
term, have weights of the same shapes). Checkpoints of formats 1 (``weights.npz``) and 2
(no ``config_sha256``) still load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import re
import zipfile
from typing import Any, Dict, NamedTuple

import numpy as np

from async_search.errors import CheckpointError
from async_search.files import (folder_lock, folder_path, is_leftover, make_folder,
                                read_file, remove_tree, write_file)
from async_search.npz import MAX_ITEMSIZE, checked_array
from async_search.problems.nets import (NetConfig, Weights, check_weights, config_of,
                                        to_model, weights_of)


FORMAT = "async_search.checkpoint/3"
_FORMAT_2 = "async_search.checkpoint/2"  # the net config not tied to the weights
_FORMAT_1 = "async_search.checkpoint/1"  # weights always in weights.npz
_CONFIG, _WEIGHTS_1 = "config.json", "weights.npz"
_WEIGHTS = re.compile(r"^weights-[0-9a-f]{16}\.npz$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: How many times a load tries the weights a ``config.json`` names while saves keep
#: removing them (each miss means a whole save completed between two of its reads).
_READS = 5
#: The largest weights file a load reads (a net of a billion float32 parameters takes
#: 4 GB): past it, or not a regular file, it is refused before it is read.
MAX_WEIGHTS_BYTES = 1 << 32


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds."""

    config: NetConfig
    """The net's configuration."""
    weights: Weights
    """The ``(w, b)`` layers (an MLP) or named arrays as saved (bitwise)."""
    metadata: Dict[str, Any]
    """The caller's JSON metadata (iteration, scores, ...)."""

    def model(self) -> Any:
        """The NumPy model (``problems.nets.to_model``)."""
        return to_model(self.config, self.weights)


def _own_config(model: Any) -> NetConfig | None:
    """The config the model says it has (None: it does not say)."""
    try:
        return config_of(model, None)
    except ValueError:
        return None


def as_written(value: Any) -> Any:
    """``value`` as JSON gives it back (keys as strings, tuples as lists): what a file
    written from it reads as. ValueError (or TypeError) for what JSON cannot hold, NaN
    and infinities included, or for two keys written as one (``1`` and ``"1"``), which
    a reader refuses.

    Example:
        >>> as_written({1: (2, 3)})
        {'1': [2, 3]}
    """
    return json.loads(json.dumps(value, allow_nan=False), object_pairs_hook=_unique)


def _unique(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = [key for key, _ in pairs]
        twice = sorted({key for key in seen if seen.count(key) > 1})
        raise ValueError(f"keys written as {twice} twice (JSON writes keys as "
                         f"strings: 1 and '1' are one key)")
    return out


def _as_json(path: str, metadata: Dict[Any, Any]) -> Dict[str, Any]:
    """``metadata`` as written (``as_written``), so that the header's keys sort
    whatever their types were; ValueError naming ``path`` for what it refuses."""
    try:
        return as_written(metadata)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"save_checkpoint({path!r}): metadata must be JSON (strings, "
                         f"finite numbers, lists, dicts): {e}") from e


def save_checkpoint(path: str | os.PathLike, model: Any, config: Any = None,
                    metadata: Dict[str, Any] | None = None) -> str:
    """Saves ``model`` (a model ``to_model`` made, or its ``(w, b)`` layers) to the
    folder ``path``, replacing what was there atomically. Returns the path (without a
    trailing separator).

    ``config`` is the net's ``NetConfig`` or its JSON dict; None reads it from the model
    (it must then be a model, not bare layers).

    ``metadata`` is a dict (None: ``{}``) of JSON values: strings, finite numbers,
    booleans, None, lists and dicts. JSON writes dict keys as strings and tuples as
    lists, so that is how ``read_checkpoint`` gives them back.

    Raises:
        ValueError: weights that do not fit the config (or are not numbers), metadata
            that is not a dict of JSON values, or a config that ``load_checkpoint``
            would refuse; nothing is written then.
        FileWriteError: naming the file that could not be written; the checkpoint that
            was there is whole.

    Saves over one folder at once, from threads or processes, run one after the other
    (``files.folder_lock``); the last to finish is the checkpoint there.

    Example:
        >>> import tempfile
        >>> from async_search.problems.nets import NetConfig, initial_weights
        >>> config = NetConfig("policy_value", "connect_four", (8,))
        >>> path = save_checkpoint(tempfile.mkdtemp() + "/ckpt",
        ...                        initial_weights(config, 0), config, {"iteration": 0})
        >>> read_checkpoint(path).metadata
        {'iteration': 0}
    """
    path = folder_path(path)
    if metadata is not None and not isinstance(metadata, dict):  # loading needs an object
        raise ValueError(f"save_checkpoint({path!r}): metadata must be a dict (or None), "
                         f"got {type(metadata).__name__} {metadata!r:.80}")
    bare = isinstance(model, (list, tuple, dict))
    if bare and config is None:
        raise ValueError("save_checkpoint: bare weights ((w, b) layers or named arrays) "
                         "need their NetConfig")
    own = None if bare or config is None else _own_config(model)
    config = config_of(None if bare else model, config)
    if own is not None:
        # What weights' shapes cannot tell: a residual net and a conv net of one size,
        # or a heuristic with and without its Manhattan term, would load as the other.
        fields = ("kind", "problem") + (("architecture",) if own.kind == "policy_value"
                                        else ("residual",))
        differ = {f: (getattr(config, f), getattr(own, f)) for f in fields
                  if getattr(config, f) != getattr(own, f)}
        if differ:
            raise ValueError(
                f"save_checkpoint({path!r}): the config given is not the model's: "
                + ", ".join(f"{f} {given!r} where the model's is {its!r}"
                            for f, (given, its) in differ.items())
                + "; give config=None to save the model's own")
    weights = model if bare else weights_of(model)
    check_weights(config, weights)  # real numbers of the right shapes, kept as given
    if config.convolutional:  # by name; an MLP's layers as w0, b0, w1, ...
        arrays = {name: np.asarray(weights[name]) for name in config.conv_shapes}
    else:
        arrays = {f"{kind}{i}": np.asarray(a) for i, layer in enumerate(weights)
                  for kind, a in zip("wb", layer)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    weights_file = f"weights-{digest[:16]}.npz"
    header = {"format": FORMAT, "config": config.to_json(),
              "metadata": _as_json(path, metadata if metadata is not None else {}),
              "weights_file": weights_file, "weights_sha256": digest,
              "layers": len(weights)}
    header["config_sha256"] = _config_digest(header["config"], digest)
    try:  # refuses non-JSON metadata (and NaN, which strict JSON readers reject) early
        text = json.dumps(header, indent=1, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"save_checkpoint({path!r}): metadata must be JSON (strings, "
                         f"finite numbers, lists, dicts): {e}") from e
    config_file = os.path.join(path, _CONFIG)
    try:  # what is written is what loading accepts (a NetConfig checks less: its size)
        _checked_header(json.loads(text), config_file)
    except (CheckpointError, RecursionError) as e:
        raise ValueError(f"save_checkpoint({path!r}): refused, as load_checkpoint would "
                         f"refuse it: {e}") from e
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"save_checkpoint({path!r}): a file has that name; a checkpoint "
                         f"is a folder (remove the file or choose another path)")
    make_folder(path)
    # One save at a time: each removes every weights file but its own, so another's,
    # written and about to be named by its config.json, would go (loads take no lock).
    with folder_lock(path):
        write_file(os.path.join(path, weights_file), data)
        write_file(config_file, text)  # the commit: names the new weights
        for name in sorted(os.listdir(path)):  # the old weights, and interrupted writes
            if (name != weights_file and (name == _WEIGHTS_1 or _WEIGHTS.match(name))
                    or is_leftover(name)):
                remove_tree(os.path.join(path, name))
    parent = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    for name in sorted(os.listdir(parent)):  # this name's, from older versions' saves
        if name.startswith(base + ".") and is_leftover(name) and (
                name.rsplit("-", 1)[0] in (f"{base}.tmp", f"{base}.old")):
            remove_tree(os.path.join(parent, name))
    return path


class _Header(NamedTuple):
    """A checked ``config.json``."""

    config: NetConfig
    metadata: Dict[str, Any]
    layers: int
    digest: str
    weights_file: str  # the name, in the checkpoint's folder
    raw_config: Any  # the config as read, for the config digest
    config_digest: str | None  # None: a format before 3


def _config_digest(config: Any, weights_digest: str) -> str:
    """What ties a net config to its weights: a SHA-256 of both."""
    text = json.dumps([config, weights_digest], sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The config, weights and metadata of the checkpoint at ``path``.

    A save over the checkpoint while it loads is no error: when the weights that the
    ``config.json`` read names are gone (the save replaced ``config.json`` and removed
    them), ``config.json`` is read again and the checkpoint it now names is loaded.

    Raises:
        CheckpointError: naming the file and what is wrong with it.
    """
    path = folder_path(path)
    config_file = os.path.join(path, _CONFIG)
    header = _read_header(path, config_file)
    for read in range(1, _READS + 1):
        weights_file = os.path.join(path, header.weights_file)
        try:
            data = read_file(weights_file, MAX_WEIGHTS_BYTES)
            break
        except (ValueError, MemoryError) as e:  # a FIFO, a device, past any net's size
            raise CheckpointError(f"checkpoint {weights_file!r} cannot be read: "
                                  f"{e}") from None
        except FileNotFoundError:
            # A save committed a new config.json and removed these weights after this
            # read the old one: the new one names weights that are there.
            newer = _read_header(path, config_file)
            if newer.weights_file == header.weights_file and not os.path.exists(
                    weights_file):
                raise CheckpointError(f"checkpoint {path!r}: {weights_file!r}, which "
                                      f"{_CONFIG} names, is missing") from None
            if read == _READS:
                raise CheckpointError(f"checkpoint {path!r}: each of the {_READS} times "
                                      f"{_CONFIG} was read, a save removed the weights it "
                                      f"named before they could be read") from None
            header = newer
        except OSError as e:
            raise CheckpointError(f"checkpoint {weights_file!r} cannot be read: "
                                  f"{e}") from e
    config, layers = header.config, header.layers
    if hashlib.sha256(data).hexdigest() != header.digest:
        raise CheckpointError(f"checkpoint {weights_file!r} does not match the digest in "
                              f"{_CONFIG} (truncated or corrupt)")
    shapes = (dict(config.conv_shapes) if config.convolutional else {
        f"{kind}{i}": shape for i, (fan_in, fan_out) in enumerate(config.layer_shapes)
        for kind, shape in (("w", (fan_in, fan_out)), ("b", (fan_out,)))})
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            if set(arrays.files) != set(shapes):
                raise ValueError(f"it holds arrays {sorted(arrays.files)}, expected "
                                 f"{sorted(shapes)}")

            def read(name: str) -> np.ndarray:
                # Only what the config's layers can take is inflated (a zip bomb, a
                # header declaring terabytes, is refused first); a misshapen array
                # within that is check_weights' to name.
                try:
                    return checked_array(arrays, name,
                                         math.prod(shapes[name]) * MAX_ITEMSIZE)
                except ValueError as e:
                    raise ValueError(f"weights do not fit {config}: {e}") from None

            weights = ({name: read(name) for name in config.conv_shapes}
                       if config.convolutional else
                       [(read(f"w{i}"), read(f"b{i}")) for i in range(layers)])
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError,
            MemoryError) as e:
        raise CheckpointError(f"checkpoint {weights_file!r} cannot be read: {e}") from e
    try:
        check_weights(config, weights)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {weights_file!r}: {e}") from e
    if header.config_digest is not None and header.config_digest != _config_digest(
            header.raw_config, header.digest):
        raise CheckpointError(f"checkpoint {path!r}: the net config in {_CONFIG} is not "
                              f"the one its weights were saved with (config_sha256 "
                              f"differs: edited?); they would load as another net, "
                              f"{config}")
    return Checkpoint(config, weights, header.metadata)


def _read_header(path: str, config_file: str) -> _Header:
    """The checkpoint's ``config.json``, read and checked."""
    from async_search.schema import read_json

    if not os.path.isfile(config_file):
        raise CheckpointError(f"checkpoint {path!r}: {config_file!r} is missing (is it a "
                              f"checkpoint folder written by save_checkpoint?)")
    return _checked_header(read_json(config_file), config_file)


def _checked_header(header: Any, config_file: str) -> _Header:
    """Every field of a ``config.json`` checked (saving checks what it writes here)."""
    from async_search.schema import Fields

    got = header.get("format") if isinstance(header, dict) else None
    if got not in (FORMAT, _FORMAT_2, _FORMAT_1):
        shown = got if isinstance(header, dict) else f"a JSON {type(header).__name__}"
        raise CheckpointError(f"checkpoint {config_file!r} has format {shown!r}; this "
                              f"version of async_search reads {FORMAT!r} (and "
                              f"{_FORMAT_2!r}, {_FORMAT_1!r})")
    fields = Fields(header, config_file)
    try:
        config = NetConfig.from_json(_net_config(fields))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {config_file!r} has an invalid net config: "
                              f"{e}") from e
    metadata = fields.object("metadata").data
    layers = fields.int("layers", minimum=1)
    try:  # the shapes come from the problem the config names, made here
        expected = len(config.conv_shapes if config.convolutional else config.layer_shapes)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {config_file!r} has an invalid net config: "
                              f"{e}") from e
    if layers != expected:
        raise fields.error(f"says {layers} layers; its net config has {expected}",
                           "layers")
    digest = fields.str("weights_sha256", pattern=_SHA256.pattern)
    name = (_WEIGHTS_1 if got == _FORMAT_1 else
            fields.str("weights_file", pattern=_WEIGHTS.pattern))
    bound = (fields.str("config_sha256", pattern=_SHA256.pattern) if got == FORMAT
             else None)
    fields.exactly(["format", "config", "metadata", "layers", "weights_sha256"]
                   + ([] if got == _FORMAT_1 else ["weights_file"])
                   + ([] if bound is None else ["config_sha256"]))
    return _Header(config, metadata, layers, digest, name, header["config"], bound)


def _net_config(fields: Any) -> Dict[str, Any]:
    """The ``config`` field, its fields typed (NetConfig itself converts them)."""
    net = fields.object("config")
    out = {"kind": net.str("kind"), "problem": net.str("problem"),
           "hidden_sizes": net.list("hidden_sizes")}
    for i, width in enumerate(out["hidden_sizes"]):
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise net.error(f"must be integer widths >= 1, got {width!r} at {i}",
                            "hidden_sizes")
    if "size" in net.data:
        out["size"] = net.int("size", minimum=2, maximum=8)  # SlidingPuzzle's sizes
    if "residual" in net.data:
        out["residual"] = net.bool("residual")
    if "architecture" in net.data:
        out["architecture"] = net.str("architecture")
    if "features" in net.data:
        out["features"] = net.str("features")
    if "value_net" in net.data:
        out["value_net"] = net.str("value_net")
    for name, minimum in (("channels", 1), ("blocks", 0), ("value_hidden", 1),
                          ("value_planes", 1)):
        if name in net.data:
            out[name] = net.int(name, minimum=minimum)
    net.exactly(["kind", "problem", "hidden_sizes", "size", "residual", "architecture",
                 "channels", "blocks", "value_hidden", "features", "value_planes",
                 "value_net"])
    return out


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
