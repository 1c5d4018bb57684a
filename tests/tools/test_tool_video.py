"""The video tools on a REAL synthetic video with REAL decoding; only the VLM replies are scripted.

Frame accuracy is checked with the barcode every synthetic frame carries: the pixels the scripted
model received must be exactly the frames the observation's FrameRefs name.
"""
from __future__ import annotations

import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.synth.barcode import read_frame_index, read_frame_indices
from medclaw.models.spec import ModelSpec
from medclaw.tools.base import ToolContext
from medclaw.tools.registry import default_registry
from medclaw.tools.timeline import Window
from medclaw.tools.view_full_video import MIN_PAD_S, widen

P = 28 * 28
STAGE1 = ("[00:00-00:10] preparation of the field\n"
          "[00:10-00:25] dissection of the hepatocystic triangle\n"
          "[00:25-00:40] clipping and cutting\n"
          "[00:40-01:00] closure\n"
          "WINDOW: [00:20-00:30]")
STAGE2 = "WINDOW: [00:22.0-00:26.5]\nThe clip applier closes a clip on the vessel."


@pytest.fixture(scope="module")
def video(synth_video):
    from medclaw.kernels.probe import probe_video

    return probe_video(synth_video.path)


@pytest.fixture(scope="module")
def frame_source():
    from medclaw.kernels.frames import FrameSource

    return FrameSource()


def specs(with_verifier: bool = True) -> dict:
    # Small budgets keep decoding cheap; total_pixels makes the whole-video pass low resolution.
    out = {"video_expert": ModelSpec(name="vx", path="/models/vx", fps=1.0, max_frames=64,
                                     min_pixels=4 * P, max_pixels=48 * P, total_pixels=256 * P,
                                     max_model_len=32768)}
    if with_verifier:
        out["frame_verifier"] = ModelSpec(name="fv", path="/models/fv", min_pixels=4 * P,
                                          max_pixels=64 * P)
    return out


@pytest.fixture
def make_ctx(video, frame_source):
    def make(video_script=(), frame_script=(), budget=10 ** 9, with_verifier=True):
        backends = {"video_expert": ScriptedBackend(video_script, model_name="vx")}
        if with_verifier:
            backends["frame_verifier"] = ScriptedBackend(frame_script, model_name="fv")
        return ToolContext(video=video, question="q", backends=backends,
                           specs=specs(with_verifier), frames=frame_source,
                           visual_token_budget=budget)
    return make


def media_of(request, kind):
    return [m for m in request.media if m.kind == kind]


def assert_frames_match(obs, requests):
    """Every FrameRef names exactly the decoded frame the model was sent (barcode check)."""
    sent = []
    for request in requests:
        for item in request.media:
            if item.uuid in {s[0] for s in sent}:
                continue             # stage 2 re-sends the stage-1 clip (same uuid, same pixels)
            frames = item.frames if item.kind == "video" else item.frames[None]
            sent.append((item.uuid, frames))
    decoded = [i for _, frames in sent for i in read_frame_indices(frames)]
    assert decoded == [ref.frame_index for ref in obs.frames]
    shapes = [(f.shape[1], f.shape[0]) for _, frames in sent for f in frames]
    assert shapes == [(ref.width, ref.height) for ref in obs.frames]


# --- view_full_video ---------------------------------------------------------------------------
async def test_view_full_video_two_stages(make_ctx, video):
    ctx = make_ctx([STAGE1, STAGE2])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "when is the vessel clipped?"})
    assert obs.error is None, obs.error
    backend = ctx.backends["video_expert"]
    stage1, stage2 = backend.requests
    # stage-1 layout: system → video → instructions + query LAST
    assert [m["role"] for m in stage1.messages] == ["system", "user"]
    parts = stage1.messages[1]["content"]
    assert [p["type"] for p in parts] == ["video", "text"]
    assert parts[1]["text"].endswith("Query: when is the vessel clipped?")
    # stage 2 EXTENDS stage 1: same messages verbatim, then the stage-1 reply, then the window
    assert stage2.messages[:2] == stage1.messages
    assert stage2.messages[2] == {"role": "assistant", "content": [{"type": "text", "text": STAGE1}]}
    assert [p["type"] for p in stage2.messages[3]["content"]] == ["video", "text"]
    whole_uuid = parts[0]["uuid"]
    assert {m.uuid for m in stage2.media} >= {whole_uuid}
    whole, window = media_of(stage2, "video")
    assert whole.uuid == whole_uuid and window.uuid != whole_uuid
    # windows: candidate 20-30 widened by max(25 %, MIN_PAD_S) → 17-33; refined 22-26.5
    assert obs.data["candidate_window"] == [20.0, 30.0]
    search = widen(Window(20.0, 30.0), video.duration_s)
    assert search == Window(20.0 - MIN_PAD_S, 30.0 + MIN_PAD_S)
    assert obs.data["search_window"][0] == pytest.approx(search.start_s, abs=0.05)
    assert obs.data["search_window"][1] == pytest.approx(search.end_s, abs=0.05)
    assert obs.data["refined_window"] == [22.0, 26.5] and obs.data["window_source"] == "refined"
    assert [e["text"] for e in obs.data["timeline"]][:2] == [
        "preparation of the field", "dissection of the hepatocystic triangle"]
    assert "Refined window: [22.0-26.5 s]" in obs.text and "clip applier" in obs.text
    # whole video at low resolution, the window at higher resolution, all frames in range
    assert window.frames.shape[1] * window.frames.shape[2] > whole.frames.shape[1] * whole.frames.shape[2]
    assert whole.frame_indices[0] == 0 and whole.frame_indices[-1] >= video.num_frames - 26
    assert all(search.start_s - 0.05 <= t <= search.end_s + 0.05 for t in window.timestamps_s)
    assert_frames_match(obs, [stage2])
    # budget: charged exactly the tokens of the two clips
    tokens = sum(len(m.frames) // 2 * (m.frames.shape[1] // 28) * (m.frames.shape[2] // 28)
                 for m in (whole, window))
    assert ctx.visual_tokens_used == tokens
    assert [c.model_name for c in obs.model_calls] == ["vx", "vx"]
    assert obs.data["stage_frames"] == [len(whole.frames), len(window.frames)]


async def test_stage1_prefix_is_identical_across_questions(make_ctx):
    first, second = make_ctx([STAGE1, STAGE2]), make_ctx([STAGE1, STAGE2])
    registry = default_registry()
    await registry.run(first, "view_full_video", {"query": "when is the vessel clipped?"})
    await registry.run(second, "view_full_video", {"query": "is there bleeding?"})
    a = first.backends["video_expert"].requests[0]
    b = second.backends["video_expert"].requests[0]
    assert a.messages[0] == b.messages[0]
    assert a.messages[1]["content"][0] == b.messages[1]["content"][0]      # same media uuid
    text_a, text_b = a.messages[1]["content"][1]["text"], b.messages[1]["content"][1]["text"]
    head = text_a[:text_a.index("Query:")]
    assert text_b.startswith(head) and text_a != text_b


async def test_stage2_clip_relative_answer_is_shifted(make_ctx):
    ctx = make_ctx([STAGE1, "<answer>WINDOW: [00:05-00:09]</answer>"])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    start = obs.data["search_window"][0]
    assert obs.data["refined_window"] == pytest.approx([start + 5.0, start + 9.0])
    assert "read as clip time" in obs.text


async def test_stage2_unreadable_falls_back_to_candidate(make_ctx):
    ctx = make_ctx([STAGE1, "I am not sure what happens here."])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    assert obs.error is None
    assert obs.data["refined_window"] is None
    assert obs.data["window"] == [20.0, 30.0] and obs.data["window_source"] == "candidate"
    assert "not readable" in obs.text and "I am not sure" in obs.text
    assert len(obs.model_calls) == 2


async def test_stage1_without_window_returns_timeline_only(make_ctx):
    stage1 = STAGE1.rsplit("\n", 1)[0] + "\nsome rambling without times"
    ctx = make_ctx([stage1])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    assert obs.error is None
    assert len(ctx.backends["video_expert"].requests) == 1          # no stage 2
    assert obs.data["candidate_window"] is None and obs.data["window"] is None
    assert len(obs.data["timeline"]) == 4
    assert "Candidate window: not given" in obs.text
    assert "some rambling without times" in obs.text
    assert_frames_match(obs, ctx.backends["video_expert"].requests)


async def test_stage1_garbage_is_an_error_observation(make_ctx):
    ctx = make_ctx(["zzzz qqq"])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    assert obs.error is not None and "neither a timeline nor a window" in obs.error
    assert "zzzz qqq" in obs.error
    # the look still happened: its frames and the sub-agent call stay in the trace
    assert len(obs.model_calls) == 1 and obs.frames and ctx.visual_tokens_used > 0
    assert_frames_match(obs, ctx.backends["video_expert"].requests)


async def test_candidate_outside_video_is_clamped(make_ctx, video):
    ctx = make_ctx([STAGE1.replace("WINDOW: [00:20-00:30]", "WINDOW: [00:55-01:30]"), STAGE2])
    obs = await default_registry().run(ctx, "view_full_video", {"query": "closure"})
    assert obs.data["candidate_window"] == [55.0, pytest.approx(video.duration_s)]
    assert obs.data["search_window"][1] <= video.duration_s + 1e-6


async def test_budget_spent_is_an_error_observation(make_ctx):
    ctx = make_ctx([STAGE1, STAGE2], budget=1)
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    assert obs.error is not None and "visual budget is spent" in obs.error
    assert ctx.backends["video_expert"].requests == [] and ctx.visual_tokens_used == 0


async def test_short_budget_plans_fewer_tokens(make_ctx):
    full = make_ctx([STAGE1, STAGE2])
    await default_registry().run(full, "view_full_video", {"query": "clip"})
    budget = full.visual_tokens_used // 3
    short = make_ctx([STAGE1, STAGE2], budget=budget)
    obs = await default_registry().run(short, "view_full_video", {"query": "clip"})
    assert obs.error is None
    assert 0 < short.visual_tokens_used <= budget
    # stage 1 left room for stage 2 (it takes at most STAGE1_SHARE of a binding budget)
    assert len(obs.model_calls) == 2 and obs.data["window_source"] == "refined"
    n_whole = obs.data["stage_frames"][0]
    assert pixels(obs.frames[:n_whole]) < pixels(full_frames(full))
    assert_frames_match(obs, short.backends["video_expert"].requests[-1:])


async def test_budget_for_stage1_only_skips_stage2_plainly(make_ctx, video):
    from medclaw.tools.media import min_useful_tokens

    floor = min_useful_tokens(video, specs()["video_expert"])
    ctx = make_ctx([STAGE1], budget=floor)         # exactly one smallest look
    obs = await default_registry().run(ctx, "view_full_video", {"query": "clip"})
    assert obs.error is None and len(obs.model_calls) == 1
    assert ctx.visual_tokens_used <= floor
    assert "not refined" in obs.text and "visual budget is spent" in obs.text
    assert obs.data["window"] == [20.0, 30.0] and obs.data["window_source"] == "candidate"


def full_frames(ctx):
    """FrameRef-like (width, height) of the whole-video clip the context's backend was sent."""
    whole = ctx.backends["video_expert"].requests[0].media[0]
    return [(whole.frames.shape[2], whole.frames.shape[1])] * len(whole.frames)


def pixels(frames):
    return sum(w * h for w, h in ((f.width, f.height) if hasattr(f, "width") else f for f in frames))


# --- crop_video --------------------------------------------------------------------------------
async def test_crop_video_timeline_in_video_time(make_ctx):
    reply = "[00:00-00:02] clip applier enters\n[00:02-00:04.5] clip closed\nno bleeding"
    ctx = make_ctx([reply])
    obs = await default_registry().run(ctx, "crop_video",
                                       {"start_s": 30.0, "end_s": 36.0, "query": "clips"})
    assert obs.error is None, obs.error
    # the clip reaches the model as its own video (starts at 0): clip times shifted to video time
    assert obs.data["time_basis"] == "clip"
    assert [(e["start_s"], e["end_s"]) for e in obs.data["timeline"]] == [(30.0, 32.0), (32.0, 34.5)]
    assert "[30.0-32.0 s] clip applier enters" in obs.text and "no bleeding" in obs.text
    request = ctx.backends["video_expert"].requests[0]
    assert request.messages[1]["content"][-1]["text"].endswith("Query: clips")
    assert all(30.0 <= ref.timestamp_s <= 36.0 for ref in obs.frames)
    assert_frames_match(obs, [request])
    assert ctx.visual_tokens_used > 0


async def test_crop_video_higher_resolution_than_whole_video(make_ctx):
    ctx = make_ctx(["[00:30-00:36] x", STAGE1, STAGE2])
    registry = default_registry()
    crop = await registry.run(ctx, "crop_video", {"start_s": 30, "end_s": 36, "query": "x"})
    whole = await registry.run(ctx, "view_full_video", {"query": "x"})
    assert crop.frames[0].width * crop.frames[0].height > whole.frames[0].width * whole.frames[0].height


async def test_crop_video_without_timestamps_passes_text_on(make_ctx):
    ctx = make_ctx(["The surgeon places two clips."])
    obs = await default_registry().run(ctx, "crop_video", {"start_s": 30, "end_s": 36, "query": "x"})
    assert obs.error is None
    assert "no readable timestamps" in obs.text and "The surgeon places two clips." in obs.text


@pytest.mark.parametrize("start, end, fragment", [
    (30.0, 61.0, "outside the video"), (50.0, 40.0, "must be before"), (10.0, 10.0, "must be before"),
])
async def test_crop_video_bad_ranges(make_ctx, start, end, fragment):
    ctx = make_ctx(["never used"])
    obs = await default_registry().run(ctx, "crop_video", {"start_s": start, "end_s": end, "query": "x"})
    assert obs.error is not None and fragment in obs.error
    assert ctx.backends["video_expert"].requests == [] and ctx.visual_tokens_used == 0


async def test_crop_video_empty_reply_is_error(make_ctx):
    ctx = make_ctx(["<think>hmm</think>"])
    obs = await default_registry().run(ctx, "crop_video", {"start_s": 1, "end_s": 5, "query": "x"})
    assert obs.error is not None and "empty description" in obs.error
    assert obs.error.startswith("crop_video: ") and len(obs.model_calls) == 1 and obs.frames


# --- select_video_frame / crop_video_frame -----------------------------------------------------
async def test_select_video_frame_exact_frame_on_the_verifier(make_ctx, video):
    ctx = make_ctx(frame_script=["A grasper holds the gallbladder."])
    obs = await default_registry().run(ctx, "select_video_frame", {"time_s": 12.34, "query": "tools?"})
    assert obs.error is None, obs.error
    assert ctx.backends["video_expert"].requests == []             # the frame verifier answered
    (request,) = ctx.backends["frame_verifier"].requests
    (image,) = media_of(request, "image")
    expected = int(12.34 * video.fps)
    assert read_frame_index(image.frames) == expected
    (ref,) = obs.frames
    assert ref.frame_index == expected and ref.timestamp_s == pytest.approx(expected / video.fps)
    assert (ref.width, ref.height) == (image.frames.shape[1], image.frames.shape[0])
    assert ref.width % 28 == 0 and ref.height % 28 == 0
    assert ref.width * ref.height <= 64 * P and ref.crop_box is None
    assert ctx.visual_tokens_used == (ref.width // 28) * (ref.height // 28)
    assert "A grasper holds the gallbladder." in obs.text and f"frame {expected}" in obs.text.lower()
    assert obs.model_calls[0].model_name == "fv"


async def test_select_video_frame_at_the_end_and_past_it(make_ctx, video):
    ctx = make_ctx(frame_script=["last"])
    registry = default_registry()
    end = await registry.run(ctx, "select_video_frame", {"time_s": video.duration_s, "query": "x"})
    assert end.frames[0].frame_index == video.num_frames - 1
    past = await registry.run(ctx, "select_video_frame", {"time_s": video.duration_s + 1, "query": "x"})
    assert past.error is not None and "outside the video" in past.error


async def test_frame_verifier_falls_back_to_video_expert(make_ctx):
    ctx = make_ctx(video_script=["seen by the video expert"], with_verifier=False)
    obs = await default_registry().run(ctx, "select_video_frame", {"time_s": 3.0, "query": "x"})
    assert obs.error is None and "seen by the video expert" in obs.text
    assert len(ctx.backends["video_expert"].requests) == 1


async def test_crop_video_frame_zooms_the_region(make_ctx, video, frame_source):
    ctx = make_ctx(frame_script=["full", "region"])
    registry = default_registry()
    full = await registry.run(ctx, "select_video_frame", {"time_s": 20.0, "query": "x"})
    # the top half across the full width keeps the barcode strip inside the crop
    obs = await registry.run(ctx, "crop_video_frame", {"time_s": 20.0, "x1": 0.0, "y1": 0.0,
                                                       "x2": 1.0, "y2": 0.5, "query": "x"})
    assert obs.error is None, obs.error
    (ref,) = obs.frames
    assert ref.crop_box == (0.0, 0.0, 1.0, 0.5) and ref.frame_index == full.frames[0].frame_index
    (image,) = media_of(ctx.backends["frame_verifier"].requests[1], "image")
    assert read_frame_index(image.frames) == ref.frame_index
    # aspect of the region (320 × 90), not of the frame (320 × 180)
    assert ref.width / ref.height == pytest.approx(320 / 90, rel=0.3)
    assert "region x 0.00-1.00, y 0.00-0.50" in obs.text.lower()
    assert ctx.backends["frame_verifier"].requests[1].media[0].uuid != \
        ctx.backends["frame_verifier"].requests[0].media[0].uuid


async def test_crop_video_frame_region_pixels_match_reference(make_ctx, video, frame_source):
    """The region the model saw is the same region cut from the full-size decoded frame."""
    import numpy as np

    ctx = make_ctx(frame_script=["r"])
    box = (0.25, 0.3, 0.75, 0.9)
    await default_registry().run(ctx, "crop_video_frame", {"time_s": 30.0, "x1": box[0], "y1": box[1],
                                                           "x2": box[2], "y2": box[3], "query": "x"})
    (image,) = media_of(ctx.backends["frame_verifier"].requests[0], "image")
    index = int(30.0 * video.fps)
    full = frame_source.get_frame(video, index, video.width, video.height)          # (H, W, 3)
    from medclaw.kernels.ops import crop_box_to_pixels

    x1, y1, x2, y2 = crop_box_to_pixels(box, video.width, video.height)
    reference = full[y1:y2, x1:x2].astype(np.float32)
    seen = image.frames.astype(np.float32)
    # compare mean colour per quadrant (sizes differ: the model's copy is resized)
    def quadrants(a):
        h, w = a.shape[0] // 2, a.shape[1] // 2
        return np.array([a[:h, :w].mean((0, 1)), a[:h, w:].mean((0, 1)),
                         a[h:, :w].mean((0, 1)), a[h:, w:].mean((0, 1))])
    assert np.abs(quadrants(seen) - quadrants(reference)).max() < 12


@pytest.mark.parametrize("box", [(0.5, 0.1, 0.5, 0.9), (0.6, 0.1, 0.4, 0.9), (0.1, 0.8, 0.9, 0.2)])
async def test_crop_video_frame_rejects_empty_regions(make_ctx, box):
    ctx = make_ctx(frame_script=["never"])
    args = dict(zip(("x1", "y1", "x2", "y2"), box), time_s=5.0, query="x")
    obs = await default_registry().run(ctx, "crop_video_frame", args)
    assert obs.error is not None and "x1 < x2 and y1 < y2" in obs.error
    assert ctx.backends["frame_verifier"].requests == []


async def test_crop_video_frame_rejects_out_of_unit_coordinates(make_ctx):
    ctx = make_ctx(frame_script=["never"])
    obs = await default_registry().run(ctx, "crop_video_frame", {"time_s": 5.0, "x1": 0.1, "y1": 0.1,
                                                                 "x2": 1.5, "y2": 0.9, "query": "x"})
    assert obs.error is not None and "x2" in obs.error and "maximum" in obs.error


async def test_frame_tools_budget(make_ctx):
    ctx = make_ctx(frame_script=["never"], budget=1)
    obs = await default_registry().run(ctx, "select_video_frame", {"time_s": 5.0, "query": "x"})
    assert obs.error is not None and "visual budget is spent" in obs.error
    assert ctx.visual_tokens_used == 0


async def test_frame_verifier_empty_reply_keeps_the_evidence(make_ctx):
    ctx = make_ctx(frame_script=["<think>only thinking</think>   "])
    obs = await default_registry().run(ctx, "select_video_frame", {"time_s": 5.0, "query": "x"})
    assert obs.error is not None and obs.error.startswith("select_video_frame: ")
    assert "empty description" in obs.error
    assert len(obs.model_calls) == 1 and len(obs.frames) == 1 and ctx.visual_tokens_used > 0


@pytest.mark.parametrize("cap", [None, 64])
async def test_every_sub_agent_reply_keeps_the_episode_s_cap(make_ctx, cap):
    """`EpisodeConfig.sub_agent_max_tokens` (here on the context) caps each sub-agent request's
    reply budget; unset, each tool asks for its own."""
    from medclaw.tools import prompts

    ctx = make_ctx([STAGE1, STAGE2, "[00:00-00:05] dissection"], ["a frame", "a region"])
    ctx.sub_agent_max_tokens = cap
    registry = default_registry()
    for tool, args in (("view_full_video", {"query": "q"}),
                       ("crop_video", {"start_s": 0.0, "end_s": 10.0, "query": "q"}),
                       ("select_video_frame", {"time_s": 5.0, "query": "q"}),
                       ("crop_video_frame", {"time_s": 5.0, "x1": 0.0, "y1": 0.0, "x2": 1.0,
                                             "y2": 0.5, "query": "q"})):
        assert (await registry.run(ctx, tool, args)).error is None, tool
    asked = [r.max_tokens for role in ("video_expert", "frame_verifier")
             for r in ctx.backends[role].requests]
    own = [prompts.TIMELINE_MAX_TOKENS, prompts.REFINE_MAX_TOKENS, prompts.TIMELINE_MAX_TOKENS,
           prompts.FRAME_MAX_TOKENS, prompts.FRAME_MAX_TOKENS]
    assert asked == (own if cap is None else [min(cap, n) for n in own])
    assert cap is None or set(asked) == {cap}


async def test_decodes_do_not_need_the_default_executor(make_ctx, video):
    """Frames are decoded in the frame source's own threads: with the loop's default executor
    fully taken (by, say, episodes probing videos), a tool's decode still completes."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    release = threading.Event()
    blocker = loop.run_in_executor(None, release.wait, 60)
    try:
        ctx = make_ctx(frame_script=["A grasper."])
        obs = await asyncio.wait_for(default_registry().run(
            ctx, "select_video_frame", {"time_s": 12.0, "query": "instrument?"}), 30)
        assert obs.error is None and obs.frames[0].frame_index == 300
    finally:
        release.set()
        await blocker
