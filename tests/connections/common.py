"""What the connection tests share: queue factories and bounded receive helpers."""

import queue
import time

import pytest

from async_search.queues import local_queue, thread_queue
from tests.helpers import WAIT_S

#: Factories whose queues a single thread can use without blocking forever.
FACTORIES = [pytest.param(queue.Queue, id="Queue"), pytest.param(local_queue, id="local"),
             pytest.param(thread_queue, id="thread")]


def recv(conn):
    """The next message, without blocking forever (a LocalQueue never blocks anyway)."""
    return conn.recv(timeout=WAIT_S)


def flush_until(fns, futures, timeout=WAIT_S):
    """Flushes ``fns`` until every future is done (bounded); no loop runs."""
    deadline = time.monotonic() + timeout
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, "responses did not arrive in time"
        for fn in fns:
            fn.flush()
        time.sleep(0.001)
