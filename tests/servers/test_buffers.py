import asyncio

import numpy as np

import async_search as asr
from async_search import batchers
from async_search.models import with_spec
from async_search.servers.buffers import BufferPool


def test_pool_reuses_a_returned_buffer():
    pool = BufferPool(capacity=16)
    like = np.zeros((1, 3), np.float32)
    first = pool.take(10, like)
    pool.give_back(first, outputs=np.zeros((10, 1)))
    assert pool.take(4, like) is first
    assert (pool.allocated, pool.reused) == (1, 1)


def test_pool_keeps_a_buffer_that_outputs_still_view():
    pool = BufferPool(capacity=4)
    like = np.zeros((1, 2), np.int64)
    buffer = pool.take(3, like)
    pool.give_back(buffer, outputs=(buffer[:3] * 1, {"view": buffer[1:2]}))
    assert pool.take(3, like) is not buffer


def test_pool_declines_batches_over_capacity():
    assert BufferPool(capacity=4).take(5, np.zeros((1, 1))) is None


async def test_server_reuses_batch_buffers_and_identity_models_stay_correct(monkeypatch):
    # Every batch goes through the pool (small ones are joined otherwise). The identity
    # model returns a view of its input: those buffers must not be reused.
    monkeypatch.setattr(batchers, "JOIN_BELOW_BYTES", 0)
    for fn, reused in ((lambda x: x * 1.0, True), (lambda x: x, False)):
        async with asr.serve(with_spec(fn, (2,), np.float32), max_batch_size=8) as ev:
            results = []
            for round_ in range(5):
                xs = [np.full((1, 2), 10 * round_ + i, np.float32) for i in range(6)]
                ys = await asyncio.gather(*(ev(x) for x in xs))
                results.append((xs, ys))
            stats = ev.stats
        for xs, ys in results:
            for x, y in zip(xs, ys):
                np.testing.assert_array_equal(x, y)
        assert (stats["buffers_reused"] > 0) == reused


async def test_small_batches_are_joined_not_pooled_and_stay_correct():
    for fn in (lambda x: x * 1.0, lambda x: x):  # the identity returns the joined batch
        async with asr.serve(with_spec(fn, (2,), np.float32), max_batch_size=8) as ev:
            for round_ in range(3):
                xs = [np.full((1, 2), 10 * round_ + i, np.float32) for i in range(6)]
                ys = await asyncio.gather(*(ev(x) for x in xs))
                for x, y in zip(xs, ys):
                    np.testing.assert_array_equal(x, y)
            stats = ev.stats
        assert stats["buffers_allocated"] == 0 and stats["buffers_reused"] == 0


def test_pool_buffers_past_the_byte_limit_hold_what_fits_or_the_batch():
    from async_search.servers import buffers
    like = np.zeros((1, 16, 16, 16), np.float32)  # 16 KiB an element
    fit = buffers.MAX_BUFFER_BYTES // like[0].nbytes
    assert len(BufferPool(capacity=fit).take(20, like)) == fit  # capacity rows
    assert len(BufferPool(capacity=2 ** 40).take(20, like)) == fit  # not 16 TiB
    assert len(BufferPool(capacity=2 ** 40).take(fit + 5, like)) == fit + 5


def test_pool_reuses_big_buffers_of_big_elements_that_are_long_enough():
    # 3 x 224 x 224 float32 (588 KiB) x 256 rows: past the limit, yet pooled.
    pool = BufferPool(capacity=256)
    like = np.zeros((1, 3, 224, 224), np.float32)
    first = pool.take(256, like)
    pool.give_back(first, outputs=np.zeros(256))
    assert pool.take(256, like) is first and (pool.allocated, pool.reused) == (1, 1)
    short = pool.take(10, like)  # a new one, as long as fits the limit
    pool.give_back(short, outputs=np.zeros(10))
    assert len(short) < 256
    assert pool.take(200, like) is not short  # too short for 200 rows


async def test_a_huge_max_batch_size_serves_batches_over_the_join_limit():
    # Four requests of 20 rows of 16 KiB (1.25 MiB): pooled buffers of max_batch_size
    # rows would have asked for 32 GiB.
    model = with_spec(lambda x: x.reshape(len(x), -1)[:, :1] + 0.0, (16, 16, 16),
                      np.float32)
    async with asr.serve(model, max_batch_size=2 ** 21) as evaluate:
        xs = [np.full((20, 16, 16, 16), i, np.float32) for i in range(4)]
        ys = await asyncio.wait_for(asyncio.gather(*map(evaluate, xs)), 30)
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(y, np.full((20, 1), i, np.float32))
