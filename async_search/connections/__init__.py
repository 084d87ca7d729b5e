"""Connections over QueueLike queues, and connected functions that make requests on them.

These are the knossos prototype's connections, with its semantics exactly (code written
for it runs here after changing its imports), plus awaiting, closing and notices.
``pipes``: the ends of a connection (``Connection``, ``pipe``, ``forked_pipe``,
``PassThroughConnection``, ``Notice``); ``functions``: calls that are requests over a
connection (``FifoConnectedFunction``, ``UnorderedConnectedFunction``,
``get_connected_functions``).

One lifecycle, the same over every queue (local, thread, process, socket, Ray, and the
prototype's ``queue.Queue``):

- ``close()`` ends the stream an end sends on, once (a second close does nothing); the
  other end receives everything sent before it, then ``ClosedConnection``, and only
  ``ClosedConnection`` from then on. Closing is half-closing: the end still receives.
- ``send`` after ``close`` raises ``ClosedConnection`` naming the misuse; nothing is put
  after the end of a stream. Copies of an end (``copy()``) share its state.
- A forked server end closes a client's stream of answers once that client has closed
  its requests and every one of them is answered; ``serve_connection`` closes the end it
  serves once its stream has ended. A call on a connected function whose own end was
  closed raises ``ClosedConnection`` at once; one whose server's end is gone fails with
  ``ConnectionGoneError`` (a ``ClosedConnection`` and a ``ServerDiedError``), at once
  once that is known, and so does every later call.
- Misuse raises an error that names it: ``send`` on a server end with no request to
  answer, a message that is not ``(key, value)`` on a forked or pass-through end.

    >>> from queue import Queue
    >>> server, clients = forked_pipe(Queue, 2)
    >>> clients[0].send(3); server.recv()
    3
    >>> server.send(9); clients[0].recv()
    9
"""

from async_search.connections.functions import (ConnectedFunction, FifoConnectedFunction,
                                                Receiver, UnorderedConnectedFunction,
                                                get_connected_functions)
from async_search.connections.pipes import (Connection, DelegatingConnection,
                                            ForkedConnection, KeyedConnection, Notice,
                                            PassThroughConnection, forked_pipe, identity,
                                            pipe)
from async_search.errors import ClosedConnection

__all__ = [
    "Connection", "DelegatingConnection", "ForkedConnection", "KeyedConnection",
    "PassThroughConnection", "ClosedConnection", "Notice", "pipe", "forked_pipe",
    "ConnectedFunction", "FifoConnectedFunction", "UnorderedConnectedFunction",
    "Receiver", "get_connected_functions", "identity",
]
