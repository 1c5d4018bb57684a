"""Evidence thumbnails: JPEGs of the frames a trace references, re-decoded through `FrameSource`.

    thumbs = Thumbnailer()                                  # its own small frame cache
    info = thumbs.open_video(view_or_header_video)          # probe + check the trace's sha256
    jpegs = thumbs.render(info, {key: (frame_index, crop_box | None), ...})   # key → JPEG bytes

Frames come from the same frame-exact pipeline the tools used (`kernels.frames.FrameSource`), by
frame index, so a thumbnail shows the very frame the model was sent, not a seek near its time. A
zoomed region is cut from the full-resolution frame like the tool did. Before decoding, the video
file is probed and its SHA-256 compared with the trace's: a file that changed since the episode
is refused (`ThumbnailError`), never shown as if it were the evidence.

Sizes: the longest side is `max_side` pixels (aspect kept); whole frames of one request are decoded
in one batch. Blocking (decoding): call it from a worker thread in async code.
"""
from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

from medclaw.errors import MedClawError

DEFAULT_MAX_SIDE = 240
JPEG_QUALITY = 80


class ThumbnailError(MedClawError):
    """The trace's video cannot be shown (missing, changed since the episode, undecodable)."""


class Thumbnailer:
    def __init__(self, frame_source=None, *, max_side: int = DEFAULT_MAX_SIDE,
                 cache_items: int = 2048):
        self._frames = frame_source
        self.max_side = int(max_side)
        self._jpegs: OrderedDict[tuple, bytes] = OrderedDict()
        self._cache_items = cache_items
        self._videos: dict[tuple, object] = {}       # (path, size, mtime, sha256) → VideoInfo
        self._lock = threading.Lock()

    @property
    def frames(self):
        if self._frames is None:
            from medclaw.kernels.frames import FrameSource

            # Thumbnails are small: a small cache, apart from the episodes' frame cache.
            self._frames = FrameSource(cache_mb=64)
        return self._frames

    def open_video(self, video: dict):
        """A `VideoInfo` for the trace's video (`{"path", "sha256", ...}` from its header)."""
        from medclaw.kernels.probe import probe_video

        path, sha256 = video.get("path"), video.get("sha256")
        if not path:
            raise ThumbnailError("the trace names no video file")
        try:
            stat = os.stat(path)
        except OSError as err:
            raise ThumbnailError(f"cannot read the trace's video {path}: {err.strerror}") from None
        known = (str(path), stat.st_size, stat.st_mtime_ns, sha256)
        with self._lock:
            if known in self._videos:
                return self._videos[known]
        try:
            info = probe_video(path)
        except MedClawError as err:
            raise ThumbnailError(f"cannot read the trace's video: {err}") from None
        if sha256 and info.sha256 != sha256:
            raise ThumbnailError(f"{path} changed since the trace was written (sha256 "
                                 f"{info.sha256[:12]}… is not the trace's {str(sha256)[:12]}…)")
        with self._lock:
            if len(self._videos) >= 64:
                self._videos.clear()
            self._videos[known] = info
        return info

    def size_for(self, info, crop_box=None) -> tuple[int, int]:
        """(width, height) of a thumbnail: the frame's (or region's) aspect, longest side max_side."""
        width, height = float(info.width), float(info.height)
        if crop_box:
            x1, y1, x2, y2 = (float(v) for v in crop_box)
            width, height = width * (x2 - x1), height * (y2 - y1)
        scale = min(1.0, self.max_side / max(width, height, 1.0)) if max(width, height) > 0 else 1.0
        return max(2, round(width * scale)), max(2, round(height * scale))

    def render(self, info, requests: dict[str, tuple[int, list | None]]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        todo: dict[str, tuple[int, list | None]] = {}
        for key, request in requests.items():
            cached = self._cached((info.sha256, key, self.max_side))
            if cached is not None:
                out[key] = cached
            else:
                todo[key] = request
        whole = {key: index for key, (index, crop) in todo.items() if not crop}
        if whole:
            width, height = self.size_for(info)
            keys = list(whole)
            batch = self.frames.get_frames(info, [whole[k] for k in keys], width, height)  # (T, H, W, 3)
            for key, frame in zip(keys, batch):
                out[key] = self._store((info.sha256, key, self.max_side), _jpeg(frame))
        for key, (index, crop) in todo.items():
            if crop:
                width, height = self.size_for(info, crop)
                frame = self.frames.get_frame(info, index, width, height, tuple(crop))  # (H, W, 3)
                out[key] = self._store((info.sha256, key, self.max_side), _jpeg(frame))
        return out

    def close(self) -> None:
        close = getattr(self._frames, "close", None)
        if callable(close):
            close()

    def _cached(self, key) -> bytes | None:
        with self._lock:
            data = self._jpegs.get(key)
            if data is not None:
                self._jpegs.move_to_end(key)
            return data

    def _store(self, key, data: bytes) -> bytes:
        with self._lock:
            self._jpegs[key] = data
            while len(self._jpegs) > self._cache_items:
                self._jpegs.popitem(last=False)
        return data


def _jpeg(frame) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()
