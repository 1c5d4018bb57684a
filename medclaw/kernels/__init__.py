"""Video kernels: probe, per-video decode index, token-budgeted frame planner, batched decoders
with a frame-identity check, resize/crop ops, frame cache.

Contract used by the tools (see each module's docstring for details):
    probe_video(path, *, max_pixels=None, assumed_fps=None) -> VideoInfo      kernels.probe
        (builds the pts/keyframe index once, test-decodes, refuses what no decoder can read)
    index_for(info) -> VideoIndex (every frame's pts, keyframes)              kernels.index
    plan_frames(info, start_s, end_s, *, fps, max_frames, min_pixels, max_pixels,
                max_visual_tokens) -> FramePlan                               kernels.planner
    frame_at_time(info, t) / frame_time_s(info, i)   time <-> frame by pts    kernels.planner
    FrameSource(device="cpu", decoder="auto", cache_mb=...)                   kernels.frames
        .get(info, plan, crop_box=None) -> uint8 array (T, H, W, 3), every frame's pts checked
        await .aget(...), .close()
"""
