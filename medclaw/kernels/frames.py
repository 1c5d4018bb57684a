"""FrameSource: the one way tools get pixels — planned frames, cached, decoded in batches, bounded.

    src = FrameSource(device="cpu", decoder="auto", cache_mb=1024, timeout_s=120)
    src.get(info, plan, crop_box=None, as_tensor=False)          -> uint8 (T, H, W, 3)
    src.get_frames(info, indices, width, height, crop_box=None)  -> uint8 (T, H, W, 3)
    src.get_frame(info, index, width, height, crop_box=None)     -> uint8 (H, W, 3)
    await src.aget(info, plan, crop_box=None) / await src.aget_frame(...)   same, for asyncio:
        waits for the per-video lock in the event loop and decodes in the source's own threads,
        so neither a waiting nor a running decode occupies the loop's default executor
    src.stats() -> dict   cache hits/misses/evictions/bytes + frames decoded + decode calls
    src.close()           stop the source's threads, drop its cache (idempotent)

Every frame returned is the frame planned: the decoder reports each frame's pts, which must equal
the pts of the planned index in the video's index (`kernels.index`, `kernels.verify`). On a
mismatch (or a decoder error on data the safe path can read) the request's frames are decoded
again on the safe path — PyAV, finding frames by pts — and a warning is logged once per
(decoder, container, codec); that decoder is then not used for that container and codec again in
this process (`refused_decoders()`). A frame the safe path cannot deliver either raises
`FrameIdentityError` (a `CorruptVideoError`): never an unverified frame.

Returns a READ-ONLY numpy array (CPU) — it may share memory with the cache, which saves a copy of
every frame (~0.3 s and 540 MB for a 768-frame coarse pass); `.copy()` it to draw on it — or, with
`as_tensor=True`, a torch tensor of the caller's own on the source's device (on CUDA frames never
leave the GPU). `crop_box` is normalised (x1, y1, x2, y2); the crop is cut
from the full-resolution frame and then resized to (width, height).

Caching: every frame is stored under (video sha256, index, width, height, crop) in a shared LRU
(`cache.FrameCache`); a request decodes only the frames the cache lacks, in one batched call.
Requests for the same video are serialised, so concurrent episodes asking for overlapping frames
decode them once. Decoding runs in a worker thread with a deadline: past `timeout_s` the worker is
told to stop (it checks between chunks) and the caller gets `DecodeTimeoutError` — never a hang.
Out-of-range frame indices raise `TimeRangeError`; corrupt data raises `CorruptVideoError`
naming the frame and time.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict

from medclaw.errors import ConfigError
from medclaw.kernels.cache import FrameCache, FrameKey
from medclaw.kernels.errors import (
    CorruptVideoError, DecodeTimeoutError, FrameIdentityError, FrameTooLargeError, TimeRangeError,
)

log = logging.getLogger(__name__)
LARGE_SOURCE_PIXELS = 1920 * 1080      # at and above: CPU decodes that shrink go to PyAV
MAX_VIDEO_LOCKS = 256                   # per-video locks kept; idle ones beyond this are dropped
ASYNC_WORKERS = 4                       # threads of a source's own executor (aget)
# (decoder, container, codec) -> why: decoders that returned a wrong frame (or failed where the
# safe path did not) on that format; not used for it again in this process.
_REFUSED: dict[tuple[str, str, str], str] = {}
_REFUSED_LOCK = threading.Lock()


def refused_decoders() -> dict[tuple[str, str, str], str]:
    with _REFUSED_LOCK:
        return dict(_REFUSED)

MAX_FRAME_PIXELS = 7680 * 4320          # an 8K frame: anything larger is a caller mistake
# Decode threads (= keyframe segments decoded in parallel, see decoders/base.py): one per core,
# capped at 8 because every segment holds its own chunk of full-resolution frames in memory.
DEFAULT_DECODE_THREADS = max(1, min(8, os.cpu_count() or 1))


class FrameSource:
    def __init__(self, device: str = "cpu", decoder: str = "auto", cache_mb: float = 1024,
                 timeout_s: float = 120.0, *, num_threads: int = DEFAULT_DECODE_THREADS,
                 chunk: int = 32, interpolation: str = "bicubic") -> None:
        from medclaw.kernels.decoders import DECODERS, device_kind
        from medclaw.kernels.ops import INTERPOLATIONS

        device_kind(device)
        if decoder != "auto" and decoder not in DECODERS:
            raise ConfigError(f"unknown decoder {decoder!r}: choose from auto, "
                              f"{', '.join(DECODERS)}")
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
        if cache_mb < 0:
            raise ConfigError(f"cache_mb must be >= 0, got {cache_mb}")
        if num_threads < 1 or chunk < 1:
            raise ConfigError(f"num_threads and chunk must be >= 1, got {num_threads}, {chunk}")
        if interpolation not in INTERPOLATIONS:
            raise ConfigError(f"unknown interpolation {interpolation!r}: choose from "
                              f"{', '.join(INTERPOLATIONS)}")
        self.device = device
        self.decoder_name = decoder
        self.timeout_s = float(timeout_s)
        self.num_threads = num_threads
        self.chunk = chunk
        self.interpolation = interpolation
        self.cache = FrameCache(int(cache_mb * 2 ** 20))
        self._decoder = None
        self._safe = None
        self._guard = threading.Lock()
        self._video_locks: OrderedDict[str, threading.Lock] = OrderedDict()
        self._async_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._executor = None
        self._closed = False
        self.frames_decoded = 0
        self.decode_calls = 0
        self.identity_fallbacks = 0          # requests re-decoded on the safe path

    # --- public API -----------------------------------------------------------------------------

    def get(self, info, plan, crop_box=None, *, as_tensor: bool = False):
        """Frames of a `FramePlan`: uint8 (T, plan.height, plan.width, 3)."""
        return self.get_frames(info, plan.frame_indices, plan.width, plan.height, crop_box,
                               as_tensor=as_tensor)

    def get_frame(self, info, index: int, width: int, height: int, crop_box=None, *,
                  as_tensor: bool = False):
        """One frame: uint8 (height, width, 3)."""
        return self.get_frames(info, [index], width, height, crop_box, as_tensor=as_tensor)[0]

    def get_frames(self, info, indices, width: int, height: int, crop_box=None, *,
                   as_tensor: bool = False):
        from medclaw.kernels.ops import crop_box_to_pixels

        deadline = time.monotonic() + self.timeout_s
        indices = [int(i) for i in indices]
        self._validate(info, indices, width, height)
        crop_px = crop_box_to_pixels(crop_box, info.width, info.height) if crop_box else None
        keys = {i: FrameKey(info.sha256, i, width, height, crop_px) for i in set(indices)}
        lock = self._video_lock(info.sha256)
        if not lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise DecodeTimeoutError(f"{info.path}: waited longer than {self.timeout_s:g} s for "
                                     f"another decode of this video")
        try:
            frames = {i: self.cache.get(key) for i, key in keys.items()}
            missing = sorted(i for i, frame in frames.items() if frame is None)
            decoded = None
            if missing:
                decoded = self._decode(info, missing, width, height, crop_px, deadline)
                if self.cache.capacity_bytes:
                    # The cache keeps per-frame views into the decoded batch: no copy. The
                    # caller may get the same batch, read-only (see module docstring).
                    stored = decoded if decoded.is_cuda else decoded.numpy()
                    self.cache.put_batch([keys[i] for i in missing], list(stored),
                                         stored.nbytes)
                for slot, index in enumerate(missing):
                    frames[index] = decoded[slot]                         # (H, W, 3) view
        finally:
            lock.release()
        shares_cache = bool(missing) and missing == indices and self.cache.capacity_bytes > 0
        if missing and missing == indices:
            out = decoded                    # a first request: the decoded batch itself
        else:
            out = self._assemble(indices, frames, width, height)
        if as_tensor:
            # Tensors cannot be made read-only: hand out a copy when the cache shares the batch.
            return out.clone() if shares_cache else out
        array = out.cpu().numpy()
        array.flags.writeable = False
        return array

    async def aget(self, info, plan, crop_box=None, *, as_tensor: bool = False):
        """`get` for asyncio callers (see module docstring)."""
        return await self._async_call(info.sha256, self.get, info, plan, crop_box,
                                      as_tensor=as_tensor)

    async def aget_frame(self, info, index: int, width: int, height: int, crop_box=None, *,
                         as_tensor: bool = False):
        return await self._async_call(info.sha256, self.get_frame, info, index, width, height,
                                      crop_box, as_tensor=as_tensor)

    async def _async_call(self, sha256: str, fn, *args, **kwargs):
        import functools
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        with self._guard:
            if self._closed:
                raise RuntimeError("FrameSource is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(ASYNC_WORKERS,
                                                    thread_name_prefix="medclaw-frames")
            locks = self._async_locks.setdefault(loop, OrderedDict())
            lock = locks.setdefault(sha256, asyncio.Lock())
            locks.move_to_end(sha256)
            while len(locks) > MAX_VIDEO_LOCKS:
                stale = next((k for k, v in locks.items() if not v.locked()), None)
                if stale is None:
                    break
                locks.pop(stale)
            executor = self._executor
        async with lock:            # waiting here costs no thread
            return await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the source's threads and drop its cache; later calls raise. Idempotent."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
            decoders = [d for d in (self._decoder, self._safe) if d is not None]
            self._decoder = self._safe = None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        for decoder in decoders:
            decoder.close()
        self.cache.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        return {**self.cache.stats().to_dict(), "frames_decoded": self.frames_decoded,
                "decode_calls": self.decode_calls, "identity_fallbacks": self.identity_fallbacks,
                "decoder": self._decoder.name if self._decoder else self.decoder_name}

    # --- internals ------------------------------------------------------------------------------

    def _assemble(self, indices, frames, width, height):
        import torch

        out = torch.empty((len(indices), height, width, 3), dtype=torch.uint8,
                          device=self.device)                             # (T, H, W, 3)
        for slot, index in enumerate(indices):
            frame = frames[index]
            out[slot] = torch.from_numpy(frame) if not isinstance(frame, torch.Tensor) else frame
        return out

    def _validate(self, info, indices, width: int, height: int) -> None:
        if not indices:
            return
        if width < 1 or height < 1:
            raise ValueError(f"frame size must be positive, got {width}x{height}")
        if width * height > MAX_FRAME_PIXELS:
            raise FrameTooLargeError(f"{info.path}: requested frames of {width}x{height} exceed "
                                     f"the {MAX_FRAME_PIXELS}-pixel cap")
        bad = [i for i in indices if not 0 <= i < info.num_frames]
        if bad:
            raise TimeRangeError(f"{info.path}: frame index {bad[0]} is outside the video "
                                 f"(0-{info.num_frames - 1})")

    def _video_lock(self, sha256: str) -> threading.Lock:
        with self._guard:
            lock = self._video_locks.setdefault(sha256, threading.Lock())
            self._video_locks.move_to_end(sha256)
            while len(self._video_locks) > MAX_VIDEO_LOCKS:
                stale = next((k for k, v in self._video_locks.items()
                              if not v.locked() and k != sha256), None)
                if stale is None:
                    break
                self._video_locks.pop(stale)
            return lock

    def _get_decoder(self):
        with self._guard:              # requests for different videos may arrive together
            if self._closed:
                raise RuntimeError("FrameSource is closed")
            if self._decoder is None:
                from medclaw.kernels.decoders import make_decoder

                self._decoder = make_decoder(self.decoder_name, self.device)
            return self._decoder

    def _get_safe(self):
        with self._guard:
            if self._safe is None:
                from medclaw.kernels.decoders.pyav_decoder import PyAVDecoder

                self._safe = PyAVDecoder(device=self.device)
            return self._safe

    def _choose(self, index, width: int = 0, height: int = 0):
        """The decoder for this video: the configured one unless it declines the format or failed
        the identity check on it before, else the safe path — which is also taken on CPU when the
        codec can decode at reduced resolution for this output size (PyAV's `lowres`), and for
        1080p and larger H.264/HEVC wanted at most half-size."""
        from medclaw.kernels.decoders.base import DECODER_RESIZE_MAX_FRACTION
        from medclaw.kernels.decoders.pyav_decoder import SKIP_NONREF_CODECS, lowres_for

        decoder = self._get_decoder()
        meta = index.meta
        src_w, src_h = meta.get("width", 0), meta.get("height", 0)
        small = bool(width and src_w and meta.get("rotation", 0) % 360 == 0
                     and width * height <= DECODER_RESIZE_MAX_FRACTION * src_w * src_h)
        if self.device == "cpu" and small and (
                lowres_for(index.codec, src_w, src_h, width, height)
                or (src_w * src_h >= LARGE_SOURCE_PIXELS and index.codec in SKIP_NONREF_CODECS)):
            # Reduced-resolution decode, or a large H.264/HEVC source wanted small: PyAV skips
            # the unwanted non-reference frames and scales in YUV before converting the small
            # frame to RGB (4K coarse pass measured, one-pass swscale then: PyAV 3.9 s,
            # torchcodec 6.0 s, ffmpeg decoding all 3.8 s; README has the current ratios).
            return self._get_safe()
        key = (decoder.name, index.container, index.codec)
        with _REFUSED_LOCK:
            refused = key in _REFUSED
        if refused or decoder.supports(index) is not None or decoder.name == "pyav":
            return self._get_safe()
        return decoder

    @staticmethod
    def _refuse(decoder, index, why: str) -> None:
        key = (decoder.name, index.container, index.codec)
        with _REFUSED_LOCK:
            if key in _REFUSED:
                return
            _REFUSED[key] = why
        log.warning("decoder %s failed the frame identity check on %s/%s (%s); decoding that "
                    "format on the safe path (PyAV by pts) from now on", decoder.name,
                    index.container, index.codec, why)

    def _decode(self, info, missing, width, height, crop_px, deadline):
        """Decode `missing`, verified frame by frame (see module docstring)."""
        from medclaw.kernels.index import index_for
        from medclaw.kernels.verify import mismatches

        index = index_for(info)
        if missing[-1] >= index.num_frames:
            raise TimeRangeError(f"{info.path}: frame index {missing[-1]} is outside the "
                                 f"decodable video (0-{index.num_frames - 1})")
        decoder = self._choose(index, width if crop_px is None else 0, height)
        safe = self._get_safe()
        try:
            frames, pts = self._run(decoder, index, info, missing, width, height, crop_px,
                                    deadline)
            bad = mismatches(index, missing, pts)
            why = f"{len(bad)} of {len(missing)} frames had another pts than planned"
        except CorruptVideoError as err:
            if decoder is safe:
                raise
            # An error is not a wrong frame: this request goes to the safe path, the decoder
            # stays in use for the format.
            log.warning("decoder %s failed on %s (%s); decoding this request on the safe path",
                        decoder.name, info.path, str(err)[:200])
            frames, pts, bad, why = None, None, list(range(len(missing))), ""
        if bad and decoder is safe:
            raise self._identity_error(info, index, missing, bad, frames, pts)
        if bad:
            if why:
                self._refuse(decoder, index, why[:200])
            with self._guard:
                self.identity_fallbacks += 1
            again = [missing[slot] for slot in bad]
            fixed, fixed_pts = self._run(safe, index, info, again, width, height, crop_px,
                                         deadline)
            still = mismatches(index, again, fixed_pts)
            if still:
                raise self._identity_error(info, index, again, still, fixed, fixed_pts)
            if frames is None:
                frames = fixed
            else:
                import torch

                frames[torch.as_tensor(bad)] = fixed.to(frames.device)
        with self._guard:
            self.frames_decoded += len(missing)
            self.decode_calls += 1
        return frames

    @staticmethod
    def _identity_error(info, index, indices, bad, frames, pts):
        slot = bad[0]
        i = indices[slot]
        got = pts[slot] if pts is not None else None
        shown = "no pts" if got is None else f"pts {got}"
        return FrameIdentityError(
            f"{info.path}: frame {i} ({index.time_s(i):.3f} s, pts {int(index.pts[i])}) could not "
            f"be decoded as planned: the decoder returned {shown} ({len(bad)} frames wrong)")

    def _run(self, decoder, index, info, missing, width, height, crop_px, deadline):
        """Run one decoder in a worker thread: (frames, pts); DecodeTimeoutError past the
        deadline."""
        from medclaw.kernels.decoders.base import DecodeCancelled, DecodeJob

        job = DecodeJob(path=str(info.path), indices=tuple(missing), width=width, height=height,
                        fps=info.fps, crop_px=crop_px, rotation=info.rotation,
                        src_width=info.width, src_height=info.height,
                        num_threads=self.num_threads, index=index,
                        chunk=self.chunk, interpolation=self.interpolation)
        result: dict = {}

        def work():
            try:
                result["out"] = decoder.decode(job)
            except BaseException as err:   # handed to the caller's thread below
                result["error"] = err

        worker = threading.Thread(target=work, name="medclaw-decode", daemon=True)
        worker.start()
        worker.join(max(deadline - time.monotonic(), 0.0))
        if worker.is_alive() or isinstance(result.get("error"), DecodeCancelled):
            job.cancel.set()      # the worker stops at its next chunk boundary
            raise DecodeTimeoutError(
                f"{info.path}: decoding {len(missing)} frames took longer than "
                f"{self.timeout_s:g} s; ask for fewer frames or raise timeout_s")
        if "error" in result:
            raise result["error"]
        return result["out"].frames, result["out"].pts
