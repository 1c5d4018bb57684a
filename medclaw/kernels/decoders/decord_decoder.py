"""decord decoder (CPU), used only when the optional `decord` package is installed.

decord's `get_batch` seeks per keyframe by itself; we call it per chunk of sorted indices and
resize/crop each chunk with `ops.resize_crop`. decord numbers frames itself and the pts it
reports (`get_frame_timestamp`) come from its own frame table, not from the decoded frame: on
MPEG-TS it returns wrong frames with the planned pts. It cannot be verified, so `supports`
declines every video and `FrameSource` serves decoder="decord" on the safe path; the class stays
for direct comparisons (`medclaw bench decode --check-all`).
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import Decoder, DecodeJob, DecodeResult


class DecordDecoder(Decoder):
    name = "decord"
    applies_rotation = True       # decord 0.6 rotates by the display matrix itself (tested)

    def supports(self, index) -> str | None:
        # decord's get_frame_timestamp reads its own frame table, not the frame it decoded: a
        # wrong frame comes back with the right pts (seen on MPEG-TS), so nothing can verify it.
        return "decord reports table timestamps, not the decoded frame's: unverifiable"

    def decode(self, job: DecodeJob) -> DecodeResult:
        import decord
        import torch

        out = self._output(job)                                           # (T, H, W, 3)
        got_pts: list = [None] * len(job.indices)
        if not job.indices:
            return DecodeResult(out, got_pts)
        tick = job.index.tick_s
        try:
            reader = decord.VideoReader(job.path, ctx=decord.cpu(0), num_threads=job.num_threads)
        except Exception as err:
            raise job.corrupt(job.indices[0], err) from err
        job.check_length(len(reader))
        for start, chunk in job.chunks():
            job.check_cancelled()
            try:
                frames = torch.from_numpy(reader.get_batch(list(chunk)).asnumpy())  # (n, H, W, 3)
                stamps = reader.get_frame_timestamp(list(chunk))[:, 0]             # (n,) seconds
            except Exception as err:
                raise job.corrupt(chunk[0], err) from err
            for slot, seconds in enumerate(stamps.tolist()):
                # decord reports pts relative to the stream start; the index holds absolute pts.
                got_pts[start + slot] = round(seconds / tick) + int(job.index.pts[0])
            self._put(out, start, frames, job)
        return DecodeResult(out, got_pts)
