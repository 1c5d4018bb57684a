"""From (time range | time + region) to pixels a sub-agent can see: plan, decode, name, charge.

Contract
- `check_window(video, start_s, end_s)` / `check_time(video, t)`: `TimeRangeError` (one line, for
  the model) when times fall outside [0, duration] or start >= end.
- `plan_clip(ctx, role, window, context_tokens=0)`: a kernels `FramePlan` under the role's
  ModelSpec budgets (fps, pixels, max_frames) and under the tokens left — both the episode's visual
  budget (`ctx.visual_tokens_left`) and the model's context (`max_model_len` minus the text around
  the clip). Nothing fits → `VisualBudgetError` (a `ToolError`: the orchestrator reads it).
- `await load_clip(ctx, plan)` / `await load_frame(ctx, role, t, crop_box)`: decode (through
  `FrameSource.aget`: in the source's own threads, never the loop's default executor, and a
  decode queued behind another of the same video holds no thread), build the `MediaItem` with its
  stable uuid, the `FrameRef`s of exactly the frames decoded, and charge `ctx.visual_tokens_used`.
- Media uuids follow docs/architecture.md rule 2: `requests.conversation.media_uuid(sha256, first, last, fps,
  pixels)`, plus the frame count, the output size and the crop box — every input that determines
  the pixels, none computed from them. Same video + range + sampling + size ⇒ same uuid ⇒ vLLM
  reuses the KV across tool calls and across questions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from medclaw.kernels.errors import TimeRangeError
from medclaw.kernels.planner import FACTOR as PATCH          # 28 px per token side (14-px patches, 2×2 merge)
from medclaw.kernels.planner import FRAME_FACTOR as TEMPORAL_PATCH   # 2 frames per temporal patch
from medclaw.kernels.planner import (
    frame_at_time, frame_time_s, plan_frames, smart_resize, visual_tokens,
)
from medclaw.tools.base import ToolContext, ToolError
from medclaw.tools.prompts import FRAME_MAX_TOKENS
from medclaw.tools.timeline import Window
from medclaw.types import FrameRef, MediaItem, VideoInfo

TEXT_RESERVE_TOKENS = 512        # system prompt + instructions + query around a clip
MIN_CROP_SOURCE_PX = 8           # a region narrower than this (source pixels) shows nothing

# roles whose absence falls back to another role's engine (frame checks on the video expert)
ROLE_FALLBACK = {"frame_verifier": "video_expert"}


class VisualBudgetError(ToolError):
    """Not even the smallest plan fits in the visual tokens (or context) left."""


@dataclass(slots=True)
class Clip:
    """Pixels ready for a request, and the evidence of what they are."""

    media: MediaItem
    frames: list[FrameRef] = field(default_factory=list)
    num_visual_tokens: int = 0
    window: Window | None = None          # video-time span of a video clip


# --- roles ----------------------------------------------------------------------------------------
def resolve_role(ctx: ToolContext, role: str) -> str:
    if role in ctx.specs:
        return role
    fallback = ROLE_FALLBACK.get(role)
    if fallback is not None and fallback in ctx.specs:
        return fallback
    raise ToolError(f"no {role} model is configured for this session")


def spec_for(ctx: ToolContext, role: str):
    return ctx.specs[resolve_role(ctx, role)]


async def backend_for(ctx: ToolContext, role: str):
    """The role's backend; builds it off the event loop when the mapping knows how (runtime)."""
    role = resolve_role(ctx, role)
    getter = getattr(ctx.backends, "aget", None)
    if getter is not None:
        return await getter(role)
    return ctx.backends[role]


# --- time checks ----------------------------------------------------------------------------------
def check_time(video: VideoInfo, time_s: float) -> float:
    if not 0 <= time_s <= video.duration_s:
        raise TimeRangeError(f"time {time_s:g} s is outside the video (0 to {video.duration_s:.2f} s)")
    return float(time_s)


def check_window(video: VideoInfo, start_s: float, end_s: float) -> Window:
    if start_s >= end_s:
        raise TimeRangeError(f"start {start_s:g} s must be before end {end_s:g} s")
    for t in (start_s, end_s):
        check_time(video, t)
    return Window(float(start_s), float(end_s))


def frame_index_at(video: VideoInfo, time_s: float) -> int:
    """Index of the frame on screen at `time_s`, by the frames' real pts (variable rates
    included; the last frame at the end)."""
    return frame_at_time(video, time_s)


# --- planning -------------------------------------------------------------------------------------
def tokens_available(ctx: ToolContext, spec, context_tokens: int, max_tokens: int) -> int:
    """Visual tokens one request may carry: episode budget ∧ model context."""
    context_room = spec.max_model_len - context_tokens - max_tokens - TEXT_RESERVE_TOKENS
    return max(0, min(ctx.visual_tokens_left, context_room))


def min_useful_tokens(video: VideoInfo, spec) -> int:
    """Tokens of the smallest clip worth sending: 2 frames at the spec's min_pixels.

    The planner would shrink a plan down to two 28×28 frames to honour any budget; below the
    model's min_pixels that shows nothing, so such a plan counts as "nothing fits".
    """
    height, width = smart_resize(video.height, video.width, PATCH, spec.min_pixels, spec.min_pixels)
    return visual_tokens(TEMPORAL_PATCH, height, width)


def plan_clip(ctx: ToolContext, role: str, window: Window, *, context_tokens: int = 0,
              max_tokens: int = 0, share: float = 1.0):
    """A FramePlan for `window` under the role's budgets and the tokens left (see module doc).

    `share` < 1 keeps part of a *binding* limit (episode budget or model context) for a later look
    in the same conversation (stage 2 of view_full_video); when neither binds it changes nothing,
    so plans (and uuids) stay identical across questions.
    """
    spec = spec_for(ctx, role)
    available = tokens_available(ctx, spec, context_tokens, max_tokens)
    floor = min_useful_tokens(ctx.video, spec)
    if available < floor:
        raise VisualBudgetError(_budget_message(ctx))
    available = max(floor, int(available * share))
    plan = plan_frames(
        ctx.video, window.start_s, window.end_s, fps=spec.fps, max_frames=spec.max_frames,
        min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
        total_pixels=spec.total_pixels, max_visual_tokens=available)
    if plan.num_visual_tokens > available:       # the planner's budget is hard; this is a bug
        raise RuntimeError(f"planner exceeded its budget: {plan.num_visual_tokens} > {available}")
    return plan


def _budget_message(ctx: ToolContext) -> str:
    return (f"the visual budget is spent ({ctx.visual_tokens_used} of {ctx.visual_token_budget} "
            "visual tokens used, not enough left for another look); answer with the evidence "
            "gathered so far")


def image_tokens(width: int, height: int) -> int:
    """A still is encoded as one temporal patch (the frame repeated), so as a 2-frame clip."""
    return visual_tokens(TEMPORAL_PATCH, height, width)


def image_size(width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) for one still, multiples of 28 with min_pixels <= w*h <= max_pixels."""
    out_h, out_w = smart_resize(height, width, factor=PATCH, min_pixels=min_pixels,
                                max_pixels=max_pixels)
    return out_w, out_h


# --- decoding -------------------------------------------------------------------------------------
def clip_uuid(video: VideoInfo, first: int, last: int, fps: float, width: int, height: int,
              count: int, crop_box=None, kind: str = "video") -> str:
    from medclaw.requests.conversation import media_uuid

    uuid = f"{media_uuid(video.sha256, first, last, fps, width * height)}:n{count}:{width}x{height}"
    if crop_box is not None:
        uuid += ":crop" + ",".join(f"{v:.4f}" for v in crop_box)
    return uuid if kind == "video" else f"{uuid}:{kind}"


async def load_clip(ctx: ToolContext, plan, crop_box=None) -> Clip:
    """Decode `plan` (a FramePlan), charge its tokens, and return the clip with its evidence."""
    video = ctx.video
    # aget: a decode waiting for another one of this video waits without holding a thread
    frames = await ctx.frames.aget(video, plan, crop_box)                  # (T, H, W, 3) uint8
    count, height, width = int(frames.shape[0]), int(frames.shape[1]), int(frames.shape[2])
    indices = [int(i) for i in plan.frame_indices]
    timestamps = [float(t) for t in plan.timestamps_s]
    if count != len(indices):
        raise RuntimeError(f"decoder returned {count} frames for a plan of {len(indices)}")
    media = MediaItem(
        kind="video",
        uuid=clip_uuid(video, indices[0], indices[-1], plan.fps, width, height, count, crop_box),
        frames=frames, fps=float(plan.fps), frame_indices=indices, timestamps_s=timestamps,
        source_fps=video.fps, source_num_frames=video.num_frames)
    refs = [FrameRef(video.sha256, i, t, width, height, crop_box) for i, t in zip(indices, timestamps)]
    ctx.visual_tokens_used += int(plan.num_visual_tokens)
    return Clip(media, refs, int(plan.num_visual_tokens),
                Window(float(plan.start_s), float(plan.end_s)))


async def load_frame(ctx: ToolContext, role: str, time_s: float,
                     crop_box: tuple[float, float, float, float] | None = None) -> Clip:
    """One still (optionally a normalised region of it) at the role's image pixel budget.

    A region keeps its source resolution when that fits the budget — zooming in means spending the
    pixel budget on the region instead of the whole frame — and is never shrunk below min_pixels.
    """
    video = ctx.video
    spec = spec_for(ctx, role)
    index = frame_index_at(video, time_s)
    src_w, src_h = video.width, video.height
    if crop_box is not None:
        x1, y1, x2, y2 = crop_box
        src_w, src_h = (x2 - x1) * video.width, (y2 - y1) * video.height
        if min(src_w, src_h) < MIN_CROP_SOURCE_PX:
            raise ToolError(f"region {crop_box} is only {src_w:.0f}×{src_h:.0f} source pixels; "
                            f"choose a region at least {MIN_CROP_SOURCE_PX} pixels on each side")
    src_w, src_h = max(1, round(src_w)), max(1, round(src_h))
    width, height = image_size(src_w, src_h, spec.min_pixels, spec.max_pixels)
    available = tokens_available(ctx, spec, 0, ctx.reply_tokens(FRAME_MAX_TOKENS))
    if image_tokens(width, height) > available:
        # budget short: spend what is left, but never go below the model's min_pixels
        cap = max(spec.min_pixels, available * PATCH * PATCH)
        width, height = image_size(src_w, src_h, spec.min_pixels, cap)
    tokens = image_tokens(width, height)
    if tokens > available:
        raise VisualBudgetError(_budget_message(ctx))
    frame = await ctx.frames.aget_frame(video, index, width, height, crop_box)
    height, width = int(frame.shape[0]), int(frame.shape[1])                  # (H, W, 3) uint8
    timestamp = frame_time_s(video, index)                                  # the frame's pts
    media = MediaItem(
        kind="image", uuid=clip_uuid(video, index, index, video.fps, width, height, 1, crop_box,
                                     kind="image"),
        frames=frame, frame_indices=[index], timestamps_s=[timestamp],
        source_fps=video.fps, source_num_frames=video.num_frames)
    ctx.visual_tokens_used += tokens
    return Clip(media, [FrameRef(video.sha256, index, timestamp, width, height, crop_box)], tokens)
