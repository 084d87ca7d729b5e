"""One way to write a file: whole or not at all, with an error that names it.

Every file async_search writes (checkpoints, replay buffers, a training run's state,
results JSON, plots) goes through ``write_file``. The content goes to a temporary file in
the same folder (``<name>.tmp-<pid>``), is synced to the disk, and is renamed over the
name in one atomic step; then the folder is synced, so that the rename survives a power
cut too. Until the rename the previous file is untouched; after it the new one is whole.
On any failure (a full disk, a file-size limit, no permission, an exception from the
caller's writer) the temporary is removed, and an ``OSError`` becomes a
``FileWriteError`` that names the file and the operation that failed, with the cause's
errno.

A process killed mid-write leaves its temporary behind; ``remove_leftovers`` (run when a
training run starts) removes those of processes that are gone.

Example:
    >>> import json, os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = write_json(os.path.join(folder, "r.json"), {"solved": 3})
    >>> json.load(open(path)), os.listdir(folder)
    ({'solved': 3}, ['r.json'])
"""

from __future__ import annotations

import errno as errno_codes
import io
import json
import os
import re
import shutil
from typing import Any, BinaryIO, Callable, Union

from async_search.errors import FileWriteError


#: What ``write_file`` writes: bytes, text (UTF-8), or a function that writes into the
#: open binary file it is given (``np.savez``, ``fig.savefig``, ...).
Content = Union[bytes, bytearray, memoryview, str, Callable[[BinaryIO], Any]]

#: ``<name>.tmp-<pid>`` and ``<name>.old-<pid>``: what an interrupted save leaves behind.
_LEFTOVER = re.compile(r"^(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)$")


def folder_path(path: str | os.PathLike) -> str:
    """``path`` without trailing separators (``"runs/ckpt/"`` names ``"runs/ckpt"``);
    the root stays the root."""
    path = os.fspath(path)
    stripped = path.rstrip("/" + (os.sep if os.sep != "/" else ""))
    return stripped or path[:1]


def _failure(path: str, operation: str, error: BaseException, *,
             replaced: bool = False) -> FileWriteError:
    code = getattr(error, "errno", None)
    reason = os.strerror(code) if isinstance(code, int) else str(error)
    if code in (errno_codes.EFBIG, errno_codes.ENOSPC, errno_codes.EDQUOT):
        reason += " (the disk, a quota or a file-size limit is full)"
    message = f"cannot write {path!r}: {operation} failed: {reason}"
    detail = getattr(error, "filename", None)
    if detail and os.fspath(detail) != path and os.fspath(detail) not in message:
        message += f" ({os.fspath(detail)!r})"
    outcome = ("the new file is in place, but a power cut could still lose the rename"
               if replaced else "the file that was there is unchanged")
    return FileWriteError(f"{message}; {outcome}", code, path)


_CHUNK = 1 << 20  # small writes are gathered up to this many bytes


class _File(io.RawIOBase):
    """The temporary, as the binary file a writer function is given. Small writes (a
    zip header, a JSON line) are gathered and go out in one ``os.write``; large ones go
    out as they come. ``os.write`` is looked up at each call, so a test can wrap it to
    count or fail writes. Nothing is flushed when it is collected: ``finish`` is the
    only way out, so a failed write never reaches the descriptor later."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _write_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._fd, view):]

    def finish(self) -> None:
        """Writes what was gathered."""
        if self._pending:
            pending, self._pending = self._pending, bytearray()
            self._write_all(pending)

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if len(self._pending) + size <= _CHUNK:
            self._pending += data
        else:
            self.finish()
            if size >= _CHUNK:
                self._write_all(data)
            else:
                self._pending += data
        return size

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.finish()
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR) + len(self._pending)

    def truncate(self, size: int | None = None) -> int:
        self.finish()
        size = self.tell() if size is None else size
        os.ftruncate(self._fd, size)
        return size

    def flush(self) -> None:
        pass  # finish() writes; a flush from the writer may come before all is known

    def fileno(self) -> int:
        return self._fd


def _write_content(fd: int, content: Content) -> None:
    f = _File(fd)
    if callable(content):
        content(f)
    else:
        f.write(content.encode() if isinstance(content, str) else content)
    f.finish()


def write_file(path: str | os.PathLike, content: Content) -> str:
    """Writes ``content`` to ``path`` atomically (a temporary in the same folder, synced,
    renamed over ``path``, the folder synced); makes missing folders. Returns ``path``.

    Raises:
        FileWriteError: naming ``path`` and the failed operation (the cause's errno
            kept); ``path`` is as it was and no temporary is left.
        Exception: what ``content`` raised when it is a function (nothing is left then
            either).

    Example:
        >>> import tempfile, numpy as np
        >>> path = write_file(tempfile.mkdtemp() + "/a.npz", lambda f: np.savez(f, x=[1]))
        >>> np.load(path)["x"]
        array([1])
    """
    path = os.fspath(path)
    if not path or path.endswith(("/", os.sep)):
        raise FileWriteError(f"cannot write {path!r}: a file name cannot end with a "
                             f"separator (it names a folder)", errno_codes.EISDIR, path)
    folder = os.path.dirname(os.path.abspath(path))
    make_folder(folder)
    tmp = f"{path}.tmp-{os.getpid()}"
    operation = f"creating the temporary {tmp!r}"
    fd = -1
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, 0o666)
        operation = f"writing the temporary {tmp!r}"
        _write_content(fd, content)
        operation = f"syncing the temporary {tmp!r}"
        os.fsync(fd)
        operation = f"closing the temporary {tmp!r}"
        fd, closing = -1, fd
        os.close(closing)
        operation = f"renaming {tmp!r} over it"
        os.replace(tmp, path)
        tmp = None
        operation = f"syncing its folder {folder!r}"
        _sync_folder(folder)
    except BaseException as e:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and not isinstance(e, FileWriteError):
            raise _failure(path, operation, e, replaced=tmp is None) from e
        raise
    return path


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 1,
               default: Callable[[Any], Any] | None = None, allow_nan: bool = True,
               sort_keys: bool = False) -> str:
    """``write_file`` of ``data`` as JSON (a final newline); the text is made before the
    disk is touched, so data that is not JSON raises ``TypeError`` or ``ValueError``
    with the previous file unchanged. Returns ``path``."""
    text = json.dumps(data, indent=indent, default=default, allow_nan=allow_nan,
                      sort_keys=sort_keys) + "\n"
    return write_file(path, text)


def sync_folder(path: str | os.PathLike) -> None:
    """Syncs a folder's entries (a rename or a new file in it) to the disk.

    Raises:
        FileWriteError: naming the folder.
    """
    path = os.fspath(path)
    try:
        _sync_folder(path)
    except OSError as e:
        raise _failure(path, "syncing the folder", e) from e


def _sync_folder(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno_codes.EINVAL, errno_codes.ENOTSUP):  # fs without it
            raise
    finally:
        os.close(fd)


def make_folder(path: str | os.PathLike) -> str:
    """Makes ``path`` and its missing parents (each new one synced into its parent);
    returns it without trailing separators.

    Raises:
        FileWriteError: naming the folder, e.g. when a file stands where it should be.
    """
    path = folder_path(path)
    if os.path.isdir(path):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    if parent != os.path.abspath(path):
        make_folder(parent)
    try:
        os.mkdir(path)
    except FileExistsError as e:
        if not os.path.isdir(path):
            raise _failure(path, "making the folder (a file has its name)", e) from e
        return path
    except OSError as e:
        raise _failure(path, "making the folder", e) from e
    sync_folder(parent)
    return path


def remove_tree(path: str | os.PathLike) -> None:
    """Removes a file or a folder and everything in it; nothing if it is absent.

    Raises:
        FileWriteError: naming what could not be removed.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _failure(path, "removing it", e) from e


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False  # never a process (0 and -n would name process groups)
    if pid == os.getpid():
        return False  # ours, from before: a pid reused, nothing of ours is in progress
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or never a process id
        return False
    except OSError:  # exists, another user's
        return True
    return True


def is_leftover(name: str) -> bool:
    """Whether ``name`` is what an interrupted write left behind (``*.tmp-<pid>`` or
    ``*.old-<pid>``) by a process that is gone (or by this one, from before)."""
    match = _LEFTOVER.match(name)
    return bool(match) and not _alive(int(match["pid"]))


def remove_leftovers(folder: str | os.PathLike) -> list:
    """Removes from ``folder`` (not below it) the ``*.tmp-<pid>`` and ``*.old-<pid>``
    files and folders of writes that were interrupted (their process is gone). Returns
    the names removed; nothing when the folder does not exist.

    Raises:
        FileWriteError: naming what could not be removed.
    """
    folder = os.fspath(folder)
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = [name for name in names if is_leftover(name)]
    for name in removed:
        remove_tree(os.path.join(folder, name))
    if removed:
        sync_folder(folder)
    return removed
