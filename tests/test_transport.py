import asyncio
import socket

import numpy as np
import pytest

from async_search.transport import read_frame, write_frame

pytestmark = pytest.mark.timeout(30)


async def streams():
    a, b = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=a)
    reader, other = await asyncio.open_connection(sock=b)
    return writer, reader, other


async def test_frames_carry_arrays_and_plain_objects_in_order():
    writer, reader, other = await streams()
    big = np.random.default_rng(0).standard_normal((3000, 64)).astype(np.float32)
    messages = [("eval", 1, big), {"k": (np.arange(3), "text")}, ("done", [])]
    for m in messages:
        write_frame(writer, m)
    got = [await asyncio.wait_for(read_frame(reader), 10) for _ in messages]
    np.testing.assert_array_equal(got[0][2], big)
    assert got[0][:2] == ("eval", 1)
    assert got[1]["k"][0].tolist() == [0, 1, 2] and got[1]["k"][1] == "text"
    assert got[2] == ("done", [])
    writer.close()
    other.close()


async def test_reading_from_a_closed_stream_raises_incomplete_read():
    writer, reader, other = await streams()
    writer.close()
    with pytest.raises(asyncio.IncompleteReadError):
        await asyncio.wait_for(read_frame(reader), 10)
    other.close()
