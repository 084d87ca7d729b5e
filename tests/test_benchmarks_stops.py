"""benchmarks/*.py that start servers end them when they are sent SIGTERM (what
``timeout`` and ``kill`` send), as they do on Ctrl-C: the servers outlived the script,
re-parented to init, each holding a port."""

import os
import signal
import subprocess
import sys
import time

import pytest

from async_search import process_tree

pytest.importorskip("aiohttp")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(90)
def test_sigterm_to_http_load_ends_the_server_it_started(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "http_load.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.Popen([sys.executable, script, "--clients", "2", "--warmup", "0.1",
                            "--duration", "60"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = []
    try:
        for _ in range(600):  # 60 s at most for the server and the load to start
            started = [p for p in process_tree.descendants(run.pid)
                       if "async_search.http" in process_tree.command_line(p)
                       or "--load" in process_tree.command_line(p)]
            if len(started) == 2 or run.poll() is not None:
                break
            time.sleep(0.1)
        assert len(started) == 2, f"not started: {run.stderr.read()[-2000:]}"
        servers = started
        run.send_signal(signal.SIGTERM)
        assert run.wait(30) == 143
        for _ in range(100):  # 10 s at most for the server to end
            if not any(process_tree.is_alive(p) for p in servers):
                break
            time.sleep(0.1)
        left = [process_tree.command_line(p) for p in servers if process_tree.is_alive(p)]
        assert not left, f"outlived the script: {left}"
    finally:  # (what outlived the script is no longer below it: ended by name)
        if run.poll() is None:
            run.kill()
            run.wait(10)
        process_tree.end_processes([*process_tree.descendants(run.pid), *started],
                                   grace_s=1)
