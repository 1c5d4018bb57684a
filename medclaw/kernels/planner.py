"""Token-budgeted frame planner: which frames to decode, and at what size, for a Qwen2.5-VL VLM.

Contract:
    plan_frames(info, start_s=0.0, end_s=None, *, fps=2.0, num_frames=None, min_frames=4,
                max_frames=768, min_pixels=..., max_pixels=None, total_pixels=...,
                max_visual_tokens=None) -> FramePlan
    frame_at_time(info, t) -> index of the frame on screen at video time t (by pts)
    frame_time_s(info, i)  -> video time of frame i (its pts minus the first frame's)

Semantics follow qwen-vl-utils (`qwen_vl_utils/vision_process.py`) wherever they apply, so a plan
gives the very frames and sizes `fetch_video` would have given:
  * time range → frame range as `calculate_video_frame_range` (start frame = ceil(start·fps),
    end frame = floor(end·fps), inclusive);
  * frame count as `smart_nframes` (`fps` mode with min/max frames, or an explicit `num_frames`),
    always even (Qwen2.5-VL merges 2 frames per temporal patch);
  * frame indices as `torch.linspace(first, last, n).round()` (float32, like qwen-vl-utils);
  * per-frame pixel cap as `fetch_video`:
    max(min(768·28², total_pixels / n · 2), 1.05 · min_pixels), lowered to `max_pixels` when one
    is given; then `smart_resize` to multiples of 28 (patch 14 × merge 2). A `min_pixels` above
    the cap with no `max_pixels` therefore raises the cap to 1.05 · min_pixels, as fetch_video.
On top of that, `max_visual_tokens` is a *hard* budget: the plan first lowers the resolution (down
to `min_pixels`), then drops frames (keeping an even count ≥ 2), then goes below `min_pixels`,
down to 2 frames of 28×28 (1 token per temporal patch always fits).

Deliberate differences from `fetch_video` (and why):
  1. `fps` is the video's rate measured from its packets (frames / pts span, `probe_video`), not
     the container header's: headers can be wrong, the packets are what gets decoded. On files
     whose header agrees (all tested ones) the plans are identical (tests/kernels/test_planner).
  2. Variable-frame-rate video is sampled by *time*: the range is the frames whose pts lie in
     [start, end], the count is `fps` × the range's seconds, and each sample is the frame shown
     at an evenly spaced time. qwen-vl-utils spaces indices evenly, which on VFR video crowds the
     samples into the high-rate parts and mis-times every frame (index / mean fps).
  3. Timestamps are each frame's real pts (seconds since the first frame), never index / fps.
  4. Out-of-range or inverted times raise `TimeRangeError` instead of being clamped silently.
  5. A range holding a single frame (one-frame videos, a range shorter than a frame) plans that
     frame twice, filling Qwen's temporal patch; qwen-vl-utils raises.
  6. `smart_resize` never floors a side to 0 (qwen-vl-utils plans 28×0 for a 1280×720 frame under
     a 1-token cap): each side is at least 28; the token budget then decides the frame count.
  7. A `max_pixels` above qwen's 768-token constant raises that constant instead of being ignored.

Visual tokens of a video = (T / 2) · (H / 28) · (W / 28).

Pure Python at import (numpy/torch are imported lazily for the index table and the linspace), so
importing it is cheap. Timing comes from the probe's index (`kernels.index`) when the video was
probed; a hand-made VideoInfo is timed at a constant `fps`.
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
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels ({min_pixels}) <= max_pixels ({max_pixels})")
    if height < 1 or width < 1:
        raise ValueError(f"frame size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise FrameTooLargeError(
            f"frame aspect ratio {max(height, width) / min(height, width):.0f} exceeds {MAX_RATIO}")
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        # max(factor, …): qwen-vl-utils floors a thin side to 0 here (deliberate difference)
        h_bar = max(factor, floor_by_factor(height / beta, factor))
        w_bar = max(factor, floor_by_factor(width / beta, factor))
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

def _index_of(info):
    """The probe's index of `info` if one was built (memory or disk), else None: plans for a
    VideoInfo made by hand (tests, fakes) fall back to constant-rate timing i / fps."""
    from medclaw.kernels.index import load_index

    index = load_index(info.sha256)
    return index if index is not None and index.num_frames == info.num_frames else None


def frame_time_s(info, index: int) -> float:
    """Video time of frame `index`: its pts minus the first frame's (i / fps without an index)."""
    idx = _index_of(info)
    return idx.time_s(index) if idx is not None else index / info.fps


def frame_at_time(info, time_s: float) -> int:
    """Index of the frame on screen at video time `time_s` (by pts; i = floor(t·fps) without an
    index), clamped to the video."""
    idx = _index_of(info)
    if idx is not None:
        return idx.frame_at(time_s)
    return max(0, min(info.num_frames - 1, int(time_s * info.fps + 1e-6)))


def frame_range(info, start_s: float, end_s: float | None) -> tuple[int, int, float, float]:
    """(first, last, start_s, end_s): inclusive source-frame range of a time range.

    Same rounding as qwen-vl-utils; times more than half a frame outside [0, duration] raise.
    A range holding no whole frame (shorter than a frame, or a one-frame video) gives the frame
    on screen at `start_s` as both first and last: the caller repeats it.
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
    index = _index_of(info) if info.is_variable_fps else None
    if index is not None:
        # Variable rate: the frames whose pts lie in [start, end], found by time.
        times = index.times_s()
        first = int(_searchsorted(times, start_c - 1e-9, "left"))
        last = min(int(_searchsorted(times, end_c + 1e-9, "right")) - 1, info.num_frames - 1)
    else:
        first = math.ceil(start_c * info.fps)
        last = min(math.floor(end_c * info.fps), info.num_frames - 1)
    if first >= last:
        first = last = frame_at_time(info, start_c)
    return first, last, start_s, end_s


def _local_rate(info, first: int, last: int, start_s: float, end_s: float) -> float:
    """Frames per second of the range: the average rate, or for VFR video span / window time."""
    if not info.is_variable_fps or _index_of(info) is None:
        return info.fps
    seconds = min(end_s, info.duration_s) - max(start_s, 0.0)
    return (last - first + 1) / seconds if seconds > 0 else info.fps


def _searchsorted(array, value, side):
    import numpy as np

    return np.searchsorted(array, value, side)


def _vfr_indices(index, first: int, last: int, n: int) -> list[int]:
    """`n` frames spread evenly in *time* over frames first..last of a variable-rate video: for
    each of n evenly spaced times, the frame shown then (the latest pts at or before it)."""
    import numpy as np

    times = index.times_s()
    t0, t1 = float(times[first]), float(times[last])
    picks = []
    for t in np.linspace(t0, t1, n):
        at = int(np.searchsorted(times, t + 1e-9, "right")) - 1
        picks.append(min(max(at, first), last))
    return picks


def linspace_indices(first: int, last: int, n: int) -> list[int]:
    """`torch.linspace(first, last, n).round()` exactly as qwen-vl-utils computes it (float32)."""
    import torch

    return torch.linspace(first, last, n).round().long().tolist()


def _size_for_tokens(height: int, width: int, tokens: int) -> tuple[int, int]:
    """The largest (h, w), multiples of 28 and at least 28, aspect kept as well as the grid
    allows, with (h / 28) · (w / 28) <= tokens (>= 1)."""
    scale = math.sqrt(tokens * FACTOR * FACTOR / (height * width))
    while True:
        gh = max(1, math.floor(height * scale / FACTOR))
        gw = max(1, math.floor(width * scale / FACTOR))
        if gh * gw <= tokens:
            return gh * FACTOR, gw * FACTOR
        scale *= 0.97


def _fit_budget(n: int, height: int, width: int, min_pixels: float, max_pixels: float,
                max_tokens: int) -> tuple[int, int, int]:
    """(n, h, w) with visual_tokens ≤ max_tokens: resolution first, then frames, then below
    min_pixels. Every side is a positive multiple of 28."""
    h, w = smart_resize(height, width, FACTOR, min_pixels, max_pixels)
    if visual_tokens(n, h, w) <= max_tokens:
        return n, h, w
    # 1) lower the resolution: the per-frame share of the budget, down to min_pixels.
    per_pair = max_tokens // (n // FRAME_FACTOR)                 # tokens of one temporal patch
    if per_pair * FACTOR * FACTOR >= min_pixels:
        h, w = _size_for_tokens(height, width, per_pair)
        if h * w >= min_pixels * 0.9 or visual_tokens(n, h, w) <= max_tokens:
            return n, h, w
    # 2) keep min_pixels resolution, drop frames (even count).
    h, w = smart_resize(height, width, FACTOR, min_pixels, max(min_pixels, min_pixels * 1.05))
    pairs = max_tokens // visual_tokens(FRAME_FACTOR, h, w)
    if pairs >= 1:
        return min(n, pairs * FRAME_FACTOR), h, w
    # 3) two frames, resolution below min_pixels.
    h, w = _size_for_tokens(height, width, max_tokens)
    return FRAME_FACTOR, h, w


def plan_frames(info, start_s: float = 0.0, end_s: float | None = None, *,
                fps: float | None = DEFAULT_FPS, num_frames: int | None = None,
                min_frames: int = 4, max_frames: int = 768,
                min_pixels: float = DEFAULT_MIN_PIXELS, max_pixels: float | None = None,
                total_pixels: float = DEFAULT_TOTAL_PIXELS,
                max_visual_tokens: int | None = None) -> FramePlan:
    """Plan frames for `info` (a `VideoInfo`) over [start_s, end_s]; see the module docstring."""
    if num_frames is None and (fps is None or not fps > 0):
        raise ValueError(f"fps must be > 0 when num_frames is not given, got {fps}")
    if num_frames is not None and num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if not min_pixels > 0:
        raise ValueError(f"min_pixels must be > 0, got {min_pixels}")
    if max_pixels is not None and max_pixels < min_pixels:
        raise ValueError(f"need min_pixels <= max_pixels, got {min_pixels} > {max_pixels}")
    if not total_pixels > 0:
        raise ValueError(f"total_pixels must be > 0, got {total_pixels}")
    if max_visual_tokens is not None and max_visual_tokens < 1:
        raise ValueError(f"max_visual_tokens must be >= 1, got {max_visual_tokens}")
    first, last, start_s, end_s = frame_range(info, start_s, end_s)
    span = last - first + 1
    if span < FRAME_FACTOR:
        n = FRAME_FACTOR                     # one frame in range: repeated to fill the patch
    elif num_frames is not None:
        # An explicit count larger than the range is the caller asking for "all of them".
        n = smart_nframes(span, info.fps, num_frames=min(num_frames, floor_by_factor(span, 2)))
    else:
        # Variable rate: `fps` frames per second of *time* in the range, not per average-rate
        # frame count (the local rate may be far from the average).
        rate = _local_rate(info, first, last, start_s, end_s)
        n = smart_nframes(span, rate, fps=fps, min_frames=min_frames, max_frames=max_frames)
    # fetch_video's per-frame cap: share of total_pixels, never below 1.05 × min_pixels.
    # (A max_pixels above qwen's 768-token constant raises that constant instead of being ignored.)
    ceiling = DEFAULT_MAX_PIXELS if max_pixels is None else max(DEFAULT_MAX_PIXELS, max_pixels)
    frame_cap = max(min(ceiling, total_pixels / n * FRAME_FACTOR), int(min_pixels * 1.05))
    if max_pixels is not None:
        frame_cap = min(max_pixels, frame_cap)
    if max_visual_tokens is None:
        height, width = smart_resize(info.height, info.width, FACTOR, min_pixels, frame_cap)
    else:
        n, height, width = _fit_budget(n, info.height, info.width, min_pixels, frame_cap,
                                       max_visual_tokens)
    index = _index_of(info)
    if span < FRAME_FACTOR:
        indices = [first] * n
    elif index is not None and info.is_variable_fps:
        indices = _vfr_indices(index, first, last, n)
    else:
        indices = linspace_indices(first, last, n)
    if index is not None:
        timestamps = tuple(round(index.time_s(i), 6) for i in indices)
    else:
        timestamps = tuple(round(i / info.fps, 6) for i in indices)
    return FramePlan(
        frame_indices=tuple(indices),
        timestamps_s=timestamps,
        width=width,
        height=height,
        fps=n / span * info.fps,
        num_visual_tokens=visual_tokens(n, height, width),
        start_s=start_s,
        end_s=end_s,
    )
