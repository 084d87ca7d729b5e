"""The replay buffer: training samples held as arrays, sampled uniformly, saved to disk.

A sample is an encoded state ``x``, a policy target ``pi`` (an MCTS visit distribution;
absent for heuristic nets) and a value target ``z`` (a game outcome or a cost to go).
The buffer is a ring of arrays: adding a game is one slice assignment, sampling a
minibatch is one fancy index. The arrays grow (doubling, up to the capacity) as adds
need, so a capacity far above the samples held costs no memory: a fresh buffer starts
empty, and a loaded one allocates no more than its file's arrays, whatever capacity its
header says.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zipfile
from typing import Any, Callable, NamedTuple, Sequence, Tuple

import numpy as np

from async_search.checks import check_callable, check_int, is_int
from async_search.errors import CheckpointError
from async_search.files import write_file
from async_search.npz import checked_array
from async_search.schema import Fields, NeverWrittenError, loads_strict


#: A symmetry: ``(x, pi) -> (x', pi')`` for a minibatch; the value target is unchanged.
Augment = Callable[[np.ndarray, np.ndarray | None], Tuple[np.ndarray, np.ndarray | None]]

_FORMAT = "async_search.replay/1"


class Minibatch(NamedTuple):
    """A sampled minibatch (``n`` samples)."""

    x: np.ndarray
    """float32 ``[n, *state_shape]``: encoded states."""
    policy: np.ndarray | None
    """float32 ``[n, num_actions]``: policy targets, rows summing to 1; None for a
    buffer without policies."""
    value: np.ndarray
    """float32 ``[n]``: value targets."""


def mirror_columns(x: np.ndarray, policy: np.ndarray | None) -> tuple:
    """Connect Four's left-right mirror: flips the board's columns (the last axis of
    ``[n, 2, 6, 7]``) and the policy over columns."""
    return x[..., ::-1], None if policy is None else policy[:, ::-1]


@dataclasses.dataclass(frozen=True)
class _Spec:
    state_shape: Tuple[int, ...]
    num_actions: int | None  # None: value targets only


class ReplayBuffer:
    """A fixed-capacity ring of training samples, oldest overwritten first.

    The arrays grow (doubling) as samples are added, up to ``capacity`` rows: memory
    follows the samples held, not the capacity.

    Args:
        capacity: the most samples held (>= 1).
        seed: seeds minibatch sampling and augmentation.
        state_shape: per-sample shape of ``x`` (integers >= 1); default: taken from the
            first add.
        num_actions: width of the policy targets (>= 1), given with ``state_shape``;
            None there for a value-only buffer. Default: taken from the first add.
        augment: a symmetry applied to half of each minibatch, chosen at random (e.g.
            ``mirror_columns`` for Connect Four); None for none.

    Raises:
        ValueError: an argument that is not an integer in its range, or
            ``num_actions`` without ``state_shape``.
        TypeError: ``augment`` neither callable nor None.

    Example:
        >>> buf = ReplayBuffer(100, seed=0)
        >>> buf.add(np.zeros((3, 4), np.float32), np.full((3, 2), 0.5, np.float32),
        ...         np.array([1.0, -1.0, 0.0]))
        >>> len(buf), buf.sample(2).x.shape
        (3, (2, 4))
    """

    def __init__(self, capacity: int, seed: int = 0, *,
                 state_shape: Sequence[int] | None = None,
                 num_actions: int | None = None, augment: Augment | None = None):
        self.capacity = check_int("capacity", capacity, minimum=1, maximum=_MAX_CAPACITY)
        self.seed = check_int("seed", seed, minimum=0)
        # Checked here, not at the first sample() that calls it.
        self.augment = check_callable("augment", augment, optional=True)
        if num_actions is not None:
            num_actions = check_int("num_actions", num_actions, minimum=1)
            if state_shape is None:  # else it would be ignored: the first add decides
                raise ValueError("ReplayBuffer: num_actions is declared with state_shape; "
                                 "pass both, or neither to take them from the first add")
        self._rng = np.random.default_rng(self.seed)
        self._spec: _Spec | None = None
        self._has_policy: bool | None = None
        if state_shape is not None:
            self._allocate(_Spec(_check_shape(state_shape), num_actions))
        self._size = 0
        self._next = 0  # where the next sample goes
        self.added = 0  # samples ever added

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        spec = self._spec
        return (f"ReplayBuffer({self._size}/{self.capacity} samples, state "
                f"{spec.state_shape if spec else '?'}, policy "
                f"{spec.num_actions if spec else '?'})")

    @property
    def state_shape(self) -> Tuple[int, ...] | None:
        return None if self._spec is None else self._spec.state_shape

    @property
    def num_actions(self) -> int | None:
        return None if self._spec is None else self._spec.num_actions

    def _allocate(self, spec: _Spec) -> None:
        """Empty arrays for ``spec``: ``_reserve`` grows them as adds need."""
        self._spec = spec
        self._x = np.zeros((0, *spec.state_shape), np.float32)
        self._pi = (np.zeros((0, spec.num_actions), np.float32)
                    if spec.num_actions is not None else None)
        self._z = np.zeros(0, np.float32)

    def _reserve(self, rows: int) -> None:
        """Grows the arrays to hold at least ``rows`` samples (``<= capacity``): they
        hold only the samples added (or read, for a loaded buffer). Below the capacity
        the ring has not wrapped, so the samples are the first rows, kept in place."""
        held = len(self._z)
        if rows <= held:
            return
        rows = min(self.capacity, max(rows, 2 * held))  # doubling: few copies of a sample
        grown = {}
        for name in ("_x", "_pi", "_z"):  # all allocated before any is replaced
            old = getattr(self, name)
            if old is not None:
                grown[name] = np.zeros((rows, *old.shape[1:]), np.float32)
                grown[name][:held] = old
        for name, array in grown.items():
            setattr(self, name, array)

    # -- adding ---------------------------------------------------------------------------

    def add(self, x: np.ndarray, policy: np.ndarray | None, value: np.ndarray) -> None:
        """Adds ``n`` samples (a whole game, say).

        Args:
            x: ``[n, *state_shape]`` encoded states.
            policy: ``[n, num_actions]`` non-negative rows (visit counts or
                probabilities; each row is normalised to sum 1), or None for a
                value-only buffer.
            value: ``[n]`` or ``[n, 1]`` finite value targets.

        Raises:
            ValueError: naming the array and the expected shape when anything does not
                fit, or an array not of real numbers (complex, text); nothing is added
                then (the buffer is unchanged).
        """
        x, policy, value = self._checked(x, policy, value)
        n = given = len(x)
        if n == 0:
            return
        if n > self.capacity:  # only the newest fit
            x, value = x[-self.capacity:], value[-self.capacity:]
            policy = None if policy is None else policy[-self.capacity:]
            n = self.capacity
        self._reserve(min(self.capacity, self._size + n))
        index = (self._next + np.arange(n)) % self.capacity
        self._x[index] = x
        if policy is not None:
            self._pi[index] = policy
        self._z[index] = value
        self._next = int((self._next + n) % self.capacity)
        self._size = min(self.capacity, self._size + n)
        self.added += given  # every sample passed in, stored or not (runs resume by it)

    def _checked(self, x, policy, value) -> tuple:
        x = _real("x", x)
        if x.ndim < 1 or 0 in x.shape[1:]:  # (a state of no values: no file holds it)
            raise ValueError(f"ReplayBuffer.add: x must be an array [n, *state_shape] "
                             f"with every state dimension >= 1, got shape {x.shape}")
        n = len(x)
        if not np.isfinite(x).all():
            raise ValueError("ReplayBuffer.add: states x must be finite")
        value = _real("value", value)
        if value.shape not in ((n,), (n, 1)):
            raise ValueError(f"ReplayBuffer.add: value must have shape [{n}] or [{n}, 1] "
                             f"(one target per state), got {value.shape}")
        value = value.reshape(n)
        if not np.isfinite(value).all():
            raise ValueError("ReplayBuffer.add: value targets must be finite")
        if policy is not None:
            policy = _real("policy", policy)
            if policy.ndim != 2 or len(policy) != n:
                raise ValueError(f"ReplayBuffer.add: policy must have shape [{n}, "
                                 f"num_actions], got {policy.shape}")
            if not np.isfinite(policy).all() or (policy < 0).any():
                raise ValueError("ReplayBuffer.add: policy targets must be finite and "
                                 "non-negative")
            # Summed in float64: rows near float32's largest sum to inf in float32.
            totals = policy.sum(axis=1, keepdims=True, dtype=np.float64)
            if n and (totals <= 0).any():
                raise ValueError("ReplayBuffer.add: every policy row needs a positive sum "
                                 "(visit counts of at least one action)")
            policy = (policy / totals).astype(np.float32)
        spec = _Spec(tuple(x.shape[1:]), None if policy is None else policy.shape[1])
        if self._spec is None:
            if not n:  # an empty add says nothing of the samples to come
                return x, policy, value
            self._allocate(spec)
        elif spec != self._spec:
            want = self._spec
            raise ValueError(
                f"ReplayBuffer.add: this buffer holds states {list(want.state_shape)} and "
                f"{'no policy' if want.num_actions is None else f'{want.num_actions} policy columns'}"
                f"; got states {list(spec.state_shape)} and "
                f"{'no policy' if spec.num_actions is None else f'{spec.num_actions} policy columns'}")
        return x, policy, value

    # -- sampling -------------------------------------------------------------------------

    def sample(self, batch_size: int) -> Minibatch:
        """A minibatch drawn uniformly with replacement; ``augment`` is applied to a
        random half of it."""
        batch_size = check_int("batch_size", batch_size, minimum=1)
        if self._size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty; add samples first")
        index = self._rng.integers(0, self._size, batch_size)
        x = self._x[index]
        policy = None if self._pi is None else self._pi[index]
        if self.augment is not None:
            flip = self._rng.random(batch_size) < 0.5
            if flip.any():
                fx, fp = _augmented(self.augment(
                    x[flip], None if policy is None else policy[flip]),
                    x[flip], None if policy is None else policy[flip])
                x[flip] = fx
                if policy is not None:
                    policy[flip] = fp
        return Minibatch(x, policy, self._z[index].copy())

    def arrays(self) -> Minibatch:
        """Every sample held, oldest first (copies)."""
        if self._spec is None:
            raise ValueError("ReplayBuffer.arrays: the buffer is empty")
        order = (np.arange(self._size) + (self._next if self._size == self.capacity else 0)
                 ) % self.capacity
        return Minibatch(self._x[order], None if self._pi is None else self._pi[order],
                         self._z[order])

    # -- saving ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes the buffer (samples, ring position, sampling state) to one ``.npz``
        file, atomically (``files.write_file``): a crash or a full disk leaves the
        previous file whole.

        Raises:
            FileWriteError: naming the file and what failed.
        """
        arrays = self._state_arrays()
        write_file(path, lambda f: np.savez(f, **arrays))

    def _state_arrays(self) -> dict:
        meta = {"format": _FORMAT, "capacity": self.capacity, "seed": self.seed,
                "size": self._size, "next": self._next, "added": self.added,
                "state_shape": None if self._spec is None else list(self._spec.state_shape),
                "num_actions": None if self._spec is None else self._spec.num_actions,
                "rng": self._rng.bit_generator.state}
        arrays = {"meta": np.frombuffer(json.dumps(meta, allow_nan=False).encode(), np.uint8)}
        if self._spec is not None:
            arrays.update(x=self._x[:self._size], z=self._z[:self._size])
            if self._pi is not None:
                arrays["pi"] = self._pi[:self._size]
        return arrays

    @classmethod
    def load(cls, path: str | os.PathLike, *, augment: Augment | None = None
             ) -> "ReplayBuffer":
        """A buffer as ``save`` wrote it; every field and array is checked (format,
        types, ranges, shapes, finite targets, policy rows summing to 1). Its arrays
        hold the samples read, checked against the header before anything is
        allocated, and grow as adds need (so a capacity far above the samples held
        allocates nothing up front).

        Raises:
            CheckpointError: (a ``ValueError``) naming the file and the problem when it
                is missing, truncated, corrupt, not a replay buffer, or out of range.
            TypeError: ``augment`` neither callable nor None.
        """
        path = os.fspath(path)
        # Checked before the file: a TypeError below would read as a corrupt file.
        check_callable("augment", augment, optional=True)
        if not os.path.isfile(path):
            raise CheckpointError(f"replay buffer file {path!r} " + (
                "is not a regular file (a FIFO, a device, a folder?)"
                if os.path.lexists(path) else "is missing"))
        try:
            with np.load(path, allow_pickle=False) as data:
                if "meta" not in data.files:
                    raise CheckpointError(f"replay buffer file {path!r} is not a replay "
                                          f"buffer (no header; it holds {data.files})")
                meta = _read_meta(checked_array(data, "meta", _MAX_META_BYTES),
                                  path)
                buf = cls(meta["capacity"], meta["seed"], augment=augment)
                size, actions = meta["size"], meta["num_actions"]
                want = {"meta"}
                if meta["state_shape"] is not None:
                    spec = _Spec(tuple(meta["state_shape"]), actions)
                    shapes = {"x": (size, *spec.state_shape), "z": (size,)}
                    if actions is not None:
                        shapes["pi"] = (size, actions)
                    want |= set(shapes)
                    held = {}
                    for name, shape in shapes.items():  # the file's arrays are the buffer's
                        try:  # inflated only once its header fits (a zip bomb...)
                            array = checked_array(data, name, math.prod(shape) * 4)
                        except KeyError:
                            array = None
                        except ValueError as e:
                            raise CheckpointError(
                                f"replay buffer file {path!r}: the array {name!r} must "
                                f"be float32 {list(shape)}: {e}") from None
                        if array is None or array.shape != shape or (
                                array.dtype != np.float32):
                            got = "nothing" if array is None else (
                                f"{array.dtype} {list(array.shape)}")
                            raise CheckpointError(
                                f"replay buffer file {path!r}: the array {name!r} must "
                                f"be float32 {list(shape)}, got {got}")
                        held[name] = np.require(array, np.float32, ["C", "W"])
                    buf._spec = spec
                    buf._x, buf._z, buf._pi = held["x"], held["z"], held.get("pi")
                if set(data.files) != want:
                    raise CheckpointError(f"replay buffer file {path!r} holds arrays "
                                          f"{sorted(data.files)}, expected {sorted(want)}")
                buf._size, buf._next, buf.added = size, meta["next"], meta["added"]
                buf._check_samples(path)
                try:
                    buf._rng.bit_generator.state = meta["rng"]
                except (TypeError, ValueError, KeyError, OverflowError) as e:
                    # OverflowError: a number past the generator's C integers (-1, 2**200)
                    kind = type(buf._rng.bit_generator).__name__
                    raise CheckpointError(f"replay buffer file {path!r}: the field 'rng' "
                                          f"is not a {kind} state: {e}") from e
        except CheckpointError:
            raise
        except (OSError, zipfile.BadZipFile, KeyError, EOFError, TypeError, ValueError,
                MemoryError, NotImplementedError, RuntimeError) as e:
            # MemoryError: an array header sized past memory; NotImplementedError and
            # RuntimeError: zipfile's words for a damaged entry (an unknown compression
            # or version, an "encrypted" flag)
            raise CheckpointError(f"replay buffer file {path!r} is corrupt, truncated or "
                                  f"not a replay buffer: {e}") from e
        return buf

    def _check_samples(self, path: str) -> None:
        if self._spec is None:
            return
        n = self._size
        x, z = self._x[:n], self._z[:n]
        if not (np.isfinite(x).all() and np.isfinite(z).all()):
            raise CheckpointError(f"replay buffer file {path!r}: its states or value "
                                  f"targets are not all finite")
        if self._pi is not None and n:
            pi = self._pi[:n]
            if not np.isfinite(pi).all() or (pi < 0).any() or (
                    np.abs(pi.sum(axis=1) - 1) > 1e-3).any():
                raise CheckpointError(f"replay buffer file {path!r}: its policy targets "
                                      f"are not all rows of non-negative numbers summing "
                                      f"to 1")


def _augmented(result: Any, x: np.ndarray, policy: np.ndarray | None) -> Tuple:
    """``augment(x, policy)``'s ``(x', policy')``, checked to be the same shapes (and
    policy rows summing to 1): written back into the minibatch, a row too few or a
    column too many broadcast into wrong targets without a word."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ValueError(f"ReplayBuffer augment must return (x, policy), got "
                         f"{type(result).__name__}")
    fx, fp = np.asarray(result[0]), result[1]
    if fx.shape != x.shape:
        raise ValueError(f"ReplayBuffer augment returned x of shape {fx.shape} for x of "
                         f"shape {x.shape}")
    if policy is None:
        return fx, None
    fp = np.asarray(fp, dtype=np.float64) if fp is not None else None
    if fp is None or fp.shape != policy.shape or not np.isfinite(fp).all() or (
            fp < 0).any() or (np.abs(fp.sum(axis=1) - 1) > 1e-3).any():
        raise ValueError(f"ReplayBuffer augment must return a policy of shape "
                         f"{policy.shape} whose rows are non-negative and sum to 1, got "
                         f"{None if fp is None else fp.shape}")
    return fx, fp


def _check_shape(state_shape) -> Tuple[int, ...]:
    """``state_shape`` as a tuple; ValueError unless a sequence of integers >= 1."""
    try:  # a str is a sequence too, of characters
        dims = None if isinstance(state_shape, (str, bytes)) else tuple(state_shape)
    except TypeError:
        dims = None
    if dims is None or not all(is_int(d) and d >= 1 for d in dims):
        raise ValueError(f"state_shape must be a sequence of integers >= 1, got "
                         f"{state_shape!r}")
    return tuple(int(d) for d in dims)


#: The most items a buffer holds: its ring positions are int64.
_MAX_CAPACITY = int(np.iinfo(np.int64).max)
#: The largest header a buffer file may hold (its fields and generator state: ~1 KB).
_MAX_META_BYTES = 1 << 20


def _real(name: str, array) -> np.ndarray:
    """``array`` as float32; ValueError unless it holds real numbers: a cast alone
    would drop a complex number's imaginary part, or parse text. An object array of
    plain numbers is its numbers."""
    try:
        array = np.asarray(array)
    except ValueError as e:  # ragged rows: NumPy's "inhomogeneous shape", unnamed
        raise ValueError(f"ReplayBuffer.add: {name} must be an array of one shape (rows "
                         f"of equal length): {e}") from None
    if array.dtype.kind == "O":
        array = np.array(array.tolist())  # Python numbers: an int or float array
    if array.dtype.kind not in "biuf":
        raise ValueError(f"ReplayBuffer.add: {name} must hold real numbers, got "
                         f"{array.dtype} values")
    return array.astype(np.float32, copy=False)


def _read_meta(raw: np.ndarray, path: str) -> dict:
    """The buffer header, every field checked."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise CheckpointError(f"replay buffer file {path!r}: its header is not bytes")
    try:
        meta = loads_strict(raw.tobytes().decode("utf-8"))
    except NeverWrittenError as e:  # a NaN or inf, a key twice (one value taken unsaid)
        raise CheckpointError(f"replay buffer file {path!r}: its header holds JSON that "
                              f"this project never writes: {e}") from e
    except (ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, or an
        # integer past Python's 4,300 digits
        raise CheckpointError(f"replay buffer file {path!r}: its header is not JSON "
                              f"text: {e}") from e
    fields = Fields(meta, path, "header")
    got = fields.raw("format")
    if got != _FORMAT:
        raise CheckpointError(f"replay buffer file {path!r} has format {got!r}, "
                              f"expected {_FORMAT!r}")
    capacity = fields.int("capacity", minimum=1, maximum=_MAX_CAPACITY)
    out = {"capacity": capacity, "seed": fields.int("seed", minimum=0),
           "size": fields.int("size", minimum=0, maximum=capacity)}
    out["next"] = fields.int("next", minimum=0, maximum=capacity - 1)
    out["added"] = fields.int("added", minimum=out["size"])
    if not (out["size"] == capacity or out["next"] == out["size"]):
        raise fields.error(f"(ring position: size {out['size']}, next {out['next']}) "
                           f"does not fit its capacity {capacity}", "next")
    shape = fields.raw("state_shape")
    if shape is not None and not (isinstance(shape, list) and all(
            is_int(d) and d >= 1 for d in shape)):
        raise fields.error(f"must be null or a list of integers >= 1, got {shape!r}",
                           "state_shape")
    out["state_shape"] = shape
    actions = fields.raw("num_actions")
    if actions is not None and not (is_int(actions) and actions >= 1):
        raise fields.error(f"must be null or an integer >= 1, got {actions!r}",
                           "num_actions")
    if shape is None and (actions is not None or out["size"]):
        raise fields.error("is null while the buffer holds samples or a policy width",
                           "state_shape")
    out["num_actions"] = actions
    out["rng"] = fields.object("rng").data
    fields.exactly(["format", "capacity", "seed", "size", "next", "added", "state_shape",
                    "num_actions", "rng"])
    return out
