"""torchcodec decoder: FFmpeg on CPU (default), NVDEC when device is "cuda".

Frames are asked for by time: `get_frames_played_at` with each planned frame's pts (from the
video's index) plus a quarter of its display interval, in "approximate" seek mode, which opens the
file without scanning it (exact mode would scan every packet on every open — seconds on an
hour-long video; the index already holds what that scan finds). Sorted times only seek when the
next frame lies beyond the current GOP. Each returned frame carries its pts, which `FrameSource`
checks; torchcodec 0.14 seeks to wrong GOPs on MPEG-TS (`supports` declines it there) and cannot
open raw elementary streams.

Threads on CPU: a request spanning several GOPs is cut at keyframes into `job.num_threads`
segments, each decoded by its own single-threaded `VideoDecoder` in its own thread (see
`base.split_at_keyframes`; torchcodec releases the GIL while it decodes). A request inside one GOP
is one segment, with FFmpeg frame threads when it is dense and one thread when it seeks. On CUDA
one decoder does it all: NVDEC is one engine, threads would only queue on it.

Resizing: a large downscale is done by the decoder itself (`torchcodec.transforms.Resize`, in
FFmpeg, before the RGB frame is ever materialised at full size); small changes such as
qwen-vl-utils' 640×360 → 644×364 go through `ops.resize_crop`, which measured faster here for
them. Crops always go through `ops.resize_crop` (crop first, then resize).
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import (
    DECODER_RESIZE_MAX_FRACTION, DEFAULT_GOP, Decoder, DecodeJob, DecodeResult, is_dense,
    nvdec_refusal, run_segments, split_at_keyframes,
)

# Containers on which torchcodec's seeking returns wrong frames (seen, not assumed: the identity
# check also learns this at run time for anything not listed).
_BAD_CONTAINERS = {"mpegts": "torchcodec 0.14 seeks to wrong frames in MPEG-TS",
                   "avi": "torchcodec 0.14 (approximate seek mode) rejects the last frames' pts "
                          "in AVI"}


class TorchcodecDecoder(Decoder):
    name = "torchcodec"
    applies_rotation = True       # torchcodec rotates by the display matrix itself

    def supports(self, index) -> str | None:
        import numpy as np

        if not index.has_pts:
            return "torchcodec cannot open a stream without timestamps"
        if index.container in _BAD_CONTAINERS:
            return _BAD_CONTAINERS[index.container]
        steps = np.diff(index.pts)
        if len(steps) > 1 and np.ptp(steps) > max(2, 0.1 * float(np.median(steps))):
            # approximate mode times frames by the header's rate: on VFR it refuses real pts
            return "torchcodec 0.14 (approximate seek mode) rejects the pts of VFR video"
        return nvdec_refusal(self.name, self.device, index.codec)

    def _open(self, job: DecodeJob, num_threads: int, transforms=None):
        from torchcodec.decoders import VideoDecoder

        kwargs = dict(dimension_order="NHWC", seek_mode="approximate", device=self.device)
        if self.device == "cpu":
            kwargs["num_ffmpeg_threads"] = num_threads
        if transforms:
            kwargs["transforms"] = transforms
        try:
            return VideoDecoder(job.path, **kwargs)
        except Exception as err:   # torchcodec raises RuntimeError/ValueError on unreadable files
            raise job.corrupt(job.indices[0] if job.indices else 0, err) from err

    @staticmethod
    def _times(job: DecodeJob) -> list[float]:
        """Seconds to ask for: each frame's pts plus a quarter of its display interval, so that
        float rounding cannot land on the previous frame."""
        index = job.index
        pts, tick, n = index.pts, index.tick_s, index.num_frames
        times = []
        for i in job.indices:
            nxt = int(pts[i + 1]) if i + 1 < n else int(index.end_pts)
            times.append((int(pts[i]) + max(nxt - int(pts[i]), 1) / 4) * tick)
        return times

    @staticmethod
    def _gop(keyframes, total: int) -> int:
        if keyframes is None:
            return DEFAULT_GOP              # the common default
        if len(keyframes) < 2:
            return max(total, 1)            # one keyframe: the whole file is one GOP
        return max(1, (keyframes[-1] - keyframes[0]) // (len(keyframes) - 1))

    def decode(self, job: DecodeJob) -> DecodeResult:
        out = self._output(job)                                           # (T, H, W, 3)
        got_pts: list = [None] * len(job.indices)
        if not job.indices:
            return DecodeResult(out, got_pts)
        job.check_length(job.index.num_frames)
        times = self._times(job)
        tick = job.index.tick_s
        first = self._open(job, 1)
        src_h, src_w = int(first.metadata.height), int(first.metadata.width)
        job.src_width, job.src_height = src_w, src_h
        keyframes = [int(k) for k in job.index.keyframes]
        on_cpu = self.device == "cpu"
        segments = split_at_keyframes(job.indices, keyframes, job.num_threads if on_cpu else 1)
        # One segment: FFmpeg frame threads when it is dense (on CPU; NVDEC takes no threads).
        dense = is_dense(job.indices, self._gop(keyframes, job.index.num_frames))
        threads = job.num_threads if on_cpu and len(segments) == 1 and dense else 1
        transforms = None
        small = job.width * job.height <= DECODER_RESIZE_MAX_FRACTION * src_w * src_h
        # On CUDA the frames are already on the GPU, where ops.resize_crop is cheap.
        if small and job.crop_px is None and on_cpu:
            from torchcodec.transforms import Resize

            transforms = [Resize((job.height, job.width))]
        reusable = [first] if threads == 1 and transforms is None else []
        del first

        def decode_segment(lo: int, hi: int) -> None:
            if lo == 0 and reusable:
                decoder = reusable.pop()         # the first segment keeps the probing decoder
            else:
                decoder = self._open(job, threads, transforms)
            for start, chunk in job.chunks(lo, hi):
                job.check_cancelled()
                try:
                    batch = decoder.get_frames_played_at(times[start:start + len(chunk)])
                except Exception as err:
                    raise job.corrupt(chunk[0], err) from err
                frames = batch.data                                       # (n, h, w, 3) uint8
                if len(frames) != len(chunk):
                    raise job.corrupt(chunk[len(frames)], "decoder returned too few frames")
                for slot, seconds in enumerate(batch.pts_seconds.tolist()):
                    got_pts[start + slot] = round(seconds / tick)
                self._put(out, start, frames, job)

        run_segments(job, segments, decode_segment)
        return DecodeResult(out, got_pts)
