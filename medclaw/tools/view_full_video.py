"""`view_full_video(query)`: coarse-to-fine localisation over the whole video, in two stages.

Stage 1 — the video expert watches the WHOLE video at low resolution (its ModelSpec's fps and
pixel budgets; `total_pixels` spread over many frames is what makes it low resolution) and writes
a dense timeline (`[mm:ss.s-mm:ss.s] description` lines) and a candidate window for the query.
Prompt layout: system → whole-video media → stable instructions → query LAST, so every question
on the same video shares the prefix up to the query (same media uuid, same text).

Stage 2 — the candidate widened by ±25 % (at least `MIN_PAD_S` a side, clamped to the video) is
re-watched at higher resolution (fewer frames under the same `total_pixels`) by CONTINUING the
stage-1 conversation: stage-1 reply appended as the assistant turn, then a user turn with the
window clip. The stage-2 prompt therefore starts with the stage-1 prompt verbatim and vLLM's prefix
cache serves it. The reply gives the tightest sub-window containing the event.

The observation tells the orchestrator plainly what could not be read: no candidate → timeline
only; no (or out-of-window) refined window → falls back to the candidate window; nothing readable
at all → error observation with an excerpt of the reply.
"""
from __future__ import annotations

from medclaw.tools import prompts
from medclaw.tools.base import Tool, ToolContext, ToolError, error_observation
from medclaw.tools.media import VisualBudgetError, backend_for, load_clip, plan_clip
from medclaw.tools.schema import object_schema, text_field
from medclaw.tools.timeline import (Timeline, Window, parse_timeline, parse_window,
                                    resolve_clip_window, strip_reasoning)
from medclaw.types import Observation

ROLE = "video_expert"
WIDEN_FRACTION = 0.25
MIN_PAD_S = 3.0
MAX_TIMELINE_LINES = 120          # bound the observation (and the orchestrator's context)
EXCERPT_CHARS = 300
STAGE1_SHARE = 0.75               # of a binding visual budget; the rest is kept for stage 2


def widen(candidate: Window, duration_s: float) -> Window:
    """The stage-2 search window: candidate ± max(25 %, MIN_PAD_S), clamped to [0, duration]."""
    pad = max(WIDEN_FRACTION * candidate.duration_s, MIN_PAD_S)
    return Window(max(0.0, candidate.start_s - pad), min(duration_s, candidate.end_s + pad))


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


class ViewFullVideoTool(Tool):
    name = "view_full_video"
    description = ("Watch the whole video at low resolution: returns a dense timeline of the "
                   "procedure and the time window most relevant to the query, refined by "
                   "re-watching that window at higher resolution. Use it first to localise events.")
    parameters = object_schema({"query": text_field("what to find or localise in the video")})

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        from medclaw.requests.conversation import Conversation

        query = args["query"].strip()
        if not query:
            raise ToolError("the query is empty")
        video = ctx.video
        whole = Window(0.0, video.duration_s)
        backend = await backend_for(ctx, ROLE)

        # --- stage 1: whole video, low resolution -------------------------------------------
        timeline_tokens = ctx.reply_tokens(prompts.TIMELINE_MAX_TOKENS)
        plan1 = plan_clip(ctx, ROLE, whole, max_tokens=timeline_tokens,
                          share=STAGE1_SHARE)
        clip1 = await load_clip(ctx, plan1)
        conversation = Conversation(system=prompts.VIDEO_EXPERT_SYSTEM)
        conversation.add_user(prompts.stage1_instructions(video.duration_s)
                              + prompts.stage1_query(query), media=[clip1.media])
        stage1 = await backend.generate_one(
            conversation.to_request(max_tokens=timeline_tokens, temperature=0.0))
        timeline = parse_timeline(stage1.text)
        raw_candidate = parse_window(stage1.text, require_label=True)
        candidate = raw_candidate.clamp(0.0, video.duration_s) if raw_candidate else None
        report = _Report(timeline=timeline, clip1_frames=len(clip1.frames),
                         clip1_size=(clip1.frames[0].width, clip1.frames[0].height))
        obs = Observation(text="", frames=list(clip1.frames), model_calls=[stage1])

        if candidate is None:
            if not timeline.entries:
                return error_observation(
                    self.name, "the video expert's reply had neither a timeline nor a window: "
                    f"{excerpt(strip_reasoning(stage1.text)) or '(empty)'}",
                    frames=clip1.frames, model_calls=[stage1])
            report.candidate_note = (
                "not given — the video expert named no readable window"
                + (f" ({raw_candidate.seconds()} is outside the video)" if raw_candidate else "")
                + "; pick a range from the timeline and use crop_video")
            return report.finish(obs)
        report.candidate = candidate

        # --- stage 2: widened window, higher resolution, same conversation -------------------
        search = widen(candidate, video.duration_s)
        conversation.add_assistant(stage1.text)
        context_tokens = max(stage1.num_prompt_tokens, clip1.num_visual_tokens) \
            + stage1.num_completion_tokens
        refine_tokens = ctx.reply_tokens(prompts.REFINE_MAX_TOKENS)
        try:
            plan2 = plan_clip(ctx, ROLE, search, context_tokens=context_tokens,
                              max_tokens=refine_tokens)
        except VisualBudgetError as err:
            report.refined_note = f"not refined ({err}); using the candidate window"
            report.window, report.window_source = candidate, "candidate"
            return report.finish(obs)
        clip2 = await load_clip(ctx, plan2)
        search = clip2.window or search
        report.search, report.clip2_frames = search, len(clip2.frames)
        report.clip2_size = (clip2.frames[0].width, clip2.frames[0].height)
        conversation.add_user(prompts.stage2_prompt(search, query), media=[clip2.media])
        stage2 = await backend.generate_one(
            conversation.to_request(max_tokens=refine_tokens, temperature=0.0))
        obs.frames.extend(clip2.frames)
        obs.model_calls.append(stage2)

        refined, basis = resolve_clip_window(parse_window(stage2.text), search)
        if refined is None:
            report.refined_note = (f"not readable ({basis}; the reply was: "
                                   f"{excerpt(strip_reasoning(stage2.text)) or '(empty)'}); "
                                   "using the candidate window instead")
            report.window, report.window_source = candidate, "candidate"
        else:
            report.refined, report.refined_basis = refined, basis
            report.refined_summary = _summary(stage2.text)
            report.window, report.window_source = refined, "refined"
        return report.finish(obs)


def _summary(text: str) -> str:
    """The stage-2 sentence: the reply without its WINDOW line."""
    lines = [line for line in strip_reasoning(text).splitlines()
             if line.strip() and not line.strip().upper().startswith("WINDOW")]
    return excerpt(" ".join(lines))


class _Report:
    """Collects what each stage found and renders the observation text + data once."""

    def __init__(self, timeline: Timeline, clip1_frames: int, clip1_size: tuple[int, int]):
        self.timeline = timeline
        self.clip1_frames, self.clip1_size = clip1_frames, clip1_size
        self.candidate: Window | None = None
        self.candidate_note = ""
        self.search: Window | None = None
        self.clip2_frames, self.clip2_size = 0, (0, 0)
        self.refined: Window | None = None
        self.refined_basis = ""
        self.refined_summary = ""
        self.refined_note = ""
        self.window: Window | None = None
        self.window_source: str | None = None

    def finish(self, obs: Observation) -> Observation:
        lines = [f"Timeline of the whole video ({self.clip1_frames} frames at "
                 f"{self.clip1_size[0]}x{self.clip1_size[1]}):"]
        entries = self.timeline.entries
        for e in entries[:MAX_TIMELINE_LINES]:
            lines.append(f"{Window(e.start_s, e.end_s).seconds()} {e.text}".rstrip())
        if len(entries) > MAX_TIMELINE_LINES:
            lines.append(f"… {len(entries) - MAX_TIMELINE_LINES} more timeline lines omitted")
        if not entries:
            lines.append("(no readable timeline lines)")
        if self.timeline.unparsed:
            shown = "; ".join(excerpt(u, 80) for u in self.timeline.unparsed[:5])
            lines.append(f"Lines without readable times ({len(self.timeline.unparsed)}): {shown}")
        if self.candidate is not None:
            lines.append(f"Candidate window: {self.candidate.seconds()}")
        else:
            lines.append(f"Candidate window: {self.candidate_note}")
        if self.refined is not None:
            basis = "" if self.refined_basis == "video" else f" (read as {self.refined_basis} time)"
            lines.append(f"Refined window: {self.refined.seconds()}{basis} — re-watched "
                         f"{self.search.seconds()} "
                         f"({self.clip2_frames} frames at {self.clip2_size[0]}x{self.clip2_size[1]})"
                         + (f": {self.refined_summary}" if self.refined_summary else ""))
        elif self.refined_note:
            lines.append(f"Refined window: {self.refined_note}")
        if self.window is not None:
            lines.append(f"Best window: {self.window.seconds()}")
        obs.text = "\n".join(lines)
        obs.data = {
            "timeline": [e.to_dict() for e in entries],
            "unparsed": list(self.timeline.unparsed),
            "candidate_window": _pair(self.candidate),
            "search_window": _pair(self.search),
            "refined_window": _pair(self.refined),
            "window": _pair(self.window),
            "window_source": self.window_source,
            "stage_frames": [self.clip1_frames] + ([self.clip2_frames] if self.clip2_frames else []),
        }
        return obs


def _pair(window: Window | None) -> list[float] | None:
    return None if window is None else [window.start_s, window.end_s]
