"""Video kernels: probe, token-budgeted frame planner, batched decoders, resize/crop ops, frame
cache.

Contract used by the tools (see each module's docstring for details):
    probe_video(path) -> VideoInfo                                  kernels.probe
    plan_frames(info, start_s, end_s, *, fps, max_frames, min_pixels, max_pixels,
                max_visual_tokens) -> FramePlan                     kernels.planner
    FrameSource(device="cpu", decoder="auto", cache_mb=...)         kernels.frames
        .get(info, plan, crop_box=None) -> uint8 array (T, H, W, 3)
"""
