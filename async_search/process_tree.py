"""The processes a process started, and ending them: what a stopped run must not leave.

A process is named by its pid and its start time (``Pid``), so that a pid the system
has reused since it was listed is never signalled. Listing reads ``/proc`` on Linux
(psutil elsewhere, when installed; else nothing is listed).

Example:
    >>> import os
    >>> mine = descendants()
    >>> all(p.pid != os.getpid() for p in mine)
    True
    >>> end_processes([], grace_s=0.0)
    []
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional


_PROC = "/proc"


class Pid(NamedTuple):
    """A process: its pid and when it started (clock ticks since boot on Linux)."""

    pid: int
    """The process id."""
    started: float
    """Its start time: two listings name the same process only if this agrees."""


def _read_stat(pid: int) -> Optional[tuple]:
    """``(ppid, start, state)`` from ``/proc/<pid>/stat``; None if it is gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name, in parentheses, may hold spaces
    try:
        return int(fields[1]), float(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def _table() -> Dict[int, tuple]:
    """pid -> (ppid, start, state) for every live process (zombies left out)."""
    if os.path.isdir(f"{_PROC}/self"):
        table = {}
        for name in os.listdir(_PROC):
            if name.isdigit():
                stat = _read_stat(int(name))
                if stat is not None and stat[2] not in ("Z", "X", "x"):
                    table[int(name)] = stat
        return table
    try:
        import psutil
    except ImportError:
        return {}
    table = {}
    for p in psutil.process_iter(["ppid", "create_time", "status"]):
        if p.info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            table[p.pid] = (p.info["ppid"], p.info["create_time"], p.info["status"])
    return table


def descendants(pid: Optional[int] = None) -> List[Pid]:
    """The live processes below ``pid`` (default: this process), parents first."""
    return _below(_table(), [os.getpid() if pid is None else pid])


def _below(table: Dict[int, tuple], roots: List[int]) -> List[Pid]:
    children: Dict[int, List[int]] = {}
    for child, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, seen, frontier = [], set(roots), list(roots)
    while frontier:
        next_frontier = []
        for parent in frontier:
            for child in sorted(children.get(parent, ())):
                if child not in seen:
                    seen.add(child)
                    found.append(Pid(child, table[child][1]))
                    next_frontier.append(child)
        frontier = next_frontier
    return found


def command_line(p: Pid) -> str:
    """The process's command line, arguments joined by spaces ('' once it is gone)."""
    if os.path.isdir(f"{_PROC}/self"):
        try:
            with open(f"{_PROC}/{p.pid}/cmdline", "rb") as f:
                text = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return text if is_alive(p) else ""
    try:
        import psutil

        return " ".join(psutil.Process(p.pid).cmdline()) if is_alive(p) else ""
    except Exception:  # psutil missing, or the process gone
        return ""


def is_alive(p: Pid) -> bool:
    """Whether the process still runs (not a zombie, its pid not reused since)."""
    if os.path.isdir(f"{_PROC}/self"):
        stat = _read_stat(p.pid)
        return stat is not None and stat[1] == p.started and stat[2] not in ("Z", "X", "x")
    entry = _table().get(p.pid)
    return entry is not None and entry[1] == p.started


def _signal(processes: Iterable[Pid], signum: int) -> None:
    for p in processes:
        if is_alive(p):  # never a pid that was reused by another process since
            try:
                os.kill(p.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def end_processes(processes: Iterable[Pid], *, grace_s: float = 2.0,
                  kill_wait_s: float = 2.0) -> List[Pid]:
    """Ends ``processes``: SIGTERM, up to ``grace_s`` to go, then SIGKILL.

    Every process is first stopped (SIGSTOP), so that none can start another while the
    others are ended; the children any of them started since the list was made are
    ended with them. With ``grace_s=0`` they are killed at once.

    Returns:
        The processes still alive after ``kill_wait_s`` more seconds (normally none).
    """
    pending = {p.pid: p for p in processes}
    if not pending:
        return []
    # Freeze, and take in what they started meanwhile, until the set stops growing.
    for _ in range(20):
        _signal(pending.values(), signal.SIGSTOP)
        grown = [c for c in _below(_table(), list(pending)) if c.pid not in pending]
        if not grown:
            break
        pending.update((c.pid, c) for c in grown)
    if grace_s > 0:
        _signal(pending.values(), signal.SIGTERM)
        _signal(pending.values(), signal.SIGCONT)  # a stopped process handles SIGTERM
        _wait(pending.values(), grace_s)
    _signal(pending.values(), signal.SIGKILL)
    # No reaping here: a child's exit status belongs to whoever started it (its Popen
    # or Process object); a zombie counts as ended, and is reaped when its parent is.
    return _wait(pending.values(), kill_wait_s)


def _wait(processes: Iterable[Pid], timeout_s: float) -> List[Pid]:
    deadline = time.monotonic() + timeout_s
    left = [p for p in processes if is_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if is_alive(p)]
    return left


def become_subreaper() -> bool:
    """Makes this process adopt the orphans of its descendants (Linux), so that a
    process whose parent died (a Ray agent whose raylet was killed) is still listed
    by ``descendants()`` and ended with the rest. Returns whether it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> None:
    """Ends this process when its parent, ``parent`` (a pid), dies, whatever this
    process is doing then (sleeping, blocked, stopped at a breakpoint): on Linux the
    kernel sends it SIGKILL (``PR_SET_PDEATHSIG``); elsewhere a daemon thread looks at
    ``os.getppid()`` each second. A parent gone already ends it at once."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # it died before the signal was asked for
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="async_search-parent-watch", daemon=True).start()


@contextlib.contextmanager
def starting_children() -> Iterator[None]:
    """Around starting child processes: they start deaf to Ctrl-C, and a stop that comes
    meanwhile reaches this process after they have started, not half-way through.

    A terminal sends Ctrl-C to its whole process group: a child still importing would
    die with a traceback of its own, and one cut off while this process sends it its
    start-up data prints one too. So SIGINT is blocked in the children from birth
    (their parent ends them), and SIGINT and SIGTERM are held here until the block
    ends. Outside the main thread it does nothing.

    multiprocessing's resource tracker is started first, if it is not running yet: the
    start of a spawned process starts it on first use, and unblocks SIGINT in this
    thread as it does, so the first child would be born hearing Ctrl-C.

    Example:
        >>> with starting_children():
        ...     pass
    """
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")):
        yield
        return
    _start_resource_tracker()
    held: List[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in stops}
    for s in stops:
        if previous[s] not in (signal.SIG_IGN, None):
            signal.signal(s, lambda signum, frame: held.append(signum))
    # Children inherit the blocked mask of the thread that starts them.
    masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, masked)  # one pending arrives now
        for s in dict.fromkeys(held):  # once each, in the order they came
            signal.raise_signal(s)


def _start_resource_tracker() -> None:
    """Starts multiprocessing's resource tracker unless it runs (POSIX; cheap if it does)."""
    if os.name != "posix":
        return
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except Exception:  # no tracker here (an odd platform): nothing to unblock either
        pass
