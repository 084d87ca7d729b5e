"""The processes a process started, and ending them (Linux: read through /proc)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from async_search import process_tree
from async_search.process_tree import Pid

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")]

#: A child that starts a grandchild, prints both pids, and sleeps; SIGTERM is ignored
#: in both when asked, so that only SIGKILL ends them.
TREE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    if sys.argv[1] == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, sys, time\\n"
        "if sys.argv[1] == 'deaf': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(120)", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(os.getpid(), child.pid, flush=True)
    time.sleep(120)
""")


def start_tree(mode="plain"):
    proc = subprocess.Popen([sys.executable, "-c", TREE, mode], stdout=subprocess.PIPE,
                            text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    return proc, pids


def wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = process_tree._read_stat(pid)
        if stat is None or stat[2] == "Z":
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def tree():
    started = []

    def start(mode="plain"):
        proc, pids = start_tree(mode)
        started.append((proc, pids))
        return proc, pids

    yield start
    for proc, pids in started:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(10)


def test_descendants_lists_children_and_grandchildren_parents_first(tree):
    proc, (child, grandchild) = tree()
    found = [p.pid for p in process_tree.descendants()]
    assert found.index(child) < found.index(grandchild)
    assert [p.pid for p in process_tree.descendants(child)] == [grandchild]
    assert process_tree.descendants(grandchild) == []


def test_end_processes_ends_a_tree_with_sigterm(tree):
    proc, (child, grandchild) = tree()
    left = process_tree.end_processes([p for p in process_tree.descendants()
                                       if p.pid == child], grace_s=5.0)
    assert left == []  # the grandchild, started by the child, went with it
    assert proc.wait(10) == -signal.SIGTERM
    assert wait_gone(grandchild)


def test_end_processes_kills_what_ignores_sigterm_after_the_grace(tree):
    proc, (child, grandchild) = tree("deaf")
    mine = [p for p in process_tree.descendants() if p.pid in (child, grandchild)]
    assert process_tree.end_processes(mine, grace_s=0.3) == []
    assert proc.wait(10) == -signal.SIGKILL
    assert wait_gone(grandchild)


def test_a_pid_reused_since_it_was_listed_is_never_signalled(tree):
    proc, (child, _) = tree()
    (listed,) = [p for p in process_tree.descendants() if p.pid == child]
    other = Pid(child, listed.started + 1)  # the same pid, started at another time
    assert not process_tree.is_alive(other)
    assert process_tree.end_processes([other], grace_s=0.0) == []
    assert process_tree.is_alive(listed) and proc.poll() is None


def test_command_line_and_is_alive(tree):
    proc, (child, _) = tree()
    (p,) = [p for p in process_tree.descendants() if p.pid == child]
    assert "import os, signal, subprocess" in process_tree.command_line(p)
    os.kill(child, signal.SIGKILL)
    proc.wait(10)
    assert not process_tree.is_alive(p) and process_tree.command_line(p) == ""


ORPHAN = textwrap.dedent("""
    import os, subprocess, sys, time
    from async_search import process_tree
    print(process_tree.become_subreaper(), flush=True)
    # A child that starts a grandchild and exits at once: the grandchild is an orphan.
    subprocess.run([sys.executable, "-c",
        "import subprocess, sys\\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\\n"
        "print(p.pid)"], check=True)
    time.sleep(0.5)
    left = process_tree.descendants()
    print(" ".join(str(p.pid) for p in left), flush=True)
    print(process_tree.end_processes(left, grace_s=2.0), flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux subreaper")
def test_a_subreaper_keeps_orphans_in_view_and_ends_them():
    run = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True,
                         timeout=30, cwd=os.path.dirname(os.path.dirname(__file__)))
    lines = run.stdout.split("\n")
    assert run.returncode == 0, run.stderr
    assert lines[0] == "True"
    orphan = int(lines[1])
    assert lines[2].split() == [str(orphan)]  # adopted: still a descendant
    assert lines[3] == "[]" and wait_gone(orphan)


STARTING = textwrap.dedent("""
    import multiprocessing, os, signal, sys, time
    from async_search.process_tree import starting_children

    def child(ready):
        ready.set()
        time.sleep(30)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        p = ctx.Process(target=child, args=(ready,), daemon=True)
        try:
            with starting_children():
                p.start()
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while it starts
                # A Ctrl-C goes to the process: a thread that does not block it (one
                # of numpy's, say) may take it, and on a busy host only later. A start
                # lasts long enough for it to arrive; so does this.
                time.sleep(0.5)
                print("held", flush=True)
        except KeyboardInterrupt:
            print("delivered after the block", flush=True)
        ready.wait(30)
        os.kill(p.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches the child too
        p.join(1)
        print("child alive after Ctrl-C:", p.is_alive(), flush=True)
        p.kill()
""")


def test_starting_children_holds_a_stop_and_starts_children_deaf_to_ctrl_c(tmp_path):
    script = tmp_path / "start.py"
    script.write_text(STARTING)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)),
                         env={**os.environ, "PYTHONPATH": os.path.dirname(
                             os.path.dirname(os.path.abspath(__file__)))})
    assert run.stdout.split("\n")[:3] == ["held", "delivered after the block",
                                          "child alive after Ctrl-C: True"], run.stderr
    assert "Traceback" not in run.stderr


#: The first spawned child of a fresh interpreter: nothing (no Event, no Lock) has
#: started multiprocessing's resource tracker before it.
FIRST_CHILD = textwrap.dedent("""
    import multiprocessing, signal
    from async_search.process_tree import starting_children

    def child(conn):
        conn.send(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        for _ in range(2):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=child, args=(theirs,))
            with starting_children():
                p.start()
            print(mine.recv(), flush=True)
            p.join(30)
""")


def test_the_first_spawned_child_is_born_deaf_to_ctrl_c_too(tmp_path):
    # Starting the resource tracker (which a spawn does on first use) unblocks SIGINT in
    # the starting thread: the first child was born hearing Ctrl-C, and one that got it
    # while importing died with "Fatal Python error" on the terminal.
    script = tmp_path / "first.py"
    script.write_text(FIRST_CHILD)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert run.stdout.split() == ["True", "True"], run.stderr
