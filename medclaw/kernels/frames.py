"""FrameSource: the one way tools get pixels — planned frames, cached, decoded in batches, bounded.

    src = FrameSource(device="cpu", decoder="auto", cache_mb=1024, timeout_s=120)
    src.get(info, plan, crop_box=None, as_tensor=False)          -> uint8 (T, H, W, 3)
    src.get_frames(info, indices, width, height, crop_box=None)  -> uint8 (T, H, W, 3)
    src.get_frame(info, index, width, height, crop_box=None)     -> uint8 (H, W, 3)
    src.stats() -> dict   cache hits/misses/evictions/bytes + frames decoded + decode calls

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

import os
import threading
import time

from medclaw.errors import ConfigError
from medclaw.kernels.cache import FrameCache, FrameKey
from medclaw.kernels.errors import DecodeTimeoutError, FrameTooLargeError, TimeRangeError

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
        self._guard = threading.Lock()
        self._video_locks: dict[str, threading.Lock] = {}
        self.frames_decoded = 0
        self.decode_calls = 0

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

    def stats(self) -> dict:
        return {**self.cache.stats().to_dict(), "frames_decoded": self.frames_decoded,
                "decode_calls": self.decode_calls,
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
            return self._video_locks.setdefault(sha256, threading.Lock())

    def _get_decoder(self):
        with self._guard:              # requests for different videos may arrive together
            if self._decoder is None:
                from medclaw.kernels.decoders import make_decoder

                self._decoder = make_decoder(self.decoder_name, self.device)
            return self._decoder

    def _decode(self, info, missing, width, height, crop_px, deadline):
        """Decode `missing` in a worker thread; DecodeTimeoutError past the deadline."""
        from medclaw.kernels.decoders.base import DecodeCancelled, DecodeJob

        decoder = self._get_decoder()
        job = DecodeJob(path=str(info.path), indices=tuple(missing), width=width, height=height,
                        fps=info.fps, crop_px=crop_px, rotation=info.rotation,
                        src_width=info.width, src_height=info.height,
                        num_threads=self.num_threads,
                        chunk=self.chunk, interpolation=self.interpolation)
        result: dict = {}

        def work():
            try:
                result["frames"] = decoder.decode(job)
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
        with self._guard:
            self.frames_decoded += len(missing)
            self.decode_calls += 1
        return result["frames"]
