"""ensure_ray and shutdown_ray: the caller's SIGTERM handler survives Ray's start, a
start cut short leaves none of Ray's processes, and shutdown_ray leaves none either.

Each scenario is a child Python (Ray is process-wide state) marked by an environment
variable that every process it starts inherits, so that the test finds them all.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "ASYNC_SEARCH_TEST_RAY"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")]


def marked(mark: str) -> list:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if f"{MARK}={mark}".encode() in environ and state != b"Z":
            found.append(int(name))
    return found


def none_left(mark: str, within_s: float = 10.0) -> list:
    deadline = time.monotonic() + within_s
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    return marked(mark)


@pytest.fixture
def mark():
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):  # whatever failed, nothing outlives the test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def start(script: str, mark: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                            env={**os.environ, MARK: mark, "PYTHONPATH": ROOT},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_callers_handler_comes_back_and_shutdown_leaves_nothing(mark):
    proc = start("""
        import signal
        from async_search import process_tree
        from async_search.ray_init import ensure_ray, shutdown_ray
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        ray = ensure_ray()
        print(signal.getsignal(signal.SIGTERM) is mine, ray.get(ray.put(3)), flush=True)
        print(len(process_tree.descendants()) > 0, flush=True)
        shutdown_ray()
        print(process_tree.descendants(), ray.is_initialized(), flush=True)
    """, mark)
    out, err = proc.communicate(timeout=150)
    assert out.split("\n")[:3] == ["True 3", "True", "[] False"], err[-3000:]
    assert none_left(mark) == []


def test_sigterm_while_ray_starts_leaves_none_of_its_processes(mark):
    proc = start("""
        import sys
        from async_search.ray_init import ensure_ray
        print("starting", flush=True)
        try:
            ensure_ray()
        except SystemExit as e:  # Ray's own handler, installed as its start begins
            print("stopped", e.code, flush=True)
            sys.exit(0)
        print("started", flush=True)
    """, mark)
    assert proc.stdout.readline() == "starting\n"
    # The phase: the raylet has started its agents (the processes that outlived an
    # interrupted start by a minute), and Ray's start goes on.
    deadline = time.monotonic() + 60
    while not any(c.startswith("ray::") for c in commands(mark)):
        assert time.monotonic() < deadline, "no Ray agent started in 60 s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert out == "stopped 15\n", err[-3000:]
    assert none_left(mark, within_s=5.0) == []


def commands(mark: str) -> list:
    found = []
    for pid in marked(mark):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read().decode(errors="replace"))
        except OSError:
            pass
    return found


def test_a_start_cut_short_ends_what_ray_started_and_only_that(mark):
    # ray.init replaced by one that starts a "Ray process" (its command names Ray's
    # package), which starts a child of its own, and is then interrupted; a process
    # that is not Ray's, started meanwhile (as another thread might), is left alone.
    proc = start("""
        import os, subprocess, sys, time
        import ray
        from async_search import process_tree
        from async_search.ray_init import ensure_ray
        home = os.path.dirname(ray.__file__)
        sleeper = "import subprocess, sys, time; " + (
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); ")
        started = []
        def interrupted_init(**kwargs):
            subprocess.Popen([sys.executable, "-c", sleeper + "time.sleep(60)", home])
            started.append(subprocess.Popen([sys.executable, "-c",  # another thread's
                                             "import time; time.sleep(60)"]))
            while len(process_tree.descendants()) < 3:  # Ray's, its child, the other
                time.sleep(0.01)
            raise KeyboardInterrupt
        ray.init = interrupted_init
        try:
            ensure_ray()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print([p.pid for p in process_tree.descendants()] == [started[0].pid], flush=True)
        started[0].kill()
    """, mark)
    out, err = proc.communicate(timeout=60)
    assert out == "interrupted\nTrue\n", err[-3000:]
    assert none_left(mark, within_s=5.0) == []
