"""torchcodec decoder: FFmpeg on CPU (default), NVDEC when device is "cuda".

`get_frames_at` with sorted indices only seeks when the next frame lies beyond the current GOP, so
one call per chunk is keyframe-aware by itself; what changes with density is the thread count
(frame threads for a dense sequential pass, one thread when seeking — see `base.is_dense`).
"exact" seek mode costs one packet scan of the file (no decoding) and guarantees frame i is
frame i, also for B-frames and variable frame rates.

Resizing: a large downscale is done by the decoder itself (`torchcodec.transforms.Resize`, in
FFmpeg, before the RGB frame is ever materialised at full size); small changes such as
qwen-vl-utils' 640×360 → 644×364 go through `ops.resize_crop`, which measured faster here for
them. Crops always go through `ops.resize_crop` (crop first, then resize).
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import (
    DECODER_RESIZE_MAX_FRACTION, DEFAULT_GOP, Decoder, DecodeJob, is_dense,
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

    def _gop(self, decoder) -> int:
        try:
            keys = decoder._get_key_frame_indices()
        except Exception:           # private API; fall back to the common default
            return DEFAULT_GOP
        keys = [int(k) for k in keys]
        if len(keys) < 2:
            return max(len(decoder), 1)   # one keyframe: the whole file is one GOP
        return max(1, (keys[-1] - keys[0]) // (len(keys) - 1))

    def decode(self, job: DecodeJob):
        out = self._output(job)                                           # (T, H, W, 3)
        if not job.indices:
            return out
        probe = self._open(job, 1)
        meta = probe.metadata
        src_h, src_w = int(meta.height), int(meta.width)
        dense = is_dense(job.indices, self._gop(probe))
        threads = job.num_threads if dense else 1
        transforms = None
        small = job.width * job.height <= DECODER_RESIZE_MAX_FRACTION * src_w * src_h
        # On CUDA the frames are already on the GPU, where ops.resize_crop is cheap.
        if small and job.crop_px is None and self.device == "cpu":
            from torchcodec.transforms import Resize

            transforms = [Resize((job.height, job.width))]
        decoder = probe if (threads == 1 and transforms is None) else self._open(
            job, threads, transforms)
        del probe
        job.src_width, job.src_height = src_w, src_h
        for start, chunk in job.chunks():
            job.check_cancelled()
            try:
                frames = decoder.get_frames_at(list(chunk)).data          # (n, h, w, 3) uint8
            except Exception as err:
                raise job.corrupt(self._first_bad(decoder, chunk), err) from err
            if len(frames) != len(chunk):
                raise job.corrupt(chunk[len(frames)], "decoder returned too few frames")
            self._put(out, start, frames, job)
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
