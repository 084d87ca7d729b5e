"""A request body's Content-Encoding, decoded within the front's body limit.

A compressed body is read whole (bounded by the limit on the bytes that arrive), then
inflated here a bounded step at a time: a small body that inflates past the limit is
refused as soon as its output does (413), never held in memory whole (aiohttp's own
decoding inflated each arriving chunk whole: a 1 MB gzip of zeros took 225 MB). The
work is bounded too: at most ``MAX_CODINGS`` codings, and ``MAX_MEMBERS`` gzip members
(or zlib streams) in a body, each read in linear time (4 MB of 200,000 empty members
took tens of seconds, which the event loop spent inflating).

Example:
    >>> import gzip
    >>> inflate(gzip.compress(b"abc" * 4), "gzip", limit=100)
    b'abcabcabcabc'
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict, List

from async_search.errors import ProtocolError

#: The most codings (other than identity) one Content-Encoding may stack: each may
#: inflate up to the limit (1600 gzip layers held the loop for seconds).
MAX_CODINGS = 2
#: The most gzip members (or zlib streams) one coding's body may concatenate.
MAX_MEMBERS = 1000
# The compressed bytes given to a decompressor at once: what it copies of those it has
# not used (its unconsumed_tail and unused_data) is never more, however long the body.
_STEP = 64 * 2 ** 10


def inflate(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` decoded by its ``content_encoding`` (``gzip``, ``deflate``, ``br`` with the
    ``brotli`` package, ``identity``; up to ``MAX_CODINGS``, comma-separated, are undone
    in reverse order); at most ``limit`` bytes come out.

    Raises:
        ProtocolError: 413 when the decoded body would pass ``limit``; 400 when it cannot
            be decoded or holds more than ``MAX_MEMBERS`` gzip members; 415 for an
            encoding this front does not decode, or more than ``MAX_CODINGS`` of them.
    """
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if len(codings) > MAX_CODINGS:
        raise ProtocolError(f"the body's Content-Encoding stacks {len(codings)} codings; "
                            f"this front undoes at most {MAX_CODINGS}", status=415)
    for coding in reversed(codings):
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
    """Inflates one or more concatenated zlib/gzip streams (``MAX_MEMBERS`` at most),
    ``limit`` bytes at most, in time linear in the body: the body is read at an offset,
    ``_STEP`` bytes at a time, never copied whole per stream."""
    out: List[bytes] = []
    total = 0
    view = memoryview(body)
    position = 0
    for _ in range(MAX_MEMBERS):  # a gzip body may hold members one after another
        inflater = zlib.decompressobj(wbits)
        try:
            while not inflater.eof and position < len(view):
                data = view[position:position + _STEP]
                piece = inflater.decompress(data, limit - total + 1)  # never 0: bounded
                position += len(data) - len(inflater.unconsumed_tail) - len(
                    inflater.unused_data)
                total += len(piece)
                if total > limit:
                    raise _too_large(limit)
                out.append(piece)
            piece = inflater.flush()
        except zlib.error as e:
            raise _undecodable(coding, e) from None
        total += len(piece)
        if total > limit:
            raise _too_large(limit)
        out.append(piece)
        if not inflater.eof:
            raise _undecodable(coding, "the stream ends before its end")
        if position == len(view):
            return b"".join(out)
    raise ProtocolError(f"the body's {coding} holds more than {MAX_MEMBERS} concatenated "
                        f"members (streams), more than this front takes", status=400)


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
