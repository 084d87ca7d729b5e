"""npz.checked_array: an archive's arrays read only once what they declare is bounded."""

import io
import zipfile

import numpy as np
import pytest

from async_search.npz import checked_array


def npy(header: dict) -> bytes:
    """An .npy member of format 1.0 with this header and no data."""
    text = repr(header).encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def archive(**members: bytes) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(f"{name}.npy", data)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("shape", [(0, 10 ** 30), (10 ** 30, 0), (0, 2 ** 63)])
def test_a_shape_of_no_bytes_with_a_dimension_no_array_has_is_refused(shape):
    # Its product is 0, which passed the size check; NumPy's read then raised an
    # OverflowError that no caller expects (ReplayBuffer.load promises CheckpointError).
    data = archive(meta=npy({"descr": "|u1", "fortran_order": False, "shape": shape}))
    with np.load(data) as npz:
        with pytest.raises(ValueError, match="with a dimension no array has"):
            checked_array(npz, "meta", 1 << 16)


def test_an_array_within_its_bound_is_read():
    buffer = io.BytesIO()
    np.savez(buffer, w=np.arange(6, dtype=np.int32).reshape(2, 3), empty=np.zeros((0, 4)))
    with np.load(io.BytesIO(buffer.getvalue())) as npz:
        assert checked_array(npz, "w", 24).tolist() == [[0, 1, 2], [3, 4, 5]]
        assert checked_array(npz, "empty", 0).shape == (0, 4)
        with pytest.raises(ValueError, match="more than the 23 bytes it may take"):
            checked_array(npz, "w", 23)
        with pytest.raises(KeyError, match="there is no array 'x'"):
            checked_array(npz, "x", 24)
