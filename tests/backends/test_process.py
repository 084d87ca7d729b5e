import pytest
import numpy as np

import async_search as asr
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("num_procs", [1, 2, 4])
def test_process_results_equal_the_local_backend(num_procs):
    starts = searches.starts(8)
    local = asr.run_searches(searches.astar, starts, searches.mlp_heuristic)
    out = asr.run_searches(searches.astar, starts, searches.mlp_heuristic,
                           backend="process", num_procs=num_procs)
    assert out == local
    assert out.stats["backend"] == "process" and out.stats["num_procs"] == num_procs
    assert out.stats["elements"] == local.stats["elements"]


def test_process_clients_coalesce_requests_into_one_message_per_iteration():
    out = asr.run_searches(searches.echo_sum, [5] * 20, searches.small_mlp,
                           backend="process", num_procs=1)
    assert out == searches.baseline(searches.echo_sum, [5] * 20, searches.small_mlp())
    # 20 searches x 5 sequential requests, one message per iteration: 5 batches of 20.
    assert out.stats["batches"] <= 6 and out.stats["mean_batch_size"] >= 16


def test_several_servers_share_the_stream_with_process_clients():
    out = asr.run_searches(searches.echo_sum, list(range(30)), searches.small_mlp,
                           backend="process", num_procs=2, num_servers=2, max_batch_size=4)
    assert out == searches.baseline(searches.echo_sum, list(range(30)), searches.small_mlp())


def test_a_search_that_raises_in_a_client_is_reported():
    with pytest.raises(asr.SearchError, match="start 3") as info:
        asr.run_searches(searches.fails_on_three, list(range(6)), searches.small_mlp,
                         backend="process", num_procs=2)
    assert list(info.value.failures) == [3]
    assert "cursed" in str(info.value.failures[3])


def test_a_client_process_that_dies_is_reported_and_the_rest_finish():
    with pytest.raises(asr.SearchError) as info:
        asr.run_searches(searches.kill_self_on_two, list(range(6)), searches.small_mlp,
                         backend="process", num_procs=2)
    # Client 0 ran starts 0, 2, 4 and died; client 1's starts finished.
    assert sorted(info.value.failures) == [0, 2, 4]
    assert "died with exit code -9" in str(info.value.failures[0])


def test_process_backend_with_the_model_on_the_servers_loop():
    out = asr.run_searches(searches.echo_sum, [4] * 10, searches.small_mlp,
                           backend="process", num_procs=2, model_thread=False)
    assert out == searches.baseline(searches.echo_sum, [4] * 10, searches.small_mlp())


def test_an_unpicklable_search_function_is_refused_before_any_process_starts():
    async def nested(start, evaluate):
        return start

    with pytest.raises(TypeError, match="must be picklable"):
        asr.run_searches(nested, [1], searches.small_mlp, backend="process")


async def _big_result(start, evaluate):
    return np.full(1 << 18, float(start))  # 2 MiB per search: a report far above any buffer


def test_a_large_report_reaches_a_stalled_reader_whole_before_the_client_exits():
    """The client must not let its loop end with the report's tail still buffered:
    drain() returns once less than the low-water mark (16 KiB) is left, not at empty.
    A server that stalls then (busy, loaded) read a truncated frame and reported a client
    that had exited with code 0 as dead. Small socket buffers and a reader that stops
    20 KiB short of the end for a second make the stall happen every time."""
    import socket
    import struct
    import threading
    import time

    from async_search.backends.process import client_main

    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    received = bytearray()

    def stalling_reader():
        ours.settimeout(30)
        while len(received) < 8:
            received.extend(ours.recv(8 - len(received)))
        (length,) = struct.unpack_from("!Q", received)
        stall_at, stalled = 8 + length - 20 * 1024, False
        while True:
            if not stalled and len(received) >= stall_at:
                time.sleep(1.0)  # the server is busy elsewhere
                stalled = True
            chunk = ours.recv(min(4096, max(1, stall_at - len(received)))
                              if not stalled else 4096)
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=stalling_reader)
    reader.start()
    client_main(theirs, _big_result, [1.0, 2.0], None, False)  # returns when it exits
    theirs.close()
    reader.join(timeout=60)
    ours.close()
    assert not reader.is_alive()
    (length,) = struct.unpack_from("!Q", received)
    assert len(received) == 8 + length, (
        f"the report's tail was lost: {8 + length - len(received)} of {8 + length} bytes")
