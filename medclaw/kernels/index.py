"""Per-video decode index: every frame's presentation timestamp and the keyframes, built once.

    VideoIndex            pts (N,) int64 stream ticks in presentation order, keyframes (K,) frame
                          indices, time base, container format, codec, and the probe's figures
    build_index(...)      from the demuxed packets (done by the probe, in the same pass)
    load_index(sha256)    memory (bounded LRU) → `$MEDCLAW_HOME/cache/index/<sha256>.npz` → None
    store_index(index)    memory + disk (atomic rename; a read-only home only costs a rescan)
    index_for(info)       the index of a probed video; rebuilt by probing again if it is gone

Frame i of a video is the i-th frame in presentation order: the i-th smallest packet pts. Every
decoder is checked against this table (`frames.FrameSource` compares each returned frame's pts
with `index.pts[i]`), and plans, observations and traces take their timestamps from it
(`time_s(i)` = seconds since the first frame), so variable-rate video is timed by its real pts.

Streams without timestamps (raw H.264/HEVC elementary streams) get synthetic pts i at the
assumed rate (`has_pts = False`); they can only be decoded sequentially from the start.

The index is keyed by the file's sha256, so it cannot go stale: new bytes, new key. Its size is
8 bytes per frame (a 1-hour 25 fps video: 90,000 frames, 0.7 MB).
"""
from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from fractions import Fraction
from pathlib import Path

from medclaw.home import medclaw_home
from medclaw.kernels.errors import CorruptVideoError

INDEX_VERSION = 1
MEMORY_ENTRIES = 32                # indices kept in memory (one per recently used video)


@dataclass(slots=True, eq=False)
class VideoIndex:
    sha256: str
    pts: object                    # numpy int64 (N,), sorted: presentation order
    keyframes: object              # numpy int64 (K,): frame indices of keyframes, sorted
    tb_num: int                    # stream time base = tb_num / tb_den seconds per tick
    tb_den: int
    end_pts: int                   # pts where the last frame stops being shown
    container: str                 # FFmpeg demuxer name ("mov,mp4,m4a,3gp,3g2,mj2", "mpegts" …)
    codec: str
    has_pts: bool = True           # False: synthetic pts (raw elementary stream, assumed rate)
    meta: dict = field(default_factory=dict)   # the probe's figures (width, height, rotation …)

    # --- time ------------------------------------------------------------------------------------
    @property
    def num_frames(self) -> int:
        return len(self.pts)

    @property
    def time_base(self) -> Fraction:
        return Fraction(self.tb_num, self.tb_den)

    @property
    def tick_s(self) -> float:
        return self.tb_num / self.tb_den

    @property
    def start_s(self) -> float:
        """Presentation time of the first frame in the stream's clock (ffprobe's pts_time)."""
        return float(self.pts[0]) * self.tick_s

    @property
    def duration_s(self) -> float:
        return float(self.end_pts - self.pts[0]) * self.tick_s

    def pts_s(self, index: int) -> float:
        """Absolute presentation time of frame `index` (stream clock, seconds)."""
        return float(self.pts[index]) * self.tick_s

    def time_s(self, index: int) -> float:
        """Video time of frame `index`: seconds since the first frame (what plans and traces use)."""
        return float(self.pts[index] - self.pts[0]) * self.tick_s

    def times_s(self):
        """numpy float64 (N,): `time_s` of every frame."""
        return (self.pts - self.pts[0]) * self.tick_s

    def frame_at(self, time_s: float) -> int:
        """Index of the frame on screen at video time `time_s` (clamped to the first/last)."""
        import numpy as np

        tick = int(np.floor(time_s / self.tick_s + 1e-6)) + int(self.pts[0])
        return max(0, min(self.num_frames - 1, int(np.searchsorted(self.pts, tick, "right")) - 1))

    def keyframe_before(self, index: int) -> int:
        """The keyframe that opens the GOP holding frame `index` (0 if none is known)."""
        keys = self.keyframes
        pos = bisect.bisect_right(keys, index) - 1
        return int(keys[pos]) if pos >= 0 else 0

    def to_arrays(self) -> dict:
        import numpy as np

        header = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("pts", "keyframes")}
        return {"pts": np.asarray(self.pts, dtype=np.int64),
                "keyframes": np.asarray(self.keyframes, dtype=np.int64),
                "header": np.frombuffer(json.dumps({**header, "version": INDEX_VERSION}).encode(),
                                        dtype=np.uint8)}


def build_index(sha256: str, packets, *, tb: Fraction, container: str, codec: str,
                assumed_fps: float | None = None, meta: dict | None = None) -> VideoIndex:
    """An index from demuxed packets [(pts or None, duration, is_keyframe)] in file order.

    With every pts present, frames are ordered by pts; otherwise (raw streams) by file order at
    `assumed_fps`, with a time base of 1 / assumed_fps.
    """
    import numpy as np

    if packets and all(p[0] is not None for p in packets):
        pts = np.asarray([p[0] for p in packets], dtype=np.int64)
        order = np.argsort(pts, kind="stable")
        pts = pts[order]
        keys = np.flatnonzero(np.asarray([packets[i][2] for i in order], dtype=bool))
        steps = np.diff(pts)
        last = packets[order[-1]][1] or (int(np.median(steps)) if len(steps) else 0)
        if not last and assumed_fps:
            last = max(1, round(1 / (assumed_fps * float(tb))))
        return VideoIndex(sha256, pts, keys, tb.numerator, tb.denominator,
                          int(pts[-1]) + max(int(last), 1), container, codec, True, dict(meta or {}))
    if not assumed_fps or assumed_fps <= 0:
        raise ValueError("a stream without timestamps needs an assumed frame rate")
    rate = Fraction(assumed_fps).limit_denominator(1001)
    pts = np.arange(len(packets), dtype=np.int64)
    keys = np.flatnonzero(np.asarray([p[2] for p in packets], dtype=bool))
    return VideoIndex(sha256, pts, keys, rate.denominator, rate.numerator, len(packets),
                      container, codec, False, dict(meta or {}))


# --- storage ---------------------------------------------------------------------------------------
_MEMORY: OrderedDict[str, VideoIndex] = OrderedDict()
_LOCK = threading.Lock()


def _index_dir() -> Path:
    return medclaw_home() / "cache" / "index"


def _remember(index: VideoIndex) -> None:
    with _LOCK:
        _MEMORY[index.sha256] = index
        _MEMORY.move_to_end(index.sha256)
        while len(_MEMORY) > MEMORY_ENTRIES:
            _MEMORY.popitem(last=False)


def load_index(sha256: str) -> VideoIndex | None:
    """The stored index for `sha256`, or None (never built, unreadable, older version)."""
    import numpy as np

    with _LOCK:
        if sha256 in _MEMORY:
            _MEMORY.move_to_end(sha256)
            return _MEMORY[sha256]
    path = _index_dir() / f"{sha256}.npz"
    try:
        with np.load(path) as data:
            header = json.loads(bytes(data["header"]).decode())
            if header.pop("version", None) != INDEX_VERSION or header.get("sha256") != sha256:
                return None
            index = VideoIndex(pts=data["pts"], keyframes=data["keyframes"], **header)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _remember(index)
    return index


def store_index(index: VideoIndex) -> None:
    import numpy as np

    _remember(index)
    folder = _index_dir()
    tmp = folder / f".{index.sha256}.{os.getpid()}.{threading.get_ident()}.npz"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            np.savez(fh, **index.to_arrays())
        os.replace(tmp, folder / f"{index.sha256}.npz")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def forget_memory() -> None:
    """Drop the in-memory copies (tests: as if a new process started)."""
    with _LOCK:
        _MEMORY.clear()


def index_for(info) -> VideoIndex:
    """The index of a probed `VideoInfo`: from memory or disk, else by probing the file again."""
    index = load_index(info.sha256)
    if index is None:
        from medclaw.kernels.probe import probe_video

        again = probe_video(info.path, assumed_fps=None if index_has_pts(info) else info.fps)
        if again.sha256 != info.sha256:
            # its frames are no longer the ones the plan (and the trace) name
            raise CorruptVideoError(f"{info.path} changed after it was probed (SHA-256 "
                                    f"{info.sha256[:12]}… is now {again.sha256[:12]}…)")
        index = load_index(info.sha256)
        if index is None:
            raise RuntimeError(f"{info.path}: probing did not leave an index")
    return index


def index_has_pts(info) -> bool:
    """False for a probed stream without timestamps (timed at an assumed rate, `info.fps`)."""
    return not getattr(info, "fps_is_assumed", False)
