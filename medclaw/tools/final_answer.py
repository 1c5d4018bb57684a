"""`final_answer(text, evidence_times)`: the orchestrator's last action.

It runs no model. The observation marks the episode final (`data["is_final"]`) and carries the
answer and the evidence times the orchestrator cites, so the trace can tie the answer to the frames
seen at those times. Evidence times past the video's end are a model mistake: error observation,
the episode goes on.
"""
from __future__ import annotations

from medclaw.tools.base import Tool, ToolContext, ToolError
from medclaw.tools.schema import MAX_ANSWER_CHARS, MAX_EVIDENCE_TIMES, object_schema, text_field, time_field
from medclaw.types import Observation


class FinalAnswerTool(Tool):
    name = "final_answer"
    description = ("Give the final answer to the question and end the episode. Cite the video "
                   "times (seconds) that support it in evidence_times.")
    parameters = object_schema({
        "text": text_field("the answer, as you would tell the clinician", MAX_ANSWER_CHARS),
        "evidence_times": {
            "type": "array", "maxItems": MAX_EVIDENCE_TIMES,
            "items": time_field("a supporting time in seconds"),
            "description": "times (seconds) in the video that support the answer",
        },
    })

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        answer = args["text"].strip()
        if not answer:
            raise ToolError("the answer text is empty")
        times = [float(t) for t in args.get("evidence_times", [])]
        duration = ctx.video.duration_s
        # `not t <= duration` also catches NaN, which an unconstrained model can write as JSON
        # (`NaN` parses) and which the schema's bounds let through.
        outside = [t for t in times if not t <= duration]
        if outside:
            raise ToolError(f"evidence times {', '.join(f'{t:g} s' for t in outside)} are past the "
                            f"end of the video ({duration:.1f} s)")
        cited = ", ".join(f"{t:.2f} s" for t in times) or "none"
        return Observation(
            text=f"Final answer recorded (evidence at {cited}).",
            data={"is_final": True, "answer": answer, "evidence_times": times},
        )
