"""What this process may use of the machine: its CPUs and its open-file limit.

``os.cpu_count()`` counts the machine's CPUs, not those this process may run on
(``taskset``, a container's cpuset): defaults sized by it oversubscribe a process
confined to fewer.

Example:
    >>> usable_cpus() >= 1
    True
    >>> limit = open_file_limit()
    >>> limit is None or limit > 0
    True
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system tells it), at
    least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: the machine's count is the best there is
        return os.cpu_count() or 1


def open_file_limit() -> int | None:
    """This process's soft limit on open file descriptors (``ulimit -n``); None where
    there is none or it cannot be read."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft
