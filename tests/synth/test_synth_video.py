"""Synthetic procedure video: the ground truth agrees with the pixels, frame-exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest

from medclaw.synth.barcode import read_frame_index, strip_height
from medclaw.synth.video import synthesize
from medclaw.synth.draw import SCENES
from medclaw.synth.truth import (
    BLOOD_COLOR, CLIP_COLOR, INSTRUMENTS, PHASES, SUTURE_COLOR, GroundTruth, make_ground_truth,
)

TOL = 40            # max per-channel distance of a compressed pixel to the colour that drew it
MIN_PIXELS = 20     # an object "is there" when at least this many pixels have its colour


def _decode(path, wanted: set[int]) -> dict[int, np.ndarray]:
    import av

    out = {}
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")                 # (H, W, 3)
            if i >= max(wanted):
                break
    return out


def _mask(frame, color) -> np.ndarray:
    diff = np.abs(frame.astype(np.int16) - np.asarray(color, np.int16)).max(axis=-1)
    return diff <= TOL                                                    # (H, W)


def _runs(mask_1d) -> int:
    """Number of runs of True in a 1-D mask (objects along a line)."""
    m = np.concatenate([[False], mask_1d, [False]])
    return int(np.count_nonzero(m[1:] & ~m[:-1]))


def _sample_frames(gt: GroundTruth) -> set[int]:
    frames = {0, gt.num_frames - 1}
    for spans in gt.presence.values():
        for s in spans:             # both sides of every edge, and the middle
            frames |= {s["start_frame"] - 1, s["start_frame"], s["end_frame"] - 1, s["end_frame"],
                       (s["start_frame"] + s["end_frame"]) // 2}
    for e in gt.events:
        frames |= {e["frame"] - 1, e["frame"]}
    for p in gt.phases:
        frames.add((p["start_frame"] + p["end_frame"]) // 2)
    return {f for f in frames if 0 <= f < gt.num_frames}


@pytest.fixture(scope="module")
def decoded(synth_video):
    return _decode(synth_video.path, _sample_frames(synth_video.gt))


def test_files_and_ground_truth_json(synth_video):
    assert synth_video.path.is_file() and synth_video.path.stat().st_size > 0
    assert synth_video.gt_path == synth_video.path.with_suffix(".json")
    data = json.loads(synth_video.gt_path.read_text())
    assert GroundTruth.from_dict(data) == synth_video.gt
    assert data["num_frames"] == 1500 and data["duration_s"] == pytest.approx(60.0)
    assert [p["name"] for p in data["phases"]] == list(PHASES)
    assert data["phases"][0]["start_frame"] == 0 and data["phases"][-1]["end_frame"] == 1500
    for a, b in zip(data["phases"], data["phases"][1:]):
        assert a["end_frame"] == b["start_frame"]                         # no gaps, no overlap
    assert {e["kind"] for e in data["events"]} >= {"instrument_in", "clip_placed", "cut", "suture"}
    assert all(e["time_s"] == pytest.approx(e["frame"] / 25) for e in data["events"])


def test_barcodes_match_sampled_indices(decoded):
    for index, frame in decoded.items():
        assert read_frame_index(frame) == index


def test_instrument_colours_match_presence(synth_video, decoded):
    gt = synth_video.gt
    for index, frame in decoded.items():
        present = set(gt.instruments_at(index))
        for name, (color, _) in INSTRUMENTS.items():
            pixels = int(_mask(frame, color).sum())
            if name in present:
                assert pixels >= MIN_PIXELS, (index, name, pixels)
            else:
                assert pixels <= 2, (index, name, pixels)


def test_clips_and_sutures_drawn_match_counts(synth_video, decoded):
    gt = synth_video.gt
    strip = strip_height(gt.height) + 3        # compression smears the white strip a few rows down
    checked = {"clips": 0, "sutures": 0}
    for index, frame in decoded.items():
        phase = gt.phase_at(index)
        scene = frame[strip:]
        # Clips and stitches are tall bars: a column holds one when >= 4 of its pixels match
        # (isolated edge pixels of other objects can drift near the colour after chroma subsampling).
        clips = _runs(_mask(scene, CLIP_COLOR).sum(axis=0) >= 4)
        stitches = _runs(_mask(scene, SUTURE_COLOR).sum(axis=0) >= 4)
        if phase in ("clipping", "cutting"):
            assert clips == gt.count_at("clips", index), (index, phase)
            checked["clips"] += gt.count_at("clips", index) > 0
        else:
            assert clips == 0, (index, phase)
        if phase in ("suturing", "closure"):
            assert stitches == gt.count_at("sutures", index), (index, phase)
            checked["sutures"] += gt.count_at("sutures", index) > 0
        else:
            assert stitches == 0, (index, phase)
    assert checked["clips"] > 3 and checked["sutures"] > 3               # the checks ran


def test_bleeding_visible_exactly_between_its_events(synth_video, decoded):
    gt = synth_video.gt
    start, stop = gt.events_of("bleeding_start")[0]["frame"], gt.events_of("bleeding_stop")[0]["frame"]
    for index, frame in decoded.items():
        bleeding = int(_mask(frame, BLOOD_COLOR).sum()) >= MIN_PIXELS
        assert bleeding == (start <= index < stop), index


def test_each_phase_has_its_own_scene(synth_video, decoded):
    """A patch nothing is drawn on (bottom centre) has the colour of the phase's scene."""
    gt = synth_video.gt
    bases = {name: np.asarray(color, float) for name, (color, _) in SCENES.items()}
    h, w = gt.height, gt.width
    for p in gt.phases:
        frame = decoded[(p["start_frame"] + p["end_frame"]) // 2]
        patch = frame[int(0.9 * h):h - 2, int(0.42 * w):int(0.58 * w)].reshape(-1, 3).mean(0)
        nearest = min(bases, key=lambda name: np.abs(bases[name] - patch).sum())
        assert nearest == p["name"]


def test_cut_opens_the_vessel(synth_video, decoded):
    """Before the cut the vessel is continuous between the clips; after it, it has a gap."""
    gt = synth_video.gt
    cut = gt.events_of("cut")[0]["frame"]
    vessel = (118, 30, 40)
    row = None
    for index in (cut - 1, cut):
        frame = decoded[index]
        if row is None:   # the vessel's row: where its colour is most common
            row = int(_mask(frame, vessel).sum(axis=1).argmax())
        segments = _runs(_mask(frame[row], vessel) | _mask(frame[row], CLIP_COLOR))
        assert segments == (1 if index < cut else 2), index


def test_qa_pairs_follow_the_ground_truth(synth_video):
    gt = synth_video.gt
    qa = {q["kind"] + ":" + q["question"]: q for q in gt.qa}
    assert len(gt.qa) >= 6 and len({q["id"] for q in gt.qa}) == len(gt.qa)
    for q in gt.qa:
        assert q["answer"] and q["evidence_times_s"]
        assert all(0 <= t <= gt.duration_s for t in q["evidence_times_s"])
        if q["kind"] == "count" and "clips" in q["question"]:
            assert q["answer_value"] == len(gt.events_of("clip_placed"))
        if q["kind"] == "presence":
            assert q["answer_value"] == gt.instruments_at(gt.frame_at(q["evidence_times_s"][0]))
        if q["kind"] == "phase":
            assert q["answer"] == gt.phase_at(gt.frame_at(q["evidence_times_s"][0]))
        if q["kind"] == "before_after":
            first, second = q["evidence_times_s"]
            assert first < second
            arrivals = [e for e in gt.events_of("instrument_in") if e["instrument"] == q["answer"]]
            assert any(e["time_s"] == pytest.approx(t) for e in arrivals for t in (first, second))
    assert any(k.startswith("before_after:") for k in qa)


def test_relations_point_at_real_arrivals(synth_video):
    gt = synth_video.gt
    arrivals = {(e["instrument"], e["frame"]) for e in gt.events_of("instrument_in")}
    assert gt.relations
    for rel in gt.relations:
        for side in ("instrument_in_before", "instrument_in_after"):
            if rel[side] is not None:
                frame = gt.frame_at(rel[side]["time_s"])
                assert (rel[side]["instrument"], frame) in arrivals
                assert (frame < rel["frame"]) == (side == "instrument_in_before")


def test_ground_truth_is_deterministic_and_scales_with_minutes():
    a, b = make_ground_truth(1.0, seed=3), make_ground_truth(1.0, seed=3)
    assert a.to_dict() == b.to_dict()
    assert make_ground_truth(1.0, seed=4).to_dict() != a.to_dict()
    long = make_ground_truth(3.0, seed=3)
    for short_phase, long_phase in zip(a.phases, long.phases):
        assert long_phase["start_s"] == pytest.approx(3 * short_phase["start_s"], abs=0.1)
    for short_ev, long_ev in zip(a.events, long.events):
        assert long_ev["kind"] == short_ev["kind"]
        assert long_ev["time_s"] == pytest.approx(3 * short_ev["time_s"], abs=0.1)


def test_counts_are_step_functions_of_the_events(synth_video):
    gt = synth_video.gt
    clips = gt.counts["clips"]
    assert [c["value"] for c in clips] == list(range(len(clips)))
    assert gt.count_at("clips", gt.num_frames - 1) == len(gt.events_of("clip_placed"))
    for step in gt.counts["instruments_visible"]:
        assert len(gt.instruments_at(step["frame"])) == step["value"]


@pytest.mark.parametrize("kwargs, match", [
    ({"width": 321}, "even"), ({"height": 60}, "at least"), ({"minutes": 0.1}, "at least"),
    ({"fps": 0}, "fps"), ({"minutes": float("inf")}, "finite"), ({"minutes": 800}, "barcode"),
])
def test_bad_parameters_raise_value_error(tmp_path, kwargs, match):
    args = {"minutes": 0.5, "width": 160, "height": 90, **kwargs}
    with pytest.raises(ValueError, match=match):
        synthesize(tmp_path / "x.mp4", **args)
    assert not list(tmp_path.iterdir())                                   # nothing half-written


def test_same_seed_same_video(tmp_path):
    a = synthesize(tmp_path / "a.mp4", 0.2, seed=5, width=128, height=72, fps=10)
    b = synthesize(tmp_path / "b.mp4", 0.2, seed=5, width=128, height=72, fps=10)
    assert a.gt == b.gt
    assert a.path.read_bytes() == b.path.read_bytes()
    assert not list(tmp_path.glob("*.partial*"))


def test_fast_yuv_renderer_agrees_with_rgb_reference():
    """The yuv420p canvas synthesize() encodes == RGB reference drawing + BT.601 conversion:
    luma everywhere, chroma on every 2x2 block the reference paints in one colour."""
    from medclaw.synth.video import _Renderer
    from medclaw.synth.draw import RGBCanvas, rgb_to_yuv420

    gt = make_ground_truth(0.5, seed=11, width=256, height=144, fps=25)
    frames = sorted(_sample_frames(gt))[::3]
    fast = _Renderer(gt, 11).frames(frames)
    ref = _Renderer(gt, 11, canvas_type=RGBCanvas).frames(frames)
    h, w = gt.height, gt.width
    for index, a, b in zip(frames, fast, ref):
        got, want = a.data, rgb_to_yuv420(b.rgb)
        assert np.array_equal(got[:h * w], want[:h * w]), index
        blocks = b.rgb.reshape(h // 2, 2, w // 2, 2, 3).astype(int)
        uniform = (blocks.max(axis=(1, 3)) == blocks.min(axis=(1, 3))).all(-1).ravel()
        for plane in (slice(h * w, h * w * 5 // 4), slice(h * w * 5 // 4, None)):
            assert np.array_equal(got[plane][uniform], want[plane][uniform]), index
        assert read_frame_index(b.rgb) == index
