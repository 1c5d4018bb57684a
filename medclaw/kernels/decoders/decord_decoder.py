"""decord decoder (CPU), used only when the optional `decord` package is installed.

decord's `get_batch` seeks per keyframe by itself; we call it per chunk of sorted indices and
resize/crop each chunk with `ops.resize_crop`. (STACK.md: decord 0.6 intermittently fails on the
last frame; such a failure surfaces as `CorruptVideoError`, never as a wrong frame.)
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import Decoder, DecodeJob


class DecordDecoder(Decoder):
    name = "decord"
    applies_rotation = True       # decord 0.6 rotates by the display matrix itself (tested)

    def decode(self, job: DecodeJob):
        import decord
        import torch

        out = self._output(job)                                           # (T, H, W, 3)
        if not job.indices:
            return out
        try:
            reader = decord.VideoReader(job.path, ctx=decord.cpu(0), num_threads=job.num_threads)
        except Exception as err:
            raise job.corrupt(job.indices[0], err) from err
        job.check_length(len(reader))
        for start, chunk in job.chunks():
            job.check_cancelled()
            try:
                frames = torch.from_numpy(reader.get_batch(list(chunk)).asnumpy())  # (n, H, W, 3)
            except Exception as err:
                raise job.corrupt(chunk[0], err) from err
            self._put(out, start, frames, job)
        return out
