"""Zoom options of the synthetic generator: small objects, look-alikes told apart by a mark, short
flashes — drawn exactly where and when the ground truth says, and off by default."""
from __future__ import annotations

import json

import numpy as np
import pytest

from medclaw.synth.barcode import read_frame_index
from medclaw.synth.truth import GroundTruth, make_ground_truth
from medclaw.synth.video import synthesize
from medclaw.synth.zoom import (
    FLASH_COLOR, LOOK_ALIKE_COLOR, LOOK_ALIKES, MARK_COLOR, SMALL_OBJECTS, ZoomOptions,
)

TOL = 40
W, H, FPS = 320, 180, 25


def _mask(frame, color):
    return np.abs(frame.astype(np.int16) - np.asarray(color, np.int16)).max(axis=-1) <= TOL


def _in_box(frame, box, color) -> int:
    h, w = frame.shape[:2]
    x1, y1, x2, y2 = box
    region = frame[int(y1 * h):int(np.ceil(y2 * h)), int(x1 * w):int(np.ceil(x2 * w))]
    return int(_mask(region, color).sum())


@pytest.fixture(scope="module")
def zoom_video(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoom") / "zoom.mp4"
    return synthesize(out, minutes=0.4, seed=5, width=W, height=H, fps=FPS,
                      zoom=ZoomOptions.all(), progress=False)


@pytest.fixture(scope="module")
def frames(zoom_video):
    import av

    with av.open(str(zoom_video.path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]     # (H, W, 3)


def test_off_by_default_and_base_schedule_untouched():
    plain = make_ground_truth(0.5, seed=3, width=W, height=H)
    assert plain.zoom == {} and "zoom" not in plain.to_dict()
    assert make_ground_truth(0.5, seed=3, width=W, height=H, zoom=ZoomOptions()) == plain
    zoomed = make_ground_truth(0.5, seed=3, width=W, height=H, zoom=ZoomOptions.all())
    for name in ("phases", "events", "presence", "counts", "relations", "qa"):
        assert getattr(zoomed, name) == getattr(plain, name)
    assert zoomed.zoom["options"] == ZoomOptions.all().to_dict()
    assert GroundTruth.from_dict(json.loads(json.dumps(zoomed.to_dict()))) == zoomed


def test_each_option_alone_and_held_out_seeds_differ():
    only_small = make_ground_truth(0.5, seed=1, width=W, height=H,
                                   zoom=ZoomOptions(small_instruments=True))
    assert {v["kind"] for v in only_small.zoom["visits"]} == {"small"}
    assert only_small.zoom["flashes"] == []
    only_flash = make_ground_truth(0.5, seed=1, width=W, height=H, zoom=ZoomOptions(short_events=True))
    assert only_flash.zoom["visits"] == [] and len(only_flash.zoom["flashes"]) == 2
    schedules = {json.dumps(make_ground_truth(0.5, seed=s, width=W, height=H,
                                              zoom=ZoomOptions.all()).zoom, sort_keys=True)
                 for s in range(100, 106)}
    assert len(schedules) == 6                                   # held-out seeds: new schedules
    again = make_ground_truth(0.5, seed=100, width=W, height=H, zoom=ZoomOptions.all()).zoom
    assert json.dumps(again, sort_keys=True) in schedules        # deterministic


def test_qa_answers_follow_the_schedule():
    for seed in range(10):
        gt = make_ground_truth(0.5, seed=seed, width=W, height=H, zoom=ZoomOptions.all())
        arrivals = [e for e in gt.events if e["kind"] == "instrument_in"]
        kinds = [q["kind"] for q in gt.zoom["qa"]]
        assert kinds.count("small_object") == 2 and kinds.count("look_alike") == 2
        for q in gt.zoom["qa"]:
            t = q["evidence_times_s"][0]
            frame = gt.frame_at(t)
            if q["kind"] in ("small_object", "look_alike"):
                kind = "small" if q["kind"] == "small_object" else "look_alike"
                on = [v["name"].replace("_", " ") for v in gt.zoom["visits"]
                      if v["kind"] == kind and v["start_frame"] <= frame < v["end_frame"]]
                assert on == [q["answer"]]
            else:
                flash_t, arrival_t = q["evidence_times_s"]
                first = min((a for a in arrivals if a["time_s"] > flash_t), key=lambda a: a["frame"])
                assert first["instrument"].replace("_", " ") == q["answer"]
                assert first["time_s"] == pytest.approx(arrival_t, abs=1e-3)


def test_pixels_follow_the_ground_truth(zoom_video, frames):
    gt = zoom_video.gt
    assert len(frames) == gt.num_frames
    for visit in gt.zoom["visits"]:
        inside = (visit["start_frame"] + visit["end_frame"]) // 2
        outside = [f for f in (visit["start_frame"] - 1, visit["end_frame"])
                   if 0 <= f < gt.num_frames and not any(
                       v["kind"] == visit["kind"] and v["start_frame"] <= f < v["end_frame"]
                       for v in gt.zoom["visits"])]
        if visit["kind"] == "small":
            color = SMALL_OBJECTS[visit["name"]]
            assert _in_box(frames[inside], visit["box"], color) >= 12
            for f in outside:
                assert _in_box(frames[f], visit["box"], color) == 0
        else:
            assert _in_box(frames[inside], visit["box"], LOOK_ALIKE_COLOR) >= 30
            marked = _in_box(frames[inside], visit["box"], MARK_COLOR)
            assert (marked >= 6) == LOOK_ALIKES[visit["name"]], (visit, marked)
            for f in outside:
                assert _in_box(frames[f], visit["box"], LOOK_ALIKE_COLOR) < 5
    for flash in gt.zoom["flashes"]:
        assert flash["end_frame"] - flash["frame"] <= 0.6 * FPS + 1             # short
        for f in range(flash["frame"], flash["end_frame"]):
            assert _in_box(frames[f], flash["box"], FLASH_COLOR) >= 20
        for f in (flash["frame"] - 1, flash["end_frame"]):
            assert _in_box(frames[f], flash["box"], FLASH_COLOR) == 0
    for f in (0, gt.num_frames // 2, gt.num_frames - 1):
        assert read_frame_index(frames[f]) == f                       # barcodes unaffected
