"""`crop_video(start_s, end_s, query)`: a dense, timestamped description of one range.

The video expert watches [start_s, end_s] at crop resolution (its ModelSpec budgets over the range
only, so a short range gets more pixels per frame than the whole-video pass) and writes one
`[mm:ss.s-mm:ss.s] description` line per interval. Times it gives in clip time (the clip reaches
the model as a video starting at 0) are shifted into video time. A reply with no readable times is
passed on verbatim, flagged, rather than dropped; an empty reply is an error observation.
"""
from __future__ import annotations

from medclaw.tools import prompts
from medclaw.tools.base import Tool, ToolContext, ToolError, error_observation
from medclaw.tools.media import backend_for, check_window, load_clip, plan_clip
from medclaw.tools.schema import object_schema, text_field, time_field
from medclaw.tools.timeline import Window, parse_timeline, resolve_clip_timeline, strip_reasoning
from medclaw.tools.view_full_video import MAX_TIMELINE_LINES, excerpt
from medclaw.types import Observation

ROLE = "video_expert"
RAW_CHARS = 1500


class CropVideoTool(Tool):
    name = "crop_video"
    description = ("Watch one time range of the video at higher resolution and get a dense, "
                   "timestamped description of it. Times are seconds from the video start.")
    parameters = object_schema({
        "start_s": time_field("range start, seconds"),
        "end_s": time_field("range end, seconds (after start_s)"),
        "query": text_field("what to look for in this range"),
    })

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        from medclaw.requests.conversation import Conversation

        query = args["query"].strip()
        if not query:
            raise ToolError("the query is empty")
        window = check_window(ctx.video, float(args["start_s"]), float(args["end_s"]))
        backend = await backend_for(ctx, ROLE)
        reply_tokens = ctx.reply_tokens(prompts.TIMELINE_MAX_TOKENS)
        plan = plan_clip(ctx, ROLE, window, max_tokens=reply_tokens)
        clip = await load_clip(ctx, plan)
        window = clip.window or window
        conversation = Conversation(system=prompts.VIDEO_EXPERT_SYSTEM)
        conversation.add_user(prompts.crop_video_prompt(window, query), media=[clip.media])
        result = await backend.generate_one(
            conversation.to_request(max_tokens=reply_tokens, temperature=0.0))
        answer = strip_reasoning(result.text)
        if not answer.strip():
            return error_observation(
                self.name, f"the video expert returned an empty description for "
                f"{window.seconds()}; try again with a narrower range or another query",
                frames=clip.frames, model_calls=[result])
        timeline = parse_timeline(result.text)
        basis = resolve_clip_timeline(timeline, window)
        size = f"{clip.frames[0].width}x{clip.frames[0].height}"
        lines = [f"Clip {window.seconds()} ({len(clip.frames)} frames at {size}):"]
        if timeline.entries:
            lines += [f"{Window(e.start_s, e.end_s).seconds()} {e.text}".rstrip()
                      for e in timeline.entries[:MAX_TIMELINE_LINES]]
            if basis == "clip":
                lines.append("(times were given relative to the clip; shifted to video time)")
            if timeline.unparsed:
                lines.append("Other remarks: " + "; ".join(excerpt(u, 120) for u in timeline.unparsed[:5]))
        else:
            raw = answer if len(answer) <= RAW_CHARS else answer[:RAW_CHARS] + "…"
            lines.append("(the description had no readable timestamps; verbatim:)")
            lines.append(raw)
        return Observation(
            text="\n".join(lines), frames=list(clip.frames), model_calls=[result],
            data={"window": [window.start_s, window.end_s],
                  "timeline": [e.to_dict() for e in timeline.entries],
                  "unparsed": list(timeline.unparsed), "time_basis": basis})
