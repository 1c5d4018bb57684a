"""torchcodec decoder: FFmpeg on CPU (default), NVDEC when device is "cuda".

`get_frames_at` with sorted indices only seeks when the next frame lies beyond the current GOP, so
one call per chunk is keyframe-aware by itself. "exact" seek mode costs one packet scan of the
file (no decoding) and guarantees frame i is frame i, also for B-frames and variable frame rates.

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
    DECODER_RESIZE_MAX_FRACTION, DEFAULT_GOP, Decoder, DecodeJob, is_dense, run_segments,
    split_at_keyframes,
)


class TorchcodecDecoder(Decoder):
    name = "torchcodec"
    applies_rotation = True       # torchcodec rotates by the display matrix itself

    def _open(self, job: DecodeJob, num_threads: int, transforms=None):
        from torchcodec.decoders import VideoDecoder

        kwargs = dict(dimension_order="NHWC", seek_mode="exact", device=self.device)
        if self.device == "cpu":
            kwargs["num_ffmpeg_threads"] = num_threads
        if transforms:
            kwargs["transforms"] = transforms
        try:
            return VideoDecoder(job.path, **kwargs)
        except Exception as err:   # torchcodec raises RuntimeError/ValueError on unreadable files
            raise job.corrupt(job.indices[0] if job.indices else 0, err) from err

    @staticmethod
    def _keyframes(decoder) -> list[int] | None:
        """Indices of the keyframes, or None if torchcodec cannot tell (private API)."""
        try:
            return [int(k) for k in decoder._get_key_frame_indices()]
        except Exception:
            return None

    @staticmethod
    def _gop(keyframes, total: int) -> int:
        if keyframes is None:
            return DEFAULT_GOP              # the common default
        if len(keyframes) < 2:
            return max(total, 1)            # one keyframe: the whole file is one GOP
        return max(1, (keyframes[-1] - keyframes[0]) // (len(keyframes) - 1))

    def decode(self, job: DecodeJob):
        out = self._output(job)                                           # (T, H, W, 3)
        if not job.indices:
            return out
        first = self._open(job, 1)
        src_h, src_w = int(first.metadata.height), int(first.metadata.width)
        job.src_width, job.src_height = src_w, src_h
        keyframes = self._keyframes(first)
        on_cpu = self.device == "cpu"
        segments = split_at_keyframes(job.indices, keyframes, job.num_threads if on_cpu else 1)
        # One segment: FFmpeg frame threads when it is dense (on CPU; NVDEC takes no threads).
        dense = is_dense(job.indices, self._gop(keyframes, len(first)))
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
                    frames = decoder.get_frames_at(list(chunk)).data      # (n, h, w, 3) uint8
                except Exception as err:
                    raise job.corrupt(self._first_bad(decoder, chunk), err) from err
                if len(frames) != len(chunk):
                    raise job.corrupt(chunk[len(frames)], "decoder returned too few frames")
                self._put(out, start, frames, job)

        run_segments(job, segments, decode_segment)
        return out

    @staticmethod
    def _first_bad(decoder, chunk) -> int:
        """The first index of a failed chunk that cannot be decoded on its own (for the message)."""
        for index in chunk:
            try:
                decoder.get_frame_at(int(index))
            except Exception:
                return int(index)
        return int(chunk[0])
