import os
import subprocess
import sys

import pytest

from async_search.machine import open_file_limit, usable_cpus

pytestmark = pytest.mark.timeout(60)


def in_child(code: str, preexec=None) -> str:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, preexec_fn=preexec)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_usable_cpus_counts_the_cpus_the_process_may_run_on_not_the_machines():
    # Ray's num_cpus and the server limits were sized by os.cpu_count(): under
    # `taskset -c 0` on a 2-core machine they counted 2.
    first = sorted(os.sched_getaffinity(0))[0]
    out = in_child("from async_search.machine import usable_cpus\n"
                   "from async_search.backends.config import max_servers\n"
                   "print(usable_cpus(), max_servers('local'))",
                   preexec=lambda: os.sched_setaffinity(0, {first}))
    assert out == "1 4"
    assert usable_cpus() == len(os.sched_getaffinity(0))


def test_open_file_limit_is_the_soft_limit():
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = in_child("from async_search.machine import open_file_limit\n"
                   "print(open_file_limit())",
                   preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard)))
    assert out == "100"
    assert open_file_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0] or (
        resource.getrlimit(resource.RLIMIT_NOFILE)[0] == resource.RLIM_INFINITY)
