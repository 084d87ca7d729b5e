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

__all__ = ["write_frame", "read_frame", "concat_requests", "split_outputs"]

_COUNTS = struct.Struct("!II")  # header length, number of out-of-band buffers


def write_frame(writer: asyncio.StreamWriter, obj: Any) -> None:
    """Queues ``obj`` on ``writer`` as one frame; returns at once (no await needed)."""
    buffers: List[pickle.PickleBuffer] = []
    header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    sizes = struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
    writer.writelines([_COUNTS.pack(len(header), len(views)), sizes, header, *views])


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's object.

    Raises:
        asyncio.IncompleteReadError: when the other end closed (it exited or died).
    """
    header_length, count = _COUNTS.unpack(await reader.readexactly(_COUNTS.size))
    sizes = struct.unpack(f"!{count}Q", await reader.readexactly(8 * count)) if count else ()
    header = await reader.readexactly(header_length)
    buffers = [await reader.readexactly(size) for size in sizes]
    return pickle.loads(header, buffers=buffers)


def concat_requests(xs: List[np.ndarray]) -> np.ndarray:
    """The requests of one loop iteration, as one array for one message."""
    return xs[0] if len(xs) == 1 else np.concatenate(xs)


def split_outputs(outputs: Any, sizes: List[int]) -> List[Any]:
    """One message's outputs back into each request's outputs (views)."""
    bounds = np.cumsum([0, *sizes]).tolist()
    if isinstance(outputs, dict):
        return [{k: v[a:b] for k, v in outputs.items()} for a, b in zip(bounds, bounds[1:])]
    if isinstance(outputs, tuple):
        return [tuple(v[a:b] for v in outputs) for a, b in zip(bounds, bounds[1:])]
    return [outputs[a:b] for a, b in zip(bounds, bounds[1:])]
