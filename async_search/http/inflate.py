"""A request body's Content-Encoding, decoded within the front's body limit.

A compressed body is read whole (bounded by the limit on the bytes that arrive), then
inflated here a bounded step at a time: a small body that inflates past the limit is
refused as soon as its output does (413), never held in memory whole (aiohttp's own
decoding inflated each arriving chunk whole: a 1 MB gzip of zeros took 225 MB).

Example:
    >>> import gzip
    >>> inflate(gzip.compress(b"abc" * 4), "gzip", limit=100)
    b'abcabcabcabc'
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict, List

from async_search.errors import ProtocolError


def inflate(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` decoded by its ``content_encoding`` (``gzip``, ``deflate``, ``br`` with the
    ``brotli`` package, ``identity``; several, comma-separated, are undone in reverse
    order); at most ``limit`` bytes come out.

    Raises:
        ProtocolError: 413 when the decoded body would pass ``limit``; 400 when it cannot
            be decoded; 415 for an encoding this front does not decode.
    """
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    for coding in reversed([c for c in codings if c and c != "identity"]):
        decode = _DECODERS.get(coding)
        if decode is None:
            raise ProtocolError(
                f"the body's Content-Encoding {coding!r} is not one this front decodes "
                f"({', '.join(sorted(c for c in _DECODERS if _available(c)))}, "
                f"identity)", status=415)
        body = decode(body, limit)
    return body


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(f"the request body, decoded, is larger than the front's limit "
                         f"of {limit} bytes", status=413)


def _undecodable(coding: str, why: object) -> ProtocolError:
    return ProtocolError(f"the body could not be decoded with its Content-Encoding "
                         f"({coding}): {why}", status=400)


def _zlib(body: bytes, limit: int, wbits: int, coding: str) -> bytes:
    """Inflates one or more concatenated zlib/gzip streams, ``limit`` bytes at most."""
    out: List[bytes] = []
    total = 0
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            while data:
                piece = inflater.decompress(data, limit - total + 1)  # never 0: bounded
                total += len(piece)
                if total > limit:
                    raise _too_large(limit)
                out.append(piece)
                data = inflater.unconsumed_tail
                if inflater.eof:
                    break
            piece = inflater.flush()
        except zlib.error as e:
            raise _undecodable(coding, e) from None
        total += len(piece)
        if total > limit:
            raise _too_large(limit)
        out.append(piece)
        if not inflater.eof:
            raise _undecodable(coding, "the stream ends before its end")
        data = inflater.unused_data
        if not data:  # a gzip body may hold several members, one after another
            return b"".join(out)


def _gzip(body: bytes, limit: int) -> bytes:
    return _zlib(body, limit, 16 + zlib.MAX_WBITS, "gzip")


def _deflate(body: bytes, limit: int) -> bytes:
    # HTTP's deflate is the zlib format; some clients send raw deflate (as browsers
    # accept): the zlib header says which.
    zlib_header = len(body) >= 2 and (body[0] & 0x0F) == 8 and (
        (body[0] << 8) | body[1]) % 31 == 0
    return _zlib(body, limit, zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS,
                 "deflate")


def _brotli(body: bytes, limit: int) -> bytes:
    try:
        import brotli
    except ImportError:
        raise ProtocolError("the body's Content-Encoding 'br' needs the brotli package, "
                            "which this front does not have", status=415) from None
    inflater = brotli.Decompressor()
    out: List[bytes] = []
    total = 0
    data = body
    try:
        while True:
            piece = inflater.process(data, output_buffer_limit=limit - total + 1)
            data = b""  # given whole; what it holds back comes with empty input
            total += len(piece)
            if total > limit:
                raise _too_large(limit)
            out.append(piece)
            if inflater.is_finished():
                return b"".join(out)
            if not piece and inflater.can_accept_more_data():
                raise _undecodable("br", "the stream ends before its end")
    except brotli.error as e:
        raise _undecodable("br", e) from None


def _available(coding: str) -> bool:
    if coding != "br":
        return True
    try:
        import brotli  # noqa: F401
    except ImportError:
        return False
    return True


_DECODERS: Dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate, "br": _brotli}
