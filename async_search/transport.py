"""Frames between processes over asyncio streams: pickle protocol 5, arrays out of band.

A frame is a small pickled header plus the raw bytes of every NumPy array in the object,
written straight from the arrays' memory (no pickling copy on the sending side). Streams
never block the event loop: a full pipe buffers in the transport instead of stalling, so
two processes writing to each other cannot deadlock.

    >>> import asyncio, socket
    >>> async def roundtrip(obj):
    ...     a, b = socket.socketpair()
    ...     ra, wa = await asyncio.open_connection(sock=a)
    ...     rb, wb = await asyncio.open_connection(sock=b)
    ...     write_frame(wa, obj)
    ...     got = await read_frame(rb)
    ...     wa.close(); wb.close()
    ...     return got
    >>> asyncio.run(roundtrip({"x": np.arange(3)}))["x"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any, List

import numpy as np

__all__ = ["write_frame", "read_frame", "concat_requests"]

# A frame: its length after this prefix, then the pickled header's length and the
# number of out-of-band buffers, each buffer's length, the header, the buffers.
_PREFIX = struct.Struct("!Q")
_COUNTS = struct.Struct("!II")


def write_frame(writer: asyncio.StreamWriter, obj: Any) -> None:
    """Queues ``obj`` on ``writer`` as one frame; returns at once (no await needed)."""
    buffers: List[pickle.PickleBuffer] = []
    header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    sizes = struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
    counts = _COUNTS.pack(len(header), len(views))
    length = len(counts) + len(sizes) + len(header) + sum(v.nbytes for v in views)
    writer.writelines([_PREFIX.pack(length), counts, sizes, header, *views])


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's object (two reads a frame; arrays are views of what was read).

    Raises:
        asyncio.IncompleteReadError: when the other end closed (it exited or died).
    """
    (length,) = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
    frame = memoryview(await reader.readexactly(length))
    header_length, count = _COUNTS.unpack_from(frame)
    at = _COUNTS.size
    sizes = struct.unpack_from(f"!{count}Q", frame, at)
    at += 8 * count
    header = frame[at:at + header_length]
    at += header_length
    buffers = []
    for size in sizes:
        buffers.append(frame[at:at + size])
        at += size
    return pickle.loads(header, buffers=buffers)


def concat_requests(xs: List[np.ndarray]) -> np.ndarray:
    """The requests of one loop iteration, as one array for one message."""
    return xs[0] if len(xs) == 1 else np.concatenate(xs)
