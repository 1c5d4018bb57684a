"""What the orchestrator reads: the system prompt, the first user turn, and every later turn.

Prefix-cache layout (docs/architecture.md "KV-cache reuse rules"): everything that is the same for every
question goes first and is byte-identical between calls — role and rules, the tool specs with
their JSON schemas, the skill index. Only then the per-episode user turn: video facts, then the
question LAST. Later turns are only ever appended (observations, warnings), never edited, so each
orchestrator call extends the previous prompt and vLLM serves the old part from cache.

Nothing here may depend on time, randomness or dict ordering that is not fixed: `describe_tools`
dumps schemas with sorted keys and the registry's spec order is stable, so the bytes are identical
across runs.
"""
from __future__ import annotations

from medclaw.engine.toolcall import describe_tools
from medclaw.types import Observation, VideoInfo

ROLE = """You are MedClaw, an assistant that answers questions about long surgical videos.
You cannot see the video yourself. You answer by calling tools that run vision-language models on
parts of the video, and by consulting a surgical knowledge base and a skill library.

How to work:
- Localise coarse to fine: look at the whole video first, then a time window, then single frames,
  then a region of a frame. Never look at more than you need.
- Before/after questions ("what happened just before X"): find X first, then look at the window
  adjacent to it (load the skill `directed-relook` for the procedure).
- Load a skill when its trigger matches the question; follow its steps.
- Times are in seconds from the start of the video and must lie within [0, duration].
- When you know the answer, call final_answer with the answer and the evidence times.
- Every reply is exactly ONE JSON object (one tool call) and nothing else."""


def tool_section(tool_specs: list[dict]) -> str:
    """Tool names, descriptions and arg schemas, in the registry's stable order (same bytes)."""
    return describe_tools(tool_specs)


def skill_section(skill_index: str | None) -> str:
    if not skill_index or not skill_index.strip():
        return "Skills: none available."
    return "Skills (load with load_skill by name when the trigger matches):\n" + skill_index.strip()


def build_system_prompt(tool_specs: list[dict], skill_index: str | None = None) -> str:
    """The stable prefix: role, rules, tools, skills. Same bytes for every question."""
    return "\n\n".join([ROLE, tool_section(tool_specs), skill_section(skill_index)])


def build_question_turn(video: VideoInfo, question: str) -> str:
    """The first user turn: video facts first, the question last (it differs most between calls)."""
    return (f"Video: duration {video.duration_s:.2f} s, {video.fps:.3f} fps, {video.num_frames} frames, "
            f"{video.width}x{video.height}.\n"
            f"Question: {question.strip()}")


def format_observation(step_index: int, tool: str | None, obs: Observation,
                       budget_warning: str | None = None) -> str:
    """The user turn that carries a tool's result (or the error the model must fix) back."""
    if obs.error:
        body = (f"Error at step {step_index}"
                f"{' (' + tool + ')' if tool else ''}: {obs.error}\n"
                "Fix the call and reply with one JSON object.")
    else:
        body = f"Observation from {tool} (step {step_index}):\n{obs.text.strip()}"
        if obs.frames:
            times = sorted(f.timestamp_s for f in obs.frames)
            body += (f"\n[evidence: {len(obs.frames)} frame(s), "
                     f"t={times[0]:.2f}-{times[-1]:.2f} s]")
    if budget_warning:
        body += "\n" + budget_warning
    return body


def forced_answer_turn(reason: str) -> str:
    return (f"STOP: {reason}. No more tools. Call final_answer now with your best answer from the "
            "observations so far and the times of the evidence you relied on.")
