"""Exact scorers: count, label, label set and temporal IoU, including the ways to game them."""
from __future__ import annotations

import pytest

from medclaw.eval.dataset import EvalRecord
from medclaw.eval.scorers import evidence_window, exact_scores, temporal_iou

CHOICES = ["grasper", "hook", "clip applier", "scissors"]


def _record(gold_value, window=(10.0, 20.0), choices=CHOICES):
    return EvalRecord(id="q", video="v.mp4", question="?", gold=str(gold_value), type="VTR",
                      gold_window_s=window, gold_value=gold_value, choices=list(choices))


@pytest.mark.parametrize("gold, answer, expected", [
    (4, "Four clips were placed.", 1.0),
    (4, "4", 1.0),
    (4, "I counted 3 clips, maybe 4", 0.0),          # the first number counts
    (4, "several clips", 0.0),
    ("clip applier", "The clip_applier came in.", 1.0),
    ("clip applier", "A grasper, then the clip applier.", 0.0),   # naming two labels is not an answer
    ("hook", "the hooked grasper", 0.0),
    (["grasper", "hook"], "grasper and hook", 1.0),
    (["grasper", "hook"], "only the grasper", 0.6667),
    (["grasper", "hook"], "grasper, hook, scissors, clip applier", 0.6667),
    ([], "none are visible", 1.0),
    ([], "a grasper", 0.0),
])
def test_match(gold, answer, expected):
    assert exact_scores(_record(gold), answer, [])["match"] == pytest.approx(expected, abs=1e-4)


def test_temporal_iou_from_evidence_times():
    assert temporal_iou((10, 20), (15, 25)) == pytest.approx(1 / 3, abs=1e-4)
    assert temporal_iou((0, 5), (10, 20)) == 0.0
    assert evidence_window([12.0]) == (11.5, 12.5)           # one time: a 1 s window around it
    assert evidence_window([]) is None
    scores = exact_scores(_record("hook"), "hook", [12.0, 18.0])
    assert scores["tiou"] == pytest.approx(0.6) and scores["match_kind"] == "label"
    assert exact_scores(_record("hook"), "hook", [])["tiou"] == 0.0


def test_no_gold_no_score_and_no_answer_scores_zero():
    record = _record(None, window=None)
    assert exact_scores(record, "anything", [1.0]) == {"match": None, "match_kind": None, "tiou": None}
    assert exact_scores(_record(3), None, [])["match"] == 0.0
