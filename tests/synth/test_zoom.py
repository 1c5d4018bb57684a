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


def _look_alike_views(gt, visit, name: str):
    """(whole frame, region) views of the middle of `visit` drawn with `name` there, as the frame
    tools size them (`models.train_data.view` under the tiny-trained budgets), from the RGB
    reference canvas (no encoder in between)."""
    import copy
    import dataclasses

    from medclaw.models import train_data, train_tiny
    from medclaw.synth.draw import RGBCanvas
    from medclaw.synth.video import _Renderer

    zoom = copy.deepcopy(gt.zoom)
    [drawn] = [v for v in zoom["visits"] if v["start_frame"] == visit["start_frame"]
               and v["kind"] == "look_alike"]
    drawn["name"] = name
    index = (visit["start_frame"] + visit["end_frame"]) // 2
    [canvas] = _Renderer(dataclasses.replace(gt, zoom=zoom), 5, canvas_type=RGBCanvas).frames([index])
    frames = canvas.rgb[None].copy()                                   # (1, H, W, 3)
    budget = train_tiny._Budget()
    return (train_data.view(frames, 0, budget).astype(int),
            train_data.view(frames, 0, budget, visit["box"]).astype(int))


def test_a_striped_mark_is_averaged_away_in_the_whole_frame_and_resolved_in_a_crop(monkeypatch):
    """MARK_PATTERN "stripes": the bipolar's whole frame is the dissector's to within a few
    levels (the columns' mean is the flat square's colour), while its region differs by far more
    and shows column-to-column contrast; the solid white mark shows in both views."""
    from medclaw.synth import zoom as zoom_module

    def views(pattern):
        monkeypatch.setattr(zoom_module, "MARK_PATTERN", pattern)
        gt = make_ground_truth(0.4, seed=5, width=W, height=H, fps=FPS,
                               zoom=ZoomOptions(look_alikes=True))
        visit = next(v for v in gt.zoom["visits"] if v["kind"] == "look_alike")
        return _look_alike_views(gt, visit, "bipolar"), _look_alike_views(gt, visit, "dissector")

    (whole_b, region_b), (whole_d, region_d) = views("stripes")
    assert np.abs(whole_b - whole_d).max() <= 8
    assert np.abs(region_b - region_d).max() >= 60
    columns = lambda region: np.abs(np.diff(region[..., 0], axis=1)).max()     # red, column to column
    assert columns(region_b) >= columns(region_d) + 60
    assert "with a striped mark at its tip" in zoom_module.zoom_question("look_alike", 3.0)
    striped = make_ground_truth(0.4, seed=5, width=W, height=H, fps=FPS, zoom=ZoomOptions(look_alikes=True))
    assert striped.zoom["mark_pattern"] == "stripes"
    assert all("striped mark" in qa["question"] for qa in striped.zoom["qa"] if qa["kind"] == "look_alike")
    (whole_b, region_b), (whole_d, region_d) = views("solid")
    assert np.abs(whole_b - whole_d).max() >= 60                    # the white square shows whole
    assert np.abs(region_b - region_d).max() >= 60
    assert "with a white mark at its tip" in zoom_module.zoom_question("look_alike", 3.0)
    assert "mark_pattern" not in make_ground_truth(0.4, seed=5, width=W, height=H, fps=FPS,
                                                   zoom=ZoomOptions(look_alikes=True)).zoom


def test_the_striped_mark_is_drawn_alike_on_both_canvases(monkeypatch):
    """The yuv420p canvas synthesize() encodes draws the stripes as the RGB reference + BT.601
    does: luma everywhere, chroma of every 2x2 block of the mark (two columns' mean)."""
    from medclaw.synth import zoom as zoom_module
    from medclaw.synth.draw import RGBCanvas, rgb_to_yuv420
    from medclaw.synth.video import _Renderer

    monkeypatch.setattr(zoom_module, "MARK_PATTERN", "stripes")
    gt = make_ground_truth(0.4, seed=5, width=W, height=H, fps=FPS, zoom=ZoomOptions(look_alikes=True))
    visit = next(v for v in gt.zoom["visits"] if v["name"] == "bipolar")
    index = (visit["start_frame"] + visit["end_frame"]) // 2
    [fast] = [c.data.copy() for c in _Renderer(gt, 5).frames([index])]
    [ref] = [c.rgb.copy() for c in _Renderer(gt, 5, canvas_type=RGBCanvas).frames([index])]
    want = rgb_to_yuv420(ref)
    assert np.array_equal(fast[:H * W], want[:H * W])
    y0, y1, x0, x1 = zoom_module.mark_square(W, H)
    assert (ref[y0:y1, x0:x1] == zoom_module.mark_columns(x1 - x0)[None]).all()   # stripes drawn
    for offset in (H * W, H * W * 5 // 4):                              # U, then V
        got = fast[offset:offset + H * W // 4].reshape(H // 2, W // 2)
        ref_plane = want[offset:offset + H * W // 4].reshape(H // 2, W // 2)
        block = (slice(y0 // 2, y1 // 2), slice(x0 // 2, x1 // 2))
        assert np.array_equal(got[block], ref_plane[block])
