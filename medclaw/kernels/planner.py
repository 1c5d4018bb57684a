"""Token-budgeted frame planner: which frames to decode, and at what size, for a Qwen2.5-VL VLM.

Contract:
    plan_frames(info, start_s=0.0, end_s=None, *, fps=2.0, num_frames=None, min_frames=4,
                max_frames=768, min_pixels=..., max_pixels=..., total_pixels=...,
                max_visual_tokens=None) -> FramePlan

Semantics follow qwen-vl-utils (`qwen_vl_utils/vision_process.py`) wherever they apply, so a plan
gives the very frames and sizes `fetch_video` would have given:
  * time range → frame range as `calculate_video_frame_range` (start frame = ceil(start·fps),
    end frame = floor(end·fps), inclusive) — except that out-of-range or inverted times raise
    `TimeRangeError` instead of being clamped silently;
  * frame count as `smart_nframes` (`fps` mode with min/max frames, or an explicit `num_frames`),
    always even (Qwen2.5-VL merges 2 frames per temporal patch);
  * frame indices as `torch.linspace(first, last, n).round()` (float32, like qwen-vl-utils);
  * per-frame pixel cap as `fetch_video`:
    max(min(max_pixels, total_pixels / n · 2), 1.05 · min_pixels), then `smart_resize` to multiples of 28 (patch 14 × merge 2).
On top of that, `max_visual_tokens` is a *hard* budget: the plan first lowers the resolution (down
to `min_pixels`), then drops frames (keeping an even count ≥ 2), then goes below `min_pixels`; if
not even 2 frames of 28×28 fit, it raises `ValueError`.

Visual tokens of a video = (T / 2) · (H / 28) · (W / 28).

This module is pure Python (torch is imported lazily for the index linspace only), so importing it
is cheap.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from medclaw.kernels.errors import FrameTooLargeError, TimeRangeError

PATCH_SIZE = 14
SPATIAL_MERGE = 2
FACTOR = PATCH_SIZE * SPATIAL_MERGE          # 28: output sides are multiples of this
FRAME_FACTOR = 2                             # temporal patch: frame counts are even
MAX_RATIO = 200
VIDEO_MIN_TOKEN_NUM = 128
VIDEO_MAX_TOKEN_NUM = 768
MODEL_SEQ_LEN = 128000

DEFAULT_FPS = 2.0
DEFAULT_MIN_PIXELS = VIDEO_MIN_TOKEN_NUM * FACTOR * FACTOR            # 100,352
DEFAULT_MAX_PIXELS = VIDEO_MAX_TOKEN_NUM * FACTOR * FACTOR            # 602,112
DEFAULT_TOTAL_PIXELS = MODEL_SEQ_LEN * FACTOR * FACTOR * 0.9          # 90,316,800


@dataclass(slots=True, frozen=True)
class FramePlan:
    """Frames to decode and the size to decode them at.

    `fps` is the effective sampling rate (frames kept per second of source, as qwen-vl-utils'
    `sample_fps`); `num_visual_tokens` is what the VLM will spend on these frames.
    """

    frame_indices: tuple[int, ...]
    timestamps_s: tuple[float, ...]
    width: int
    height: int
    fps: float
    num_visual_tokens: int
    start_s: float
    end_s: float

    @property
    def num_frames(self) -> int:
        return len(self.frame_indices)

    def to_dict(self) -> dict:
        return asdict(self)


# --- qwen-vl-utils arithmetic (kept identical) --------------------------------------------------

def round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


def ceil_by_factor(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def floor_by_factor(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def smart_resize(height: int, width: int, factor: int = FACTOR, min_pixels: float | None = None,
                 max_pixels: float | None = None) -> tuple[int, int]:
    """(h, w) rounded to multiples of `factor`, pixel count within [min, max], aspect kept."""
    max_pixels = max_pixels if max_pixels is not None else 16384 * factor ** 2
    min_pixels = min_pixels if min_pixels is not None else 4 * factor ** 2
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise FrameTooLargeError(
            f"frame aspect ratio {max(height, width) / min(height, width):.0f} exceeds {MAX_RATIO}")
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = floor_by_factor(height / beta, factor)
        w_bar = floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def smart_nframes(total_frames: int, video_fps: float, *, fps: float | None = DEFAULT_FPS,
                  num_frames: int | None = None, min_frames: int = 4,
                  max_frames: int | None = 768) -> int:
    """Frames to sample from `total_frames` (qwen-vl-utils `smart_nframes`; num_frames=nframes)."""
    if num_frames is not None:
        nframes = round_by_factor(num_frames, FRAME_FACTOR)
    else:
        lo = ceil_by_factor(min_frames, FRAME_FACTOR)
        hi = floor_by_factor(min(max_frames, total_frames) if max_frames else total_frames,
                             FRAME_FACTOR)
        nframes = total_frames / video_fps * fps
        nframes = min(min(max(nframes, lo), hi), total_frames)
        nframes = floor_by_factor(nframes, FRAME_FACTOR)
    if not FRAME_FACTOR <= nframes <= total_frames:
        raise ValueError(f"frame count must be in [{FRAME_FACTOR}, {total_frames}] for this range, "
                         f"got {nframes}")
    return int(nframes)


def visual_tokens(num_frames: int, height: int, width: int) -> int:
    return (num_frames // FRAME_FACTOR) * (height // FACTOR) * (width // FACTOR)


# --- planning -----------------------------------------------------------------------------------

def frame_range(info, start_s: float, end_s: float | None) -> tuple[int, int, float, float]:
    """(first, last, start_s, end_s): inclusive source-frame range of a time range.

    Same rounding as qwen-vl-utils; times more than half a frame outside [0, duration] raise.
    """
    duration = info.num_frames / info.fps if info.fps > 0 else info.duration_s
    end_s = duration if end_s is None else float(end_s)
    start_s = float(start_s)
    slack = 0.5 / info.fps
    name = info.path
    if not (math.isfinite(start_s) and math.isfinite(end_s)):
        raise TimeRangeError(f"{name}: times must be finite numbers, got {start_s}..{end_s}")
    if start_s < -slack or end_s > max(duration, info.duration_s) + slack:
        raise TimeRangeError(f"{name}: time range {start_s:.2f}-{end_s:.2f} s is outside the video "
                             f"(0-{duration:.2f} s)")
    if start_s >= end_s:
        raise TimeRangeError(f"{name}: start {start_s:.2f} s must be before end {end_s:.2f} s")
    start_c = min(max(start_s, 0.0), duration)
    end_c = min(max(end_s, 0.0), duration)
    first = math.ceil(start_c * info.fps)
    last = min(math.floor(end_c * info.fps), info.num_frames - 1)
    if first >= last:
        raise TimeRangeError(f"{name}: time range {start_s:.3f}-{end_s:.3f} s holds fewer than "
                             f"2 frames at {info.fps:g} fps")
    return first, last, start_s, end_s


def linspace_indices(first: int, last: int, n: int) -> list[int]:
    """`torch.linspace(first, last, n).round()` exactly as qwen-vl-utils computes it (float32)."""
    import torch

    return torch.linspace(first, last, n).round().long().tolist()


def _fit_budget(n: int, height: int, width: int, min_pixels: float, max_pixels: float,
                max_tokens: int) -> tuple[int, int, int]:
    """(n, h, w) with visual_tokens ≤ max_tokens: resolution first, then frames, then below min."""
    h, w = smart_resize(height, width, FACTOR, min_pixels, max_pixels)
    if visual_tokens(n, h, w) <= max_tokens:
        return n, h, w
    # 1) lower the resolution: the per-frame pixel share of the budget, floored at min_pixels.
    per_frame = max_tokens * FACTOR * FACTOR * FRAME_FACTOR / n
    if per_frame >= min_pixels:
        h, w = smart_resize(height, width, FACTOR, min(min_pixels, per_frame), per_frame)
        if visual_tokens(n, h, w) <= max_tokens:
            return n, h, w
    # 2) keep min_pixels resolution, drop frames (even count).
    h, w = smart_resize(height, width, FACTOR, min_pixels, max(min_pixels, min(per_frame,
                                                                                max_pixels)))
    tokens_per_pair = visual_tokens(FRAME_FACTOR, h, w)
    pairs = max_tokens // tokens_per_pair
    if pairs >= 1:
        return min(n, pairs * FRAME_FACTOR), h, w
    # 3) two frames, resolution below min_pixels.
    n = FRAME_FACTOR
    cap = max_tokens * FACTOR * FACTOR
    if cap < FACTOR * FACTOR:
        raise ValueError(f"max_visual_tokens={max_tokens} cannot hold even 2 frames of 28x28")
    h, w = smart_resize(height, width, FACTOR, FACTOR * FACTOR, cap)
    while visual_tokens(n, h, w) > max_tokens and (h > FACTOR or w > FACTOR):
        cap *= 0.9   # smart_resize's floor can land on 0 or overshoot for odd aspects: shrink on
        h, w = smart_resize(height, width, FACTOR, min(FACTOR * FACTOR, cap), cap)
        h, w = max(h, FACTOR), max(w, FACTOR)
    if visual_tokens(n, h, w) > max_tokens:
        raise ValueError(f"max_visual_tokens={max_tokens} cannot hold 2 frames of this video")
    return n, h, w


def plan_frames(info, start_s: float = 0.0, end_s: float | None = None, *,
                fps: float | None = DEFAULT_FPS, num_frames: int | None = None,
                min_frames: int = 4, max_frames: int = 768,
                min_pixels: float = DEFAULT_MIN_PIXELS, max_pixels: float = DEFAULT_MAX_PIXELS,
                total_pixels: float = DEFAULT_TOTAL_PIXELS,
                max_visual_tokens: int | None = None) -> FramePlan:
    """Plan frames for `info` (a `VideoInfo`) over [start_s, end_s]; see the module docstring."""
    if num_frames is None and (fps is None or fps <= 0):
        raise ValueError(f"fps must be > 0 when num_frames is not given, got {fps}")
    if num_frames is not None and num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if min_pixels <= 0 or max_pixels < min_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    if max_visual_tokens is not None and max_visual_tokens < 1:
        raise ValueError(f"max_visual_tokens must be >= 1, got {max_visual_tokens}")
    first, last, start_s, end_s = frame_range(info, start_s, end_s)
    span = last - first + 1
    if num_frames is not None:
        # An explicit count larger than the range is the caller asking for "all of them".
        n = smart_nframes(span, info.fps, num_frames=min(num_frames, floor_by_factor(span, 2)))
    else:
        n = smart_nframes(span, info.fps, fps=fps, min_frames=min_frames, max_frames=max_frames)
    # fetch_video's per-frame cap: share of total_pixels, never below 1.05 × min_pixels.
    # (A max_pixels above qwen's 768-token constant raises that constant instead of being ignored.)
    frame_cap = max(min(max(DEFAULT_MAX_PIXELS, max_pixels), total_pixels / n * FRAME_FACTOR),
                    int(min_pixels * 1.05))
    frame_cap = min(max_pixels, frame_cap)
    if max_visual_tokens is None:
        height, width = smart_resize(info.height, info.width, FACTOR, min_pixels, frame_cap)
    else:
        n, height, width = _fit_budget(n, info.height, info.width, min_pixels, frame_cap,
                                       max_visual_tokens)
    indices = linspace_indices(first, last, n)
    return FramePlan(
        frame_indices=tuple(indices),
        timestamps_s=tuple(round(i / info.fps, 6) for i in indices),
        width=width,
        height=height,
        fps=n / span * info.fps,
        num_visual_tokens=visual_tokens(n, height, width),
        start_s=start_s,
        end_s=end_s,
    )
