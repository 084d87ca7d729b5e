"""One way to write a file: whole or not at all, with an error that names it.

Every file async_search writes (checkpoints, replay buffers, a training run's state,
results JSON, plots) goes through ``write_file``. The content goes to a temporary file in
the same folder (``<name>.tmp-<pid>-<n>``, its own for each write), is
synced to the disk, and is renamed over the name in one atomic step; then the folder is
synced, so that the rename survives a power cut too. Until the rename the previous file
is untouched; after it the new one is whole.
On any failure (a full disk, a file-size limit, no permission, an exception from the
caller's writer) the temporary is removed, and an ``OSError`` becomes a
``FileWriteError`` that names the file and the operation that failed, with the cause's
errno.

A process killed mid-write leaves its temporary behind; ``remove_leftovers`` (run when a
training run starts) removes those of processes that are gone, never one that a thread of
this process is writing.

``folder_lock`` makes writers of one folder take turns, across threads and processes
(``save_checkpoint`` holds it from its first write to its last delete).

Example:
    >>> import json, os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = write_json(os.path.join(folder, "r.json"), {"solved": 3})
    >>> json.load(open(path)), os.listdir(folder)
    ({'solved': 3}, ['r.json'])
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import io
import itertools
import json
import os
import re
import shutil
import stat
import threading
from typing import Any, BinaryIO, Callable, Iterator, Union

try:
    import fcntl
except ImportError:  # not POSIX: folder_lock orders the threads of one process only
    fcntl = None

from async_search.errors import FileWriteError


#: What ``write_file`` writes: bytes, text (UTF-8), or a function that writes into the
#: open binary file it is given (``np.savez``, ``fig.savefig``, ...).
Content = Union[bytes, bytearray, memoryview, str, Callable[[BinaryIO], Any]]

#: ``<name>.tmp-<pid>[-<n>]`` and ``<name>.old-<pid>``: what an interrupted save leaves
#: behind (the bare ``-<pid>`` from older versions).
_LEFTOVER = re.compile(r"^(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)(?:-\d+)?$")

#: Numbers this process's writes in turn: a temporary's name is its own, and short (a
#: long name plus the suffix must stay within the file system's 255 bytes).
_WRITES = itertools.count()

#: The names of the temporaries this process's threads are writing now: the pid in a
#: name cannot tell them from those a killed process with this pid left.
_WRITING: set = set()

#: The file ``folder_lock`` locks in the folder; there only while it is held (or after
#: a process was killed holding it: the next holder takes it over).
LOCK = ".lock"


def folder_path(path: str | os.PathLike) -> str:
    """``path`` without trailing separators (``"runs/ckpt/"`` names ``"runs/ckpt"``);
    the root stays the root."""
    path = os.fspath(path)
    stripped = path.rstrip("/" + (os.sep if os.sep != "/" else ""))
    return stripped or path[:1]


def _failure(path: str, operation: str, error: BaseException, *,
             replaced: bool = False) -> FileWriteError:
    code, reason = _errno_reason(error)
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


def special_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is there and is neither a regular file nor a folder (a link is
    followed): ``/dev/null``, a FIFO, a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (or a dangling link): a file will be made
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def read_file(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (a link is followed), which must hold at
    most ``limit`` of them: a FIFO would block the read for good and ``/dev/zero``
    would fill the memory, so neither is opened.

    Raises:
        FileNotFoundError: nothing there.
        ValueError: not a regular file, or larger than ``limit`` bytes.
        OSError: it cannot be read.
    """
    # Looked at before it is opened (opening some devices does something), and again
    # once open (it may have been replaced meanwhile).
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(_NOT_REGULAR)
    with open(path, "rb", opener=_regular_file_opener) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ValueError(f"it holds {size:,} bytes, more than the {limit:,} such a "
                             f"file may")
        # In chunks, to the end (read(n) sets n bytes aside first; a file of /proc
        # says 0 bytes and holds some; one may grow while it is read): never past limit.
        chunks, total, want = [], 0, size + 1
        while True:
            asked = min(want, limit + 1 - total)
            chunk = f.read(asked)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"it holds more than the {limit:,} bytes such a file "
                                 f"may")
            if len(chunk) < asked:  # the end
                return b"".join(chunks)
            want = _READ_CHUNK


_NOT_REGULAR = "it is not a regular file (a FIFO, a device, a folder?)"
_READ_CHUNK = 1 << 16  # past what the size said


def _regular_file_opener(path: str, flags: int) -> int:
    """``os.open``, refusing what is not a regular file before it can block: a FIFO is
    opened without waiting for a writer, then refused."""
    fd = os.open(path, flags | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(_NOT_REGULAR)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


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
    if special_file(path):  # a rename would replace the device or pipe itself
        raise FileWriteError(f"cannot write {path!r}: it is not a regular file (a "
                             f"device, a pipe or a socket); name a file",
                             errno_codes.EINVAL, path)
    folder = os.path.dirname(os.path.abspath(path))
    make_folder(folder)
    # Its own for each write: two threads of a process writing one name would truncate
    # and rename each other's temporary under a name made of the pid alone.
    tmp = _beside(path, f".tmp-{os.getpid()}-{next(_WRITES)}")
    writing = os.path.basename(tmp)
    _WRITING.add(writing)  # before it exists: a cleanup never takes it for a leftover
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
    finally:
        _WRITING.discard(writing)
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
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or never a process id
        return False
    except OSError:  # exists, another user's
        return True
    return True


def _beside(path: str, suffix: str) -> str:
    """``path + suffix``, its file name cut to fit the file system's 255 bytes: a legal
    name of 250 bytes must still get a temporary (the suffix keeps it unique)."""
    folder, name = os.path.split(path)
    room = 255 - len(suffix.encode())
    encoded = os.fsencode(name)
    if len(encoded) > room:  # cut on bytes; a character cut in half is dropped
        name = encoded[:room].decode(errors="ignore")
    return os.path.join(folder, name + suffix)


def is_leftover(name: str) -> bool:
    """Whether ``name`` is what an interrupted write left behind (``*.tmp-<pid>...`` or
    ``*.old-<pid>``) by a process that is gone, or with this process's pid but written
    by none of its threads now (a killed process's, whose pid this one reuses)."""
    match = _LEFTOVER.match(name)
    if not match:
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return name not in _WRITING
    return not _alive(pid)


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


_locks_guard = threading.Lock()
#: folder -> [its lock for this process's threads (re-entrant), threads using it, how
#: deep its holder has entered it]
_locks: dict = {}


def _forget_locks() -> None:
    # A forked child has only the thread that forked: a lock another thread held at
    # the fork would stay held in the child for good.
    global _locks_guard
    _locks_guard = threading.Lock()
    _locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks)


@contextlib.contextmanager
def folder_lock(path: str | os.PathLike) -> Iterator[None]:
    """Holds the folder ``path``'s lock while the block runs: blocks of one folder run
    one at a time, in the threads of a process and across processes (an exclusive
    ``fcntl.flock`` on ``<path>/.lock``, which is removed as the lock is let go; a
    process killed holding it lets go too). The folder must exist. Readers need not
    take it. Without ``fcntl`` (not POSIX) only this process's threads take turns; on a
    file system without locks the process's threads still do.

    A thread may enter it again inside its block (``save_checkpoint`` within it): only
    the outermost entry locks and unlocks the file. A process forked inside the block
    does not let go of its parent's lock when it leaves the block.

    Raises:
        FileWriteError: naming the lock file when it cannot be made.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with folder_lock(folder):
        ...     os.listdir(folder)
        ['.lock']
        >>> os.listdir(folder)
        []
    """
    path = folder_path(path)
    key = os.path.normcase(os.path.realpath(path))
    with _locks_guard:
        entry = _locks.setdefault(key, [threading.RLock(), 0, 0])
        entry[1] += 1
    try:
        with entry[0]:  # flock may order only processes, or be missing
            outermost = entry[2] == 0
            fd = _lock_file(path) if outermost and fcntl is not None else -1
            holder = os.getpid()
            entry[2] += 1
            try:
                yield
            finally:
                entry[2] -= 1
                if fd >= 0:
                    if os.getpid() == holder:
                        _unlock_file(path, fd)
                    else:  # a child forked in the block: the lock stays its parent's
                        os.close(fd)
    finally:
        with _locks_guard:
            entry[1] -= 1
            if not entry[1] and _locks.get(key) is entry:
                del _locks[key]


def _lock_file(path: str) -> int:
    """The open lock file of folder ``path``, locked; -1 if its file system has no
    locks."""
    lock = os.path.join(path, LOCK)
    while True:
        try:
            # Read-only: flock needs no more, and another user's lock file (0644) opens.
            flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(lock, flags, 0o666)
        except OSError as e:
            raise _lock_failure(lock, "making", e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder before removed it as it let go: then lock the file there now.
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                return fd
        except FileNotFoundError:
            pass
        except OSError as e:
            os.close(fd)
            if e.errno in (errno_codes.ENOLCK, errno_codes.ENOTSUP,
                           errno_codes.EOPNOTSUPP):  # a file system without locks
                _unlink_lock(path)
                return -1
            raise _lock_failure(lock, "locking", e) from e
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _errno_reason(error: BaseException) -> tuple:
    """``(errno or None, the reason in words)`` of a failed operation."""
    code = getattr(error, "errno", None)
    return code, os.strerror(code) if isinstance(code, int) else str(error)


def _lock_failure(lock: str, doing: str, error: OSError) -> FileWriteError:
    code, reason = _errno_reason(error)
    return FileWriteError(f"cannot lock the folder with {lock!r}: {doing} the lock file "
                          f"failed: {reason}; nothing was written", code, lock)


def _unlink_lock(path: str) -> None:
    try:
        os.unlink(os.path.join(path, LOCK))
    except OSError:
        pass  # left: the next holder locks it as it is


def _unlock_file(path: str, fd: int) -> None:
    _unlink_lock(path)  # while held: the next holder makes its own (see _lock_file)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)  # a forked child may share the open file
    finally:
        os.close(fd)
