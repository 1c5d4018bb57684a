"""A synthetic evaluation set with exact gold, from the procedure generator's ground truth.

    make_synthetic(out_dir, videos=N, minutes=M, seed=S) -> Path of OUT_DIR/dataset.jsonl

writes `videos/video-<k>.mp4` (+ its ground-truth JSON, `medclaw.synth`) for k = 0..N-1 (seed
S + k) and one native dataset (`eval.dataset`) whose gold comes from the schedule the renderer
drew, never from pixels. Question families (`QUESTIONS`), each with a gold window:

    before_after (VTR)   which instrument entered just before / after an event; window = from
                         that arrival to the event (the adjacent window directed re-look reads)
    count        (VTR)   how many clips / sutures; window = first to last placement
    presence     (VPR)   which instruments are visible at t; window = the stretch around t in
                         which that set does not change
    phase        (VPR)   which phase is shown at t; window = that phase
    phase_content(VPR)   which instruments are used during a phase; window = that phase

With `zoom=True` the videos also carry the zoom content (`synth.zoom`: small objects, look-alikes
told apart by a small mark, short flashes) and its questions join the families:

    small_object (VPR)   which small object lies in the field at t; window = t ± ZOOM_WINDOW_S
                         (choices also hold "needle driver": see `_with_longer_names`)
    look_alike   (VPR)   dissector or bipolar (the marked one) at t; window = t ± ZOOM_WINDOW_S
    short_event  (VTR)   which instrument came in just after a cautery flash; window = flash to
                         that arrival

`families` keeps only the named families (default: all of them). Questions are interleaved by
family so that `per_video` keeps a mix. Ids are `v<k>-<family>-<n>`. Deterministic from the
arguments.

`whole_seconds=True` asks the small-object and look-alike questions at a whole second inside the
same visit ("at 17 s" rather than "at 17.4 s"; `at_whole_second`), same answers: the form in
which the trained miniature's orchestrator copies the time wrongly (docs/tiny-trained.md), so a
distillation run on it has failures a lesson could fix.
"""
from __future__ import annotations

from pathlib import Path

from medclaw.eval.dataset import EvalRecord, write_dataset
from medclaw.synth.truth import INSTRUMENTS, PHASES, GroundTruth, spoken

DATASET_NAME = "dataset.jsonl"
INSTRUMENT_NAMES = sorted(INSTRUMENTS)


def _round(t: float) -> float:
    return round(float(t), 2)


def _before_after(gt: GroundTruth) -> list[dict]:
    items = []
    relations = {r["event"]: r for r in gt.relations}
    plans = (("cut", "instrument_in_before", "Which instrument was brought in just before the vessel was cut?"),
             ("bleeding_start", "instrument_in_after",
              "Which instrument was brought in just after the bleeding started?"),
             ("suture #1", "instrument_in_before", "Which instrument appeared just before the first suture?"))
    for event, side, question in plans:
        relation = relations.get(event)
        if relation is None or relation.get(side) is None:
            continue
        other = relation[side]
        window = sorted((_round(other["time_s"]), _round(relation["time_s"])))
        items.append(dict(type="VTR", subtype="before_after", question=question,
                          gold=spoken(other["instrument"]), gold_value=spoken(other["instrument"]),
                          gold_window_s=window, choices=[spoken(n) for n in INSTRUMENT_NAMES]))
    return items


def _counts(gt: GroundTruth) -> list[dict]:
    items = []
    for kind, noun, question in (("clip_placed", "clips", "How many clips were placed on the vessel?"),
                                 ("suture", "sutures", "How many sutures were placed?")):
        events = gt.events_of(kind)
        if not events:
            continue
        window = [_round(events[0]["time_s"]), _round(events[-1]["time_s"])]
        items.append(dict(type="VTR", subtype="count", question=question,
                          gold=f"{len(events)} {noun}", gold_value=len(events), gold_window_s=window))
    return items


def _stable_span(gt: GroundTruth, frame: int) -> tuple[int, int]:
    """The frames around `frame` over which the set of visible instruments does not change."""
    changes = sorted({0, gt.num_frames} | {s[k] for spans in gt.presence.values() for s in spans
                                           for k in ("start_frame", "end_frame")})
    start = max(c for c in changes if c <= frame)
    end = min(c for c in changes if c > frame)
    return start, end


def _presence(gt: GroundTruth, rng) -> list[dict]:
    items = []
    for fraction in (float(rng.uniform(0.15, 0.45)), float(rng.uniform(0.55, 0.85))):
        t = round(fraction * gt.duration_s, 1)
        frame = gt.frame_at(t)
        visible = [spoken(n) for n in gt.instruments_at(frame)]
        start, end = _stable_span(gt, frame)
        items.append(dict(type="VPR", subtype="presence",
                          question=f"Which instruments are visible at {t:g} s?",
                          gold=", ".join(visible) if visible else "none", gold_value=visible,
                          gold_window_s=[_round(start / gt.fps), _round(end / gt.fps)],
                          choices=[spoken(n) for n in INSTRUMENT_NAMES]))
    return items


def _phase(gt: GroundTruth, rng) -> list[dict]:
    phase = gt.phases[int(rng.integers(len(gt.phases)))]
    t = round((phase["start_s"] + phase["end_s"]) / 2, 1)
    return [dict(type="VPR", subtype="phase", question=f"Which phase of the procedure is shown at {t:g} s?",
                 gold=phase["name"], gold_value=phase["name"],
                 gold_window_s=[_round(phase["start_s"]), _round(phase["end_s"])], choices=list(PHASES))]


def _phase_content(gt: GroundTruth, rng) -> list[dict]:
    phase = gt.phases[int(rng.integers(len(gt.phases)))]
    used = sorted(spoken(name) for name, spans in gt.presence.items()
                  if any(s["start_frame"] < phase["end_frame"] and s["end_frame"] > phase["start_frame"]
                         for s in spans))
    return [dict(type="VPR", subtype="phase_content",
                 question=f"Which instruments are used during the {phase['name']} phase?",
                 gold=", ".join(used) if used else "none", gold_value=used,
                 gold_window_s=[_round(phase["start_s"]), _round(phase["end_s"])],
                 choices=[spoken(n) for n in INSTRUMENT_NAMES])]


def _with_longer_names(choices: list[str]) -> list[str]:
    """`choices` plus every other name drawn on these videos that contains one of them as whole
    words ("needle driver" for "needle"): the label scorer counts an answer right only when no
    other choice is named, so an answer saying "needle driver" no longer reads as "needle"."""
    from medclaw.eval.scorers import names
    from medclaw.synth.zoom import LOOK_ALIKES, SMALL_OBJECTS

    every = [spoken(n) for n in (*INSTRUMENT_NAMES, *SMALL_OBJECTS, *LOOK_ALIKES)]
    return choices + [n for n in every if n not in choices and any(names(n, c) for c in choices)]


WHOLE_SECOND_MARGIN_S = 0.25      # a whole-second moment stays this far inside its visit


def at_whole_second(gt: GroundTruth, q: dict) -> dict:
    """Zoom question `q` asked at the whole second ("at 17 s") nearest its moment that lies
    inside the same visit (WHOLE_SECOND_MARGIN_S from either end), so the answer is unchanged;
    checked against the ground truth's own `visible_at`. ValueError when the visit holds no
    whole second (visits last at least 2 s, so only a broken ground truth does that)."""
    import math

    from medclaw.synth.zoom import VISIT_KIND, visible_at, zoom_question

    t, kind = q["evidence_times_s"][0], VISIT_KIND[q["kind"]]
    visit = next(v for v in gt.zoom["visits"] if v["kind"] == kind and v["start_s"] <= t < v["end_s"])
    seconds = range(math.ceil(visit["start_s"] + WHOLE_SECOND_MARGIN_S),
                    math.floor(visit["end_s"] - WHOLE_SECOND_MARGIN_S) + 1)
    if not seconds:
        raise ValueError(f"the {kind} visit at {visit['start_s']:.2f}-{visit['end_s']:.2f} s "
                         f"holds no whole second to ask at")
    s = min(seconds, key=lambda k: (abs(k - t), k))
    if visible_at(gt.zoom, kind, gt.frame_at(s)) != [visit["name"]]:
        raise ValueError(f"at {s} s the ground truth does not show {visit['name']} alone")
    return {**q, "question": zoom_question(q["kind"], float(s)), "evidence_times_s": [float(s)]}


def _zoom(gt: GroundTruth, whole_seconds: bool = False) -> list[list[dict]]:
    """The zoom questions of `gt` (`synth.zoom`), one list per family; with `whole_seconds`
    the small-object and look-alike ones asked at a whole second (`at_whole_second`)."""
    from medclaw.synth.zoom import LOOK_ALIKES, SMALL_OBJECTS, VISIT_KIND

    choices = {"small_object": _with_longer_names([spoken(n) for n in SMALL_OBJECTS]),
               "look_alike": _with_longer_names([spoken(n) for n in LOOK_ALIKES]),
               "short_event": [spoken(n) for n in INSTRUMENT_NAMES]}
    families: dict[str, list[dict]] = {kind: [] for kind in ZOOM_QUESTIONS}
    for q in (gt.zoom or {}).get("qa", []):
        if whole_seconds and q["kind"] in VISIT_KIND:
            q = at_whole_second(gt, q)
        times = q["evidence_times_s"]
        window = ([_round(times[0] - ZOOM_WINDOW_S), _round(times[0] + ZOOM_WINDOW_S)]
                  if len(times) == 1 else [_round(min(times)), _round(max(times))])
        families[q["kind"]].append(dict(
            type="VTR" if q["kind"] == "short_event" else "VPR", subtype=q["kind"],
            question=q["question"], gold=q["answer"], gold_value=q["answer_value"],
            gold_window_s=window, choices=choices[q["kind"]]))
    return list(families.values())


QUESTIONS = ("before_after", "count", "presence", "phase", "phase_content")
ZOOM_QUESTIONS = ("small_object", "look_alike", "short_event")
# A zoom question names its moment; the evidence is that moment, a frame-exact answer cites it.
ZOOM_WINDOW_S = 0.5


def questions_for(gt: GroundTruth, seed: int, families: tuple[str, ...] | None = None,
                  whole_seconds: bool = False) -> list[dict]:
    """The question dicts of one video, interleaved by family (see module docstring)."""
    import numpy as np

    rng = np.random.default_rng(seed + 7919)    # apart from the renderer's own stream
    lists = [_before_after(gt), _counts(gt), _presence(gt, rng), _phase(gt, rng),
             _phase_content(gt, rng), *(_zoom(gt, whole_seconds) if gt.zoom else [])]
    families = [[q for q in f if families is None or q["subtype"] in families] for f in lists]
    out, depth = [], max(len(f) for f in families)
    for level in range(depth):
        out.extend(f[level] for f in families if level < len(f))
    return out


def make_synthetic(out_dir: str | Path, *, videos: int, minutes: float, seed: int = 0,
                   width: int = 320, height: int = 180, fps: float = 25, split: str = "synthetic",
                   per_video: int | None = None, zoom: bool = False,
                   families: tuple[str, ...] | None = None, whole_seconds: bool = False) -> Path:
    """Render `videos` procedure videos and write OUT_DIR/dataset.jsonl (see module docstring)."""
    from medclaw.synth.video import synthesize
    from medclaw.synth.zoom import ZoomOptions

    known = QUESTIONS + (ZOOM_QUESTIONS if zoom else ())
    unknown = sorted(set(families or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown question families {unknown}; known: {', '.join(known)}"
                         + ("" if zoom else " (zoom families need zoom)"))

    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    records: list[EvalRecord] = []
    for k in range(videos):
        video = synthesize(out / "videos" / f"video-{k}.mp4", minutes=minutes, seed=seed + k,
                           width=width, height=height, fps=fps, progress=False,
                           zoom=ZoomOptions.all() if zoom else None)
        items = questions_for(video.gt, seed + k, families, whole_seconds)
        if per_video is not None:
            items = items[:per_video]
        counters: dict[str, int] = {}
        for item in items:
            n = counters[item["subtype"]] = counters.get(item["subtype"], 0) + 1
            records.append(EvalRecord(id=f"v{k}-{item['subtype']}-{n}", video=str(video.path),
                                      split=split, gold_window_s=tuple(item.pop("gold_window_s")),
                                      **item))
    return write_dataset(out / DATASET_NAME, records, relative_to=out)
