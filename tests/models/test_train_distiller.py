"""The distiller of the trained miniature (`models.train_distiller`): its scripted reviewer, the
episodes it is trained on, and the committed checkpoint."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from medclaw.models import train_distiller as D
from medclaw.models.train_tiny import file_sha256
from medclaw.skills.prompts import diagnose_turn

CROP = ('{n}. crop_video_frame {{"query": "Which small object is there?", "time_s": {t}, "x1": 0.3, '
        '"x2": 0.4, "y1": 0.3, "y2": 0.5}} -> Region x 0.30-0.40 ... : nothing of note')


def _turn(question: str, answer: str, gold: str, crop_times) -> str:
    steps = "\n".join(CROP.format(n=k + 1, t=t) for k, t in enumerate(crop_times))
    steps += f'\n{len(crop_times) + 1}. final_answer {{"text": "{answer}"}} -> Final answer recorded.'
    return diagnose_turn(SimpleNamespace(question=question, gold=gold), answer, steps)


@pytest.mark.parametrize("question, answer, gold, crops, category", [
    ("Which small object lies in the field at 12.6 s: needle, bulldog clamp, gauze tag?",
     "Needle", "needle", [9.6], "C"),                               # right, wherever it looked
    ("Which small object lies in the field at 12.6 s: needle, bulldog clamp, gauze tag?",
     "not seen", "needle", [12.6, 12.6], "B"),                      # looked where asked
    ("Which small object lies in the field at 12.6 s: needle, bulldog clamp, gauze tag?",
     "not seen", "needle", [19.6, 19.6], "A"),                      # a digit copied wrongly
    ("At 17 s, is the instrument on the left the dissector or the bipolar?",
     "not seen", "bipolar", [11.7], "A"),                           # a whole second miscopied
    ("At 17 s, is the instrument on the left the dissector or the bipolar?",
     "dissector", "bipolar", [17], "B"),                            # misread at the asked time
    ("At 17 s, is the instrument on the left the dissector or the bipolar?",
     "not seen", "bipolar", [], "B"),                               # no crop at all to compare
])
def test_the_scripted_reviewer_reads_the_turn(question, answer, gold, crops, category):
    assert D.expected_category(_turn(question, answer, gold, crops)) == category


def test_the_reviewer_replies_in_the_formats_distill_parses():
    """A diagnosis reply parses as distill parses it; a lesson reply is a skill_manage call that
    creates LESSON's skill through the real tool, and a second one updates that candidate."""
    from medclaw.engine.runtime import load_skill_library
    from medclaw.engine.toolcall import Action, parse_action
    from medclaw.requests.conversation import Conversation
    from medclaw.skills.distill import _parse_diagnosis
    from medclaw.skills.manage import CandidateSet, SkillManageTool
    from medclaw.skills.prompts import DIAGNOSE_SYSTEM, LESSON_SYSTEM

    turn = _turn("At 17 s, is the instrument on the left the dissector or the bipolar?",
                 "not seen", "bipolar", [11.7])
    conversation = Conversation(system=DIAGNOSE_SYSTEM)
    conversation.add_user(turn)
    reply = D.reviewer_reply(conversation.to_request(max_tokens=64))
    assert _parse_diagnosis(reply) == {"category": "A", "reason": D.REASON["A"]}

    tool = SkillManageTool(CandidateSet(load_skill_library(), 5, created_by="test"))
    conversation = Conversation(system=LESSON_SYSTEM)
    conversation.add_user("The library now holds ...")
    action = parse_action(D.reviewer_reply(conversation.to_request(max_tokens=64)), [tool.spec()])
    assert isinstance(action, Action) and action.tool == "skill_manage"
    first = asyncio.run(tool.run(None, action.args))
    again = asyncio.run(tool.run(None, action.args))
    assert first.data == {"written": True, "skill": D.LESSON["name"], "version": 1}
    assert again.data["skill"] == D.LESSON["name"] and "updated" in again.text
    assert list(tool.candidates.candidates) == [D.LESSON["name"]]


def test_training_episodes_end_the_way_their_run_says(tmp_path):
    """Played through the real episode loop and reviewed through distill's own functions: each
    run kind gets the diagnosis it stands for (whole-second questions included), every A writes
    the lesson's skill, and what was recorded is what distill sends (its system turns)."""
    from medclaw.models.orchestrator_data import ASKED_TIME_RE
    from medclaw.requests.conversation import message_text
    from medclaw.skills.prompts import DIAGNOSE_SYSTEM, LESSON_SYSTEM

    reviewer = D.scripted_reviewer()
    rng = np.random.default_rng(3)
    reviews = asyncio.run(D.played_reviews(tmp_path, (1000,), 0.5, 24, rng, reviewer))
    assert {r.run for r in reviews} == set(D.RUNS)
    asked = [ASKED_TIME_RE.search(r.question).group() for r in reviews]
    assert any("." not in t for t in asked) and any("." in t for t in asked)   # "At 5 s", "7.7 s"
    for r in reviews:
        assert r.category == r.expected
        if r.run in ("elsewhere", "missed"):
            assert r.answer == "not seen"
        if r.run != "right":                  # a right run at a whole second may see nothing
            assert r.expected == D.CATEGORY_OF_RUN[r.run], r
        assert (r.skill == D.LESSON["name"]) == (r.expected == "A")
    systems = {message_text(q.messages[0]).split("\n\n")[0] for q in reviewer.requests}
    assert systems == {DIAGNOSE_SYSTEM.split("\n\n")[0], LESSON_SYSTEM.split("\n\n")[0]}
    assert len(reviewer.requests) == len(reviews) + sum(r.expected == "A" for r in reviews)


def test_scores_count_diagnoses_and_lessons():
    rows = [D.Review("right", "small_object", "q", "needle", "C", "C", None),
            D.Review("elsewhere", "look_alike", "q", "not seen", "A", "A", D.LESSON["name"]),
            D.Review("elsewhere", "look_alike", "q", "not seen", "A", "A", None),
            D.Review("missed", "look_alike", "q", "not seen", "B", "A", None)]
    held = D.score(rows)
    assert held["diagnosis_accuracy"] == 0.75
    assert held["by_category"] == {"A": 1.0, "B": 0.0, "C": 1.0}
    assert held["lessons_written"] == round(1 / 3, 4)
    assert [w["run"] for w in held["wrong"]] == ["missed"]
    assert not D.targets_met(held)


def test_the_committed_distiller_is_the_committed_orchestrator_fine_tuned():
    """Its manifest holds, its report's verdict follows from its held-out figures, it writes the
    lesson for every A it diagnoses, it started from the orchestrator that is committed now, and
    it keeps that orchestrator's tokenizer byte for byte. (Its diagnoses miss TARGET: the report
    says so, README's Not done too.)"""
    from medclaw.models.train_tiny import COMMITTED, check_manifest

    folder = D.COMMITTED_DISTILLER
    assert check_manifest(folder) == []
    report = json.loads((folder / "distiller-report.json").read_text())
    held = report["held_out"]
    assert report["targets_met"] == D.targets_met(held)
    assert held["lessons_written"] >= D.TARGET
    # Held out, each question is played once per run kind, two of the four kinds B: diagnosing
    # every episode B would score 0.5. The committed model must beat that constant.
    assert held["diagnosis_accuracy"] > 0.5
    assert report["orchestrator_sha256"] == file_sha256(COMMITTED / "llm" / "model.safetensors")
    assert (folder / "tokenizer.json").read_bytes() == (COMMITTED / "llm" / "tokenizer.json").read_bytes()
    assert report["command"].startswith("medclaw models train-distiller ")


@pytest.mark.engine
def test_the_distiller_served_by_vllm_reviews_held_out_episodes(tmp_path, trained_specs):
    """The committed distiller on vLLM (what `medclaw distill` serves it with, schema-constrained)
    reviews the episodes of a held-out video, played in each way an episode can end: every reply
    parses, its diagnoses beat a constant one, and each A writes the lesson through the real
    skill_manage tool."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(trained_specs["distiller"])
    try:
        reviews = asyncio.run(D.played_reviews(tmp_path, D.EVAL_SEEDS[:1], D.EVAL_MINUTES, None,
                                               np.random.default_rng(0), backend))
    finally:
        backend.shutdown()
    held = D.score(reviews)
    assert {r.expected for r in reviews} == {"A", "B", "C"}
    assert all(r.category in ("A", "B", "C") for r in reviews)     # every reply parsed
    # Better than any constant diagnosis (B, the commonest, is half of the reviews); TARGET is
    # not met yet (the committed report).
    commonest = max(sum(r.expected == c for r in reviews) for c in "ABC") / len(reviews)
    assert held["diagnosis_accuracy"] > commonest, held["wrong"]
    assert held["lessons_written"] >= D.TARGET, held
