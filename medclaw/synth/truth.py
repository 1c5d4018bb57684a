"""Ground truth of a synthetic procedure video: the schedule the renderer draws, and what tests,
benchmarks and the demo check answers against.

`make_ground_truth(minutes, seed, width, height, fps)` is pure and deterministic from its
arguments; event times scale with `minutes`. All intervals are half-open in frames
[start_frame, end_frame) and times are `frame / fps`, so "present at frame f" is exact.

The JSON written next to the video (`OUT.json`) is `GroundTruth.to_dict()`:
    phases       [{name, start_s, end_s, start_frame, end_frame}]
    instruments  {name: {color: [r, g, b], shape}}
    presence     {instrument: [{start_s, end_s, start_frame, end_frame}]}
    events       [{time_s, frame, kind, phase, instrument?, count?}]  kinds: EVENT_KINDS
    counts       {clips | sutures | instruments_visible: [{time_s, frame, value}]}  step functions
    relations    [{event, time_s, instrument_in_before, instrument_in_after}]  for directed re-look
    qa           [{id, kind, question, answer, answer_value, evidence_times_s}]
    zoom         only with `synth.zoom.ZoomOptions` on: small objects, look-alikes, flashes
"""
from __future__ import annotations

from dataclasses import dataclass, field
import json
import math
from pathlib import Path

PHASES = ("preparation", "dissection", "clipping", "cutting", "suturing", "closure")
# Relative phase lengths before the seeded jitter.
_PHASE_WEIGHTS = (0.10, 0.22, 0.18, 0.12, 0.25, 0.13)

# name -> (RGB, shape). Saturated colours that no scene texture comes near (tests check both ways).
INSTRUMENTS: dict[str, tuple[tuple[int, int, int], str]] = {
    "grasper": ((0, 200, 0), "fork"),
    "hook": ((255, 128, 0), "L"),
    "suction": ((0, 220, 230), "disc"),
    "clip_applier": ((255, 220, 0), "head"),
    "scissors": ((30, 60, 255), "X"),
    "needle_driver": ((240, 0, 240), "ring"),
}
CLIP_COLOR = (240, 240, 244)       # bright titanium clips on the vessel
BLOOD_COLOR = (210, 0, 0)
SUTURE_COLOR = (15, 15, 15)

# Per phase: (instrument, enter, leave) as fractions of the phase, jittered by the seed.
_VISITS: dict[str, tuple[tuple[str, float, float], ...]] = {
    "preparation": (("grasper", 0.30, 0.90),),
    "dissection": (("grasper", 0.10, 0.95), ("hook", 0.15, 0.85), ("suction", 0.55, 0.80)),
    "clipping": (("grasper", 0.05, 0.93), ("clip_applier", 0.15, 0.85)),
    "cutting": (("grasper", 0.07, 0.90), ("scissors", 0.20, 0.80)),
    "suturing": (("needle_driver", 0.10, 0.90), ("grasper", 0.15, 0.85)),
    "closure": (("grasper", 0.10, 0.60), ("suction", 0.40, 0.70)),
}
EVENT_KINDS = ("phase_start", "instrument_in", "instrument_out", "bleeding_start", "bleeding_stop",
               "clip_placed", "cut", "suture")
MAX_CLIPS, MAX_SUTURES = 4, 6
MIN_SECONDS = 12.0                 # shorter videos leave phases too short for their events


def spoken(name: str) -> str:
    """A ground-truth name as questions, answers and model targets write it: "clip_applier" ->
    "clip applier"."""
    return name.replace("_", " ")


@dataclass(slots=True)
class GroundTruth:
    """What happens in the synthetic video, frame-exact. See the module docstring for fields."""

    seed: int
    minutes: float
    width: int
    height: int
    fps: float
    num_frames: int
    phases: list[dict]
    instruments: dict[str, dict]
    presence: dict[str, list[dict]]
    events: list[dict]
    counts: dict[str, list[dict]]
    relations: list[dict] = field(default_factory=list)
    qa: list[dict] = field(default_factory=list)
    zoom: dict = field(default_factory=dict)     # synth.zoom; empty (and not saved) by default

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps

    def frame_at(self, time_s: float) -> int:
        return min(self.num_frames - 1, max(0, int(time_s * self.fps + 1e-6)))

    def phase_at(self, frame: int) -> str:
        for phase in self.phases:
            if phase["start_frame"] <= frame < phase["end_frame"]:
                return phase["name"]
        raise ValueError(f"frame {frame} outside [0, {self.num_frames})")

    def instruments_at(self, frame: int) -> list[str]:
        return sorted(name for name, spans in self.presence.items()
                      if any(s["start_frame"] <= frame < s["end_frame"] for s in spans))

    def count_at(self, name: str, frame: int) -> int:
        value = 0
        for step in self.counts[name]:
            if step["frame"] > frame:
                break
            value = step["value"]
        return value

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]

    def to_dict(self) -> dict:
        data = {"version": 1, **{name: getattr(self, name) for name in self.__slots__},
                "duration_s": self.duration_s}
        if not self.zoom:
            del data["zoom"]                 # default videos keep their exact JSON
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "GroundTruth":
        return cls(**{name: data[name] for name in cls.__slots__ if name in data})

    @classmethod
    def load(cls, path: str | Path) -> "GroundTruth":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))


def _span(start: int, end: int, fps: float) -> dict:
    return {"start_s": start / fps, "end_s": end / fps, "start_frame": start, "end_frame": end}


def _event(frame: int, fps: float, kind: str, phase: str, **extra) -> dict:
    return {"time_s": frame / fps, "frame": frame, "kind": kind, "phase": phase, **extra}


def _phase_bounds(rng, num_frames: int) -> list[tuple[int, int]]:
    weights = [w * rng.uniform(0.85, 1.15) for w in _PHASE_WEIGHTS]
    total = sum(weights)
    cuts = [0]
    for w in weights[:-1]:
        cuts.append(cuts[-1] + w / total)
    edges = [int(round(c * num_frames)) for c in cuts] + [num_frames]
    return list(zip(edges[:-1], edges[1:]))


def make_ground_truth(minutes: float, seed: int = 0, width: int = 640, height: int = 360,
                      fps: float = 25, zoom=None) -> GroundTruth:
    """The deterministic schedule of a `minutes`-long video (see module docstring).

    `zoom` (a `synth.zoom.ZoomOptions`) adds content worth zooming into, drawn from a random
    stream of its own: the base schedule is the same with or without it."""
    import numpy as np

    if not math.isfinite(minutes * 60 * fps):
        raise ValueError(f"minutes and fps must be finite numbers, got {minutes} min at {fps} fps")
    num_frames = int(round(minutes * 60 * fps))
    if num_frames < MIN_SECONDS * fps:
        raise ValueError(f"a synthetic procedure needs at least {MIN_SECONDS:.0f} s, got {minutes} min")
    rng = np.random.default_rng(seed)
    n_clips = int(rng.integers(2, MAX_CLIPS + 1))
    n_sutures = int(rng.integers(3, MAX_SUTURES + 1))
    phases, events, presence = [], [], {name: [] for name in INSTRUMENTS}

    def at(lo: int, hi: int, u: float) -> int:
        return lo + int(round(u * (hi - lo)))

    for name, (lo, hi) in zip(PHASES, _phase_bounds(rng, num_frames)):
        phases.append({"name": name, **_span(lo, hi, fps)})
        events.append(_event(lo, fps, "phase_start", name))
        for instrument, enter, leave in _VISITS[name]:
            jitter = rng.uniform(-0.04, 0.04, size=2)
            start, end = at(lo, hi, enter + jitter[0]), at(lo, hi, leave + jitter[1])
            presence[instrument].append(_span(start, end, fps))
            events.append(_event(start, fps, "instrument_in", name, instrument=instrument))
            events.append(_event(end, fps, "instrument_out", name, instrument=instrument))
        if name == "dissection":
            suction_in = presence["suction"][-1]["start_frame"]
            bleed = at(lo, hi, 0.42 + rng.uniform(-0.03, 0.03))
            events.append(_event(min(bleed, suction_in - 1), fps, "bleeding_start", name))
            events.append(_event(at(lo, hi, 0.74), fps, "bleeding_stop", name))
        elif name == "clipping":
            for k, u in enumerate(np.linspace(0.30, 0.75, n_clips)):
                frame = at(lo, hi, u + rng.uniform(-0.02, 0.02))
                events.append(_event(frame, fps, "clip_placed", name, instrument="clip_applier",
                                     count=k + 1))
        elif name == "cutting":
            events.append(_event(at(lo, hi, 0.5 + rng.uniform(-0.05, 0.05)), fps, "cut", name,
                                 instrument="scissors"))
        elif name == "suturing":
            for k, u in enumerate(np.linspace(0.25, 0.80, n_sutures)):
                frame = at(lo, hi, u + rng.uniform(-0.02, 0.02))
                events.append(_event(frame, fps, "suture", name, instrument="needle_driver",
                                     count=k + 1))
    order = {kind: i for i, kind in enumerate(EVENT_KINDS)}
    events.sort(key=lambda e: (e["frame"], order[e["kind"]]))
    truth = GroundTruth(
        seed=seed, minutes=minutes, width=width, height=height, fps=fps, num_frames=num_frames,
        phases=phases, events=events, presence=presence,
        instruments={n: {"color": list(c), "shape": s} for n, (c, s) in INSTRUMENTS.items()},
        counts=_counts(events, presence, fps),
    )
    truth.relations = _relations(events)
    truth.qa = _qa(truth, rng)
    if zoom is not None and zoom.any:
        from medclaw.synth.zoom import make_zoom_truth

        truth.zoom = make_zoom_truth(zoom, seed, num_frames, fps, width, height,
                                     [e for e in events if e["kind"] == "instrument_in"])
    return truth


def _counts(events: list[dict], presence: dict[str, list[dict]], fps: float) -> dict:
    counts: dict[str, list[dict]] = {}
    for name, kind in (("clips", "clip_placed"), ("sutures", "suture")):
        counts[name] = [{"time_s": 0.0, "frame": 0, "value": 0}] + [
            {"time_s": e["time_s"], "frame": e["frame"], "value": e["count"]}
            for e in events if e["kind"] == kind]
    changes = sorted({0} | {s[k] for spans in presence.values() for s in spans
                            for k in ("start_frame", "end_frame")})
    visible = []
    for frame in changes:
        value = sum(1 for spans in presence.values()
                    for s in spans if s["start_frame"] <= frame < s["end_frame"])
        if not visible or visible[-1]["value"] != value:
            visible.append({"time_s": frame / fps, "frame": frame, "value": value})
    counts["instruments_visible"] = visible
    return counts


def _describe(event: dict) -> str:
    if event["kind"] in ("clip_placed", "suture"):
        return f"{event['kind']} #{event['count']}"
    return event["kind"]


def _relations(events: list[dict]) -> list[dict]:
    """For every key event: which instrument entered just before it and just after it."""
    arrivals = [e for e in events if e["kind"] == "instrument_in"]
    relations = []
    for event in events:
        if event["kind"] not in ("bleeding_start", "bleeding_stop", "clip_placed", "cut", "suture"):
            continue
        before = [a for a in arrivals if a["frame"] < event["frame"]]
        after = [a for a in arrivals if a["frame"] > event["frame"]]
        relations.append({
            "event": _describe(event), "time_s": event["time_s"], "frame": event["frame"],
            "instrument_in_before": ({"instrument": before[-1]["instrument"],
                                      "time_s": before[-1]["time_s"]} if before else None),
            "instrument_in_after": ({"instrument": after[0]["instrument"],
                                     "time_s": after[0]["time_s"]} if after else None),
        })
    return relations


def _qa(truth: GroundTruth, rng) -> list[dict]:
    """A handful of question/answer pairs derived from the schedule (not from pixels)."""
    clips, sutures = truth.events_of("clip_placed"), truth.events_of("suture")
    bleed, cut = truth.events_of("bleeding_start")[0], truth.events_of("cut")[0]
    relation = {r["event"]: r for r in truth.relations}
    after_bleed = relation["bleeding_start"]["instrument_in_after"]
    before_cut = relation["cut"]["instrument_in_before"]
    before_suture = relation["suture #1"]["instrument_in_before"]
    phase = truth.phases[int(rng.integers(len(truth.phases)))]
    t_phase = round((phase["start_s"] + phase["end_s"]) / 2, 1)
    t_look = round(float(rng.uniform(0.05, 0.95)) * truth.duration_s, 1)
    visible = truth.instruments_at(truth.frame_at(t_look))

    def qa(kind, question, answer, value, times):
        return {"id": f"q{len(items)}", "kind": kind, "question": question, "answer": answer,
                "answer_value": value, "evidence_times_s": [round(t, 3) for t in times]}

    items: list[dict] = []
    items.append(qa("count", "How many clips were placed on the vessel?", str(len(clips)),
                    len(clips), [e["time_s"] for e in clips]))
    items.append(qa("count", "How many sutures were placed?", str(len(sutures)), len(sutures),
                    [e["time_s"] for e in sutures]))
    items.append(qa("before_after", "Which instrument was brought in just after the bleeding started?",
                    after_bleed["instrument"], after_bleed["instrument"],
                    [bleed["time_s"], after_bleed["time_s"]]))
    items.append(qa("before_after", "Which instrument was brought in just before the vessel was cut?",
                    before_cut["instrument"], before_cut["instrument"],
                    [before_cut["time_s"], cut["time_s"]]))
    items.append(qa("before_after", "Which instrument appeared just before the first suture?",
                    before_suture["instrument"], before_suture["instrument"],
                    [before_suture["time_s"], sutures[0]["time_s"]]))
    items.append(qa("temporal", "At what time (in seconds) was the first clip placed?",
                    f"{clips[0]['time_s']:.1f}", clips[0]["time_s"], [clips[0]["time_s"]]))
    items.append(qa("phase", f"Which phase of the procedure is shown at {t_phase} s?",
                    phase["name"], phase["name"], [t_phase]))
    items.append(qa("presence", f"Which instruments are visible at {t_look} s?",
                    ", ".join(visible) if visible else "none", visible, [t_look]))
    return items
