"""What every decoder implements, and the helpers they share.

A decoder turns a `DecodeJob` (sorted unique source-frame indices + output size + optional crop)
into ONE uint8 torch tensor (T, height, width, 3) on its device. It decodes in chunks of
`job.chunk` frames and resizes each chunk at once, so peak memory is the output plus one chunk of
full-resolution frames — never every full-resolution frame of a long video. Between chunks it
calls `job.check_cancelled()`, which is how `FrameSource` stops a decode that ran past its timeout.

Identity: a decoder returns a `DecodeResult`: the frames AND the presentation timestamp (stream
ticks) of each, as its library reports them. `FrameSource` checks every one against the video's
index (`kernels.index`) and never hands out a frame whose pts is not the planned one
(`kernels.verify`). Decoders find frames by time where they can (the index gives every pts and
keyframe, so no decoder scans the file itself).

Errors: a decoder raises `CorruptVideoError` naming the frame index and time where decoding
failed (or the first frame it could not deliver); it lets `DecodeCancelled` through. Running out
of memory (host or GPU) or a CUDA failure is not a property of the video: `job.corrupt` turns
those into `DecodeResourceError` instead (`is_resource_failure`).

Density (`is_dense`): a seek to the keyframe before each target decodes about half a GOP per
target, a sequential pass decodes the whole gap, so the sequential pass (with frame threads)
wins when the mean gap is under half a keyframe interval. Sparser requests seek without frame
threads (torchcodec: one thread; PyAV: slice threads), which are flushed at every seek
(measured here: 64 frames spread over a 10-min video decode in 1.3 s with 1 thread, 1.9-2.2 s
with 2).

Segments (`split_at_keyframes`, `run_segments`): a request that spans several GOPs is cut at
keyframes into `num_threads` runs, each decoded by its own single-threaded decoder in its own
thread; every decoder starts from a keyframe, so the runs need nothing from each other and no GOP
is decoded twice. This beats FFmpeg's frame threads, which kept only ~1.5 of 2 cores busy here:
a 768-frame coarse pass over 10 min of 640x360 took 3.3 s (4.6 s CPU) with one torchcodec decoder
and 2 frame threads, 1.7 s (3.2 s CPU) with 2 segment decoders (benchmarks/decoder_threads.py).
The torchcodec (CPU) and PyAV decoders do this; decord and NVDEC use one reader.
"""
from __future__ import annotations

import bisect
import re
import threading
from dataclasses import dataclass, field

from medclaw.errors import first_line
from medclaw.kernels.errors import CorruptVideoError, DecodeResourceError

DEFAULT_CHUNK = 32
CHUNK_MAX_BYTES = 64 * 2 ** 20   # full-resolution RGB decoded at once, at most
DEFAULT_GOP = 250          # x264's default keyint: used when a decoder cannot read the real one
# Decoders resize inside FFmpeg (before a full-size RGB frame exists) when the output has at most
# this fraction of the source pixels; near-identity resizes (640x360 -> 644x364) use ops instead.
DECODER_RESIZE_MAX_FRACTION = 0.5


class DecodeCancelled(Exception):
    """Raised inside a decode worker when its job was cancelled (timeout); never user-facing."""


_RESOURCE_WORDS = ("out of memory", "cuda", "cudaerror", "nvdec", "cuvid", "cannot allocate memory",
                   "resource temporarily unavailable", "no space left")


def is_resource_failure(err: BaseException) -> bool:
    """True for failures of the machine rather than of the data: OOM, CUDA/NVDEC errors."""
    if isinstance(err, (MemoryError, DecodeResourceError)):
        return True
    if type(err).__name__ in ("OutOfMemoryError", "AcceleratorError", "CudaError"):
        return True
    if isinstance(err, OSError) and getattr(err, "errno", None) in (12, 28):   # ENOMEM, ENOSPC
        return True
    text = str(err).lower()
    return any(word in text for word in _RESOURCE_WORDS)


@dataclass(slots=True)
class DecodeResult:
    """Frames of a job and the pts (stream ticks) the decoder reports for each; None where the
    library gave none (such a frame fails the identity check)."""

    frames: object                           # uint8 tensor (T, H, W, 3)
    pts: list                                # (T,) int | None


@dataclass(slots=True)
class DecodeJob:
    """One batched decode: frames `indices` of `path`, resized (after `crop_px`) to width×height."""

    path: str
    indices: tuple[int, ...]                 # sorted, unique source frame indices
    width: int
    height: int
    fps: float                               # source fps, for error messages (index → time)
    crop_px: tuple[int, int, int, int] | None = None     # (x1, y1, x2, y2), display pixels
    rotation: int = 0                        # display rotation (CCW degrees, VideoInfo.rotation)
    src_width: int = 0                       # source frame size if known (bounds chunk bytes)
    src_height: int = 0
    num_threads: int = 2
    chunk: int = DEFAULT_CHUNK
    interpolation: str = "bicubic"
    index: object = None                     # kernels.index.VideoIndex of the video
    cancel: threading.Event = field(default_factory=threading.Event)

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            raise DecodeCancelled(self.path)

    def chunks(self, lo: int = 0, hi: int | None = None):
        """(position, indices) of `indices[lo:hi]` in consecutive chunks of at most `chunk`
        frames and CHUNK_MAX_BYTES of full-resolution RGB (so a 4K video decodes a few frames at a
        time, not 32). `position` is where the chunk goes in the output."""
        hi = len(self.indices) if hi is None else hi
        size = self.chunk
        if self.src_width and self.src_height:
            size = max(1, min(size, CHUNK_MAX_BYTES // (self.src_width * self.src_height * 3)))
        for start in range(lo, hi, size):
            yield start, self.indices[start:min(start + size, hi)]

    def check_length(self, total: int) -> None:
        """Raise `CorruptVideoError` at the first requested index the file (of `total` frames)
        does not hold."""
        if self.indices and self.indices[-1] >= total:
            missing = next(i for i in self.indices if i >= total)
            raise self.corrupt(missing, f"the file holds only {total} frames")

    def time_s(self, index: int) -> float:
        if self.index is not None and 0 <= index < self.index.num_frames:
            return self.index.time_s(index)
        return index / self.fps if self.fps else 0.0

    def pts(self, index: int) -> int:
        return int(self.index.pts[index])

    def corrupt(self, index: int, why) -> Exception:
        """The error to raise for a failure at frame `index`: `CorruptVideoError`, or
        `DecodeResourceError` when the machine (memory, GPU) failed, not the data."""
        reason = first_line(why)
        # torchcodec prefixes "function, /path/File.cpp:123, ": noise for the reader.
        reason = re.sub(r"^\w+, \S+\.cpp:\d+, ", "", reason)
        where = f"frame {index} ({self.time_s(index):.2f} s)"
        if isinstance(why, BaseException) and is_resource_failure(why):
            return DecodeResourceError(f"{self.path}: out of resources while decoding {where} "
                                       f"({type(why).__name__}: {reason[:160]}); the video is "
                                       f"not at fault: free memory or decode on another device")
        return CorruptVideoError(f"{self.path}: decoding failed at {where}: {reason[:200]}")


def split_at_keyframes(indices, keyframes, parts: int) -> list[tuple[int, int]]:
    """Cut sorted `indices` into at most `parts` runs [lo, hi) of about equal length, each cut
    moved back to the first index at or after the keyframe that opens its GOP (so no GOP is
    decoded by two workers). Without keyframes (unknown) or parts < 2: one run."""
    if not indices:
        return []
    keyframes = sorted(keyframes or ())
    bounds = [0]
    if parts >= 2 and keyframes:
        for part in range(1, parts):
            target = indices[len(indices) * part // parts]
            opening = keyframes[max(bisect.bisect_right(keyframes, target) - 1, 0)]
            cut = bisect.bisect_left(indices, opening)
            if cut > bounds[-1]:
                bounds.append(cut)
    bounds.append(len(indices))
    return list(zip(bounds[:-1], bounds[1:]))


def run_segments(job: DecodeJob, segments, decode_segment) -> None:
    """Call `decode_segment(lo, hi)` for each segment, in parallel threads when there are several.

    The first failure cancels the job (the other segments stop at their next chunk) and is
    raised; a `DecodeCancelled` of a segment stopped that way is not what failed. The threads are
    daemons, like `FrameSource`'s decode worker: a decoder stuck inside FFmpeg past the timeout
    must not keep the process from exiting.
    """
    if len(segments) <= 1:
        for lo, hi in segments:
            decode_segment(lo, hi)
        return
    errors: list[BaseException | None] = [None] * len(segments)

    def work(slot: int, lo: int, hi: int) -> None:
        try:
            decode_segment(lo, hi)
        except BaseException as err:       # handed to the calling thread below
            errors[slot] = err
            job.cancel.set()

    threads = [threading.Thread(target=work, args=(slot, lo, hi), daemon=True,
                                name=f"medclaw-segment-{slot}")
               for slot, (lo, hi) in enumerate(segments)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failures = [e for e in errors if e is not None]
    real = [e for e in failures if not isinstance(e, DecodeCancelled)]
    if failures:
        raise (real or failures)[0]


def is_dense(indices, gop: int) -> bool:
    """True when the mean gap between requested frames is at most half a keyframe interval."""
    if len(indices) < 2:
        return False
    mean_gap = (indices[-1] - indices[0]) / (len(indices) - 1)
    return mean_gap <= max(gop / 2, 1)


# Codecs the NVDEC engines of data-centre GPUs decode (A100, H100, L4/L40: H.264, HEVC, VP9, AV1).
# Anything else on a CUDA decoder — MPEG-4 Part 2 for one, MPEG-2, VC-1 — is declined, so
# FrameSource decodes it on the CPU safe path; the reason is logged once per (decoder, codec).
NVDEC_CODECS = frozenset({"h264", "hevc", "av1", "vp9"})
_NVDEC_LOGGED: set[tuple[str, str]] = set()
_NVDEC_LOCK = threading.Lock()


def nvdec_refusal(decoder_name: str, device: str, codec: str) -> str | None:
    """Why a CUDA decoder declines `codec` (None on CPU or for an NVDEC codec); logs it once."""
    if not str(device).startswith("cuda") or codec in NVDEC_CODECS:
        return None
    why = (f"NVDEC does not decode {codec} (it decodes {', '.join(sorted(NVDEC_CODECS))}); "
           "decoding on the CPU instead")
    with _NVDEC_LOCK:
        first = (decoder_name, codec) not in _NVDEC_LOGGED
        _NVDEC_LOGGED.add((decoder_name, codec))
    if first:
        import logging

        logging.getLogger("medclaw.kernels.decoders").warning("%s: %s", decoder_name, why)
    return why


class Decoder:
    """Base class. Subclasses set `name` and implement `decode`.

    Frames are returned in display orientation (as `VideoInfo.width/height` describe them);
    decoders whose library does not apply the display rotation itself leave
    `applies_rotation = False` and `_put` rotates each chunk before cropping.
    """

    name = "base"
    applies_rotation = False

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def decode(self, job: DecodeJob) -> DecodeResult:
        """uint8 tensor (T, job.height, job.width, 3) on `self.device` for `job.indices`, with
        the pts of each frame."""
        raise NotImplementedError

    def supports(self, index) -> str | None:
        """None if this decoder can be tried on a video with this index, else why not."""
        return None

    def close(self) -> None:
        """Release what the decoder holds open (none of ours keeps state between jobs)."""

    def _output(self, job: DecodeJob):
        import torch

        return torch.empty((len(job.indices), job.height, job.width, 3), dtype=torch.uint8,
                           device=self.device)                            # (T, H, W, 3)

    def _put(self, out, start: int, chunk_frames, job: DecodeJob) -> None:
        """Rotate/crop/resize a decoded chunk (n, H, W, 3) into out[start:start+n]."""
        import torch

        from medclaw.kernels.ops import resize_crop

        if chunk_frames.device != out.device:
            chunk_frames = chunk_frames.to(out.device, non_blocking=True)
        if job.rotation % 360 and not self.applies_rotation:
            # torch.rot90 over (H, W) with k=1 turns the picture counter-clockwise, like FFmpeg's
            # display matrix angle (and torchcodec's own autorotation).
            chunk_frames = torch.rot90(chunk_frames, k=(job.rotation // 90) % 4, dims=(1, 2))
        resize_crop(chunk_frames, job.width, job.height, job.crop_px, job.interpolation,
                    out=out[start:start + len(chunk_frames)])
