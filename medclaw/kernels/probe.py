"""Probe a video file: what it really holds, or a typed one-line error saying why it is unusable.

    probe_video(path, *, max_pixels=None, use_cache=True) -> VideoInfo

- `num_frames` is counted by demuxing the video stream's packets with PyAV (no decoding; ~10 ms
  per 1,000 frames), not read from the container header; when the header indexes more frames than
  the file holds, the file is truncated and we say so.
- `duration_s` and `fps` come from the packets' timestamps: duration = last pts + its duration -
  first pts; fps = num_frames / duration. `is_variable_fps` is true when frame intervals differ
  by more than 10 % (or 1.5 clock ticks) from their median.
- `rotation` is the display-matrix angle FFmpeg reports (counter-clockwise degrees, what ffprobe
  prints), normalised to 0/90/180/270; `width`/`height` are the display size, i.e. swapped for
  90/270. Decoders return frames in this display orientation (`decoders/base.py`).
- The first frame is decoded (from the first packets, during the same pass), to prove the stream
  decodes and to read the rotation; `verify.test_decode` then decodes the middle (and, where the
  container cannot show a cut, the end).
- Damaged but decodable files are served, not refused: a header that promises more frames or a
  longer duration than the data holds (a faststart MP4 or a Matroska file cut short), or an
  MPEG-TS whose last packets do not decode. The index keeps the frames that decode, up to the
  last one (`verify.test_decode`), and `VideoInfo.damage` says what is wrong, logged once as a
  warning when the file is first probed. An MP4 cut before its 'moov' index cannot be read at
  all: refused.
- `sha256` is of the file's bytes, cached by (real path, size, mtime) in memory and in
  `$MEDCLAW_HOME/cache/sha256.json` (default `~/.cache/medclaw/cache/sha256.json`).
- A file probed before (its sha256 cached and its decode index stored, `kernels.index`) is
  answered from the index without opening it with FFmpeg again.

Errors (all `medclaw.kernels.errors.VideoError`, message = one line naming the file):
    NotAFileError        missing path, directory, device …
    UnreadableVideoError no permission / I/O error
    NotAVideoError       empty file, not a media container, still image, no video stream
    CorruptVideoError    truncated MP4 without its 'moov' index, garbage MP4 boxes, undecodable
                         first frame or middle, nothing decodable at a damaged end, demux error
                         — with where it happened
    ZeroDurationError    no frames or zero duration
    FrameTooLargeError   width * height > max_pixels
Bad input fails fast (tens of milliseconds); PyAV's I/O timeout guards against stalled reads.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
import math
import struct
import threading
from collections import OrderedDict
from fractions import Fraction

from medclaw.kernels.errors import (
    CorruptVideoError, FrameTooLargeError, NotAFileError, NotAVideoError, UnreadableVideoError,
    ZeroDurationError,
)
from medclaw.home import medclaw_home
from medclaw.kernels.index import build_index, load_index, store_index
from medclaw.kernels.verify import test_decode
from medclaw.types import VideoInfo

log = logging.getLogger(__name__)
OPEN_TIMEOUT_S = 5.0               # PyAV interrupts a read that stalls this long (NFS, FUSE …)
_MP4_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pdin", b"uuid", b"moof"}
_IMAGE_MAGIC = {b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image",
                b"BM": "a BMP image"}
_SHA_CACHE: OrderedDict[tuple[str, int, int], str] = OrderedDict()   # bounded LRU
_SHA_LOCK = threading.Lock()
_SHA_CACHE_MAX = 2000              # entries kept in memory and in the JSON cache
DEFAULT_ASSUMED_FPS = 25.0         # raw streams that declare no rate either (FFmpeg's default)


def probe_video(path, *, max_pixels: int | None = None, use_cache: bool = True,
                assumed_fps: float | None = None) -> VideoInfo:
    """Probe `path` (see module docstring). Raises a VideoError subclass for unusable input.

    `assumed_fps` is the frame rate of a stream without timestamps (raw .h264/.hevc); by default
    the rate the stream declares, else 25. It changes nothing for files with timestamps.
    """
    import av

    if assumed_fps is not None and not (assumed_fps > 0 and math.isfinite(assumed_fps)):
        raise ValueError(f"assumed_fps must be a positive number, got {assumed_fps}")
    p = Path(path)
    size = _check_file(p)
    head = _read_head(p)
    known = _stored_index(p, use_cache, assumed_fps)
    if known is not None:
        # Probed before (same bytes): the stored index holds every figure, so FFmpeg need not
        # open the file again (its stream analysis decodes frames: a 4K keyframe per open).
        _check_pixels(p, known.meta["width"], known.meta["height"], max_pixels)
        return info_from_index(p, known)
    try:
        container = av.open(str(p), mode="r", timeout=OPEN_TIMEOUT_S)
    except av.error.PermissionError as err:
        raise UnreadableVideoError(f"{p}: permission denied ({err.strerror})") from None
    except av.error.InvalidDataError as err:
        raise _diagnose_open_failure(p, head, size, err) from None
    except av.error.EOFError:
        raise CorruptVideoError(f"{p}: file ends before its first media packet "
                                f"(truncated or empty container)") from None
    except av.error.FFmpegError as err:
        raise NotAVideoError(f"{p}: FFmpeg cannot open it as a video ({err.strerror})") from None
    except OSError as err:
        raise UnreadableVideoError(f"{p}: cannot read it ({err.strerror or err})") from None
    with container:
        stream = _video_stream(p, container, head)
        width, height = stream.codec_context.width, stream.codec_context.height
        if width <= 0 or height <= 0:
            raise CorruptVideoError(f"{p}: the video stream has no frame size (corrupt header)")
        _check_pixels(p, width, height, max_pixels)
        sha = file_sha256(p, use_cache=use_cache)
        index = _usable(load_index(sha), assumed_fps) if use_cache else None
        if index is None:
            index = _scan(p, container, stream, sha, assumed_fps)
            test_decode(p, index, container)           # may trim a damaged end; raises if none
            store_index(index)
            if index.meta.get("damage"):
                log.warning("%s: %s", p, index.meta["damage"])    # once: later probes hit the index
    return info_from_index(p, index)


def _check_pixels(p: Path, width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise FrameTooLargeError(f"{p}: frames are {width}x{height} = {width * height:,} pixels, "
                                 f"over the limit of {max_pixels:,}; downscale the video first")


def _usable(index, assumed_fps: float | None):
    """`index`, or None where it dates a raw stream (no pts) at another rate than this probe
    asks for. Without `assumed_fps` the rate is the stream's declared one, which only a scan
    reads, so a stored raw-stream index is not reused then: it may hold an earlier user's rate."""
    if index is not None and not index.has_pts and (
            assumed_fps is None or abs(index.tb_den / index.tb_num - assumed_fps) > 1e-6):
        return None
    return index


def _stored_index(p: Path, use_cache: bool, assumed_fps: float | None):
    """The stored index of `p` when its sha256 is already cached (no hashing here: an unknown
    file must fail fast, not be read whole first), else None."""
    if not use_cache:
        return None
    real = os.path.realpath(p)
    try:
        st = os.stat(real)
    except OSError:
        return None
    sha = _cached_sha256(real, st)
    return _usable(load_index(sha), assumed_fps) if sha else None


def info_from_index(p, index) -> VideoInfo:
    """The VideoInfo a probe reports for a video with this index."""
    import numpy as np

    meta = index.meta
    width, height = meta["width"], meta["height"]
    if meta["rotation"] in (90, 270):
        width, height = height, width
    n, duration = index.num_frames, index.duration_s
    if duration <= 0:
        raise ZeroDurationError(f"{p}: the video stream has zero duration")
    steps = np.diff(index.pts)                                            # (N-1,) ticks
    median = float(np.median(steps)) if len(steps) else 0.0
    is_vfr = bool(len(steps) > 1 and np.abs(steps - median).max() > max(1.5, 0.1 * median))
    return VideoInfo(
        path=str(p), sha256=index.sha256, duration_s=duration, fps=n / duration, num_frames=n,
        width=width, height=height, codec=index.codec, rotation=meta["rotation"],
        is_variable_fps=is_vfr, start_s=index.start_s, fps_is_assumed=not index.has_pts,
        damage=meta.get("damage", ""))


def _check_file(p: Path) -> int:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise NotAFileError(f"{p}: no such file") from None
    except PermissionError:
        raise UnreadableVideoError(f"{p}: permission denied") from None
    except OSError as err:
        raise NotAFileError(f"{p}: cannot stat it ({err.strerror})") from None
    if p.is_dir():
        raise NotAFileError(f"{p}: is a directory, not a video file")
    if not p.is_file():
        raise NotAFileError(f"{p}: not a regular file")
    if st.st_size == 0:
        raise NotAVideoError(f"{p}: empty file (0 bytes)")
    return st.st_size


def _read_head(p: Path) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(64)
    except PermissionError:
        raise UnreadableVideoError(f"{p}: permission denied") from None
    except OSError as err:
        raise UnreadableVideoError(f"{p}: cannot read it ({err.strerror or err})") from None


def _diagnose_open_failure(p: Path, head: bytes, size: int, err) -> Exception:
    """FFmpeg refused the file: say whether it is a broken MP4, an image, or just not a video."""
    if head[4:8] in _MP4_BOXES:
        return CorruptVideoError(f"{p}: {_mp4_problem(p, size)}")
    for magic, what in _IMAGE_MAGIC.items():
        if head.startswith(magic):
            return NotAVideoError(f"{p}: {what}, not a video")
    return NotAVideoError(f"{p}: not a video container FFmpeg recognises ({err.strerror})")


def _mp4_problem(p: Path, size: int) -> str:
    """Walk the top-level MP4 boxes (size + type headers only) and describe the first problem."""
    seen, offset = [], 0
    with open(p, "rb") as fh:
        while offset < size:
            fh.seek(offset)
            header = fh.read(16)
            if len(header) < 8:
                return f"truncated MP4/MOV: file ends inside a box header at byte {offset:,}"
            box_size, kind = struct.unpack(">I4s", header[:8])
            if box_size == 1 and len(header) == 16:
                box_size = struct.unpack(">Q", header[8:16])[0]
            elif box_size == 0:
                box_size = size - offset              # "extends to end of file"
            name = kind.decode("latin-1")
            if box_size < 8 or not name.isprintable():
                return f"corrupt MP4/MOV: garbage box header at byte {offset:,}"
            seen.append(kind)
            if offset + box_size > size:
                missing = "" if b"moov" in seen else "; the 'moov' index is missing"
                return (f"truncated MP4/MOV: file ends at byte {size:,} inside the '{name}' box "
                        f"(starts at byte {offset:,}, declares {box_size:,} bytes){missing}")
            offset += box_size
    if b"moov" not in seen:
        return "incomplete MP4/MOV: the 'moov' index box is missing (file was not finalised)"
    return "corrupt MP4/MOV: FFmpeg rejects its index"


def _video_stream(p: Path, container, head: bytes):
    fmt = container.format.name
    if fmt == "image2" or fmt.endswith("_pipe"):
        raise NotAVideoError(f"{p}: a still image ({fmt.removesuffix('_pipe')}), not a video")
    streams = [s for s in container.streams.video
               if not (s.disposition & s.disposition.__class__.attached_pic)]
    if not streams:
        others = ", ".join(f"{s.type}/{s.codec_context.name if s.codec_context else '?'}"
                           for s in container.streams) or "none"
        raise NotAVideoError(f"{p}: no video stream (streams: {others})")
    return streams[0]


def _scan(p: Path, container, stream, sha: str, assumed_fps: float | None):
    """Demux every packet of the stream (no decoding, except the first frame by `_FirstFrame`):
    the index of frame timestamps and keyframes, with the probe's figures in its `meta`."""
    import av

    first = _FirstFrame(stream)
    packets, last_pts = [], None
    try:
        for packet in container.demux(stream):
            if packet.size == 0 and packet.pts is None and packet.dts is None:
                continue                              # the demuxer's end-of-stream flush packet
            first.feed(packet)
            packets.append((packet.pts, packet.duration or 0, bool(packet.is_keyframe)))
            last_pts = packet.pts if packet.pts is not None else last_pts
    except av.error.FFmpegError as err:
        where = f" ~{float(last_pts * stream.time_base):.1f} s" if last_pts is not None else \
            " the start"
        raise CorruptVideoError(f"{p}: demux error after {len(packets)} frames (at{where}): "
                                f"{err.strerror}") from None
    count = len(packets)
    if count == 0:
        raise ZeroDurationError(f"{p}: the video stream has no frames")
    claimed = stream.frames or 0
    tb = stream.time_base or Fraction(1, 90000)
    rotation = first.rotation(p)
    declared_rate = float(stream.average_rate or stream.guessed_rate or 0) or None
    # reorder_depth: frames the decoder holds back to reorder (learned by FFmpeg's analysis on
    # open, raised by the first frames' decode if need be); decoders that skip that analysis set
    # it themselves (pyav_decoder.open_input).
    meta = {"width": stream.codec_context.width, "height": stream.codec_context.height,
            "rotation": rotation, "reorder_depth": int(stream.codec_context.reorder_depth)}
    index = build_index(sha, packets, tb=Fraction(tb), container=container.format.name,
                        codec=_codec_name(stream),
                        assumed_fps=assumed_fps or declared_rate or DEFAULT_ASSUMED_FPS,
                        meta=meta)
    if index.duration_s <= 0:
        raise ZeroDurationError(f"{p}: the video stream has zero duration")
    # A header that promises more than the file holds: cut (a recorder that lost power, a copy
    # that stopped). What is there is served as far as it decodes (test_decode checks the end).
    declared = _declared_duration_s(container, stream) if index.has_pts else None
    if claimed > count:
        index.meta["damage"] = (f"truncated: the container indexes {claimed} frames but only "
                                f"{count} are in the file")
    elif declared and index.duration_s < declared - max(1.0, 0.02 * declared):
        index.meta["damage"] = (f"truncated: the container declares {declared:.1f} s but the "
                                f"video data ends at {index.duration_s:.1f} s")
    return index


def _codec_name(stream) -> str:
    """The codec ("av1"), not the decoder FFmpeg picked for it ("libdav1d")."""
    codec = stream.codec_context.codec
    return getattr(codec, "canonical_name", None) or stream.codec_context.name


def _declared_duration_s(container, stream) -> float | None:
    """The stream's duration per the header; the container's only when it holds just this stream
    (a longer audio track would otherwise look like missing video)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration and len(container.streams) == 1:
        return container.duration / 1_000_000          # AV_TIME_BASE
    return None


class _FirstFrame:
    """Decodes the stream's first frame from the packets the demux loop hands it (no seek, one
    pass over the file): proves the stream decodes, and carries the display rotation."""

    MAX_PACKETS = 64               # decoders with frame delay need a few packets before output

    def __init__(self, stream):
        self.codec = stream.codec_context
        self.frame = None
        self.error: str | None = None
        self.fed = 0

    def feed(self, packet) -> None:
        import av

        if self.frame is not None or self.fed >= self.MAX_PACKETS:
            return
        self.fed += 1
        try:
            frames = self.codec.decode(packet)
        except av.error.FFmpegError as err:
            self.error = err.strerror      # a broken leading packet may be followed by good ones
            return
        if frames:
            self.frame = frames[0]

    def rotation(self, p: Path) -> int:
        import av

        if self.frame is None:
            try:
                frames = self.codec.decode(None)                      # flush delayed frames
                self.frame = frames[0] if frames else None
            except av.error.FFmpegError as err:
                self.error = err.strerror
        if self.frame is None:
            why = f" ({self.error})" if self.error else ""
            raise CorruptVideoError(f"{p}: cannot decode the first frame{why}")
        return int(round(self.frame.rotation or 0)) % 360


# ---------------------------------------------------------------------------------------------
# Content hash, cached by (real path, size, mtime)


def _cache_file() -> Path:
    return medclaw_home() / "cache" / "sha256.json"


def _load_disk_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def file_sha256(path, *, use_cache: bool = True) -> str:
    """sha256 of the file's bytes; cached by (real path, size, mtime_ns) in memory and on disk."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    if use_cache:
        known = _cached_sha256(real, st)
        if known:
            return known
    digest = hashlib.sha256()
    try:
        with open(real, "rb") as fh:
            while chunk := fh.read(4 << 20):
                digest.update(chunk)
    except OSError as err:
        raise UnreadableVideoError(f"{path}: cannot read it ({err.strerror or err})") from None
    sha = digest.hexdigest()
    if use_cache:
        _remember_sha(key, sha)
        _store_disk_cache(real, st, sha)
    return sha


def _cached_sha256(real: str, st: os.stat_result) -> str | None:
    """The sha256 cached for (real path, size, mtime_ns) in memory or on disk, else None."""
    key = (real, st.st_size, st.st_mtime_ns)
    with _SHA_LOCK:
        if key in _SHA_CACHE:
            _SHA_CACHE.move_to_end(key)
            return _SHA_CACHE[key]
    entry = _load_disk_cache(_cache_file()).get(real)
    if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        _remember_sha(key, entry["sha256"])
        return entry["sha256"]
    return None


def _remember_sha(key, sha: str) -> None:
    with _SHA_LOCK:
        _SHA_CACHE[key] = sha
        _SHA_CACHE.move_to_end(key)
        while len(_SHA_CACHE) > _SHA_CACHE_MAX:
            _SHA_CACHE.popitem(last=False)


def _store_disk_cache(real: str, st: os.stat_result, sha: str) -> None:
    path = _cache_file()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _load_disk_cache(path)
        data.pop(real, None)
        data[real] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
        while len(data) > _SHA_CACHE_MAX:            # dicts keep insertion order: drop the oldest
            data.pop(next(iter(data)))
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)                        # atomic: concurrent probes never see half a file
    except OSError:                                  # a read-only home only costs re-hashing
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)              # e.g. disk full mid-write: leave no litter
