"""The one-shot baseline: the same VLM sees the whole video once, at the planner's budget, and answers.

    result = await run_oneshot(question, video_info, runtime, config, episode_id=...)  # EpisodeResult

No orchestrator, no tools: the `video_expert` model gets the whole video planned exactly as
`view_full_video`'s first look is (its ModelSpec's fps and pixel budgets, under the episode's
visual-token budget and the model's context), then the question, and answers in one call. It is
asked to end with `EVIDENCE: [mm:ss.s-mm:ss.s]`; that window's ends become the answer's evidence
times (none when it gives no readable window). The episode is written as a trace like any other
(header, one step with the frames and the model call, footer), so the eval runner, the report and
`medclaw trace show` read both modes the same way. Prompt layout follows the KV-cache rules:
system, whole-video media, stable instructions, the question last.
"""
from __future__ import annotations

import asyncio
import time

from medclaw.tools.prompts import VIDEO_EXPERT_SYSTEM
from medclaw.tools.timeline import Window, format_time

ROLE = "video_expert"
TOOL_NAME = "oneshot"
MAX_TOKENS = 512


def instructions(duration_s: float) -> str:
    return (f"The video above is the whole procedure, {format_time(duration_s)} long.\n"
            "Answer the question from what you see, briefly and specifically. Then, on the last "
            "line, give the interval that supports your answer as `EVIDENCE: [mm:ss.s-mm:ss.s]`.\n")


def split_answer(text: str) -> tuple[str, list[float]]:
    """(answer without the EVIDENCE line, [start, end] of that line's window or [])."""
    from medclaw.tools.timeline import find_windows, strip_reasoning

    body = strip_reasoning(text or "")
    kept, times = [], []
    for line in body.splitlines():
        if line.strip().upper().startswith("EVIDENCE"):
            windows = find_windows(line, lenient=True)
            if windows and not times:
                times = [round(windows[0].start_s, 3), round(windows[0].end_s, 3)]
            continue
        kept.append(line)
    return "\n".join(kept).strip(), times


async def run_oneshot(question: str, video, runtime, config, *, episode_id: str):
    """Answer `question` about `video` (a VideoInfo) in one VLM call; returns an EpisodeResult."""
    from medclaw.engine.episode import EpisodeResult
    from medclaw.engine.trace import (Footer, ModelCall, Step, TraceWriter, episode_header,
                                      trace_path_for)
    from medclaw.engine.trace_schema import FrameRef as FrameRecord
    from medclaw.requests.conversation import Conversation
    from medclaw.tools.base import ToolContext
    from medclaw.tools.media import backend_for, load_clip, plan_clip
    from medclaw.types import DEFAULT_SEED

    started = time.monotonic()
    ctx = ToolContext(video=video, question=question, backends=runtime.backends_view(),
                      specs=runtime.specs, frames=runtime.frames,
                      visual_token_budget=config.visual_token_budget,
                      sub_agent_max_tokens=config.sub_agent_max_tokens)
    writer = TraceWriter(trace_path_for(config.trace_dir, episode_id))
    writer.header(episode_header(
        episode_id=episode_id, question=question, video=video, config=config, runtime=runtime,
        system_prompt=VIDEO_EXPERT_SYSTEM, tools=[TOOL_NAME], seed=DEFAULT_SEED))
    steps: list = []
    answer, times, status = None, [], "failed: no answer"
    try:
        backend = await backend_for(ctx, ROLE)
        reply_tokens = ctx.reply_tokens(MAX_TOKENS)
        plan = plan_clip(ctx, ROLE, Window(0.0, video.duration_s), max_tokens=reply_tokens)
        clip = await load_clip(ctx, plan)
        turn = instructions(video.duration_s) + f"Question: {question.strip()}"
        conversation = Conversation(system=VIDEO_EXPERT_SYSTEM)
        conversation.add_user(turn, media=[clip.media])
        request = conversation.to_request(max_tokens=reply_tokens, temperature=0.0,
                                          request_id=f"{episode_id}-oneshot")
        call_started = time.monotonic()
        result = await asyncio.wait_for(backend.generate_one(request), config.max_wall_s)
        answer, times = split_answer(result.text)
        answer = answer or None
        status = "answered" if answer else "failed: the model gave no answer"
        step = Step(index=1, tool=TOOL_NAME, args={"question": question}, prompt_turn=turn,
                    observation=answer or "", error=None if answer else "empty answer",
                    frames=[FrameRecord.model_validate(f) for f in clip.frames],
                    model_calls=[ModelCall.model_validate(result)],
                    data={"window": [0.0, round(video.duration_s, 3)], "evidence_times": times},
                    started_at_s=round(call_started - started, 4),
                    tool_latency_s=round(time.monotonic() - call_started, 4))
        steps.append(step)
        writer.step(step)
    except BaseException as err:
        status = f"failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        writer.footer(Footer(status=status, totals=_totals(steps, ctx, started)))
        raise
    writer.footer(Footer(status=status, answer=answer, evidence_times=times,
                         totals=_totals(steps, ctx, started)))
    totals = _totals(steps, ctx, started)
    return EpisodeResult(answer=answer, status=status, steps=len(steps), trace_path=str(writer.path),
                         episode_id=episode_id, evidence_times=times, totals=totals.to_dict())


def _totals(steps, ctx, started: float):
    from medclaw.engine.trace import compute_totals

    return compute_totals(steps, visual_tokens_used=ctx.visual_tokens_used,
                          wall_s=time.monotonic() - started)
