"""Memory-bounded, thread-safe LRU cache of decoded frames, shared by every tool of an engine.

    FrameKey(video_sha256, frame_index, width, height, crop_px=None)
    FrameCache(capacity_bytes)
        .get(key) -> frame | None            counts a hit or a miss, refreshes recency
        .put(key, frame)                     evicts least-recently-used frames to stay in budget
        .stats() -> CacheStats               hits, misses, evictions, frames, bytes, capacity

A frame is one uint8 (H, W, 3) array or tensor (numpy on CPU, torch on CUDA); its cost is its
`nbytes`. Callers must not mutate what they put or get: the cache hands out the stored object
(FrameSource copies into a fresh batch). A frame larger than the whole capacity is not stored.
Keys carry the *decoded* size and crop, so stage 1 (coarse pass), stage 2 (window) and frame
look-ups share entries exactly when they asked for the same pixels.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass


@dataclass(slots=True, frozen=True)
class FrameKey:
    video_sha256: str
    frame_index: int
    width: int
    height: int
    crop_px: tuple[int, int, int, int] | None = None


@dataclass(slots=True, frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    frames: int
    bytes: int
    capacity_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate}


def _nbytes(frame) -> int:
    nbytes = getattr(frame, "nbytes", None)
    if nbytes is None:                                    # torch tensors before 2.x
        nbytes = frame.numel() * frame.element_size()
    return int(nbytes)


class FrameCache:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self._frames: OrderedDict[FrameKey, object] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: FrameKey):
        with self._lock:
            frame = self._frames.get(key)
            if frame is None:
                self._misses += 1
                return None
            self._frames.move_to_end(key)
            self._hits += 1
            return frame

    def put(self, key: FrameKey, frame) -> None:
        size = _nbytes(frame)
        if size > self.capacity_bytes:
            return
        with self._lock:
            old = self._frames.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            self._frames[key] = frame
            self._bytes += size
            while self._bytes > self.capacity_bytes:
                _, evicted = self._frames.popitem(last=False)
                self._bytes -= _nbytes(evicted)
                self._evictions += 1

    def __contains__(self, key: FrameKey) -> bool:
        with self._lock:
            return key in self._frames

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._frames),
                              self._bytes, self.capacity_bytes)
