"""NVIDIA PyNvVideoCodec decoder (GPU), used only when `PyNvVideoCodec` is installed.

`SimpleDecoder` decodes on NVDEC straight into device memory; frames come back as DLPack objects
in RGB (H, W, 3) that `torch.from_dlpack` wraps without a copy. We fetch them per chunk of sorted
indices and resize/crop each chunk on the GPU with `ops.resize_crop`. The pts of each frame is
read from the decoded frame's `timestamp` where PyNvVideoCodec gives one; where it does not, the
frame cannot be verified and `FrameSource` decodes it on a verified path instead.
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import Decoder, DecodeJob, DecodeResult, nvdec_refusal


class PyNvDecoder(Decoder):
    name = "pynvc"

    def supports(self, index) -> str | None:
        if not index.has_pts:
            return "PyNvVideoCodec cannot number frames without timestamps"
        return nvdec_refusal(self.name, self.device, index.codec)

    def decode(self, job: DecodeJob) -> DecodeResult:
        import PyNvVideoCodec as nvc
        import torch

        out = self._output(job)                                           # (T, H, W, 3) cuda
        got_pts: list = [None] * len(job.indices)
        if not job.indices:
            return DecodeResult(out, got_pts)
        gpu_id = torch.device(self.device).index or 0
        try:
            decoder = nvc.SimpleDecoder(job.path, gpu_id=gpu_id, use_device_memory=True,
                                        output_color_type=nvc.OutputColorType.RGB)
        except Exception as err:
            raise job.corrupt(job.indices[0], err) from err
        for start, chunk in job.chunks():
            job.check_cancelled()
            try:
                batch = decoder.get_batch_frames_by_index(list(chunk))
                frames = torch.stack([torch.from_dlpack(f) for f in batch])  # (n, H, W, 3)
            except Exception as err:
                raise job.corrupt(chunk[0], err) from err
            if len(frames) != len(chunk):
                raise job.corrupt(chunk[len(frames)], "decoder returned too few frames")
            for slot, frame in enumerate(batch):
                stamp = getattr(frame, "timestamp", None)
                got_pts[start + slot] = int(stamp) if stamp is not None else None
            self._put(out, start, frames, job)
        return DecodeResult(out, got_pts)
