"""`crop_video_frame(time_s, x1, y1, x2, y2, query)`: zoom on a region of one frame.

The region is normalised to the frame: (0, 0) top-left, (1, 1) bottom-right; x1 < x2 and y1 < y2
or the model gets an error observation. The frame verifier sees the region at its source resolution
(within its pixel budget), i.e. the budget goes to the region instead of the whole frame.
"""
from __future__ import annotations

from medclaw.tools.base import Tool, ToolContext, ToolError
from medclaw.tools.schema import object_schema, text_field, time_field, unit_field
from medclaw.tools.select_video_frame import describe_frame
from medclaw.types import Observation


class CropVideoFrameTool(Tool):
    name = "crop_video_frame"
    description = ("Zoom on a region of the frame at time_s: x1, y1, x2, y2 are fractions of the "
                   "frame width/height (0 = left/top, 1 = right/bottom), x1 < x2, y1 < y2.")
    parameters = object_schema({
        "time_s": time_field("time of the frame, seconds from the video start"),
        "x1": unit_field("left edge, fraction of width"),
        "y1": unit_field("top edge, fraction of height"),
        "x2": unit_field("right edge, fraction of width"),
        "y2": unit_field("bottom edge, fraction of height"),
        "query": text_field("what to check in the region"),
    })

    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        x1, y1, x2, y2 = (float(args[k]) for k in ("x1", "y1", "x2", "y2"))
        if not (x1 < x2 and y1 < y2):
            raise ToolError(f"region needs x1 < x2 and y1 < y2, got x {x1:g}-{x2:g}, y {y1:g}-{y2:g}")
        return await describe_frame(self.name, ctx, float(args["time_s"]), args["query"],
                                    (x1, y1, x2, y2))
