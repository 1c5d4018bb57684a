"""Evaluation datasets: the three formats map to one record; bad lines and duplicate ids are
reported with their line numbers, and the caller chooses to stop or to skip them."""
from __future__ import annotations

import json
import re

import pytest

from medclaw.eval.dataset import DatasetError, read_dataset

NATIVE = {"id": "q1", "video": "videos/a.mp4", "question": "Which instrument?", "gold": "grasper",
          "type": "VTR", "subtype": "before_after", "split": "val", "gold_window_s": [1.5, 4],
          "gold_value": "grasper", "choices": ["grasper", "hook"]}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_native_record_with_relative_video(tmp_path):
    records, problems = read_dataset(_write(tmp_path / "d.jsonl", [NATIVE]))
    [r] = records
    assert problems == [] and r.line == 1
    assert r.video == str(tmp_path / "videos" / "a.mp4")          # relative to the dataset file
    assert (r.id, r.type, r.subtype, r.split, r.gold_window_s) == ("q1", "VTR", "before_after", "val", (1.5, 4.0))
    assert r.gold_value == "grasper" and r.choices == ["grasper", "hook"]


def test_medclawbench_and_svu31k_mappings(tmp_path):
    bench = {"qid": 7, "video_path": "/data/v.mp4", "question": "How many clips?", "answer": "3",
             "task": "VTR", "category": "count", "split": "test", "time_window": [10, 20]}
    [r], _ = read_dataset(_write(tmp_path / "b.jsonl", [bench]))
    assert (r.id, r.video, r.gold, r.type, r.subtype, r.gold_window_s) == \
        ("7", "/data/v.mp4", "3", "VTR", "count", (10.0, 20.0))
    svu = [{"id": "s1", "video": "clip.mp4", "timecodes": [[3, 9]],
            "conversations": [{"from": "human", "value": "<video>\nWhat is the surgeon doing?"},
                              {"from": "gpt", "value": "Dissecting the triangle."}]},
           {"id": "s2", "video": "clip.mp4",
            "conversations": [{"from": "human", "value": "<video>\nWhich organ?"},
                              {"from": "gpt", "value": "The gallbladder."}]}]
    (a, b), _ = read_dataset(_write(tmp_path / "s.jsonl", svu))
    assert (a.question, a.gold, a.type, a.gold_window_s, a.split) == \
        ("What is the surgeon doing?", "Dissecting the triangle.", "VTR", (3.0, 9.0), "train")
    assert (b.type, b.gold_window_s) == ("VPR", None)


ROWS = [NATIVE, "not json {", {**NATIVE, "id": "q2", "type": "XYZ"}, {**NATIVE, "id": "q3"},
        {**NATIVE, "id": "q1", "question": "again"}, [1, 2], {**NATIVE, "id": "q4", "gold_window_s": [5, 2]}]


def test_stop_names_every_bad_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", ROWS)
    with pytest.raises(DatasetError) as err:
        read_dataset(path, on_bad="stop")
    message = str(err.value)
    assert "\n" not in message and "5 bad record(s)" in message and "--on-bad-record skip" in message
    for fragment in ("line 2: not valid JSON", "line 3: type must be one of VTR, VPR",
                     "line 5: duplicate id 'q1' (first on line 1)", "line 6: not a JSON object",
                     "line 7: gold_window_s"):
        assert fragment in message


def test_skip_keeps_the_good_records_and_reports_the_rest(tmp_path):
    records, problems = read_dataset(_write(tmp_path / "bad.jsonl", ROWS), on_bad="skip")
    assert [r.id for r in records] == ["q1", "q3"]
    assert records[0].question == "Which instrument?"              # the first q1 is kept
    assert [p.line for p in problems] == [2, 3, 5, 6, 7]


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "dataset file not found"),
    (lambda p: p.write_text("\n\n"), "no usable records"),
])
def test_missing_or_empty_file(tmp_path, setup, message):
    path = tmp_path / "d.jsonl"
    setup(path)
    with pytest.raises(DatasetError, match=message):
        read_dataset(path)


def test_synthetic_set_gold_comes_from_the_ground_truth(tmp_path):
    from medclaw.eval.synthetic import make_synthetic
    from medclaw.synth.truth import GroundTruth

    path = make_synthetic(tmp_path / "set", videos=1, minutes=0.25, seed=3, per_video=5)
    records, _ = read_dataset(path)
    gt = GroundTruth.load(tmp_path / "set" / "videos" / "video-0.json")
    assert [r.subtype for r in records] == ["before_after", "count", "presence", "phase", "phase_content"]
    assert {r.type for r in records} == {"VTR", "VPR"}
    by = {r.subtype: r for r in records}
    cut = next(e for e in gt.events if e["kind"] == "cut")
    before = next(x for x in gt.relations if x["event"] == "cut")["instrument_in_before"]
    assert by["before_after"].gold_value == before["instrument"].replace("_", " ")
    assert by["before_after"].gold_window_s == (round(before["time_s"], 2), round(cut["time_s"], 2))
    assert by["count"].gold_value == len(gt.events_of("clip_placed"))
    t = float(by["presence"].question.split(" at ")[1].split(" s")[0])
    assert by["presence"].gold_value == [n.replace("_", " ") for n in gt.instruments_at(gt.frame_at(t))]
    lo, hi = by["presence"].gold_window_s
    assert lo <= t < hi
    phase = next(p for p in gt.phases if p["name"] == by["phase"].gold_value)
    assert by["phase"].gold_window_s == (round(phase["start_s"], 2), round(phase["end_s"], 2))
    assert all(r.gold_window_s[1] <= gt.duration_s for r in records)


def test_zoom_set_asks_what_the_ground_truth_drew(tmp_path):
    from medclaw.eval.synthetic import ZOOM_WINDOW_S, make_synthetic
    from medclaw.synth.truth import GroundTruth

    path = make_synthetic(tmp_path / "set", videos=1, minutes=0.5, seed=5000, zoom=True,
                          families=("small_object", "look_alike"))
    records, _ = read_dataset(path)
    gt = GroundTruth.load(tmp_path / "set" / "videos" / "video-0.json")
    assert sorted(r.subtype for r in records) == ["look_alike"] * 2 + ["small_object"] * 2
    for r in records:
        t = float(re.search(r"(\d+(?:\.\d+)?) s\b", r.question).group(1))
        frame = gt.frame_at(t)
        kind = "small" if r.subtype == "small_object" else "look_alike"
        on_screen = [v["name"].replace("_", " ") for v in gt.zoom["visits"]
                     if v["kind"] == kind and v["start_frame"] <= frame < v["end_frame"]]
        assert on_screen == [r.gold_value], (r.question, on_screen)
        assert r.gold_value in r.choices
        assert r.gold_window_s == (round(t - ZOOM_WINDOW_S, 2), round(t + ZOOM_WINDOW_S, 2))


def test_whole_second_questions_ask_the_same_visits_at_whole_seconds(tmp_path):
    """`whole_seconds` moves each small-object and look-alike question to a whole second
    inside the same visit: the same answers, in the same order, now at "at 17 s"."""
    from medclaw.eval.synthetic import make_synthetic
    from medclaw.synth.truth import GroundTruth
    from medclaw.synth.zoom import VISIT_KIND

    def asked(records):
        return [float(re.search(r"(\d+(?:\.\d+)?) s\b", r.question).group(1)) for r in records]

    families = ("small_object", "look_alike")
    tenths, _ = read_dataset(make_synthetic(tmp_path / "a", videos=2, minutes=0.5, seed=5000,
                                            zoom=True, families=families))
    whole, _ = read_dataset(make_synthetic(tmp_path / "b", videos=2, minutes=0.5, seed=5000,
                                           zoom=True, families=families, whole_seconds=True))
    assert [r.gold_value for r in whole] == [r.gold_value for r in tenths]
    assert [r.id for r in whole] == [r.id for r in tenths]
    assert all(t == int(t) for t in asked(whole))
    assert any(t != int(t) for t in asked(tenths))     # else the option changed nothing here
    for r, t, t0 in zip(whole, asked(whole), asked(tenths)):
        gt = GroundTruth.load(tmp_path / "b" / "videos" / f"video-{r.id[1]}.json")
        kind = VISIT_KIND[r.subtype]
        visit = next(v for v in gt.zoom["visits"] if v["kind"] == kind
                     and v["start_s"] <= t0 < v["end_s"])
        assert visit["start_s"] < t < visit["end_s"], (r.question, visit)
        assert r.question.replace(f"{t:g} s", f"{t0:g} s") == next(
            x.question for x in tenths if x.id == r.id)


def test_a_longer_name_is_not_read_as_the_small_object(tmp_path):
    """A description naming the needle driver (an instrument) does not answer "needle"; one
    naming the needle alone does. Scored with the set's own choices, as `medclaw eval` does."""
    from medclaw.eval.scorers import exact_scores
    from medclaw.eval.synthetic import make_synthetic

    path = make_synthetic(tmp_path / "set", videos=2, minutes=0.5, seed=5000, zoom=True,
                          families=("small_object",))
    records, _ = read_dataset(path)
    record = next(r for r in records if r.gold_value == "needle")
    assert "needle driver" in record.choices
    wrong = "phase: suturing\ninstruments: needle driver\nsmall object: none"
    assert exact_scores(record, wrong, [])["match"] == 0.0
    assert exact_scores(record, "small object: needle", [])["match"] == 1.0


def test_zoom_families_need_zoom(tmp_path):
    from medclaw.eval.synthetic import make_synthetic

    with pytest.raises(ValueError, match="zoom families need zoom"):
        make_synthetic(tmp_path / "set", videos=1, minutes=0.25, seed=3, families=("look_alike",))
