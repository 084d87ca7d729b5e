"""Stops and the process backend: Ctrl-C reaches every process of the terminal's group,
and the serving process decides; a client neither dies of it nor prints a traceback."""

import os
import signal

import pytest

import async_search as asr
from tests.backends import searches
from tests.experiments.test_stops import default_signals

pytestmark = pytest.mark.timeout(180)


async def ctrl_c_then_echo_sum(start, evaluate):
    """echo_sum, after a Ctrl-C has reached this (client) process."""
    if start == 0:
        os.kill(os.getpid(), signal.SIGINT)
    return await searches.echo_sum(start, evaluate)


def test_a_ctrl_c_that_reaches_a_client_process_does_not_end_its_searches(capfd):
    out = asr.run_searches(ctrl_c_then_echo_sum, list(range(4)), searches.small_mlp,
                           backend="process", num_procs=2)
    assert out == searches.baseline(searches.echo_sum, list(range(4)),
                                    searches.small_mlp())
    assert "Traceback" not in capfd.readouterr().err


def test_searches_that_do_not_load_in_a_client_fail_at_once_however_many_starts():
    # Over 64 KiB of starts: they once went through spawn's pipe in a blocking write
    # that never returned when the client died before reading them (Ctrl-C held too).
    from tests.backends import unloadable

    starts = list(range(30_000))
    out = asr.run_searches(unloadable.search, starts, searches.small_mlp,
                           backend="process", num_procs=1, return_exceptions=True)
    assert all(isinstance(r, asr.SearchError) for r in out)
    assert "could not load its searches: ImportError: this module does not import" in (
        str(out[0]))
    assert len(out.stats["clients"]) == 1  # not retried: every attempt would fail so


async def sleep_and_write_pid(start, evaluate, pid_dir):
    """Writes its process id to ``pid_dir``, then sleeps without evaluating."""
    import asyncio

    with open(os.path.join(pid_dir, str(os.getpid())), "w"):
        pass
    await asyncio.sleep(600)


_PARENT = """
import functools, sys
import async_search as asr
from tests.backends import searches, test_process_stops
asr.run_searches(functools.partial(test_process_stops.sleep_and_write_pid,
                                   pid_dir=sys.argv[1]),
                 [0, 1], searches.small_mlp, backend="process", num_procs=2)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_client_processes_end_when_their_parent_is_killed(tmp_path, how):
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)],
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                  os.path.abspath(__file__)))))
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            assert parent.poll() is None, "the run ended before its searches slept"
            time.sleep(0.1)
        clients = [int(name) for name in os.listdir(tmp_path)]
        assert len(clients) == 2
        os.kill(parent.pid, how)
        parent.wait(30)

        def alive():
            left = []
            for pid in clients:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state not in "ZX":
                    left.append(pid)
            return left

        deadline = time.monotonic() + 10
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive() == []
    finally:
        parent.kill()
        for name in os.listdir(tmp_path):
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


CLOSED_RESULTS = """
import asyncio
from async_search.backends import process
from async_search.connections import pipe
from async_search.errors import ClosedConnection

class Closed:
    '''The run's results queue after the run stopped: its reading end closed.'''
    def put(self, item):
        if item[0] is process._OUTCOMES:
            raise ClosedConnection("cannot put on this socket queue: the reading end "
                                   "closed")

async def search(start, evaluate):
    return start

_, client = pipe()
asyncio.run(process._client(client, Closed(), search, [1, 2], None, None))
print("went on")
"""


def test_a_client_whose_run_stopped_ends_quietly_when_it_hands_outcomes_over(tmp_path):
    """A SIGTERM'd run closes its results queue; a client's outcomes, handed over from
    a loop callback, met ClosedConnection there and printed its traceback."""
    import subprocess
    import sys
    script = tmp_path / "closed_results.py"
    script.write_text(CLOSED_RESULTS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert "Traceback" not in done.stderr and "Exception in callback" not in done.stderr


_CTRL_C_IN_THE_PARENT = """
import functools, os, signal, sys, threading, time
import async_search as asr
from tests.backends import searches, test_process_stops

def interrupt():  # Ctrl-C, once both clients search
    while len(os.listdir(sys.argv[1])) < 2:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
try:
    asr.run_searches(functools.partial(test_process_stops.sleep_and_write_pid,
                                       pid_dir=sys.argv[1]),
                     [0, 1], searches.small_mlp, backend="process", num_procs=2)
except KeyboardInterrupt:
    pass
clients = [int(name) for name in os.listdir(sys.argv[1])]
print([pid for pid in clients if os.path.exists(f"/proc/{pid}")])  # a zombie too
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_ctrl_c_in_the_caller_leaves_no_client_process_not_even_a_zombie(tmp_path):
    # The run is cancelled twice (the run, then what is left of it): the second cancel
    # cut a client's stop after its kill and before its reaping, and the client stayed
    # a zombie holding its pipes until the next run.
    import subprocess
    import sys

    for _ in range(3):  # (it was 2 runs in 3)
        for name in os.listdir(tmp_path):
            os.remove(tmp_path / name)
        # (SIGINT as a shell leaves it: a test run started in the background inherits
        # it ignored, and the child's Ctrl-C then never came; default_signals)
        done = subprocess.run([sys.executable, "-c", _CTRL_C_IN_THE_PARENT, str(tmp_path)],
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                  os.path.abspath(__file__)))),
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=default_signals)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["[]"], done.stdout
