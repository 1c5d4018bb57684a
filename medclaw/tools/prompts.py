"""Prompt texts of the sub-agents behind the tools (video expert, frame verifier).

Layout rule (docs/architecture.md, KV-cache reuse): system prompt → media → stable instructions → the query,
with the query LAST. Everything before the query depends only on the video (its duration, the
sampling), so two questions about one video share the whole prefix up to the query. Nothing here
may contain per-call noise (clock time, request ids, budget left).

Times go to the models as `mm:ss.s` (timeline.format_time) and are read back by timeline.py, which
tolerates the other shapes models answer in.
"""
from __future__ import annotations

from medclaw.tools.timeline import Window, format_time

# --- sampling per sub-agent call (completion tokens) ----------------------------------------------
TIMELINE_MAX_TOKENS = 1024      # stage 1 and crop_video: a dense timeline is long
REFINE_MAX_TOKENS = 256         # stage 2: one window and a sentence
FRAME_MAX_TOKENS = 384          # one frame / one region described

VIDEO_EXPERT_SYSTEM = (
    "You are an expert surgical video analyst. You watch laparoscopic and open procedure videos "
    "and describe precisely what happens and when: phases, instruments, anatomy, actions, "
    "bleeding, adverse events. You give every time as mm:ss.s in the video's own clock and never "
    "invent events you cannot see."
)

FRAME_VERIFIER_SYSTEM = (
    "You are an expert surgical image analyst. You look at one still frame (or a zoomed region of "
    "it) from a surgical video and describe exactly what is visible: instruments, anatomy, tissue "
    "state, clips, bleeding, text overlays. Say plainly when something cannot be seen."
)


def stage1_instructions(duration_s: float) -> str:
    """The stable text between the whole-video media and the query (depends on the video only)."""
    return (
        f"The video above is the whole procedure, {format_time(duration_s)} long, sampled at low "
        "resolution.\n"
        "First write a dense timeline covering the whole video: one line per interval, in order, "
        "each line exactly `[mm:ss.s-mm:ss.s] short description`.\n"
        "Then, on the last line, give the interval most relevant to the query as "
        "`WINDOW: [mm:ss.s-mm:ss.s]`.\n"
    )


def stage1_query(query: str) -> str:
    return f"Query: {query.strip()}"


def stage2_prompt(search: Window, query: str) -> str:
    """Stage 2 user turn (after the window clip). Repeats the query: the turn must stand alone."""
    return (
        f"The clip above re-watches {search} of the video at higher resolution. Its times are "
        f"video times: it starts at {format_time(search.start_s)} and ends at "
        f"{format_time(search.end_s)}.\n"
        "Give the tightest interval that contains the event the query asks about, as "
        "`WINDOW: [mm:ss.s-mm:ss.s]` in video time, then one sentence on what happens in it.\n"
        f"Query: {query.strip()}"
    )


def crop_video_prompt(window: Window, query: str) -> str:
    return (
        f"The clip above shows {window} of the video. Describe it densely: one line per "
        "interval, in order, each line exactly `[mm:ss.s-mm:ss.s] description`, in video time "
        f"(the clip starts at {format_time(window.start_s)}). Focus on what the query needs.\n"
        f"Query: {query.strip()}"
    )


def frame_prompt(time_s: float, frame_index: int, query: str) -> str:
    return (
        f"The image is the frame at {format_time(time_s)} (frame {frame_index}) of the video.\n"
        f"Query: {query.strip()}"
    )


def region_prompt(time_s: float, frame_index: int, box: tuple[float, float, float, float],
                  query: str) -> str:
    x1, y1, x2, y2 = box
    return (
        f"The image is a zoomed region of the frame at {format_time(time_s)} (frame "
        f"{frame_index}): x {x1:.2f}-{x2:.2f}, y {y1:.2f}-{y2:.2f} of the frame (0 = left/top, "
        "1 = right/bottom).\n"
        f"Query: {query.strip()}"
    )
