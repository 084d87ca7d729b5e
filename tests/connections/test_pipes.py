"""connections.pipes: the knossos prototype's pipes, forked pipes and pass-through keys
(with ``queue.Queue`` and the awaitable queues), and how a stream ends when its ends
close."""

import asyncio
import pickle
import queue
import threading

import pytest

from async_search.connections import (Connection, ForkedConnection, KeyedConnection,
                                      Notice, PassThroughConnection, forked_pipe,
                                      get_connected_functions, pipe)
from async_search.errors import MalformedMessageError, ServerDiedError
from async_search.queues import (END_OF_STREAM, ClosedConnection, close_stream, local_queue,
                                 thread_queue)
from tests.connections.common import FACTORIES, recv
from tests.helpers import WAIT_S, within

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("factory", FACTORIES)
def test_pipe_carries_objects_both_ways_with_poll_and_num_waiting(factory):
    a, b = pipe(factory)
    assert isinstance(a, Connection) and not a.poll() and a.num_waiting() == 0
    a.send(1)
    a.send({"two": 2})
    b.send("back")
    assert b.poll() and b.num_waiting() == 2
    assert recv(b) == 1 and recv(b) == {"two": 2}
    assert not b.poll() and b.num_waiting() == 0
    assert a.poll() and recv(a) == "back" and not a.poll()


def test_pipe_recv_without_a_message_raises_empty():
    a, _ = pipe(queue.Queue)
    with pytest.raises(queue.Empty):
        a.recv(block=False)
    with pytest.raises(queue.Empty):
        a.recv(timeout=0.01)


def test_pipe_maxsize_bounds_each_queue():
    a, b = pipe(queue.Queue, maxsize=1)
    a.send(1)
    with pytest.raises(queue.Full):
        a.send(2, block=False)
    b.send(3, block=False)  # the other direction has its own bound
    assert recv(b) == 1 and recv(a) == 3


def test_design_contract_forked_pipe_answers_its_client():
    for queue_factory in (queue.Queue, local_queue, thread_queue):
        server, clients = forked_pipe(queue_factory, 2)
        clients[0].send(3)
        assert server.recv() == 3
        server.send(9)
        assert clients[0].recv() == 9
        assert not clients[1].poll()


@pytest.mark.parametrize("factory", FACTORIES)
def test_forked_pipe_routes_answers_to_their_clients_in_fifo_order(factory):
    server, clients = forked_pipe(factory, 3)
    assert isinstance(server, ForkedConnection) and len(clients) == 3
    assert all(isinstance(c, KeyedConnection) for c in clients)
    assert [c.key for c in clients] == [0, 1, 2]
    sends = [(2, "a"), (0, "b"), (2, "c"), (1, "d"), (0, "e"), (2, "f")]
    for i, payload in sends:
        clients[i].send(payload)
    assert server.num_waiting() == len(sends)
    received = [recv(server) for _ in sends]
    assert received == [p for _, p in sends]  # bare payloads, in arrival order
    for payload in received:
        server.send(payload.upper())
    assert [recv(clients[0]) for _ in range(2)] == ["B", "E"]
    assert [recv(clients[1])] == ["D"]
    assert [recv(clients[2]) for _ in range(3)] == ["A", "C", "F"]
    assert not any(c.poll() for c in clients)


def test_forked_pipe_answers_interleaved_with_requests_still_route_in_order():
    server, (c0, c1) = forked_pipe(queue.Queue, 2)
    c0.send(1)
    c1.send(2)
    assert recv(server) == 1
    server.send(10)  # answers c0 while c1's request is still queued
    c0.send(3)
    assert recv(server) == 2 and recv(server) == 3
    server.send(20)
    server.send(30)
    assert [recv(c0), recv(c0), recv(c1)] == [10, 30, 20]


@pytest.mark.parametrize("num_branches", [0, -1, 1.5, True, "2"])
def test_forked_pipe_refuses_a_bad_number_of_branches(num_branches):
    with pytest.raises(ValueError, match="num_branches"):
        forked_pipe(queue.Queue, num_branches)


@pytest.mark.parametrize("factory", FACTORIES)
def test_pass_through_connection_keeps_the_keys_of_its_messages(factory):
    client, server_end = pipe(factory)
    server = PassThroughConnection(server_end)
    for key, value in (("k1", 1), (("tuple", "key"), 2), (None, 3)):
        client.send((key, value))
    assert [recv(server) for _ in range(3)] == [1, 2, 3]
    for response in ("one", "two", "three"):
        server.send(response)
    assert [recv(client) for _ in range(3)] == [
        ("k1", "one"), (("tuple", "key"), "two"), (None, "three")]


@pytest.mark.parametrize("factory", FACTORIES)
def test_end_of_stream_is_sticky_for_every_reader_of_a_queue(factory):
    a, b = pipe(factory)
    readers = [b, Connection(b.inbound, b.outbound)]
    a.send("x")
    a.close()
    assert recv(readers[1]) == "x"
    for reader in readers + readers:
        with pytest.raises(ClosedConnection):
            recv(reader)


async def test_recv_async_raises_closed_connection_for_every_waiting_reader():
    a, b = pipe(local_queue)
    readers = [asyncio.ensure_future(b.recv_async()) for _ in range(2)]
    await asyncio.sleep(0)
    a.close()
    for reader in readers:
        with pytest.raises(ClosedConnection):
            await within(reader, "the end of the stream")


@pytest.mark.parametrize("factory", FACTORIES)
def test_forked_server_ends_only_after_every_client_closed(factory):
    server, clients = forked_pipe(factory, 3)
    clients[0].send("a")
    clients[0].close()
    clients[1].send("b")
    clients[2].close()
    assert recv(server) == "a" and recv(server) == "b"
    server.send("A")
    with pytest.raises(queue.Empty):  # client 1 may still send
        server.recv(block=False)
    clients[1].send("c")
    assert recv(server) == "c"
    clients[1].close()
    copy = server.copy()
    for conn in (server, copy, server):
        with pytest.raises(ClosedConnection):
            recv(conn)
    assert recv(clients[0]) == "A"


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_clients_close_is_no_message_to_poll_for(factory):
    # The prototype's serving loop, `while server.poll(): server.send(server.recv())`,
    # must not block on a close that poll counted and recv skips.
    server, (c0, c1, c2) = forked_pipe(factory, 3)
    c1.send(1)
    c0.close()
    c2.send(2)
    assert server.num_waiting() == 2  # c0's close is not one
    served = []
    while server.poll():
        served.append(server.recv())
        server.send(served[-1] * 10)
    assert served == [1, 2] and server.num_waiting() == 0
    assert recv(c1) == 10 and recv(c2) == 20
    # A message taken in by num_waiting keeps its sender and its place in the answers.
    c2.send(3)
    c1.send(4)
    assert server.num_waiting() == 2
    assert server.recv() == 3 and server.sender == c2.key
    assert server.recv() == 4 and server.sender == c1.key
    server.send(30)
    server.send(40)
    assert recv(c2) == 30 and recv(c1) == 40
    # What num_waiting took in is this end's: a pickled copy does not get it too.
    c1.send(5)
    assert server.num_waiting() == 1
    assert not server.__getstate__()["_ahead"]
    assert server.recv() == 5
    server.send(50)
    assert recv(c1) == 50
    c1.close()
    c2.close()
    assert server.num_waiting() == 0  # every client closed: the stream ends
    with pytest.raises(ClosedConnection):
        recv(server)


async def test_forked_server_recv_async_ends_after_every_client_closed():
    server, clients = forked_pipe(thread_queue, 2)

    async def take_all():
        taken = []
        with pytest.raises(ClosedConnection):
            while True:
                taken.append(await server.recv_async())
        return taken

    taking = asyncio.ensure_future(take_all())
    clients[0].send(1)
    clients[0].close()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not taking.done()
    thread = threading.Thread(target=lambda: (clients[1].send(2), clients[1].close()))
    thread.start()
    assert await within(taking, "the end of the forked stream") == [1, 2]
    thread.join(WAIT_S)


def test_a_client_closing_twice_does_not_end_the_others_stream():
    server, (c0, c1) = forked_pipe(queue.Queue, 2)
    c0.close()
    c0.close()
    c1.send(1)
    assert recv(server) == 1
    with pytest.raises(queue.Empty):
        server.recv(block=False)


@pytest.mark.parametrize("factory", FACTORIES)
def test_close_stream_on_the_inbound_ends_every_copy_of_a_server(factory):
    server, clients = forked_pipe(factory, 2)
    copies = [server, server.copy(), PassThroughConnection(server.copy())]
    clients[0].send(("k", "x"))
    close_stream(server.inbound)
    assert recv(copies[2]) == "x"
    for conn in copies:
        with pytest.raises(ClosedConnection):
            recv(conn)


def test_forked_server_close_ends_every_clients_stream():
    server, clients = forked_pipe(queue.Queue, 2)
    clients[1].send(5)
    assert recv(server) == 5
    server.send(25)
    server.close()
    assert recv(clients[1]) == 25
    for client in clients:
        with pytest.raises(ClosedConnection):
            recv(client)


def test_end_of_stream_survives_pickling():
    assert pickle.loads(pickle.dumps(END_OF_STREAM)) is END_OF_STREAM


@pytest.mark.parametrize("factory", [local_queue, thread_queue])
@pytest.mark.parametrize("num_fns", [1, 2])
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
async def test_pending_futures_fail_with_server_died_when_the_responses_stream_closes(
        factory, num_fns, ordered):
    fns, server = get_connected_functions(factory, num_fns, ordered)
    answered = fns[0]("first")
    pending = [fn(i) for i, fn in enumerate(fns)]
    assert await within(server.recv_async(), "a request") == "first"
    server.send("answer")
    server.close()  # every client's stream of responses ends
    assert await within(answered, "the answer sent before closing") == "answer"
    for fut in pending:
        with pytest.raises(ServerDiedError, match="closed"):
            await within(fut, "the failure")
    for fn in fns:
        assert isinstance(fn.error, ServerDiedError)
        with pytest.raises(ServerDiedError):  # later calls fail at once
            fn("later")



class GoneQueue:
    """A client's answer queue after its process died: every put raises."""

    def put(self, item, block=True, timeout=None):
        raise ClosedConnection("the reading end closed")

    def put_nowait(self, item):
        self.put(item)

    def qsize(self):
        return 0


async def test_an_answer_to_a_gone_client_keeps_the_next_answers_on_their_requests():
    # A pass-through end over a forked end: the answer to client 0, whose process
    # died, cannot be sent; client 1's answers must still reach their own requests.
    (f0, f1), server = get_connected_functions(local_queue, 2, ordered=False)
    lost = f0("for the gone client")
    first, second = f1("first"), f1("second")
    await asyncio.sleep(0)
    messages = [server.recv() for _ in range(3)]
    server._conn._outbounds[0] = GoneQueue()
    for message in messages:
        server.send(f"answer to {message}")  # the gone client's is dropped, not raised
    assert await within(first, "first") == "answer to first"
    assert await within(second, "second") == "answer to second"
    assert not lost.done()
    lost.cancel()
    for fn in (f0, f1):
        await fn.aclose()


def test_a_forked_end_answers_the_other_clients_after_one_is_gone():
    server, clients = forked_pipe(queue.Queue, 2)
    clients[0].send("a")
    clients[1].send("b")
    assert [server.recv(), server.recv()] == ["a", "b"]
    server._outbounds[0] = GoneQueue()
    server.send("to the gone client")
    server.send("to b")
    server.send_pending()
    assert clients[1].recv(timeout=WAIT_S) == "to b"
    server.notify(Notice())  # the gone client hears of nothing more; no error
    assert isinstance(clients[1].recv(timeout=WAIT_S), Notice)


def test_a_pass_through_answer_that_timed_out_still_waits_to_be_sent():
    client, server_end = pipe(queue.Queue, maxsize=1)
    server = PassThroughConnection(server_end)
    client.send(("k1", 1))
    assert server.recv() == 1
    client.send(("k2", 2))
    assert server.recv() == 2
    server.send("one")  # the answers' bound: room for one
    with pytest.raises(queue.Full):
        server.send("two", timeout=0.01)  # not sent: k2 still waits for its answer
    assert client.recv() == ("k1", "one")
    server.send("two")
    assert client.recv() == ("k2", "two")


def test_closing_on_a_full_queue_that_cannot_wait_leaves_the_end_open_to_close_again():
    a, b = pipe(local_queue, maxsize=1)
    a.send("x")
    with pytest.raises(queue.Full):
        a.close()
    assert not a.closed
    assert b.recv() == "x"
    a.close()
    assert a.closed
    with pytest.raises(ClosedConnection):
        b.recv()


def test_a_keyed_client_closing_on_a_full_queue_stays_open_to_close_again():
    server, (client,) = forked_pipe(local_queue, 1, maxsize=1)
    client.send("x")
    with pytest.raises(queue.Full):
        client.close()
    assert not client.closed and server.recv() == "x"
    client.close()
    with pytest.raises(ClosedConnection):
        server.recv()


@pytest.mark.parametrize("error", [BrokenPipeError, ClosedConnection])
def test_closing_an_end_whose_reader_is_gone_closes_it_once_quietly(error):
    # Outside a running loop each close raised again: the end never counted as closed.
    class Gone(queue.Queue):
        def put(self, item, block=True, timeout=None):
            raise error("the reading end closed")

    a, _ = pipe(Gone)
    a.close()
    a.close()
    assert a.closed
    with pytest.raises(ClosedConnection):
        a.send("x")
    server, (client,) = forked_pipe(Gone, 1)
    client.close()
    client.close()
    assert client.closed


@pytest.mark.parametrize("message", [42, ("a", "b", "c"), (7, "from a stranger"),
                                     ([1], "an unhashable key")])
def test_a_forked_end_names_a_malformed_message(message):
    server, _ = forked_pipe(queue.Queue, 2)
    server.inbound.put(message)
    with pytest.raises(MalformedMessageError):
        server.recv()


def test_a_forked_end_polls_true_for_a_message_still_in_a_multiprocessing_feeder():
    # The prototype's poll is qsize() > 0; the forked end's found nothing (False in 19
    # of 20 tries) until the queue's feeder thread had written the message.
    import multiprocessing
    for _ in range(10):
        server, clients = forked_pipe(multiprocessing.get_context("spawn").Queue, 2)
        clients[1].send("x")
        assert server.poll() and server.recv() == "x" and server.sender == 1
        clients[0].close()  # a close on its way is no message to poll for
        assert not server.poll()
