"""One way to write a file: whole or not at all, an error that names the file, nothing
left behind."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from async_search.errors import FileWriteError
from async_search.files import (LOCK, folder_lock, folder_path, make_folder,
                                remove_leftovers, remove_tree, sync_folder, write_file,
                                write_json)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def names(folder):
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("content, expected", [
    (b"bytes", b"bytes"), ("text \u00e9", "text \u00e9".encode()),
    (bytearray(b"ba"), b"ba"), (memoryview(b"mv"), b"mv"),
    (lambda f: (f.write(b"a"), f.write(b"b")), b"ab"),
])
def test_a_file_is_written_whole_and_nothing_else_is_left(tmp_path, content, expected):
    path = write_file(tmp_path / "deep" / "er" / "f.bin", content)
    assert path == str(tmp_path / "deep" / "er" / "f.bin")
    assert open(path, "rb").read() == expected
    assert names(tmp_path / "deep" / "er") == ["f.bin"]


def test_a_writer_that_seeks_and_writes_much_round_trips(tmp_path):
    big = np.arange(600_000, dtype=np.float64)  # 4.8 MB: past the gathering of writes
    path = write_file(tmp_path / "a.npz", lambda f: np.savez(f, big=big, small=big[:3]))
    with np.load(path) as data:
        np.testing.assert_array_equal(data["big"], big)
        np.testing.assert_array_equal(data["small"], big[:3])


def test_writing_over_a_file_replaces_it(tmp_path):
    write_file(tmp_path / "f", b"old")
    write_file(tmp_path / "f", b"new")
    assert (tmp_path / "f").read_bytes() == b"new" and names(tmp_path) == ["f"]


def test_a_writer_that_raises_leaves_the_previous_file_and_no_temporary(tmp_path):
    write_file(tmp_path / "f", b"old")

    def half(f):
        f.write(b"half of it")
        raise ValueError("the writer failed")

    with pytest.raises(ValueError, match="the writer failed"):
        write_file(tmp_path / "f", half)
    assert (tmp_path / "f").read_bytes() == b"old" and names(tmp_path) == ["f"]

    def interrupted(f):
        f.write(b"x" * (3 << 20))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file(tmp_path / "f", interrupted)
    assert (tmp_path / "f").read_bytes() == b"old" and names(tmp_path) == ["f"]


def test_json_that_cannot_be_written_is_refused_before_the_disk_is_touched(tmp_path):
    write_json(tmp_path / "r.json", {"a": 1})
    with pytest.raises(TypeError):
        write_json(tmp_path / "r.json", {"a": object()})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert names(tmp_path) == ["r.json"]
    write_json(tmp_path / "n.json", {"x": float("nan")})  # as json.dump wrote it
    with pytest.raises(ValueError):
        write_json(tmp_path / "n.json", {"x": float("nan")}, allow_nan=False)


def test_a_path_ending_with_a_separator_is_refused_naming_it(tmp_path):
    with pytest.raises(FileWriteError, match="names a folder") as info:
        write_file(f"{tmp_path}{os.sep}r.json{os.sep}", b"x")
    assert info.value.errno == errno.EISDIR and "r.json" in str(info.value)
    assert names(tmp_path) == []


def test_a_file_in_the_way_of_a_folder_is_named(tmp_path):
    (tmp_path / "results").write_text("a file")
    with pytest.raises(FileWriteError) as info:
        write_file(tmp_path / "results" / "r.json", b"x")
    assert isinstance(info.value, OSError) and info.value.errno == errno.EEXIST
    assert f"{tmp_path / 'results'}" in str(info.value) and "a file has its name" in str(
        info.value)
    assert (tmp_path / "results").read_text() == "a file"


def test_a_folder_in_the_way_of_a_file_is_named_and_left_alone(tmp_path):
    (tmp_path / "r.json").mkdir()
    with pytest.raises(FileWriteError) as info:
        write_file(tmp_path / "r.json", b"x")
    assert str(tmp_path / "r.json") in str(info.value) and "renaming" in str(info.value)
    assert names(tmp_path) == ["r.json"] and os.path.isdir(tmp_path / "r.json")


def run_with_file_size_limit(code: str, limit: int) -> str:
    script = (f"import resource, signal, sys\nsys.path.insert(0, {ROOT!r})\n"
              f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
              f"try:\n" + "".join(f"    {line}\n" for line in code.strip().splitlines())
              + "except OSError as e:\n    print(type(e).__name__, e.errno, e.filename, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("content", ["b'x' * 5000", "lambda f: np.savez(f, x=np.ones(999))"])
def test_a_full_disk_names_the_file_keeps_the_previous_one_and_leaves_no_temporary(
        tmp_path, content):
    path = tmp_path / "r.json"
    path.write_bytes(b'{"previous": true}')
    out = run_with_file_size_limit(f"""
import numpy as np
from async_search.files import write_file
write_file({str(path)!r}, {content})
""", limit=1000)
    assert out.startswith(f"FileWriteError 27 {path} cannot write '{path}'"), out
    assert "writing the temporary" in out and "File too large" in out
    assert "the file that was there is unchanged" in out
    assert path.read_bytes() == b'{"previous": true}' and names(tmp_path) == ["r.json"]


def test_the_error_is_an_os_error_that_keeps_its_errno_and_pickles():
    error = FileWriteError("cannot write 'x': writing failed", errno.ENOSPC, "x")
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.errno, again.filename) == (
        FileWriteError, str(error), errno.ENOSPC, "x")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_leftovers_of_gone_processes_are_removed_and_nothing_else(tmp_path):
    dead = _dead_pid()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in (f"a.json.tmp-{dead}", f"best.old-{dead}", f"ours.tmp-{os.getpid()}",
                     f"busy.tmp-{alive.pid}", "state.json", "tmp-3", "x.tmp-abc",
                     "huge.tmp-99999999999999999999", "zero.old-0"):
            (tmp_path / name).write_text("")
        (tmp_path / f"ckpt.tmp-{dead}").mkdir()
        (tmp_path / f"ckpt.tmp-{dead}" / "weights.npz").write_text("")
        removed = remove_leftovers(tmp_path)
        assert sorted(removed) == sorted([f"a.json.tmp-{dead}", f"best.old-{dead}",
                                          f"ours.tmp-{os.getpid()}", f"ckpt.tmp-{dead}",
                                          "huge.tmp-99999999999999999999", "zero.old-0"])
        assert names(tmp_path) == sorted([f"busy.tmp-{alive.pid}", "state.json", "tmp-3",
                                          "x.tmp-abc"])
    finally:
        alive.kill()
        alive.wait()
    assert remove_leftovers(tmp_path / "absent") == []


# -- threads and processes at once -------------------------------------------------------


class PausedWrite:
    """``write_file(path, ...)`` in a thread, paused half-way through its temporary
    until ``resume``; ``error`` is what it raised."""

    def __init__(self, path, first=b"first " * 1000, rest=b"end"):
        self.half, self.go, self.error = threading.Event(), threading.Event(), None
        self.content = first + rest

        def content(f):
            f.write(first)
            f.finish()  # on the disk, in the temporary
            self.half.set()
            if not self.go.wait(30):
                raise TimeoutError("never resumed")
            f.write(rest)

        def run():
            try:
                write_file(path, content)
            except BaseException as e:  # noqa: BLE001 - the test reads it
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.half.wait(30), "the write never started"

    def resume(self):
        self.go.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the write never finished"


def test_threads_writing_one_file_at_once_each_have_their_own_temporary(tmp_path):
    # One name per process: the second write truncated the first's temporary and
    # renamed it away, and the first failed to rename it (FileWriteError).
    path = tmp_path / "f"
    paused = PausedWrite(path)
    [temporary] = [n for n in names(tmp_path) if n.startswith("f.tmp-")]
    assert re.fullmatch(rf"f\.tmp-{os.getpid()}-\d+", temporary)
    write_file(path, b"second")  # meanwhile, in this thread
    assert path.read_bytes() == b"second" and temporary in names(tmp_path)
    paused.resume()
    assert paused.error is None
    assert path.read_bytes() == paused.content and names(tmp_path) == ["f"]


def test_a_temporary_another_thread_is_writing_is_no_leftover(tmp_path):
    # The pid in its name is this process's: it was taken for one a killed process
    # with the same pid left, removed, and the write failed at its rename.
    path = tmp_path / "state.json"
    left = [f"a.json.tmp-{_dead_pid()}-7", f"ours.tmp-{os.getpid()}-7"]
    for name in left:
        (tmp_path / name).write_text("")
    paused = PausedWrite(path)
    assert sorted(remove_leftovers(tmp_path)) == sorted(left)
    assert len(names(tmp_path)) == 1  # the paused write's temporary
    paused.resume()
    assert paused.error is None
    assert path.read_bytes() == paused.content and names(tmp_path) == ["state.json"]


HOLD_LOCK = """
import sys
sys.path.insert(0, sys.argv[1])
from async_search.files import folder_lock
with folder_lock(sys.argv[2]):
    open(sys.argv[3], "w").close()
    sys.stdin.read()  # until the test closes it (or is gone)
"""


def hold_lock_in_a_child(folder, marker):
    """A child process that holds ``folder``'s lock (it has once ``marker`` exists)
    until its stdin is closed."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, ROOT, str(folder),
                              str(marker)], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert child.poll() is None and time.monotonic() < deadline, "no lock held"
        time.sleep(0.01)
    return child


def lock_in_a_thread(folder):
    """A thread that takes ``folder``'s lock, sets the event it returns, and lets go."""
    entered = threading.Event()

    def take():
        with folder_lock(folder):
            entered.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, entered


def test_a_folder_lock_is_held_by_one_process_at_a_time_and_leaves_no_file(tmp_path):
    folder, marker = tmp_path / "folder", tmp_path / "held"
    folder.mkdir()
    child = hold_lock_in_a_child(folder, marker)
    try:
        assert names(folder) == [".lock"]
        thread, entered = lock_in_a_thread(folder)
        assert not entered.wait(0.5)  # the child holds it
        child.stdin.close()
        assert entered.wait(30) and child.wait(30) == 0
        thread.join(30)
    finally:
        child.kill()
        child.wait(30)
    assert names(folder) == []  # removed as the lock is let go


def test_a_folder_lock_held_by_a_killed_process_is_taken_over(tmp_path):
    folder, marker = tmp_path / "folder", tmp_path / "held"
    folder.mkdir()
    child = hold_lock_in_a_child(folder, marker)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    child.stdin.close()
    assert names(folder) == [".lock"]  # left behind by the killed holder
    thread, entered = lock_in_a_thread(folder)
    assert entered.wait(30)
    thread.join(30)
    assert names(folder) == []


def test_folders_are_made_synced_and_removed(tmp_path):
    assert make_folder(f"{tmp_path}/a/b/") == f"{tmp_path}/a/b"
    assert os.path.isdir(tmp_path / "a" / "b")
    sync_folder(tmp_path / "a")
    remove_tree(tmp_path / "a")
    remove_tree(tmp_path / "a")  # absent: nothing
    assert names(tmp_path) == []
    with pytest.raises(FileWriteError, match="absent"):
        sync_folder(tmp_path / "absent")
    assert folder_path("runs/ckpt//") == "runs/ckpt" and folder_path("/") == "/"


def test_a_long_name_that_fits_the_file_system_writes_with_its_temporary(tmp_path):
    # The temporary's suffix is short: a name of 240 bytes (255 the limit) saves.
    path = tmp_path / ("n" * 240)
    write_file(path, b"x")
    assert path.read_bytes() == b"x" and names(tmp_path) == ["n" * 240]


@pytest.mark.parametrize("name", ["n" * 255, "é" * 127, "b" * 244 + ".npz"])
def test_a_name_at_the_file_systems_limit_writes_with_a_shortened_temporary(tmp_path,
                                                                             name):
    # The temporary was the name plus its suffix: past 255 bytes, a legal name failed.
    write_file(tmp_path / name, b"x")
    assert (tmp_path / name).read_bytes() == b"x" and names(tmp_path) == [name]


def child_waiting_for_the_lock(folder, marker, why):
    """A child process that asks for ``folder``'s lock, which this process holds: it
    must not have it half a second later. It takes it once the lock is let go (and
    its stdin closed: wait for it then)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, ROOT, str(folder),
                              str(marker)], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)  # long enough for the child to take a free lock
        assert not marker.exists(), why
    finally:
        child.stdin.close()
    return child


def test_a_folder_lock_entered_again_in_its_thread_runs_and_locks_once(tmp_path):
    marker = tmp_path / "held"
    with folder_lock(tmp_path):
        with folder_lock(tmp_path):  # a save_checkpoint inside the block, say
            assert names(tmp_path) == [LOCK]
        assert names(tmp_path) == [LOCK]  # still held by the outer block
        child = child_waiting_for_the_lock(tmp_path, marker,
                                           "another process took a held lock")
    child.wait(60)
    assert marker.exists() and names(tmp_path) == ["held"]


def test_a_child_forked_in_the_block_leaves_its_parents_lock_held(tmp_path):
    marker = tmp_path / "held"

    def fork_in_the_block():
        with folder_lock(tmp_path):
            pid = os.fork()
            if pid == 0:
                return 0  # the child leaves the block it was forked in
            os.waitpid(pid, 0)
            child = child_waiting_for_the_lock(tmp_path, marker,
                                               "the child let go of its parent's lock")
        child.wait(60)
        return pid

    if fork_in_the_block() == 0:
        os._exit(0)
    assert marker.exists()


def test_a_lock_file_of_another_user_read_only_to_us_still_locks(tmp_path, monkeypatch):
    # Another user's lock file (0644) opens for reading only; flock needs no more. The
    # permission is played by os.open here: root, as CI may run, opens anything.
    real_open = os.open

    def as_another_users(path, flags, *args):
        if os.path.basename(path) == LOCK and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", as_another_users)
    (tmp_path / LOCK).write_text("")
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK).exists()


def test_a_device_or_a_pipe_is_never_replaced_by_a_file(tmp_path):
    # The temporary was renamed over whatever had the name: run as root, /dev/null.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileWriteError, match="not a regular file"):
        write_file(fifo, b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["fifo"]


def test_read_file_takes_what_the_file_holds_and_refuses_what_is_not_a_file(tmp_path):
    import tracemalloc

    from async_search.files import read_file

    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    tracemalloc.start()
    try:
        assert read_file(small, 1 << 40) == b"x" * 1000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # not the limit set aside (it took 64 MiB for read_json's)
    with pytest.raises(ValueError, match="more than the 999"):
        read_file(small, 999)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, "/dev/zero"):  # none of them opened for a read
        with pytest.raises(ValueError, match="not a regular file"):
            read_file(path, 1 << 20)
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "missing", 10)


def test_read_file_reads_a_file_that_says_it_holds_nothing():
    # A file of /proc reports 0 bytes and holds some: refused as "grown" once.
    from async_search.files import read_file

    assert b"Name:" in read_file("/proc/self/status", 1 << 20)
    with pytest.raises(ValueError, match="more than the 10 bytes"):
        read_file("/proc/self/status", 10)
