"""RunGuard: SIGTERM takes Ctrl-C's path, and what a run started ends with it.

The guard changes process-wide state (signal handlers; on Linux the process becomes a
subreaper for good), so each scenario runs in a child Python, which prints what it saw.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from async_search.experiments.stops import EXIT_STATUS, RunGuard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)


def default_signals() -> None:
    """In the child before it starts Python: SIGINT and SIGTERM as a shell leaves them.
    An ignored signal stays ignored across exec, and Python installs its Ctrl-C handler
    only over a SIGINT that is not: a test run that ignores SIGINT (started in the
    background, or by a test before) would otherwise hand the child no Ctrl-C path."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def run_script(body: str, stderr: list = None) -> list:
    """The child's stdout lines; its stderr lines are appended to ``stderr`` if given."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=ROOT,
                         capture_output=True, text=True, timeout=50,
                         env={**os.environ, "PYTHONPATH": ROOT},
                         preexec_fn=default_signals)
    assert run.returncode == 0, run.stderr
    if stderr is not None:
        stderr.extend(run.stderr.splitlines())
    return run.stdout.split("\n")[:-1]


def test_stopped_by_names_the_signal_or_none():
    guard = RunGuard()
    assert guard.stopped_by(KeyboardInterrupt()) == signal.SIGINT
    assert guard.stopped_by(SystemExit(15)) == signal.SIGTERM  # Ray's handler, mid-start
    assert guard.stopped_by(SystemExit(2)) is None
    assert guard.stopped_by(ValueError("bad")) is None
    assert EXIT_STATUS == {signal.SIGINT: 130, signal.SIGTERM: 143}


def test_sigterm_outside_a_loop_raises_keyboard_interrupt_then_handlers_come_back():
    out = run_script("""
        import os, signal
        from async_search.experiments.stops import RunGuard
        before = signal.getsignal(signal.SIGTERM)
        with RunGuard() as guard:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                print("not stopped")
            except KeyboardInterrupt as e:
                print("stopped by", guard.stopped_by(e).name)
        print("restored", signal.getsignal(signal.SIGTERM) is before,
              signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    assert out == ["stopped by SIGTERM", "restored True True"]


def test_sigterm_in_a_running_loop_cancels_the_main_task_so_finally_runs():
    out = run_script("""
        import asyncio, os, signal
        from async_search.experiments.stops import RunGuard

        async def run():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                print("cancelled")
                raise
            finally:
                print("finally ran")

        with RunGuard() as guard:
            try:
                asyncio.run(run())
            except KeyboardInterrupt as e:
                print("stopped by", guard.stopped_by(e).name)
    """)
    assert out == ["cancelled", "finally ran", "stopped by SIGTERM"]


def test_what_the_run_left_is_ended_at_exit_even_what_ignores_sigterm():
    out = run_script("""
        import subprocess, sys
        from async_search import process_tree
        from async_search.experiments.stops import RunGuard
        code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
        with RunGuard(grace_s=0.5) as guard:
            children = [subprocess.Popen([sys.executable, "-c", code],
                                         stdout=subprocess.PIPE, text=True)
                        for _ in range(2)]
            for c in children:
                c.stdout.readline()
        print(sorted(p.pid for p in guard.left_over) == sorted(c.pid for c in children))
        print([c.wait(10) for c in children])
        print(process_tree.descendants())
    """)
    assert out == ["True", f"[{-signal.SIGKILL}, {-signal.SIGKILL}]", "[]"]


def test_a_normal_exit_with_nothing_left_ends_nothing():
    out = run_script("""
        from async_search.experiments.stops import RunGuard
        with RunGuard() as guard:
            pass
        print(guard.left_over, guard.received)
    """)
    assert out == ["[] None"]


def test_ignore_after_leaves_both_signals_ignored_once_the_run_is_over():
    out = run_script("""
        import signal
        from async_search.experiments.stops import RunGuard
        with RunGuard(ignore_after=True):
            pass
        print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
              signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
    """)
    assert out == ["True True"]


# A Ctrl-C that lands in a finalizer or a weakref callback: Python drops the
# KeyboardInterrupt there ("Exception ignored in ..."). CI saw a run go on to its end
# after one landed in a WeakKeyDictionary's callback. The finalizer below raises it as
# the signal handler would have.
DROPPED_IN_A_FINALIZER = """
    import time
    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt
"""


def test_a_ctrl_c_dropped_in_a_finalizer_is_sent_again_and_stops_the_run():
    stderr = []
    out = run_script(DROPPED_IN_A_FINALIZER + """
    from async_search.experiments.stops import RunGuard
    with RunGuard() as guard:
        try:
            Finalized()
            for _ in range(1000):  # 10 s at most
                time.sleep(0.01)
            print("not stopped")
        except KeyboardInterrupt as e:
            print("stopped by", guard.stopped_by(e).name)
    """, stderr)
    assert out == ["stopped by SIGINT"]
    assert not any("KeyboardInterrupt" in line or "Exception ignored" in line
                   for line in stderr), stderr


def test_a_ctrl_c_dropped_in_a_finalizer_in_a_running_loop_cancels_the_main_task():
    out = run_script(DROPPED_IN_A_FINALIZER + """
    import asyncio
    from async_search.experiments.stops import RunGuard

    async def run():
        try:
            Finalized()
            await asyncio.sleep(10)
            print("not stopped")
        finally:
            print("finally ran")

    with RunGuard() as guard:
        try:
            asyncio.run(run())
        except KeyboardInterrupt as e:
            print("stopped by", guard.stopped_by(e).name)
    """)
    assert out == ["finally ran", "stopped by SIGINT"]


def test_a_sigterm_dropped_in_a_finalizer_is_sent_again_as_sigterm():
    out = run_script(DROPPED_IN_A_FINALIZER + """
    import os, signal
    from async_search.experiments.stops import RunGuard
    with RunGuard() as guard:
        try:
            # SIGTERM's handler raises the KeyboardInterrupt inside the finalizer
            class Terminated:
                def __del__(self):
                    os.kill(os.getpid(), signal.SIGTERM)
            Terminated()
            for _ in range(1000):
                time.sleep(0.01)
            print("not stopped")
        except KeyboardInterrupt as e:
            print("stopped by", guard.stopped_by(e).name)
    """)
    assert out == ["stopped by SIGTERM"]


def test_other_dropped_errors_are_reported_as_before_and_the_hook_comes_back():
    stderr = []
    out = run_script("""
    import sys
    from async_search.experiments.stops import RunGuard
    class Finalized:
        def __del__(self):
            raise ValueError("dropped")
    before = sys.unraisablehook
    with RunGuard():
        Finalized()
        print("went on")
    print("restored", sys.unraisablehook is before)
    """, stderr)
    assert out == ["went on", "restored True"]
    assert any("ValueError: dropped" in line for line in stderr), stderr
