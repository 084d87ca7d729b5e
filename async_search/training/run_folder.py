"""A training run's folder: one commit point per iteration, for every trainer.

Both trainers (the AlphaZero ``Commander`` and ``Davi``) keep their state here, the same
way. Each save writes a new *generation*, a folder holding everything the iteration
changed (checkpoints and replay buffers), in full and synced; then one atomic replace of
``state.json`` (the run's record: config, history, random state, and the name of its
generation) commits it; then the previous generation is removed. Killed at any instant,
the folder holds the last committed iteration whole: before the replace, ``state.json``
still names the previous generation, which is untouched; after it, the new one, which
is complete. What a killed save leaves behind (a partial generation, ``*.tmp-<pid>``
files) is removed when the next run starts.

Layout::

    state.json       the commit point: format, trainer, generation, the run's record
    gen-000012/      the generation state.json names: checkpoints/, buffers .npz
    best/            exports: copies of a committed checkpoint for load_checkpoint,
                     refreshed after each commit (never read back by the run)

Every file read back is checked (``async_search.schema``): a damaged one raises a
``CheckpointError`` that names it and what is wrong with it.

Example:
    >>> import tempfile
    >>> from async_search.training import NetConfig, initial_weights
    >>> config = NetConfig("heuristic", "sliding_puzzle", (8,), size=3)
    >>> run = RunFolder(tempfile.mkdtemp(), "davi")
    >>> run.commit({"rounds": 1}, checkpoints={
    ...     "latest": SavedNet(initial_weights(config, 0), config, {})})
    >>> saved = run.load()
    >>> saved.fields.int("rounds"), saved.checkpoint("latest").config == config
    (1, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any, Callable, Dict, Iterator, Mapping, Sequence

from async_search.checks import check_instance
from async_search.errors import CheckpointError, FileWriteError
from async_search.files import (folder_path, make_folder, remove_leftovers, remove_tree,
                                write_json)
from async_search.problems.checkpoints import (Checkpoint, as_written, read_checkpoint,
                                               save_checkpoint)
from async_search.schema import Fields, read_json
from async_search.training.replay import Augment, ReplayBuffer


FORMAT = "async_search.training_run/1"
STATE = "state.json"
#: The fields of ``state.json`` that the folder writes; the trainer's record has the rest.
ENVELOPE = ("format", "trainer", "generation", "checkpoints", "buffers")
_GENERATION = re.compile(r"^gen-(\d{6,})$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class SavedNet:
    """A net to save in a generation: what ``save_checkpoint`` takes."""

    model: Any
    """A model ``to_model`` made, or its ``(w, b)`` layers."""
    config: Any
    """Its ``NetConfig``."""
    metadata: Dict[str, Any]
    """JSON metadata for its ``config.json``."""


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """The last committed state of a run, as ``RunFolder.load`` read it."""

    fields: Fields
    """``state.json``'s fields, for the trainer to read with checks."""
    generation: str
    """The folder of the committed generation."""
    checkpoint_names: tuple
    buffer_names: tuple

    def checkpoint(self, name: str) -> Checkpoint:
        """The generation's checkpoint ``name``, checked (``CheckpointError``)."""
        if name not in self.checkpoint_names:
            raise self.fields.error(f"does not list the checkpoint {name!r}",
                                    "checkpoints")
        return read_checkpoint(os.path.join(self.generation, name))

    def buffer(self, name: str, *, augment: Augment | None = None) -> ReplayBuffer:
        """The generation's replay buffer ``name``, checked (``CheckpointError``)."""
        if name not in self.buffer_names:
            raise self.fields.error(f"does not list the buffer {name!r}", "buffers")
        return ReplayBuffer.load(os.path.join(self.generation, f"{name}.npz"),
                                 augment=augment)


class RunFolder:
    """The folder of one training run: commits, loads, and cleans up after a crash.

    Args:
        path: the folder (made at the first commit).
        trainer: which trainer's run this is (``"alphazero"``, ``"davi"``); a run of
            another trainer is refused at load.
    """

    def __init__(self, path: str | os.PathLike, trainer: str):
        self.path = folder_path(path)
        if not isinstance(trainer, str) or not _NAME.match(trainer):
            # (5 committed a run whose state no load could read back)
            raise ValueError(f"RunFolder trainer must be a name (letters, digits, _), got "
                             f"{trainer!r}")
        self.trainer = trainer
        self.state_file = os.path.join(self.path, STATE)
        self._generation: int | None = None  # the committed one, once known

    def __repr__(self) -> str:
        return f"RunFolder({self.path!r}, {self.trainer!r})"

    def exists(self) -> bool:
        """Whether a run was committed here (``state.json`` exists)."""
        return os.path.isfile(self.state_file)

    # -- writing ------------------------------------------------------------------------

    def commit(self, record: Mapping[str, Any], *,
               checkpoints: Mapping[str, SavedNet] | None = None,
               buffers: Mapping[str, ReplayBuffer] | None = None,
               exports: Sequence[str] = ()) -> None:
        """Saves one iteration: a new generation with ``checkpoints`` (folders) and
        ``buffers`` (``<name>.npz``), then ``state.json`` (``record`` and the envelope)
        in one atomic replace, then removes the previous generation and refreshes the
        ``exports`` (names of ``checkpoints`` copied to the run's folder).

        Raises:
            FileWriteError: naming the file that could not be written; before the
                commit point the previous iteration is still the state on disk, whole
                (after it, only an export failed: the next start refreshes it).
            TypeError, ValueError: a record that is not JSON (NaN and infinities, which
                strict JSON readers refuse, and two keys written as one, ``1`` and
                ``"1"``, included), or a name that cannot be a file; nothing is written
                then.
        """
        checkpoints = dict(checkpoints or {})
        buffers = dict(buffers or {})
        if isinstance(exports, (str, bytes)):  # read letter by letter otherwise
            raise ValueError(f"RunFolder.commit: exports is a sequence of names "
                             f"([{exports!r}] for one), got {exports!r}")
        for name in (*checkpoints, *buffers, *exports):
            if not isinstance(name, str) or not _NAME.match(name) or name in ("state",):
                raise ValueError(f"RunFolder.commit: {name!r} cannot name a checkpoint, "
                                 f"a buffer or an export (letters, digits, _)")
        clash = sorted(set(record) & set(ENVELOPE))
        if clash:
            raise ValueError(f"RunFolder.commit: the record may not use the fields "
                             f"{clash}: the folder writes them")
        for kind, values, example in (("checkpoints", checkpoints.values(), SavedNet),
                                      ("buffers", buffers.values(), ReplayBuffer)):
            for value in values:  # before the generation folder is made
                check_instance(f"RunFolder.commit: each of {kind}", value, example,
                               f"{example.__name__}(...)")
        unknown = sorted(set(exports) - set(checkpoints))
        if unknown:
            raise ValueError(f"RunFolder.commit: exports {unknown} are not checkpoints "
                             f"of this commit")
        current = self._current()
        number = max([current if current is not None else -1, *self._generations()]) + 1
        generation = self._generation_path(number)
        state = {"format": FORMAT, "trainer": self.trainer,
                 "generation": os.path.basename(generation),
                 "checkpoints": sorted(checkpoints), "buffers": sorted(buffers),
                 **record}
        try:  # not JSON (NaN and infinities, keys written twice: what load refuses):
            as_written(state)  # refused before the disk is touched
        except ValueError as e:
            raise ValueError(f"RunFolder.commit: the record must be JSON (strings, "
                             f"finite numbers, lists, dicts): {e}") from e
        make_folder(self.path)
        make_folder(generation)  # numbered past every one there, partial ones included
        for name, net in checkpoints.items():
            save_checkpoint(os.path.join(generation, name), net.model, net.config,
                            net.metadata)
        for name, buffer in buffers.items():
            buffer.save(os.path.join(generation, f"{name}.npz"))
        write_json(self.state_file, state, allow_nan=False)  # the commit point
        self._generation = number
        for old in self._generations():  # the previous one, and any a crash left
            if old != number:
                remove_tree(self._generation_path(old))
        for name in exports:
            net = checkpoints[name]
            save_checkpoint(os.path.join(self.path, name), net.model, net.config,
                            net.metadata)

    def clean(self) -> list:
        """Removes what interrupted saves left: ``*.tmp-<pid>`` and ``*.old-<pid>``
        entries of processes that are gone, and generations that ``state.json`` does not
        name. With no readable ``state.json`` no generation is removed (a damaged file
        is reported at load, not answered by deleting). Returns the names removed."""
        removed = remove_leftovers(self.path)
        current = self._current()
        if current is not None:
            for number in self._generations():
                if number != current:
                    remove_tree(self._generation_path(number))
                    removed.append(os.path.basename(self._generation_path(number)))
        return removed

    def export(self, name: str, checkpoint: Checkpoint) -> None:
        """Copies a loaded checkpoint to the run's folder as ``name`` (refreshing an
        export that a save killed after its commit left stale)."""
        save_checkpoint(os.path.join(self.path, name), checkpoint.weights,
                        checkpoint.config, checkpoint.metadata)

    # -- reading ------------------------------------------------------------------------

    def load(self) -> SavedRun:
        """The last committed state: ``state.json`` checked (format, trainer, the
        generation it names and what that holds); the trainer reads its record from
        ``fields``, its nets and buffers with ``checkpoint`` and ``buffer``.

        Raises:
            CheckpointError: naming the file and what is wrong with it.
        """
        data = read_json(self.state_file)
        fields = Fields(data, self.state_file)
        got = data.get("format")
        if got != FORMAT:
            hint = (" (written by an older version of async_search, which had no commit "
                    "point; start a new run)" if got is None and "history" in data else "")
            raise CheckpointError(f"{self.state_file!r} has format {got!r}, expected "
                                  f"{FORMAT!r}{hint}")
        fields.str("trainer", choices=[self.trainer])
        name = fields.str("generation", pattern=_GENERATION.pattern)
        names = {}
        for kind in ("checkpoints", "buffers"):
            names[kind] = fields.list(kind)
            if not all(isinstance(n, str) and _NAME.match(n) for n in names[kind]):
                raise fields.error(f"must be a list of names, got {names[kind]!r}", kind)
        generation = os.path.join(self.path, name)
        if not os.path.isdir(generation):
            raise CheckpointError(f"{self.state_file!r} names the generation {name!r}, "
                                  f"but {generation!r} is missing")
        self._generation = int(_GENERATION.match(name)[1])
        return SavedRun(fields, generation, tuple(names["checkpoints"]),
                        tuple(names["buffers"]))

    # -- helpers ------------------------------------------------------------------------

    def _generation_path(self, number: int) -> str:
        return os.path.join(self.path, f"gen-{number:06d}")

    def _generations(self) -> list:
        try:
            names = os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m[1]) for m in map(_GENERATION.match, names) if m)

    def _current(self) -> int | None:
        """The committed generation's number; None when none can be read."""
        if self._generation is not None:
            return self._generation
        try:
            data = read_json(self.state_file)
            match = _GENERATION.match(data.get("generation", ""))
        except (CheckpointError, AttributeError, TypeError):
            return None
        return int(match[1]) if match and data.get("format") == FORMAT else None


#: The file that a run holds locked in its folder while it runs (``held``).
LOCK = ".lock"


class RunFolderBusyError(ValueError):
    """Another process holds the run folder (``held``): two runs into one folder would
    remove each other's saves in progress and interleave their iterations."""


@contextlib.contextmanager
def held(path: str | os.PathLike) -> Iterator[str]:
    """Holds the run folder ``path`` (made if missing) for this process until the block
    ends, by an advisory lock on its ``.lock`` file that the system lets go of when the
    process ends, however it ends. Yields the folder's path.

    Raises:
        RunFolderBusyError: another process holds it (the message gives its pid).
        FileWriteError: its ``.lock`` cannot be opened for writing (a folder in its
            place, a read-only disk).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with held(folder):
        ...     try:
        ...         with held(folder):    # a second run, here in the same process
        ...             pass
        ...     except RunFolderBusyError:
        ...         print("busy")
        busy
    """
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows): nothing is held
        yield folder_path(path)
        return
    folder = make_folder(path)
    lock = os.path.join(folder, LOCK)

    def unusable(e: OSError) -> FileWriteError:  # a folder or FIFO in its place, a
        # read-only or full disk, a file-size limit
        return FileWriteError(f"cannot lock the run folder: {lock!r} cannot be written "
                              f"({e.strerror or e})", e.errno, lock)

    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise unusable(e) from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise RunFolderBusyError(
                f"{folder!r} is in use by another run (pid {holder}): two runs into one "
                f"folder would undo each other's saves; give this one its own folder "
                f"(--save_dir), or wait for that one to end") from None
        except OSError as e:  # no locks on this file (a FIFO, some network disks)
            raise unusable(e) from e
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as e:
            raise unusable(e) from e
        yield folder
    finally:
        os.close(fd)  # lets go of the lock


def resume_folder(save_dir: str | os.PathLike | None, trainer: str) -> RunFolder:
    """The folder of the run of ``trainer`` saved in ``save_dir``, to resume it.

    Raises:
        ValueError: ``save_dir`` is None or holds no committed run (``state.json`` is
            missing).
    """
    if save_dir is not None:
        folder = RunFolder(save_dir, trainer)
        if folder.exists():
            return folder
        if os.path.lexists(folder.state_file):  # a folder, a link to nothing...
            raise ValueError(f"cannot resume: {folder.state_file!r} is not a file")
    raise ValueError(f"cannot resume: no saved run in {save_dir!r} (state.json "
                     f"is missing); start without resume")


def check_same_config(stored: Any, config: Any, free: str,
                      to_json: Callable[[Any], Dict[str, Any]], folder: RunFolder) -> None:
    """Refuses to resume the run in ``folder``, saved with the config ``stored``, with a
    ``config`` that differs from it in more than the field ``free`` (the run's length).

    Args:
        stored, config: dataclasses of one type, the saved run's and the new one.
        free: the field that may change.
        to_json: the config as a dict, whose keys name the fields that differ.
        folder: the run's folder, named in the error.

    Raises:
        ValueError: naming the fields that differ.
    """
    if dataclasses.replace(stored, **{free: getattr(config, free)}) != config:
        old, new = to_json(stored), to_json(config)
        differ = [k for k in old if k != free and old[k] != new[k]]
        raise ValueError(f"cannot resume {folder.path!r} with other parameters "
                         f"({', '.join(differ)} differ from the saved run); only "
                         f"{free} may change")
