"""http.inflate: a body's Content-Encoding decoded within the front's body limit."""

import gzip
import tracemalloc
import zlib

import pytest

from async_search.errors import ProtocolError
from async_search.http.inflate import inflate

TEXT = b"the body of a request " * 50


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def brotli_or_skip():
    return pytest.importorskip("brotli", reason="the brotli package is not installed")


@pytest.mark.parametrize("encoding, encode", [
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("GZip", gzip.compress),
    ("deflate", zlib.compress), ("deflate", raw_deflate),
    ("identity", lambda b: b), (None, lambda b: b), ("", lambda b: b),
])
def test_each_encoding_gives_the_body_back(encoding, encode):
    assert inflate(encode(TEXT), encoding, limit=len(TEXT)) == TEXT


def test_brotli_gives_the_body_back():
    brotli = brotli_or_skip()
    assert inflate(brotli.compress(TEXT), "br", limit=len(TEXT)) == TEXT


def test_several_encodings_are_undone_in_reverse_order():
    assert inflate(zlib.compress(gzip.compress(TEXT)), "gzip, deflate", 10_000) == TEXT


def test_a_gzip_body_of_several_members_is_read_whole():
    assert inflate(gzip.compress(b"one ") + gzip.compress(b"two"), "gzip", 100) == (
        b"one two")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_body_that_inflates_past_the_limit_is_refused_without_inflating_it(encoding):
    if encoding == "br":
        encode = brotli_or_skip().compress
    else:
        encode = gzip.compress if encoding == "gzip" else zlib.compress
    bomb = encode(b"\0" * (64 << 20))  # 64 MiB of zeros, tens of kB compressed
    limit = 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as refused:
            inflate(bomb, encoding, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413 and "decoded" in str(refused.value)
    assert peak < 4 * limit, peak  # never the 64 MiB


def test_a_body_exactly_at_the_limit_is_taken():
    assert inflate(gzip.compress(b"x" * 1000), "gzip", limit=1000) == b"x" * 1000
    with pytest.raises(ProtocolError):
        inflate(gzip.compress(b"x" * 1001), "gzip", limit=1000)


@pytest.mark.parametrize("encoding, body", [
    ("gzip", gzip.compress(TEXT)[:-12]),           # cut short
    ("gzip", b"not gzip at all"),
    ("deflate", zlib.compress(TEXT)[:10]),
    ("gzip", gzip.compress(TEXT) + b"trailing junk"),
])
def test_a_body_that_cannot_be_decoded_gets_400(encoding, body):
    with pytest.raises(ProtocolError) as refused:
        inflate(body, encoding, limit=1 << 20)
    assert refused.value.status == 400 and "could not be decoded" in str(refused.value)


def test_a_cut_brotli_body_gets_400():
    brotli = brotli_or_skip()
    with pytest.raises(ProtocolError) as refused:
        inflate(brotli.compress(TEXT)[:-3], "br", limit=1 << 20)
    assert refused.value.status == 400


def test_an_encoding_the_front_does_not_decode_gets_415():
    with pytest.raises(ProtocolError) as refused:
        inflate(b"abc", "compress", limit=100)
    assert refused.value.status == 415 and "'compress'" in str(refused.value)


def test_a_gzip_body_of_too_many_members_gets_400_at_once():
    # 200,000 empty members (4 MB) before the real one took tens of seconds, on the
    # front's event loop.
    body = gzip.compress(b"", mtime=0) * 20_000 + gzip.compress(TEXT)
    with pytest.raises(ProtocolError) as refused:
        inflate(body, "gzip", limit=16 << 20)
    assert refused.value.status == 400 and "members" in str(refused.value)


def test_a_gzip_body_of_many_members_is_handed_to_zlib_a_bounded_step_at_a_time(
        monkeypatch):
    # Each member was given the rest of the body, which zlib copied whole (its
    # unused_data) at the member's end: time quadratic in the number of members.
    import async_search.http.inflate as module

    members = 900
    body = gzip.compress(b"", mtime=0) * members + gzip.compress(b"x" * (4 << 20), 0)
    fed = []
    make = zlib.decompressobj

    class Counted:
        def __init__(self, wbits):
            self.inner = make(wbits)

        def decompress(self, data, max_length=0):
            fed.append(len(data))
            return self.inner.decompress(data, max_length)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(module.zlib, "decompressobj", Counted)
    assert inflate(body, "gzip", limit=8 << 20) == b"x" * (4 << 20)
    assert max(fed) <= 1 << 20, max(fed)  # never the rest of the body
    assert sum(fed) <= len(body) + (members + 1) * max(fed)  # linear in the body


def test_more_stacked_codings_than_the_cap_get_415():
    # 1600 layers of gzip each inflated up to the limit: seconds on the event loop.
    body = gzip.compress(gzip.compress(gzip.compress(TEXT)))
    with pytest.raises(ProtocolError) as refused:
        inflate(body, "gzip, gzip, gzip", limit=1 << 20)
    assert refused.value.status == 415 and "at most 2" in str(refused.value)
    assert inflate(gzip.compress(gzip.compress(TEXT)), "gzip, identity, gzip",
                   limit=1 << 20) == TEXT  # identity is no coding
