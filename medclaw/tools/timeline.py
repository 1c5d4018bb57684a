"""Tolerant parsing of timestamps and time windows out of free VLM text.

Sub-agent models (Qwen2.5-VL, Video-R1) are asked for lines like `[mm:ss-mm:ss] description`, but
they answer in many shapes: `[00:12-00:30]`, `12.5s - 30s`, `from 1:02 to 1:10`, `1m02s–1m10s`,
`{"start": 12, "end": 30}`, wrapped in `<think>…</think><answer>…</answer>` or not. This module
turns such text into structured entries and reports plainly what it could not read, so the tool can
tell the orchestrator instead of guessing.

Contract:
    parse_timestamp(text) -> float | None        one time, in seconds
    find_windows(text, *, lenient=False) -> list[Window]   every `A <sep> B` window, in order
    parse_window(text) -> Window | None          the window a reply designates (labelled line first)
    parse_timeline(text) -> Timeline             one entry per line that starts with a time/window
    strip_reasoning(text) -> str                 drop <think>…</think>, unwrap <answer>…</answer>
    format_time(seconds) -> "mm:ss.s" / "h:mm:ss"

Bare numbers ("12 - 30") are ambiguous in prose ("steps 1-2"), so they count as a window only when
`lenient=True` (a line labelled as the window, a bracketed span) — times with a colon or a unit
("12s", "1:02", "2 min") always count.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from medclaw.requests.output_format import split_think_answer

# One time value. Alternatives, most specific first:
#   h:mm:ss(.f) | m:ss(.f) | 1h2m3s / 1m02s / 2min / 12.5s / 12.5 seconds | bare number
_UNIT_S = r"(?:s|sec|secs|second|seconds)"
_UNIT_M = r"(?:m|min|mins|minute|minutes)"
_UNIT_H = r"(?:h|hr|hrs|hour|hours)"
_NUM = r"\d+(?:\.\d+)?"
_TIME = (
    rf"(?:\d+:\d{{1,2}}:\d{{1,2}}(?:\.\d+)?"                          # h:mm:ss
    rf"|\d+:\d{{1,2}}(?:\.\d+)?"                                      # m:ss
    rf"|(?:{_NUM}\s*{_UNIT_H}\s*)?(?:{_NUM}\s*{_UNIT_M}\s*)?{_NUM}\s*{_UNIT_S}\b"  # [h][m]s
    rf"|(?:{_NUM}\s*{_UNIT_H}\s*)?{_NUM}\s*{_UNIT_M}\b"               # [h]m
    rf"|{_NUM}\s*{_UNIT_H}\b"                                         # h
    rf"|{_NUM})"                                                      # bare seconds
)
_SEP = r"(?:-{1,2}|–|—|~|to|until|till|through|and)"
_WINDOW_RE = re.compile(
    rf"(?<![\w.:])(?:from\s+|between\s+)?(?P<a>{_TIME})\s*{_SEP}\s*(?P<b>{_TIME})(?!\w|:\d|\.\d)",
    re.IGNORECASE)
_TIME_RE = re.compile(rf"(?<![\w.:])(?P<t>{_TIME})(?!\w|:\d|\.\d)", re.IGNORECASE)
_COMPONENT_RE = re.compile(rf"({_NUM})\s*({_UNIT_H}|{_UNIT_M}|{_UNIT_S})(?![a-z])", re.IGNORECASE)
# Lines that name the window the reply designates, e.g. "WINDOW: [01:02-01:10]", "Answer: 12-30".
_LABEL_RE = re.compile(
    r"^\W*(?:refined\s+|candidate\s+|event\s+|tightest\s+)?"
    r"(?:window|answer|interval|segment|range|span)\b[^:\n\d]{0,20}:", re.IGNORECASE)
_JSON_KEYS = (("start_s", "end_s"), ("start", "end"), ("start_time", "end_time"), ("from", "to"))
_ENTRY_PREFIX_RE = re.compile(r"^\s*(?:[-*•]\s*|\d+[.)]\s+)?[\[(]?\s*")


@dataclass(slots=True, frozen=True)
class Window:
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def clamp(self, lo: float, hi: float) -> Window | None:
        """The part of this window inside [lo, hi], or None when they do not overlap."""
        start, end = max(lo, self.start_s), min(hi, self.end_s)
        return Window(start, end) if end >= start else None

    def __str__(self) -> str:
        """`[mm:ss.s-mm:ss.s]`: how windows are written to the VLMs (and read back)."""
        return f"[{format_time(self.start_s)}-{format_time(self.end_s)}]"

    def seconds(self) -> str:
        """`[12.0-30.5 s]`: how windows are written to the orchestrator, whose tools take seconds."""
        return f"[{self.start_s:.1f}-{self.end_s:.1f} s]"


@dataclass(slots=True, frozen=True)
class TimelineEntry:
    start_s: float
    end_s: float               # == start_s for a point ("[00:12] …")
    text: str

    def to_dict(self) -> dict:
        return {"start_s": self.start_s, "end_s": self.end_s, "text": self.text}


@dataclass(slots=True)
class Timeline:
    entries: list[TimelineEntry] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)   # non-empty lines with no leading time


def strip_reasoning(text: str) -> str:
    """Drop `<think>…</think>` (an unclosed one swallows the rest) and unwrap `<answer>…</answer>`:
    the answer part of the one `<think>/<answer>` parser, `requests.output_format`."""
    return split_think_answer(text).answer


def _is_bare(token: str) -> bool:
    return re.fullmatch(_NUM, token.strip()) is not None


def parse_timestamp(text: str) -> float | None:
    """Seconds for one time token ("1:02", "01:02:03.5", "12.5s", "1m02s", "2 min", "42"), else None."""
    token = text.strip().lower()
    if not token:
        return None
    if ":" in token:
        parts = token.split(":")
        if len(parts) > 3 or not all(re.fullmatch(r"\d+(?:\.\d+)?", p) for p in parts):
            return None
        if any("." in p for p in parts[:-1]):
            return None
        seconds = 0.0
        for p in parts:
            seconds = seconds * 60 + float(p)
        # "1:75" is not a time; the leading field is free (minutes may exceed 59 in m:ss).
        if len(parts) >= 2 and float(parts[-1]) >= 60:
            return None
        if len(parts) == 3 and int(parts[1]) >= 60:
            return None
        return seconds
    if _is_bare(token):
        return float(token)
    components = _COMPONENT_RE.findall(token)
    if not components or _COMPONENT_RE.sub("", token).strip():
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(v) * scale[u[0]] for v, u in components)


def find_windows(text: str, *, lenient: bool = False) -> list[Window]:
    """Every `time <sep> time` window in `text`, in order. Reversed windows are put in order."""
    windows = []
    for m in _WINDOW_RE.finditer(text):
        a, b = m.group("a"), m.group("b")
        if not lenient and _is_bare(a) and _is_bare(b):
            continue
        ta, tb = parse_timestamp(a), parse_timestamp(b)
        if ta is None or tb is None:
            continue
        # "1:02-10s" style mixes are fine; a bare number next to an m:ss reads as seconds.
        windows.append(Window(min(ta, tb), max(ta, tb)))
    return windows


def _window_from_json(text: str) -> Window | None:
    for m in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        for start_key, end_key in _JSON_KEYS:
            if start_key in obj and end_key in obj:
                ta, tb = (_json_time(obj[start_key]), _json_time(obj[end_key]))
                if ta is not None and tb is not None:
                    return Window(min(ta, tb), max(ta, tb))
    return None


def _json_time(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        return parse_timestamp(value)
    return None


def parse_window(text: str, *, require_label: bool = False) -> Window | None:
    """The window a reply designates.

    Order of preference: a JSON object with start/end keys; a line labelled "window:"/"answer:"
    (bare numbers allowed there; a single time there is a zero-length window); the last window anywhere in the (reasoning-stripped) text with a
    colon or unit. The *last* one, because models restate the question's range before answering.
    `require_label=True` stops after the labelled lines: for replies that also hold a timeline,
    whose every line is a window too.
    """
    body = strip_reasoning(text)
    from_json = _window_from_json(body)
    if from_json is not None:
        return from_json
    for line in reversed(body.splitlines()):
        label = _LABEL_RE.match(line)
        if label:
            rest = line[label.end():]
            found = find_windows(rest, lenient=True)
            if found:
                return found[-1]
            point = _TIME_RE.search(rest)        # "WINDOW: 00:20" — a moment, not a span
            if (point is not None and not _is_bare(point.group("t"))
                    and (t := parse_timestamp(point.group("t"))) is not None):
                return Window(t, t)
    if require_label:
        return None
    found = find_windows(body)
    if not found:
        # A lone bracketed span like "[12-30]" is a clear enough window.
        bracketed = [w for seg in re.findall(r"[\[(]([^\[\]()]*)[\])]", body)
                     for w in find_windows(seg, lenient=True)]
        found = bracketed
    return found[-1] if found else None


def parse_timeline(text: str) -> Timeline:
    """One entry per line that *starts* with a window or a time; other non-empty lines are unparsed.

    Labelled lines ("WINDOW: …") are not timeline entries and are skipped silently (the caller reads
    them with `parse_window`). Entries come back sorted by start time.
    """
    timeline = Timeline()
    for raw in strip_reasoning(text).splitlines():
        line = raw.strip()
        if not line or _LABEL_RE.match(line) or line.lower().startswith(("timeline", "```")):
            continue
        prefix = _ENTRY_PREFIX_RE.match(line)
        rest = line[prefix.end():] if prefix else line
        entry = _leading_entry(rest)
        if entry is None:
            timeline.unparsed.append(line)
        else:
            timeline.entries.append(entry)
    timeline.entries.sort(key=lambda e: (e.start_s, e.end_s))
    return timeline


def _leading_entry(rest: str) -> TimelineEntry | None:
    m = _WINDOW_RE.match(rest)
    if m is not None:
        ta, tb = parse_timestamp(m.group("a")), parse_timestamp(m.group("b"))
        if ta is not None and tb is not None:
            return TimelineEntry(min(ta, tb), max(ta, tb), _clean_description(rest[m.end():]))
    m = _TIME_RE.match(rest)
    if m is not None:
        t = parse_timestamp(m.group("t"))
        # A bare leading number ("3 graspers visible") is not a timestamp.
        if t is not None and not _is_bare(m.group("t")):
            return TimelineEntry(t, t, _clean_description(rest[m.end():]))
    return None


def _clean_description(text: str) -> str:
    return re.sub(r"^[\s\])]*[:\-–—|,]*\s*", "", text).strip()


def format_time(seconds: float) -> str:
    """`mm:ss.s` below an hour, `h:mm:ss.s` above; the format `parse_timestamp` reads back."""
    seconds = max(0.0, float(seconds))
    hours, rem = divmod(seconds, 3600)
    minutes, secs = divmod(rem, 60)
    secs_text = f"{secs:04.1f}"
    if secs_text == "60.0":      # rounding carried over
        return format_time(round(seconds, 1))
    if hours >= 1:
        return f"{int(hours)}:{int(minutes):02d}:{secs_text}"
    return f"{int(minutes):02d}:{secs_text}"


# --- clip time → video time -------------------------------------------------------------------------
# A clip of a longer video reaches the model as a video of its own (its first frame at t=0), so a
# model may answer in clip time although it was asked for video time. Prefer video time; read the
# answer as clip time only when it does not fit the clip in video time but does fit in clip time.
TIME_TOLERANCE_S = 0.5


def resolve_clip_window(window: Window | None, clip: Window) -> tuple[Window | None, str]:
    """`window` in video time, and how it was read: "video", "clip" (shifted) or why not."""
    if window is None:
        return None, "no window given"
    tol = TIME_TOLERANCE_S
    if window.start_s >= clip.start_s - tol and window.end_s <= clip.end_s + tol:
        return window.clamp(clip.start_s, clip.end_s), "video"
    if window.end_s <= clip.duration_s + tol:
        shifted = Window(window.start_s + clip.start_s, window.end_s + clip.start_s)
        return shifted.clamp(clip.start_s, clip.end_s), "clip"
    inside = window.clamp(clip.start_s, clip.end_s)
    if inside is not None and inside.duration_s > 0:
        return inside, "video (clipped to the window)"
    return None, f"{window} is outside the re-watched window {clip}"


def resolve_clip_timeline(timeline: Timeline, clip: Window) -> str:
    """Shift `timeline` into video time in place when it reads as clip time; returns the basis."""
    if not timeline.entries:
        return "video"
    tol = TIME_TOLERANCE_S
    fits_video = all(clip.start_s - tol <= e.start_s and e.end_s <= clip.end_s + tol
                     for e in timeline.entries)
    fits_clip = all(e.end_s <= clip.duration_s + tol for e in timeline.entries)
    if fits_video or not fits_clip:
        return "video"
    timeline.entries = [TimelineEntry(e.start_s + clip.start_s, e.end_s + clip.start_s, e.text)
                        for e in timeline.entries]
    return "clip"
