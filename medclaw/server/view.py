"""What the audit viewer shows, computed from a trace: one JSON-able dict, the same for the live
service and for the self-contained HTML file.

    trace = Trace.load(path)                        # the typed trace: the only way traces are read
    view = build_view(trace_record(trace))          # {"episode", "video", "models", "steps", ...}
    step_view(step_row, duration_s)                 # one step's part (what the live stream sends)

Per step: the call (tool, arguments, thought), the observation or error, the orchestrator's and
every sub-agent's model and revision with tokens / cached tokens / latency, the windows of video
time the step inspected or named (the trace's `windows`) and its evidence frames. Each frame is named by a thumbnail key — `"<frame index>"` for the whole frame,
`"<frame index>@x1,y1,x2,y2"` for a zoomed region (`frame_requests` maps keys back to the
trace's exact frame index and crop box); the viewer draws a region as a box on the whole frame and shows the zoom beside
it. A step with many frames (a coarse pass over the whole video) shows at most
`MAX_THUMBS_PER_STEP` of them, evenly spaced, every zoomed region included; the timeline still
marks every frame. The answer's evidence times are each linked to the nearest frame shown.
"""
from __future__ import annotations

MAX_THUMBS_PER_STEP = 24
MAX_TEXT_CHARS = 4000                  # per observation / model reply kept in the view


def trace_record(trace) -> dict:
    """The trace as its JSON record `{"header", "steps", "footer"}` (validated by `Trace.load`)."""
    dump = getattr(trace, "model_dump", None)
    record = dump(mode="json") if callable(dump) else trace.to_dict()
    return {"header": record.get("header") or {}, "steps": list(record.get("steps") or []),
            "footer": record.get("footer")}


def build_view(record: dict) -> dict:
    header, footer = record["header"], record.get("footer")
    video = dict(header.get("video") or {})
    duration = float(video.get("duration_s") or 0.0)
    steps = [step_view(row, duration) for row in record["steps"]]
    view = {
        "episode": {"id": header.get("episode_id"), "question": header.get("question", ""),
                    "created_at": header.get("created_at"), "finished": footer is not None},
        "video": {"name": _basename(video.get("path")), "sha256": video.get("sha256"),
                  "duration_s": duration, "fps": video.get("fps"), "width": video.get("width"),
                  "height": video.get("height"), "num_frames": video.get("num_frames")},
        "models": {role: {"name": m.get("name"), "backend": m.get("backend"),
                          "revision": m.get("revision")}
                   for role, m in (header.get("models") or {}).items()},
        "steps": steps,
        "answer": answer_view(footer, steps),
    }
    return view


def answer_view(footer: dict | None, steps: list[dict]) -> dict | None:
    if footer is None:
        return None
    shown = [f for s in steps for f in s["frames"] if f["shown"]]
    evidence = []
    for t in footer.get("evidence_times") or []:
        nearest = min(shown, key=lambda f: abs(f["timestamp_s"] - float(t)), default=None)
        evidence.append({"time_s": float(t),
                         "frame": None if nearest is None else
                         {"key": nearest["key"], "step": nearest["step"],
                          "timestamp_s": nearest["timestamp_s"]}})
    totals = footer.get("totals") or {}
    return {"text": footer.get("answer"), "status": footer.get("status"),
            "forced_reason": footer.get("forced_reason"), "error": _last_line(footer.get("error")),
            "evidence": evidence,
            "totals": {k: totals.get(k) for k in ("steps", "errors", "unique_frames",
                                                  "visual_tokens_used", "cached_hit_rate", "wall_s")}}


def step_view(row: dict, duration_s: float) -> dict:
    index = int(row.get("index", 0))
    frames = _frames(row.get("frames") or [], index)
    return {
        "index": index,
        "kind": row.get("kind", "action"),
        "tool": row.get("tool"),
        "args": row.get("args") or {},
        "thought": row.get("thought", ""),
        "observation": _clip(row.get("observation", "")),
        "error": row.get("error"),
        "windows": step_windows(row, duration_s),
        "frames": frames,
        "frames_total": len(frames),
        "orchestrator": _call(row.get("orchestrator_call")),
        "calls": [_call(c) for c in row.get("model_calls") or []],
        "started_at_s": row.get("started_at_s"),
        "tool_latency_s": row.get("tool_latency_s"),
    }


# --- windows: what part of the video each step looked at --------------------------------------

# The trace's windows (`TimeWindow`): "inspected" spans of the frames a model was shown, and the
# windows a tool named in its data ("window", "candidate_window", …). Label and drawing style:
WINDOW_LABELS = {"inspected": "frames shown", "window": "best window",
                 "candidate_window": "candidate", "search_window": "re-watched",
                 "refined_window": "refined"}


def step_windows(row: dict, duration_s: float) -> list[dict]:
    windows = []
    for w in row.get("windows") or []:
        kind = str(w.get("kind", "inspected"))
        label = WINDOW_LABELS.get(kind, kind.replace("_", " "))
        if kind == "inspected" and w.get("num_frames"):
            label = f"{w['num_frames']} frame{'s' if w['num_frames'] != 1 else ''} shown"
        windows.append({"start_s": float(w["start_s"]), "end_s": float(w["end_s"]), "label": label,
                        "kind": "inspected" if kind == "inspected" else "named"})
    if not windows and row.get("frames"):          # a trace written without windows
        times = [float(f["timestamp_s"]) for f in row["frames"]]
        windows.append({"start_s": min(times), "end_s": max(times), "label": "frames shown",
                        "kind": "inspected"})
    data = row.get("data") or {}
    if data.get("is_final"):
        windows.extend({"start_s": float(t), "end_s": float(t), "label": "evidence",
                        "kind": "evidence"}
                       for t in data.get("evidence_times") or [] if isinstance(t, (int, float)))
    return windows


# --- frames -----------------------------------------------------------------------------------

def thumb_key(frame_index: int, crop_box=None) -> str:
    if not crop_box:
        return str(int(frame_index))
    return f"{int(frame_index)}@" + ",".join(f"{float(v):.4f}" for v in crop_box)


def _frames(refs: list[dict], step: int) -> list[dict]:
    seen, frames = set(), []
    for ref in sorted(refs, key=lambda r: (float(r["timestamp_s"]), r.get("crop_box") is not None)):
        key = thumb_key(ref["frame_index"], ref.get("crop_box"))
        if key in seen:
            continue
        seen.add(key)
        crop = ref.get("crop_box")
        frames.append({"key": key, "frame_key": thumb_key(ref["frame_index"]),
                       "frame_index": int(ref["frame_index"]),
                       "timestamp_s": float(ref["timestamp_s"]),
                       "crop_box": list(crop) if crop else None,
                       "size": [ref.get("width"), ref.get("height")], "step": step,
                       "shown": False})
    for slot in _spread(frames, MAX_THUMBS_PER_STEP):
        frames[slot]["shown"] = True
    return frames


def _spread(frames: list[dict], limit: int) -> list[int]:
    """Indices of at most `limit` frames: every zoomed region, then evenly spaced others."""
    cropped = [i for i, f in enumerate(frames) if f["crop_box"]]
    plain = [i for i, f in enumerate(frames) if not f["crop_box"]]
    room = max(0, limit - len(cropped))
    if len(plain) > room:
        plain = [plain[round(k * (len(plain) - 1) / max(1, room - 1))] for k in range(room)] \
            if room > 1 else plain[:room]
    return sorted(set(cropped[:limit]) | set(plain))


def frame_requests(view: dict, *, shown_only: bool = False) -> dict[str, tuple[int, list | None]]:
    """Thumbnail key → (frame index, exact crop box or None) for every frame the trace references
    (or only those the view shows), plus the whole frame under each zoomed region."""
    requests: dict[str, tuple[int, list | None]] = {}
    for step in view["steps"]:
        for frame in step["frames"]:
            if shown_only and not frame["shown"]:
                continue
            requests.setdefault(frame["frame_key"], (frame["frame_index"], None))
            requests.setdefault(frame["key"], (frame["frame_index"], frame["crop_box"]))
    return requests


# --- small helpers ----------------------------------------------------------------------------

def _call(call: dict | None) -> dict | None:
    if not call:
        return None
    return {"model": call.get("model_name"), "revision": call.get("model_revision"),
            "prompt_tokens": call.get("num_prompt_tokens", 0),
            "cached_tokens": call.get("num_cached_tokens", 0),
            "completion_tokens": call.get("num_completion_tokens", 0),
            "latency_s": call.get("latency_s", 0.0), "text": _clip(call.get("text", ""))}


def _clip(text) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + "…"


def _basename(path) -> str | None:
    if not path:
        return None
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


def _last_line(text) -> str | None:
    if not text:
        return None
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else None
