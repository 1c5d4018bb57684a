"""What the orchestrator reads during distillation: the diagnosis of a mining episode and the
lesson-writing turn. Stable text first (role, definitions, the tool), the episode's facts last."""
from __future__ import annotations

DIAGNOSE_SYSTEM = """You review how a video question-answering agent worked on one question, after
the fact. The agent cannot see pixels; it calls tools that run vision-language models on the whole
video, a time window, a frame or a region. You now see the reference answer it did not have.

Classify the gap between the agent's answer and the reference as exactly one of:
A  operational: another way of looking would have caught it (a different window, the window
   adjacent to an event, a closer frame or region, another query, a check it skipped);
B  unreachable: the answer depends on narration, intent, pathology or pixels the models cannot
   resolve; no way of looking would have helped;
C  already correct: the answer agrees with the reference.

Reply with one JSON object: {"category": "A" | "B" | "C", "reason": "<one sentence>"}."""

LESSON_SYSTEM = """You maintain the skill library of a video question-answering agent. A skill is a
short procedure (markdown steps that name the agent's tools: view_full_video, crop_video,
select_video_frame, crop_video_frame, search_surgical_kb, load_skill, final_answer) with a one-line
trigger saying when to use it. You turn one lesson from a failed question into a skill.

Read the library first. If a skill already covers the lesson, update it (better steps, a clearer
trigger) instead of creating a near-duplicate. A skill must help on future questions of the same
kind, so write general steps, never this question's answer.

Every reply is exactly ONE JSON object, a call of the tool below:
{"thought": "<short>", "tool": "skill_manage", "args": {...}}"""


def episode_summary(trace, max_steps: int = 12, excerpt_chars: int = 240) -> str:
    """The agent's steps, compactly: tool, arguments, and an excerpt of what came back."""
    import json

    lines = []
    for step in trace.steps[:max_steps]:
        result = step.error or step.observation
        result = " ".join(str(result).split())
        if len(result) > excerpt_chars:
            result = result[:excerpt_chars] + "…"
        args = json.dumps(step.args, ensure_ascii=False, sort_keys=True)
        lines.append(f"{step.index}. {step.tool or '(unparseable output)'} {args} -> "
                     f"{'ERROR ' if step.error else ''}{result}")
    if len(trace.steps) > max_steps:
        lines.append(f"... {len(trace.steps) - max_steps} more step(s)")
    return "\n".join(lines) or "(no steps)"


def diagnose_turn(record, answer: str | None, summary: str) -> str:
    return (f"Agent's steps:\n{summary}\n\n"
            f"Question: {record.question}\n"
            f"Agent's answer: {answer or '(no answer)'}\n"
            f"Reference answer: {record.gold}")


def lesson_turn(record, answer: str | None, reason: str, summary: str, listing: str) -> str:
    return (f"The library now holds (skill_manage list):\n{listing}\n\n"
            f"Lesson to write (category A: {reason})\n"
            f"Agent's steps:\n{summary}\n\n"
            f"Question: {record.question}\n"
            f"Agent's answer: {answer or '(no answer)'}\n"
            f"Reference answer: {record.gold}")
