"""PyAV decoder (CPU): exact frame indices from a packet scan, sequential or keyframe seeking.

Frame i is the i-th frame in presentation order. We learn every frame's pts and the keyframes by
demuxing the packets once (no decoding), then:
  * a request spanning several GOPs is cut at keyframes into `job.num_threads` segments, each
    decoded by its own single-threaded codec context in its own thread (`base.split_at_keyframes`;
    PyAV releases the GIL while FFmpeg decodes and converts); a request inside one GOP is one
    segment, with frame threads when dense and slice threads when it seeks;
  * within a segment, dense requests are one sequential pass converting only the wanted frames;
    sparse requests seek, for each wanted frame whose GOP lies ahead of the decoder, to the
    keyframe before it and decode forward.
A large downscale without a crop happens in libswscale together with the YUV→RGB conversion (one
pass, no full-size RGB frame); everything else goes through `ops.resize_crop`, so for those sizes
PyAV and torchcodec return identical pixels.
"""
from __future__ import annotations

import bisect

from medclaw.kernels.decoders.base import (
    DECODER_RESIZE_MAX_FRACTION, Decoder, DecodeJob, is_dense, run_segments, split_at_keyframes,
)

_SWS_INTERPOLATION = {"bilinear": "BILINEAR", "bicubic": "BICUBIC"}


class PyAVDecoder(Decoder):
    name = "pyav"

    @staticmethod
    def _scan(container, stream) -> tuple[list[int], list[int]]:
        """(sorted frame pts, indices of keyframes) from the packets alone."""
        pts_key = []
        for packet in container.demux(stream):
            if packet.pts is not None and packet.size > 0:
                pts_key.append((packet.pts, bool(packet.is_keyframe)))
        pts_key.sort()
        return [p for p, _ in pts_key], [i for i, (_, k) in enumerate(pts_key) if k]

    def decode(self, job: DecodeJob):
        import av
        import numpy as np
        import torch

        out = self._output(job)                                           # (T, H, W, 3)
        if not job.indices:
            return out
        try:
            with av.open(job.path) as container:
                stream = container.streams.video[0]
                src_w, src_h = stream.codec_context.width, stream.codec_context.height
                pts_list, keyframes = self._scan(container, stream)
        except Exception as err:
            raise job.corrupt(job.indices[0], err) from err
        job.check_length(len(pts_list))
        job.src_width, job.src_height = src_w, src_h
        dense = is_dense(job.indices, max(1, len(pts_list) // max(len(keyframes), 1)))
        segments = split_at_keyframes(job.indices, keyframes, job.num_threads)
        if len(segments) > 1:
            thread_type, thread_count = "SLICE", 1
        else:
            thread_type, thread_count = ("AUTO" if dense else "SLICE"), job.num_threads
        pts_to_index = {p: i for i, p in enumerate(pts_list)}
        chunk_size = len(next(job.chunks())[1])
        small = job.width * job.height <= DECODER_RESIZE_MAX_FRACTION * src_w * src_h
        scale = small and job.crop_px is None and job.rotation % 360 == 0
        sws = _SWS_INTERPOLATION[job.interpolation]

        def convert(frame):
            if scale:
                frame = frame.reformat(width=job.width, height=job.height, format="rgb24",
                                       interpolation=sws)
            return frame.to_ndarray(format="rgb24")                       # (h, w, 3)

        def flush(buf, position):
            chunk = torch.from_numpy(np.stack(buf))                       # (n, h, w, 3)
            if scale:
                out[position:position + len(buf)] = chunk.to(out.device)
            else:
                self._put(out, position, chunk, job)

        def decode_segment(lo: int, hi: int) -> None:
            try:
                container = av.open(job.path)
            except Exception as err:
                raise job.corrupt(job.indices[lo], err) from err
            with container:
                stream = container.streams.video[0]
                stream.thread_type, stream.thread_count = thread_type, thread_count
                wanted = job.indices[lo:hi]
                buf, position = [], lo
                for slot, frame in self._iterate(container, stream, job, wanted, pts_list,
                                                 keyframes, pts_to_index, dense):
                    buf.append(convert(frame))
                    if len(buf) == chunk_size or slot == len(wanted) - 1:
                        job.check_cancelled()
                        flush(buf, position)
                        position += len(buf)
                        buf = []
                if position != hi:
                    raise job.corrupt(job.indices[position], "stream ended before this frame")

        run_segments(job, segments, decode_segment)
        return out

    @staticmethod
    def _decode_from(container, stream, start_pts, pts_to_index, wanted_set):
        """Decoded frames from the keyframe at or before `start_pts` on.

        Packets of frames nobody asked for are sent with skip_frame=NONREF: if no other frame
        references them (x264's non-reference B-frames, ~1/3 of the frames here) FFmpeg does not
        decode them at all — the one way to decode a dense request faster than decoding every
        frame. Wanted frames are always decoded (skip_frame=DEFAULT on their packets).
        """
        ctx = stream.codec_context
        container.seek(start_pts, stream=stream, backward=True, any_frame=False)
        for packet in container.demux(stream):
            index = pts_to_index.get(packet.pts)
            ctx.skip_frame = "NONREF" if index is not None and index not in wanted_set \
                else "DEFAULT"
            yield from ctx.decode(packet)

    def _iterate(self, container, stream, job, wanted, pts_list, keyframes, pts_to_index, dense):
        """Yield (slot, av.VideoFrame) for each index of `wanted`, in order; stop at end of
        stream."""
        wanted_set = set(wanted)
        slot = 0
        frames = self._decode_from(container, stream, pts_list[wanted[0]], pts_to_index,
                                   wanted_set)
        while slot < len(wanted):
            target = wanted[slot]
            try:
                frame = next(frames)
            except StopIteration:
                return                         # the caller reports the first missing frame
            except Exception as err:           # av.error.InvalidDataError and friends
                raise job.corrupt(target, err) from err
            index = pts_to_index.get(frame.pts)
            if index is None or index < target:
                continue
            if index > target:
                raise job.corrupt(target, "frame missing from the decoded stream")
            yield slot, frame
            slot += 1
            if slot < len(wanted) and not dense:
                # Seek when the next target's keyframe lies beyond the frame we stand on.
                nxt = wanted[slot]
                key = keyframes[max(bisect.bisect_right(keyframes, nxt) - 1, 0)] if keyframes else 0
                if key > index:
                    frames.close()
                    frames = self._decode_from(container, stream, pts_list[nxt], pts_to_index,
                                               wanted_set)
