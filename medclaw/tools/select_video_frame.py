"""`select_video_frame(time_s, query)`: one still frame, described by the frame verifier.

The frame verifier (ModelSpec role "frame_verifier", which may be a different model from the
video expert; it falls back to the video expert's engine when not configured) sees the frame on
screen at `time_s` at its image pixel budget. Times outside [0, duration] → error observation.
"""
from __future__ import annotations

from medclaw.tools import prompts
from medclaw.tools.base import Tool, ToolContext, ToolError, error_observation
from medclaw.tools.media import backend_for, check_time, load_frame
from medclaw.tools.schema import object_schema, text_field, time_field
from medclaw.tools.timeline import strip_reasoning
from medclaw.types import Observation

ROLE = "frame_verifier"


async def describe_frame(tool: str, ctx: ToolContext, time_s: float, query: str,
                         crop_box: tuple[float, float, float, float] | None = None) -> Observation:
    """Decode the frame (or region), ask the frame verifier, build the observation."""
    from medclaw.requests.conversation import Conversation

    query = query.strip()
    if not query:
        raise ToolError("the query is empty")
    time_s = check_time(ctx.video, time_s)
    backend = await backend_for(ctx, ROLE)
    clip = await load_frame(ctx, ROLE, time_s, crop_box)
    ref = clip.frames[0]
    text = (prompts.frame_prompt(ref.timestamp_s, ref.frame_index, query) if crop_box is None
            else prompts.region_prompt(ref.timestamp_s, ref.frame_index, crop_box, query))
    conversation = Conversation(system=prompts.FRAME_VERIFIER_SYSTEM)
    conversation.add_user(text, media=[clip.media])
    result = await backend.generate_one(
        conversation.to_request(max_tokens=ctx.reply_tokens(prompts.FRAME_MAX_TOKENS),
                                temperature=0.0))
    answer = strip_reasoning(result.text).strip()
    if not answer:
        return error_observation(
            tool, f"the frame verifier returned an empty description of the frame at "
            f"{ref.timestamp_s:.2f} s; try another query or time",
            frames=clip.frames, model_calls=[result])
    where = f"frame {ref.frame_index} at {ref.timestamp_s:.2f} s"
    if crop_box is not None:
        where = (f"region x {crop_box[0]:.2f}-{crop_box[2]:.2f}, y {crop_box[1]:.2f}-{crop_box[3]:.2f} "
                 f"of {where}")
    return Observation(
        text=f"{where[0].upper()}{where[1:]} ({ref.width}x{ref.height}): {answer}",
        frames=[ref], model_calls=[result],
        data={"frame_index": ref.frame_index, "timestamp_s": ref.timestamp_s,
              "crop_box": list(crop_box) if crop_box is not None else None})


class SelectVideoFrameTool(Tool):
    name = "select_video_frame"
    description = ("Look closely at the single frame shown at time_s (seconds) and describe what "
                   "the query asks about: instruments, anatomy, clips, bleeding.")
    parameters = object_schema({
        "time_s": time_field("time of the frame, seconds from the video start"),
        "query": text_field("what to check in the frame"),
    })

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        return await describe_frame(self.name, ctx, float(args["time_s"]), args["query"])
