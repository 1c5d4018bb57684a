"""Frame identity: is each decoded frame the frame that was planned? And can the file be decoded?

    mismatches(index, indices, pts) -> list[int]     positions whose pts is not index.pts[i]
    test_decode(path, index, container=None)         the probe's bounded decodability test
    reference_decode(path, index, width, height)     every frame, decoded sequentially (slow,
                                                     the ground truth for tests and benchmarks)

A frame is identified by its presentation timestamp, never by its position in a decoder's output:
libraries that seek by index (torchcodec on MPEG-TS, decord on HEVC) return other frames than
asked, silently. `FrameSource` calls `mismatches` on every decode.

`test_decode` (done once per file by `probe_video`; the verdict is stored with the index):
  * decodes the keyframe that opens the GOP in the middle of the video (a keyframe decodes on its
    own: one frame's work, even at 4K), and
  * for containers that carry no index of their own (MPEG-TS, raw elementary streams — anything
    but MP4/MOV, Matroska/WebM and AVI, whose truncation the probe already sees in the header),
    the last GOP, from its keyframe to the end of the stream.
The end is also tested when the probe found the header promising more than the file holds
(`index.meta["damage"]`: a faststart MP4 or Matroska file cut short).
Frames at the end that do not decode (a truncated MPEG-TS cut inside its last packets, a cut
MP4's last partial packet) are dropped from the index, so the video is served up to its last
decodable frame instead of failing later; `index.meta["damage"]` then says what is served.
Packets the demuxer flags as corrupt (cut off) and FFmpeg rejects are skipped, here, in
`reference_decode` and in the PyAV decoder alike, as the ffmpeg command line does; any other
decode error ends the tested region there. The end is decoded with one thread, as damaged files
are served (frame threads lose the frames in flight where a packet fails). If the middle
keyframe or nothing at the end decodes, the file is refused with `CorruptVideoError` — before
any engine starts. Work is bounded: at most 2 × `MAX_TEST_FRAMES`
frames are decoded at the end (a GOP longer than that is not tested).
"""
from __future__ import annotations

import contextlib

from medclaw.kernels.errors import CorruptVideoError

MAX_TEST_FRAMES = 600
# Containers with their own frame index: a truncated file shows in the header (probe checks it).
INDEXED_CONTAINERS = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi")


def mismatches(index, indices, pts) -> list[int]:
    """Positions p where pts[p] (stream ticks, or None) is not the pts of frame indices[p]."""
    bad = []
    for slot, (i, got) in enumerate(zip(indices, pts)):
        if got is None or int(got) != int(index.pts[int(i)]):
            bad.append(slot)
    return bad


def _open(path, frame_threads: bool = True):
    """The file and its video stream. Without `frame_threads`, one decoding thread: FFmpeg's
    frame threads lose the frames in flight when a packet fails (a cut file's end), one thread
    loses none — the decoders decode damaged files that way too (`PyAVDecoder`)."""
    import av

    container = av.open(str(path))
    stream = container.streams.video[0]
    if frame_threads:
        stream.thread_type = "AUTO"
    else:
        stream.thread_type, stream.thread_count = "SLICE", 1
    return container, stream


def _decoded_pts(path, index, start: int) -> tuple[set, str | None]:
    """pts of the frames that decode from frame `start`'s keyframe to the end, as the decoders
    decode them (`pyav_decoder.decode_packet`: a corrupt-flagged packet FFmpeg rejects is
    skipped; any other decode error ends the stream there), and the last error."""
    import av

    container, stream = _open(path, frame_threads=False)
    seen, error, count = set(), None, 0
    with container:
        if index.has_pts:
            # One GOP earlier than needed: containers that seek by byte estimates (MPEG-TS) may
            # land a little late; the caller checks that the start of its region was reached.
            key = index.keyframe_before(max(index.keyframe_before(start) - 1, 0))
            container.seek(int(index.pts[key]), stream=stream, backward=True, any_frame=False)
        ctx = stream.codec_context
        position = -1
        for packet in container.demux(stream):
            try:
                frames = ctx.decode(packet)
            except av.error.FFmpegError as err:
                error = err.strerror
                if packet.is_corrupt:
                    continue              # skipped by the decoders too (decode_packet)
                break                     # where the decoders stop: nothing after it is served
            for frame in frames:
                position += 1
                seen.add(int(frame.pts) if index.has_pts and frame.pts is not None else position)
                count += 1
            if count > 2 * MAX_TEST_FRAMES + (0 if index.has_pts else index.num_frames):
                break
    return seen, error


def test_decode(path, index, container=None) -> None:
    """Check that the middle and the end of the video decode; trim undecodable trailing frames
    from `index` (in place). Raises CorruptVideoError when a region does not decode.
    `container`: the caller's open PyAV container of `path` (the probe's), used for the middle
    keyframe instead of opening the file again; it is left open."""
    import numpy as np

    n = index.num_frames
    if n > 2 and index.has_pts:
        middle = index.keyframe_before(n // 2)
        from medclaw.kernels.decoders.pyav_decoder import FrameMissing, iter_frames
        import av

        own = container is None
        try:
            if own:
                container, _ = _open(path)
            with container if own else contextlib.nullcontext():
                for _ in iter_frames(container, container.streams.video[0], index, [middle],
                                     dense=True):
                    pass
        except (FrameMissing, av.error.FFmpegError) as err:
            raise CorruptVideoError(
                f"{path}: cannot decode frame {middle} ({index.time_s(middle):.2f} s) in the "
                f"middle of the video: {str(err)[:120]}") from None
    if index.has_pts and index.container in INDEXED_CONTAINERS and not index.meta.get("damage"):
        return
    last_key = index.keyframe_before(n - 1) if index.has_pts else 0
    if index.has_pts and n - index.keyframe_before(max(last_key - 1, 0)) > 2 * MAX_TEST_FRAMES:
        return                                   # an endless GOP: too long to test its end
    seen, error = _decoded_pts(path, index, last_key)
    if error and not index.meta.get("damage"):
        index.meta = {**index.meta, "damage": f"damaged end ({error})"}
    if not index.has_pts:
        decoded = len(seen)
        if decoded == 0:
            raise CorruptVideoError(f"{path}: no frame of the stream decodes ({error})")
        if decoded < n:
            index.pts = index.pts[:decoded]
            index.keyframes = index.keyframes[index.keyframes < decoded]
            index.end_pts = decoded
            _note_trim(index, n)
        return
    tail = index.pts[last_key:]
    if seen and min(seen) > int(tail[0]):
        return                                   # the seek landed inside the GOP: no verdict
    ok = np.isin(tail, np.fromiter(seen, dtype=np.int64, count=len(seen)))
    if ok.all():
        if index.meta.get("damage"):
            _note_trim(index, n)
        return
    if not ok.any():
        raise CorruptVideoError(f"{path}: the end of the video does not decode (frames "
                                f"{last_key}-{n - 1}, from {index.time_s(last_key):.2f} s)"
                                + (f": {error}" if error else ""))
    # Keep the decodable frames up to the last one that decodes: a truncated end.
    keep = np.concatenate([np.ones(last_key, dtype=bool), ok])
    keep[last_key + int(np.flatnonzero(ok)[-1]) + 1:] = False
    step = int(np.median(np.diff(index.pts))) if n > 1 else 1
    old_to_new = np.cumsum(keep) - 1
    index.keyframes = old_to_new[index.keyframes[keep[index.keyframes]]]
    index.pts = index.pts[keep]
    index.end_pts = int(index.pts[-1]) + max(step, 1)
    _note_trim(index, n)


def _note_trim(index, before: int) -> None:
    """Say in `index.meta["damage"]` what is served of a damaged file (`before` frames were in
    it); `dropped_frames` counts the frames that did not decode."""
    dropped = before - index.num_frames
    what = index.meta.get("damage") or "damaged end"
    if dropped:
        what += (f"; the last {dropped} frames do not decode" if dropped > 1
                 else "; the last frame does not decode")
    index.meta = {**index.meta, "dropped_frames": int(dropped),
                  "damage": f"{what}; serving the {index.num_frames} frames that decode "
                            f"(0-{index.duration_s:.2f} s)"}


def reference_decode(path, index, width: int | None = None, height: int | None = None,
                     keep=None):
    """(frames uint8 (N, H, W, 3), pts list): the frames of the stream, decoded sequentially
    with PyAV from the start, in output order — no seeking, nothing trusted but FFmpeg. Frames
    are rotated to display orientation. With `keep` (sorted positions), only those frames are
    kept (memory stays bounded on long videos). With a size, frames are resized by swscale."""
    import numpy as np

    from medclaw.kernels.decoders.pyav_decoder import decode_packet

    wanted = None if keep is None else set(int(k) for k in keep)
    container, stream = _open(path, frame_threads=not index.meta.get("damage"))
    frames, pts = [], []
    position = -1
    with container:
        for packet in container.demux(stream):
            for frame in decode_packet(stream.codec_context, packet):
                position += 1
                if wanted is not None and position not in wanted:
                    continue
                if width and height:
                    frame = frame.reformat(width=width, height=height, format="rgb24")
                frames.append(frame.to_ndarray(format="rgb24"))
                pts.append(int(frame.pts) if index.has_pts and frame.pts is not None
                           else position)
    rotation = index.meta.get("rotation", 0)
    out = np.stack(frames) if frames else np.zeros((0, 1, 1, 3), np.uint8)
    if rotation % 360:
        out = np.ascontiguousarray(np.rot90(out, k=rotation // 90, axes=(1, 2)))
    return out, pts
