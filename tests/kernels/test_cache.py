"""Frame cache: LRU order, byte budget, hit/miss counts, thread safety."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from medclaw.kernels.cache import FrameCache, FrameKey


def _key(i, w=4, h=4, crop=None):
    return FrameKey("sha", i, w, h, crop)


def _frame(value=0, h=4, w=4):
    return np.full((h, w, 3), value, np.uint8)                # 48 bytes


def test_hits_misses_and_lru_eviction():
    cache = FrameCache(capacity_bytes=3 * 48)
    for i in range(3):
        cache.put(_key(i), _frame(i))
    assert cache.get(_key(0))[0, 0, 0] == 0                   # 0 is now most recent
    cache.put(_key(3), _frame(3))                             # evicts 1, the least recent
    assert _key(1) not in cache and _key(0) in cache and _key(3) in cache
    assert cache.get(_key(1)) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.frames) == (1, 1, 1, 3)
    assert stats.bytes == 3 * 48 and stats.hit_rate == pytest.approx(0.5)


def test_keys_distinguish_size_and_crop():
    cache = FrameCache(1 << 20)
    cache.put(_key(0), _frame(1))
    assert cache.get(_key(0, w=8)) is None
    assert cache.get(_key(0, crop=(0, 0, 2, 2))) is None
    assert cache.get(_key(0)) is not None


def test_oversized_frame_is_not_stored_and_replace_keeps_accounting():
    cache = FrameCache(100)
    cache.put(_key(0), _frame(0, 10, 10))                     # 300 bytes > capacity
    assert len(cache) == 0
    cache.put(_key(1), _frame(1))
    cache.put(_key(1), _frame(2))
    assert cache.stats().bytes == 48 and cache.get(_key(1))[0, 0, 0] == 2


def test_negative_capacity_rejected():
    with pytest.raises(ValueError):
        FrameCache(-1)


def test_concurrent_use_keeps_budget_and_counts():
    cache = FrameCache(capacity_bytes=50 * 48)
    per_thread = 400

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(per_thread):
            i = int(rng.integers(0, 120))
            if cache.get(_key(i)) is None:
                cache.put(_key(i), _frame(i % 256))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats.hits + stats.misses == 8 * per_thread
    assert stats.bytes <= 50 * 48 and stats.frames == len(cache) <= 50
    for key in list(cache._frames):
        assert cache.get(key)[0, 0, 0] == key.frame_index % 256


def test_batch_storage_counts_until_its_last_frame_leaves():
    batch = np.zeros((4, 4, 4, 3), np.uint8)                  # 4 frames, 192 bytes in one storage
    cache = FrameCache(capacity_bytes=250)
    cache.put_batch([_key(i) for i in range(4)], list(batch), batch.nbytes)
    assert cache.stats().bytes == 192 and len(cache) == 4
    cache.put(_key(10), _frame(1))                            # 192 + 48 = 240 fits
    assert len(cache) == 5
    cache.put(_key(11), _frame(2))                            # 288 > 250: evict oldest frames
    # Dropping some frames of the batch frees nothing, so LRU goes on until the batch is gone.
    stats = cache.stats()
    assert stats.bytes == 96 and stats.evictions == 4 and len(cache) == 2
    assert _key(10) in cache and _key(11) in cache


def test_replacing_a_frame_of_a_batch_keeps_accounting_exact():
    batch = np.zeros((2, 4, 4, 3), np.uint8)
    cache = FrameCache(capacity_bytes=10_000)
    cache.put_batch([_key(0), _key(1)], list(batch), batch.nbytes)
    cache.put(_key(0), _frame(5))
    assert cache.stats().bytes == 96 + 48
    cache.put(_key(1), _frame(6))
    assert cache.stats().bytes == 96                          # the batch storage is released


def test_a_key_repeated_within_one_batch_keeps_accounting_exact():
    batch = np.zeros((2, 4, 4, 3), np.uint8)
    batch[1] = 7
    cache = FrameCache(capacity_bytes=10_000)
    cache.put_batch([_key(0), _key(0)], list(batch), batch.nbytes)
    assert len(cache) == 1 and cache.get(_key(0))[0, 0, 0] == 7      # the last one wins
    assert cache.stats().bytes == batch.nbytes
    cache.put(_key(0), _frame(1))
    assert cache.stats().bytes == 48                                  # the batch is released
