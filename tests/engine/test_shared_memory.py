"""`shared_memory_of` finds the segments a process maps; `release_shared_memory` unlinks those
its owners left behind and skips those already gone (a real segment in /dev/shm)."""
from __future__ import annotations

import os
import sys
from multiprocessing import shared_memory

import pytest

from medclaw.engine.backends.shared_memory import release_shared_memory, shared_memory_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/shm")


def test_a_left_segment_is_found_then_released_once():
    segment = shared_memory.SharedMemory(create=True, size=4096)
    path = f"/dev/shm/{segment.name.lstrip('/')}"
    try:
        assert path in shared_memory_of(os.getpid())          # mapped by this process
        segment.close()                                      # its owner gone, the file stays
        assert path not in shared_memory_of(os.getpid()) and os.path.exists(path)
        assert release_shared_memory({path}) == [path]
        assert not os.path.exists(path)
        assert release_shared_memory({path}) == []           # already gone: skipped
    finally:
        if os.path.exists(path):
            segment.unlink()


def test_a_process_that_is_gone_maps_nothing():
    assert shared_memory_of(2 ** 22 + 7) == set()            # beyond Linux's pid_max default
