"""Arrays read from an ``.npz`` file only once their headers fit what is expected.

``np.load`` inflates a member whole before its shape can be checked, and allocates
what its header declares: a small hostile file (a zip bomb, a header declaring
terabytes) would take the memory. ``checked_array`` reads the member's header first.
"""

from __future__ import annotations

import math

import numpy as np

#: Bytes an ``.npy`` member may hold besides its data (its magic and header).
_HEADER_BYTES = 1 << 16
#: The widest element an expected array may arrive in (dtypes are kept: float64,
#: int64, the long double of some platforms, complex128).
MAX_ITEMSIZE = 16


def checked_array(npz: "np.lib.npyio.NpzFile", name: str, max_bytes: int) -> np.ndarray:
    """``npz[name]``, once the member's size and the shape and dtype its header declares
    take at most ``max_bytes`` of data: what it is checked against after that (its
    shape, its dtype) is the caller's.

    Example:
        >>> import io
        >>> buffer = io.BytesIO(); np.savez(buffer, w=np.ones((2, 3), np.float32))
        >>> with np.load(io.BytesIO(buffer.getvalue())) as npz:
        ...     checked_array(npz, "w", 6 * MAX_ITEMSIZE).shape
        (2, 3)

    Raises:
        KeyError: no such member.
        ValueError: the member, or what its header declares, is larger than allowed, or
            its header is not an ``.npy`` header.
    """
    member = name + ".npy"
    try:
        info = npz.zip.getinfo(member)
    except KeyError:
        raise KeyError(f"there is no array {name!r}") from None
    if info.file_size > max_bytes + _HEADER_BYTES:
        raise ValueError(f"the array {name!r} takes {info.file_size:,} bytes unpacked, "
                         f"more than the {max_bytes:,} it may")
    with npz.zip.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            declared, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            declared, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"the array {name!r} is in .npy format {version}, not one "
                             f"this reads (1.0, 2.0)")
    if not all(0 <= d < 2 ** 63 for d in declared):  # (0, 10**30) is 0 bytes, and
        # NumPy's read then overflows
        raise ValueError(f"the array {name!r} declares a shape {list(declared)[:8]} "
                         f"with a dimension no array has")
    if math.prod(declared) * dtype.itemsize > max_bytes:
        raise ValueError(f"the array {name!r} declares {list(declared)} of {dtype}, more "
                         f"than the {max_bytes:,} bytes it may take")
    return npz[name]
