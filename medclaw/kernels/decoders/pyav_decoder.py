"""PyAV decoder (CPU): frames found by their pts, from the video's index; the safe path.

Frame i is the frame whose pts is `index.pts[i]` (kernels.index). A decoded frame is identified by
the pts FFmpeg puts on it, never by counting output frames or trusting where a seek landed:
  * `iter_frames` seeks to the keyframe that opens the target's GOP (from the index) and decodes
    forward; if the seek landed past the target (MPEG-TS and other containers seek by byte
    estimates) it seeks one keyframe further back, then from the start;
  * a sparse request seeks again when the next target's GOP lies ahead of the decoder; a dense one
    decodes straight through;
  * streams without timestamps (raw .h264/.hevc) cannot seek: they are decoded from the start and
    frames are counted, which is how FFmpeg itself numbers them.
A request spanning several GOPs is cut at keyframes into `job.num_threads` segments, each decoded
by its own single-threaded codec context in its own thread (`base.split_at_keyframes`; PyAV
releases the GIL while FFmpeg decodes and converts).
A large downscale without a crop happens in libswscale, before any RGB frame exists: the decoded
YUV frame is scaled to the output size, then converted to RGB at that size (half the CPU of
scaling and converting in one swscale pass, which filters full-resolution chroma for every output
pixel; closer to `ops.resize_crop` of the full RGB frame too), written straight into the output;
everything else goes through `ops.resize_crop`, so for those sizes PyAV and torchcodec return
identical pixels.
Opening: FFmpeg's stream analysis on open (`avformat_find_stream_info`) decodes the first frames
to learn the codec's reorder depth — at 4K a keyframe costs as much as ~30 P-frames — which the
probe already learned; `open_input` skips that decode when the index carries the depth and gives
the codec context that depth itself (what a plain open would have given it).
Codecs that can decode at reduced resolution (`LOWRES_CODECS`: MJPEG, MPEG-1/2, MPEG-4 Part 2 —
FFmpeg's `lowres`, 1/2, 1/4 or 1/8 of each side) do so when the output needs at most that many
pixels: a 4K MJPEG frame wanted at 644×364 is decoded at 960×540, never at full size.
"""
from __future__ import annotations

from medclaw.kernels.decoders.base import (
    DECODER_RESIZE_MAX_FRACTION, Decoder, DecodeJob, DecodeResult, is_dense, run_segments,
    split_at_keyframes,
)

_SWS_INTERPOLATION = {"bilinear": "BILINEAR", "bicubic": "BICUBIC"}
SKIP_NONREF_CODECS = ("h264", "hevc")
LOWRES_CODECS = ("mjpeg", "mpeg1video", "mpeg2video", "mpeg4")
MAX_LOWRES = 3


def lowres_for(codec: str, src_w: int, src_h: int, width: int, height: int) -> int:
    """The largest FFmpeg `lowres` level k (sides / 2^k) that still covers width × height."""
    if codec not in LOWRES_CODECS:
        return 0
    k = 0
    while k < MAX_LOWRES and (src_w >> (k + 1)) >= width and (src_h >> (k + 1)) >= height:
        k += 1
    return k


def open_input(path, index=None):
    """`av.open(path)` for decoding a probed video (see module docstring): without FFmpeg's
    analysis decode when `index.meta` holds the probe's reorder depth. Raises what av.open
    raises."""
    import av

    depth = index.meta.get("reorder_depth") if index is not None and index.has_pts else None
    if depth is None:
        return av.open(str(path))
    # "skip_frame" reaches only the analysis' own decoders, not the stream's codec context.
    container = av.open(str(path), options={"skip_frame": "all"})
    container.streams.video[0].codec_context.reorder_depth = int(depth)
    return container


def _converter(scale: bool, width: int, height: int, interpolation: str, threads: int):
    """frame -> uint8 (h, w, 3): RGB at the frame's size, or (scale) scaled to width x height in
    the frame's own pixel format first, then converted at the small size (module docstring).
    One per thread: a reformatter keeps its swscale context between frames."""
    if not scale:
        return lambda frame: frame.to_ndarray(format="rgb24")
    from av.video.reformatter import VideoReformatter

    shrink, to_rgb = VideoReformatter(), VideoReformatter()

    def convert(frame):
        small = shrink.reformat(frame, width=width, height=height, interpolation=interpolation,
                                threads=threads)
        return to_rgb.reformat(small, format="rgb24", interpolation=interpolation,
                               threads=threads).to_ndarray()
    return convert


def decode_packet(ctx, packet) -> list:
    """`ctx.decode(packet)`, except that a packet the demuxer flagged as corrupt (the partial last
    packet of a cut file) which FFmpeg rejects yields no frame, as in the ffmpeg command line;
    any other decode error is raised."""
    import av

    try:
        return ctx.decode(packet)
    except av.error.FFmpegError:
        if packet.is_corrupt:
            return []
        raise


class FrameMissing(Exception):
    """The stream went past a wanted frame's pts without showing it."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index


def _seek(container, stream, index, key: int) -> None:
    container.seek(int(index.pts[key]), stream=stream, backward=True, any_frame=False)


def iter_frames(container, stream, index, wanted, *, dense: bool, check_cancelled=None,
                skip_unwanted: bool = True):
    """Yield (frame index, av.VideoFrame) for every index of sorted `wanted`, in order.

    Raises `FrameMissing` at the first wanted frame the stream does not deliver; lets FFmpeg's
    decode errors through (the caller names the frame).
    """
    import numpy as np

    if not wanted:
        return
    ctx = stream.codec_context
    wanted_set = set(int(i) for i in wanted)
    # Not decoding unwanted non-reference frames is safe where "non-reference" is a property of
    # the packet (H.264, HEVC); AV1 packets may carry hidden frames that later ones show.
    skip_unwanted = skip_unwanted and index.codec in SKIP_NONREF_CODECS
    if not index.has_pts:
        # No timestamps: frames are numbered in output order from the start of the stream.
        position, slot = -1, 0
        for packet in container.demux(stream):
            for frame in decode_packet(ctx, packet):
                position += 1
                if position == wanted[slot]:
                    yield position, frame
                    slot += 1
                    if slot == len(wanted):
                        return
            if check_cancelled:
                check_cancelled()
        raise FrameMissing(wanted[slot], "stream ended before this frame")

    slot = 0
    keys = list(index.keyframes) or [0]
    while slot < len(wanted):
        target = int(wanted[slot])
        # Seek to the keyframe opening the target's GOP; go one keyframe further back when the
        # seek lands after the target (or at the end), and finally to the very start.
        key_pos = max(int(np.searchsorted(keys, target, "right")) - 1, 0)
        for attempt in range(3):
            if attempt < 2 and key_pos - attempt >= 0:
                _seek(container, stream, index, int(keys[key_pos - attempt]))
            else:
                container.seek(0)                 # the start of the file
            state = {"slot": slot, "first": None}
            status = yield from _decode_run(container, stream, index, wanted, wanted_set, state,
                                            dense=dense, late_ok=attempt == 2,
                                            check_cancelled=check_cancelled,
                                            skip_unwanted=skip_unwanted)
            slot = state["slot"]
            if status == "late" or (status == "ended" and state["first"] is None):
                continue
            break
        else:
            raise FrameMissing(target, "no seek reached this frame")
        if status == "ended":
            raise FrameMissing(int(wanted[slot]), "stream ended before this frame")
        if status == "done":
            return


def _decode_run(container, stream, index, wanted, wanted_set, state, *, dense, late_ok,
                check_cancelled, skip_unwanted):
    """Decode forward from where the last seek put the demuxer, yielding wanted frames.
    Returns "done" (all yielded), "resume" (seek for the next target), "late" (the seek landed
    past the target) or "ended" (end of stream)."""
    import numpy as np

    ctx = stream.codec_context
    pts = index.pts
    target = int(wanted[state["slot"]])
    for packet in container.demux(stream):
        if skip_unwanted:
            p = packet.pts
            at = int(np.searchsorted(pts, p)) if p is not None else -1
            unwanted = 0 <= at < len(pts) and pts[at] == p and at not in wanted_set
            ctx.skip_frame = "NONREF" if unwanted else "DEFAULT"
        for frame in decode_packet(ctx, packet):
            if frame.pts is None:
                continue
            at = int(np.searchsorted(pts, frame.pts))
            if at >= len(pts) or pts[at] != frame.pts:
                continue                          # a frame the index does not hold (dropped)
            if state["first"] is None:
                state["first"] = at
                if at > target and not late_ok:
                    return "late"
            if at < target:
                continue
            if at > target:
                raise FrameMissing(target, "frame missing from the decoded stream")
            yield at, frame
            state["slot"] += 1
            if state["slot"] == len(wanted):
                return "done"
            target = int(wanted[state["slot"]])
            if not dense and index.keyframe_before(target) > at:
                return "resume"                   # the next target's GOP lies ahead: seek
        if check_cancelled:
            check_cancelled()
    return "ended"


class PyAVDecoder(Decoder):
    name = "pyav"

    def decode(self, job: DecodeJob) -> DecodeResult:
        import av
        import numpy as np
        import torch

        out = self._output(job)                                           # (T, H, W, 3)
        got_pts: list = [None] * len(job.indices)
        if not job.indices:
            return DecodeResult(out, got_pts)
        index = job.index
        job.check_length(index.num_frames)
        meta = index.meta
        src_w, src_h = meta.get("width", job.src_width), meta.get("height", job.src_height)
        job.src_width, job.src_height = src_w, src_h
        gop = max(1, index.num_frames // max(len(index.keyframes), 1))
        dense = is_dense(job.indices, gop) or not index.has_pts
        keyframes = list(index.keyframes) if index.has_pts else None
        segments = split_at_keyframes(job.indices, keyframes, job.num_threads)
        if len(segments) > 1:
            thread_type, thread_count = "SLICE", 1
        else:
            # No frame threads on a damaged file: they lose the frames in flight where a packet
            # fails, and the probe found its decodable frames with one thread (verify._open).
            threaded = dense and not meta.get("damage")
            thread_type, thread_count = ("AUTO" if threaded else "SLICE"), job.num_threads
        chunk_size = len(next(job.chunks())[1])
        small = job.width * job.height <= DECODER_RESIZE_MAX_FRACTION * src_w * src_h
        scale = small and job.crop_px is None and job.rotation % 360 == 0
        lowres = lowres_for(index.codec, src_w, src_h, job.width, job.height) if scale else 0
        sws = _SWS_INTERPOLATION[job.interpolation]
        # swscale threads only where the decode itself leaves cores idle (one segment).
        sws_threads = 1 if len(segments) > 1 else 0
        # Scaled frames are final: written straight into the output (no chunk to stack) on CPU.
        direct = out.numpy() if scale and out.device.type == "cpu" else None

        def flush(buf, position):
            chunk = torch.from_numpy(np.stack(buf))                       # (n, h, w, 3)
            if scale:
                out[position:position + len(buf)] = chunk.to(out.device)
            else:
                self._put(out, position, chunk, job)

        def decode_segment(lo: int, hi: int) -> None:
            try:
                container = open_input(job.path, index)
            except Exception as err:
                raise job.corrupt(job.indices[lo], err) from err
            convert = _converter(scale, job.width, job.height, sws, sws_threads)
            with container:
                stream = container.streams.video[0]
                stream.thread_type, stream.thread_count = thread_type, thread_count
                if lowres:
                    stream.codec_context.options = {"lowres": str(lowres)}
                wanted = job.indices[lo:hi]
                buf, position, current = [], lo, wanted[0]
                try:
                    for at, frame in iter_frames(container, stream, index, wanted, dense=dense,
                                                 check_cancelled=job.check_cancelled):
                        current = at
                        got_pts[position + len(buf)] = (
                            int(frame.pts) if index.has_pts else int(index.pts[at]))
                        if direct is not None:
                            direct[position] = convert(frame)
                            position += 1
                            if (position - lo) % chunk_size == 0:
                                job.check_cancelled()
                            continue
                        buf.append(convert(frame))
                        if len(buf) == chunk_size or position + len(buf) == hi:
                            job.check_cancelled()
                            flush(buf, position)
                            position += len(buf)
                            buf = []
                except FrameMissing as err:
                    raise job.corrupt(err.index, str(err)) from None
                except (av.error.FFmpegError, MemoryError, OSError) as err:
                    following = [i for i in wanted if i > current] or [current]
                    raise job.corrupt(following[0] if position > lo else wanted[0], err) from err

        run_segments(job, segments, decode_segment)
        return DecodeResult(out, got_pts)
