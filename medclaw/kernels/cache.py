"""Memory-bounded, thread-safe LRU cache of decoded frames, shared by every tool of an engine.

    FrameKey(video_sha256, frame_index, width, height, crop_px=None)
    FrameCache(capacity_bytes)
        .get(key) -> frame | None            counts a hit or a miss, refreshes recency
        .put(key, frame)                     evicts least-recently-used frames to stay in budget
        .stats() -> CacheStats               hits, misses, evictions, frames, bytes, capacity

A frame is one uint8 (H, W, 3) array or tensor (numpy on CPU, torch on CUDA). Frames decoded
together may be stored as views into one batch (`put_batch`): one allocation instead of one per
frame (per-frame copies cost ~9 ms each here — an mmap + page faults per 700 KB frame). Memory is
accounted per *storage*: a batch counts in full while any of its frames is cached, which is what
it really holds; LRU eviction continues until the real total fits. Callers must not mutate what
they put or get (FrameSource copies into fresh arrays). Anything larger than the capacity is not
stored.
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


class _Storage:
    """Bytes shared by the frames of one `put_batch` (or one `put`), and how many are cached."""

    __slots__ = ("nbytes", "live")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.live = 0


class FrameCache:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self._frames: OrderedDict[FrameKey, tuple[object, _Storage]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: FrameKey):
        with self._lock:
            entry = self._frames.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._frames.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: FrameKey, frame) -> None:
        """Store one frame that owns its memory."""
        self.put_batch([key], [frame], _nbytes(frame))

    def put_batch(self, keys, frames, storage_nbytes: int) -> None:
        """Store frames that are views into one storage of `storage_nbytes` bytes."""
        entries = dict(zip(keys, frames))     # a key given twice keeps its last frame, like put
        if storage_nbytes > self.capacity_bytes or not entries:
            return
        storage = _Storage(int(storage_nbytes))
        with self._lock:
            for key, frame in entries.items():
                self._drop(key)
                self._frames[key] = (frame, storage)
                storage.live += 1
            self._bytes += storage.nbytes
            while self._bytes > self.capacity_bytes and self._frames:
                self._drop(next(iter(self._frames)))
                self._evictions += 1

    def _drop(self, key: FrameKey) -> None:
        entry = self._frames.pop(key, None)
        if entry is not None:
            storage = entry[1]
            storage.live -= 1
            if storage.live == 0:
                self._bytes -= storage.nbytes

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
