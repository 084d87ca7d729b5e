"""Checking where a run will write, before it runs: a typo costs a second, not the run.

``check_output_file`` and ``check_output_folder`` make the folder (and its parents),
write and remove a probe file in it, and then remove the folders they made, so that a
check leaves nothing behind. They raise ValueError with one sentence that names the flag,
its value, the path that is in the way and why (a file where a folder must be, a folder
where the file must be, no permission, a read-only or full disk).

Example:
    >>> import tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> check_output_file(os.path.join(root, "new", "r.png"), "--save_path")
    >>> os.path.exists(os.path.join(root, "new"))  # made, written, removed again
    False
    >>> open(os.path.join(root, "r.json"), "w").close()
    >>> check_output_folder(os.path.join(root, "r.json", "x"), "--save_dir")
    Traceback (most recent call last):
    ...
    ValueError: --save_dir=.../r.json/x cannot be written: .../r.json is a file, not a folder
"""

from __future__ import annotations

import errno
import os
import uuid
from typing import List

from async_search.files import special_file


def check_output_file(path: str, flag: str, *, value: str | None = None) -> None:
    """Raises ValueError unless ``path`` can be written: its folder can be made and
    written, and ``path`` is not a folder.

    Args:
        path: the file the run will write.
        flag: the flag that named it (``--save_path``), for the message.
        value: the flag's value as given, when ``path`` is derived from it (the JSON
            beside the plot); default ``path``.
    """
    shown = f"{flag}={path if value is None else value}"
    if not os.path.basename(path):
        raise ValueError(f"{shown} names a folder; it must name a file")
    head = os.path.basename(path).split(".", 1)[0]  # " ", " .png", " .tar.gz"
    if head and not head.strip():
        raise ValueError(f"{flag}={path if value is None else value!r} names a file of "
                         f"blanks; give it a name")
    if os.path.isdir(path):
        raise ValueError(f"{shown} cannot be written: {path} is a folder, not a file")
    if special_file(path):  # write_file refuses it too: a rename would replace it
        raise ValueError(f"{shown} cannot be written: {path} is not a regular file (a "
                         f"device, a pipe or a socket)")
    name_max = _name_max(os.path.dirname(path) or ".")
    if len(os.fsencode(os.path.basename(path))) > name_max:  # found after all the work
        raise ValueError(f"{shown} cannot be written: its file name is longer than the "
                         f"{name_max} bytes the file system allows")
    check_output_folder(os.path.dirname(path) or ".", flag, value=value or path)


def _name_max(folder: str) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or of the nearest
    folder above it that exists) allows; 255 where it does not say."""
    folder = os.path.abspath(folder)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_output_folder(folder: str, flag: str, *, value: str | None = None) -> None:
    """Raises ValueError unless ``folder`` can be made (with its parents) and written.

    The folders it makes to find out are removed again.
    """
    shown = f"{flag}={folder if value is None else value}"
    made: List[str] = []
    try:
        _make(folder, made, shown)
        probe = os.path.join(folder, f".write-check-{uuid.uuid4().hex[:12]}")
        try:
            with open(probe, "wb") as f:
                f.write(b"x")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise ValueError(f"{shown} cannot be written: cannot write in {folder} "
                             f"({_why(e)})") from None
        finally:
            try:
                os.remove(probe)
            except OSError:
                pass
    finally:
        for path in reversed(made):  # leave no trace: the run makes them when it writes
            try:
                os.rmdir(path)
            except OSError:
                pass


def _make(folder: str, made: List[str], shown: str) -> None:
    """Makes ``folder`` and its missing parents, recording each it made."""
    missing, path = [], os.path.abspath(folder)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{shown} cannot be written: {_in_the_way(path, folder)}")
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:  # made meanwhile by someone else
            if not os.path.isdir(path):
                raise ValueError(f"{shown} cannot be written: "
                                 f"{_in_the_way(path, folder)}") from None
            continue
        except OSError as e:
            raise ValueError(f"{shown} cannot be written: cannot make the folder {path} "
                             f"({_why(e)})") from None
        made.append(path)


def _in_the_way(path: str, folder: str) -> str:
    shown = path if os.path.isabs(folder) else os.path.relpath(path)
    what = "a file" if os.path.isfile(path) else "not a folder"
    return f"{shown} is {what}, not a folder" if what == "a file" else f"{shown} is {what}"


def _why(error: OSError) -> str:
    reason = error.strerror or str(error)
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{reason}: no permission"
    return reason
