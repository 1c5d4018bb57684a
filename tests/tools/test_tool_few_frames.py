"""Every video tool works on one- and few-frame videos and on variable-rate video, with real
decoding (scripted sub-agents): Qwen's temporal patch is filled by repeating the frame, and the
evidence is timed by each frame's real pts."""
from __future__ import annotations

import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.models.spec import ModelSpec
from medclaw.synth.barcode import read_frame_index, read_frame_indices
from medclaw.synth.formats import make_format, missing_encoder
from medclaw.tools.base import ToolContext
from medclaw.tools.registry import default_registry

P = 28 * 28
REPLY = "[00:00-00:01] a frame\nWINDOW: [00:00-00:01]"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("few")


def _ctx(path, replies=4):
    from medclaw.kernels.frames import FrameSource
    from medclaw.kernels.probe import probe_video

    specs = {"video_expert": ModelSpec(name="vx", path="/models/vx", fps=2.0, max_frames=64,
                                       min_pixels=4 * P, max_pixels=48 * P, total_pixels=256 * P,
                                       max_model_len=32768),
             "frame_verifier": ModelSpec(name="fv", path="/models/fv", min_pixels=4 * P,
                                         max_pixels=64 * P)}
    backends = {"video_expert": ScriptedBackend([REPLY] * replies, model_name="vx"),
                "frame_verifier": ScriptedBackend(["seen"] * replies, model_name="fv")}
    return ToolContext(video=probe_video(path), question="q", backends=backends, specs=specs,
                       frames=FrameSource())


def _video(name, folder):
    why = missing_encoder(name)
    if why:
        pytest.skip(why)
    return make_format(name, folder)


@pytest.mark.parametrize("tool,args", [
    ("view_full_video", {"query": "what happens?"}),
    ("crop_video", {"start_s": 0.0, "end_s": 0.04, "query": "what happens?"}),
    ("select_video_frame", {"time_s": 0.0, "query": "tools?"}),
    ("crop_video_frame", {"time_s": 0.02, "x1": 0.0, "y1": 0.0, "x2": 1.0, "y2": 0.5,
                          "query": "tools?"}),
])
async def test_one_frame_video_works_with_every_tool(folder, tool, args):
    ctx = _ctx(_video("one", folder))
    assert ctx.video.num_frames == 1
    obs = await default_registry().run(ctx, tool, args)
    assert obs.error is None, obs.error
    assert obs.frames and all(ref.frame_index == 0 and ref.timestamp_s == 0.0
                              for ref in obs.frames)
    sent = [m for b in ctx.backends.values() for r in b.requests for m in r.media]
    for item in sent:
        if item.kind == "video":
            assert len(item.frames) % 2 == 0 and read_frame_indices(item.frames) == \
                [0] * len(item.frames)
        else:
            assert read_frame_index(item.frames) == 0


async def test_frame_tools_on_vfr_video_are_timed_by_pts(folder):
    """10 / 30 / 5 fps segments: the frame at 5.0 s is frame 85 (4.0 s + 5 frames at 5 fps),
    not frame 62 (5.0 s × 12.5 mean fps)."""
    ctx = _ctx(_video("vfr", folder))
    obs = await default_registry().run(ctx, "select_video_frame", {"time_s": 5.0, "query": "x"})
    assert obs.error is None, obs.error
    (ref,) = obs.frames
    assert ref.frame_index == 85 and ref.timestamp_s == pytest.approx(5.0)
    (request,) = ctx.backends["frame_verifier"].requests
    assert read_frame_index(request.media[0].frames) == 85
    clip = await default_registry().run(ctx, "crop_video",
                                        {"start_s": 3.0, "end_s": 6.0, "query": "x"})
    assert clip.error is None, clip.error
    assert all(3.0 - 1e-6 <= r.timestamp_s <= 6.0 + 1e-6 for r in clip.frames)
    gaps = [b.timestamp_s - a.timestamp_s for a, b in zip(clip.frames, clip.frames[1:])]
    assert max(gaps) - min(gaps) < 0.25               # sampled by time across the rate change
