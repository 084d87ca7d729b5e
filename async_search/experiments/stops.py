"""Stopping a run of main.py: Ctrl-C and SIGTERM end it the same way, leaving nothing.

``RunGuard`` is entered around everything main.py does. SIGTERM (a process manager's
stop) takes the path of Ctrl-C: inside a running event loop the main task is cancelled,
so that every ``finally`` runs (servers stop, client processes are killed); elsewhere a
``KeyboardInterrupt`` is raised. On the way out, with both signals ignored so that the
cleaning is not cut short, the guard stops a Ray that this process started and ends
every process the run started that is still alive (SIGTERM, then SIGKILL): Ray's agents,
orphaned workers, anything. The process adopts its descendants' orphans (Linux) so that
none slips out of reach.

Python drops an exception raised inside a finalizer or a weakref callback: a Ctrl-C that
lands there would be lost and the run would go on to its end. The guard sees such a
dropped ``KeyboardInterrupt`` (through ``sys.unraisablehook``) and sends the signal again,
so that it stops the run at the next step.

Example:
    main.py enters the guard around everything it does (leaving it ends every process
    the run started, and a Ray this process started, so it is not entered here), then
    reads from the error that ended the run which signal stopped it:

    >>> guard = RunGuard()
    >>> guard.stopped_by(KeyboardInterrupt()) == signal.SIGINT
    True
    >>> guard.stopped_by(ValueError("not a stop")) is None
    True
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, List, Optional

from async_search import process_tree


#: The exit status of a run stopped by each signal: 128 + the signal's number, as a
#: shell reports a process killed by it.
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}

#: How the one-line message names each signal.
SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class RunGuard:
    """Turns SIGTERM into the Ctrl-C path, and ends what a run started when it ends.

    Args:
        grace_s: how long processes left over at the end get to exit after SIGTERM,
            before SIGKILL.
        ignore_after: leave SIGINT and SIGTERM ignored after the exit (the run is over
            and only its report is left to print) instead of restoring the handlers.

    Attributes:
        received: the first stopping signal received (SIGINT or SIGTERM), or None.
        left_over: the processes that were still alive at the end and were ended.
    """

    def __init__(self, *, grace_s: float = 2.0, ignore_after: bool = False) -> None:
        self.grace_s = grace_s
        self.ignore_after = ignore_after
        self.received: Optional[int] = None
        self.left_over: List[process_tree.Pid] = []
        self._previous: dict = {}
        self._previous_unraisable_hook: Any = None

    def __enter__(self) -> "RunGuard":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("RunGuard handles signals: enter it in the main thread")
        process_tree.become_subreaper()
        # SIGINT keeps Python's handler: asyncio.Runner installs its own (cancel the main
        # task, then raise KeyboardInterrupt) only over that one.
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._previous_unraisable_hook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        return self

    def _on_unraisable(self, unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            self._previous_unraisable_hook(unraisable)
            return
        # A stop raised inside a finalizer or weakref callback, which Python drops: send
        # it again (a no-op once the guard ignores both signals on its way out). A
        # signal sent from here would run its handler inside this hook, where the
        # KeyboardInterrupt is dropped once more: another thread sends it once the hook
        # has let it go.
        again = self.received or signal.SIGINT
        while True:
            go = threading.Event()
            threading.Thread(target=_send_when_set, args=(go, again),
                             name="RunGuard: stop again", daemon=True).start()
            try:
                go.set()
                return
            except KeyboardInterrupt:  # handled before the hook returned: once more
                continue

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.received = signal.SIGTERM
        # The Ctrl-C path: asyncio.Runner's handler cancels the main task (every finally
        # of the run then runs); outside a loop, SIGINT's handler raises KeyboardInterrupt.
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored (started in the background): stop all the same
            raise KeyboardInterrupt

    def stopped_by(self, error: BaseException) -> Optional[int]:
        """The signal that ``error`` stands for, or None when it is not a stop:
        KeyboardInterrupt (Ctrl-C, or SIGTERM through this guard), or the
        ``SystemExit(15)`` that Ray's own SIGTERM handler raises while Ray starts."""
        if isinstance(error, KeyboardInterrupt):
            return self.received or signal.SIGINT
        if isinstance(error, SystemExit) and error.code == signal.SIGTERM:
            return signal.SIGTERM
        return None

    def __exit__(self, *exc: Any) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):  # the cleaning is bounded: let it end
            signal.signal(s, signal.SIG_IGN)
        try:
            self.left_over = _end_everything(self.grace_s)
        finally:
            sys.unraisablehook = self._previous_unraisable_hook
            if not self.ignore_after:
                for s, handler in self._previous.items():
                    signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _send_when_set(go: threading.Event, signum: int) -> None:
    go.wait()
    os.kill(os.getpid(), signum)


def _end_everything(grace_s: float) -> List[process_tree.Pid]:
    from async_search.ray_init import shutdown_ray

    before = process_tree.descendants()  # Ray's shutdown orphans some; keep them in view
    try:
        shutdown_ray()
    except Exception:  # a Ray that cannot shut down cleanly is ended below all the same
        pass
    tracker = _resource_tracker_pid()
    seen = {p.pid for p in before}
    candidates = before + [p for p in process_tree.descendants() if p.pid not in seen]
    left = [p for p in candidates if p.pid != tracker and process_tree.is_alive(p)]
    process_tree.end_processes(left, grace_s=grace_s)
    return left


def _resource_tracker_pid() -> Optional[int]:
    """multiprocessing's resource tracker ignores SIGTERM and ends by itself when this
    process exits (it unlinks what was left registered): it is not left over."""
    import sys

    module = sys.modules.get("multiprocessing.resource_tracker")
    tracker = getattr(module, "_resource_tracker", None)
    return getattr(tracker, "_pid", None)

