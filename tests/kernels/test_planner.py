"""Frame planner: qwen-vl-utils semantics (checked against the library) + a hard token budget."""
from __future__ import annotations

import itertools

import pytest

from medclaw.kernels.errors import TimeRangeError
from medclaw.kernels.planner import (
    DEFAULT_MIN_PIXELS, FACTOR, plan_frames, smart_nframes, smart_resize, visual_tokens,
)
from medclaw.types import VideoInfo

vp = pytest.importorskip("qwen_vl_utils.vision_process")


def _info(seconds: float, fps: float = 25.0, width: int = 640, height: int = 360) -> VideoInfo:
    n = int(round(seconds * fps))
    return VideoInfo(path="v.mp4", sha256="0" * 64, duration_s=n / fps, fps=fps, num_frames=n,
                     width=width, height=height, codec="h264")


def _qwen_plan(info: VideoInfo, ele: dict):
    """What qwen-vl-utils' fetch_video decides for this video, from its own functions.

    Mirrors `_read_video_torchcodec` (frame range, smart_nframes, linspace) and fetch_video's
    pixel cap, calling the library for every rule it implements.
    """
    import torch

    first, last, total = vp.calculate_video_frame_range(ele, info.num_frames, info.fps)
    n = vp.smart_nframes(ele, total_frames=total, video_fps=info.fps)
    idx = torch.linspace(first, last, n).round().long().tolist()
    factor = 14 * vp.SPATIAL_MERGE_SIZE
    min_pixels = ele.get("min_pixels", vp.VIDEO_MIN_TOKEN_NUM * factor * factor)
    total_pixels = ele.get("total_pixels", vp.MODEL_SEQ_LEN * factor * factor * 0.9)
    max_pixels = max(min(vp.VIDEO_MAX_TOKEN_NUM * factor * factor,
                         total_pixels / n * vp.FRAME_FACTOR), int(min_pixels * 1.05))
    max_pixels = min(ele.get("max_pixels", max_pixels), max_pixels)
    h, w = vp.smart_resize(info.height, info.width, factor=factor, min_pixels=min_pixels,
                           max_pixels=max_pixels)
    return idx, h, w, n / total * info.fps


CASES = [
    # (seconds, fps, width, height, element)
    (600, 25, 640, 360, {"fps": 2.0}),
    (600, 25, 640, 360, {"fps": 2.0, "video_start": 100.0, "video_end": 130.0}),
    (600, 25, 640, 360, {"nframes": 64}),
    (60, 25, 320, 180, {"fps": 2.0}),
    (60, 30, 1920, 1080, {"fps": 1.0, "max_pixels": 200_000}),
    (7200, 25, 1280, 720, {"fps": 2.0}),                     # 2 h: capped at 768 frames
    (3.3, 24, 848, 480, {"fps": 2.0}),                       # short: min_frames applies
    (45, 29.97, 1280, 720, {"fps": 0.5, "min_frames": 8, "max_frames": 40}),
    (600, 25, 640, 360, {"fps": 2.0, "total_pixels": 20_000_000}),
    (120, 25, 360, 640, {"nframes": 30, "video_start": 10.5, "video_end": 61.2}),
]


@pytest.mark.parametrize("seconds,fps,width,height,ele", CASES)
def test_plan_matches_qwen_vl_utils(seconds, fps, width, height, ele):
    info = _info(seconds, fps, width, height)
    kwargs = {k: ele[k] for k in ("min_frames", "max_frames", "max_pixels", "total_pixels")
              if k in ele}
    if "nframes" in ele:
        kwargs.update(fps=None, num_frames=ele["nframes"])
    else:
        kwargs["fps"] = ele["fps"]
    plan = plan_frames(info, ele.get("video_start", 0.0), ele.get("video_end"), **kwargs)
    idx, h, w, sample_fps = _qwen_plan(info, ele)
    assert list(plan.frame_indices) == idx
    assert (plan.height, plan.width) == (h, w)
    assert plan.fps == pytest.approx(sample_fps)
    assert plan.timestamps_s == pytest.approx([i / fps for i in idx], abs=1e-5)
    assert plan.num_visual_tokens == visual_tokens(len(idx), h, w)


def test_smart_resize_and_nframes_match_library():
    sizes = [(360, 640), (1080, 1920), (100, 2000), (28, 28), (4000, 3000), (181, 319)]
    pixel_caps = [(DEFAULT_MIN_PIXELS, 602_112), (3136, 50_000), (100_000, 100_000)]
    for (h, w), (lo, hi) in itertools.product(sizes, pixel_caps):
        assert smart_resize(h, w, FACTOR, lo, hi) == vp.smart_resize(h, w, FACTOR, lo, hi)
    for total, vfps, fps, lo, hi in itertools.product([9, 50, 751, 15000], [24.0, 25.0, 59.94],
                                                      [0.5, 2.0, 8.0], [4, 5], [16, 768]):
        if total < 2:
            continue
        ele = {"fps": fps, "min_frames": lo, "max_frames": hi}
        ours = smart_nframes(total, vfps, fps=fps, min_frames=lo, max_frames=hi)
        assert ours == vp.smart_nframes(ele, total_frames=total, video_fps=vfps)


def test_real_fetch_video_on_synthetic_video(synth_video, monkeypatch):
    """End to end: the library's own fetch_video picks the same frames and size as our plan."""
    from medclaw.kernels.probe import probe_video

    monkeypatch.setattr(vp, "get_video_reader_backend", lambda: "torchcodec")
    info = probe_video(synth_video.path)
    for ele, kwargs in [({"fps": 2.0}, {}),
                        ({"fps": 1.0, "video_start": 12.0, "video_end": 30.0},
                         {"start_s": 12.0, "end_s": 30.0, "fps": 1.0})]:
        video, meta = vp.fetch_video({"video": str(synth_video.path), **ele},
                                     return_video_metadata=True)
        plan = plan_frames(info, **kwargs)
        assert meta["video_backend"] == "torchcodec"
        assert list(plan.frame_indices) == list(meta["frames_indices"])
        assert (plan.height, plan.width) == tuple(video.shape[-2:])


@pytest.mark.parametrize("budget", [50, 128, 129, 700, 5_000, 30_000, 200_000])
@pytest.mark.parametrize("size", [(640, 360), (1920, 1080), (320, 180), (360, 640)])
def test_token_budget_is_hard_and_shapes_valid(budget, size):
    info = _info(600, 25, *size)
    plan = plan_frames(info, fps=2.0, max_visual_tokens=budget)
    assert plan.num_visual_tokens <= budget
    assert plan.num_visual_tokens == visual_tokens(plan.num_frames, plan.height, plan.width)
    assert plan.num_frames % 2 == 0 and plan.num_frames >= 2
    assert plan.width % FACTOR == 0 and plan.height % FACTOR == 0
    assert list(plan.frame_indices) == sorted(set(plan.frame_indices))


def test_budget_lowers_resolution_before_dropping_frames():
    info = _info(600, 25, 640, 360)
    free = plan_frames(info, fps=2.0)
    tight = plan_frames(info, fps=2.0, max_visual_tokens=free.num_visual_tokens // 2)
    assert tight.num_frames == free.num_frames                # resolution went down first
    assert tight.width * tight.height < free.width * free.height
    floor = plan_frames(info, fps=2.0, max_visual_tokens=2_000)
    assert floor.num_frames < free.num_frames                 # frames drop once at min_pixels
    assert floor.width * floor.height >= DEFAULT_MIN_PIXELS * 0.9


def test_budget_that_fits_changes_nothing():
    info = _info(60, 25)
    free = plan_frames(info)
    assert plan_frames(info, max_visual_tokens=free.num_visual_tokens) == free


def test_budget_impossible_raises():
    with pytest.raises(ValueError, match="max_visual_tokens"):
        plan_frames(_info(60), max_visual_tokens=0)


@pytest.mark.parametrize("start,end", [(-5.0, 10.0), (10.0, 700.0), (30.0, 20.0), (5.0, 5.0),
                                       (float("nan"), 3.0)])
def test_bad_time_ranges_raise_one_line(start, end):
    with pytest.raises(TimeRangeError) as err:
        plan_frames(_info(600), start, end)
    assert "\n" not in str(err.value) and "v.mp4" in str(err.value)


def test_end_at_duration_is_allowed_and_window_stays_inside():
    info = _info(600)
    plan = plan_frames(info, 570.0, 600.0)
    assert plan.frame_indices[0] >= 570 * 25 and plan.frame_indices[-1] <= info.num_frames - 1


def test_importing_kernels_stays_light():
    """CLI rule: planner, frames, cache, decoders and bench modules import no torch/numpy at top."""
    import subprocess
    import sys

    code = ("import sys, medclaw.kernels.planner, medclaw.kernels.frames, medclaw.kernels.cache, "
            "medclaw.kernels.decoders, medclaw.kernels.ops, medclaw.bench.decode; "
            "print(sorted(m for m in ('torch', 'numpy', 'av', 'torchcodec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_window_shorter_than_a_frame_repeats_the_frame_on_screen():
    """Qwen needs 2 frames per temporal patch: a range holding one frame sends it twice."""
    plan = plan_frames(_info(600), 599.99, None)
    assert plan.frame_indices == (14999, 14999) and plan.num_frames == 2
    one = VideoInfo(path="one.mp4", sha256="1" * 64, duration_s=0.04, fps=25.0, num_frames=1,
                    width=320, height=180, codec="h264")
    for kwargs in ({}, {"fps": None, "num_frames": 8}, {"max_visual_tokens": 50}):
        plan = plan_frames(one, **kwargs)
        assert plan.frame_indices == (0, 0) and plan.timestamps_s == (0.0, 0.0)
        assert plan.num_visual_tokens == visual_tokens(2, plan.height, plan.width)


def test_random_budget_sweep_never_yields_a_zero_side_or_crashes():
    """Random sizes, rates, pixel floors and budgets: every plan is valid and within budget."""
    import random

    rng = random.Random(0)
    for _ in range(3000):
        width, height = rng.randint(16, 4000), rng.randint(16, 4000)
        if max(width, height) / min(width, height) > 200:
            continue
        budget = rng.choice([1, 2, 3, rng.randint(1, 300), rng.randint(1, 30_000)])
        plan = plan_frames(_info(60, 25, width, height), fps=rng.choice([0.5, 2.0, 4.0]),
                           min_pixels=rng.choice([784, 3136, DEFAULT_MIN_PIXELS, 700_000]),
                           max_visual_tokens=budget)
        assert plan.num_visual_tokens <= budget
        assert plan.width >= FACTOR and plan.height >= FACTOR
        assert plan.width % FACTOR == 0 and plan.height % FACTOR == 0
        assert plan.num_frames >= 2 and plan.num_frames % 2 == 0
    tiny = plan_frames(_info(60, 25, 1280, 720), max_visual_tokens=1)
    assert (tiny.width, tiny.height, tiny.num_frames) == (28, 28, 2)    # qwen would plan 28x0


def test_min_pixels_above_the_frame_cap_behaves_as_qwen_vl_utils():
    """No max_pixels: the cap rises to 1.05 x min_pixels, as fetch_video does."""
    info = _info(60, 25, 1280, 720)
    ele = {"fps": 2.0, "min_pixels": 700_000}
    plan = plan_frames(info, fps=2.0, min_pixels=700_000)
    idx, h, w, _ = _qwen_plan(info, ele)
    assert list(plan.frame_indices) == idx and (plan.height, plan.width) == (h, w)
    with pytest.raises(ValueError, match="min_pixels"):           # contradictory: refused
        plan_frames(info, min_pixels=700_000, max_pixels=600_000)
