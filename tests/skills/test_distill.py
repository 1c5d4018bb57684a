"""Heuristic Skill Distillation on scripted models (agent-logic fakes) with everything else real:
the R_0 / R_s gate with its no-large-drop rule, a repeated lesson updating the existing skill,
provenance and archive, no file left by a rejected candidate, one runtime throughout."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.engine.config import EpisodeConfig
from medclaw.eval.dataset import EvalRecord
from medclaw.eval.judge import Judge
from medclaw.skills.distill import DistillConfig, distill, gate
from medclaw.skills.library import ARCHIVE_DIR, Skill, SkillLibrary, parse_skill
from medclaw.skills.prompts import DIAGNOSE_SYSTEM, LESSON_SYSTEM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "eval"))
import eval_scripted  # noqa: E402


@pytest.mark.parametrize("base, trial, kept, why", [
    ({"a": 3, "b": 3}, {"a": 3.25, "b": 3}, True, "R_s 3.125 > R_0 3.000"),
    ({"a": 3, "b": 3}, {"a": 3.05, "b": 3.05}, False, "not above"),           # +0.05 is not > 0.05
    ({"a": 3, "b": 3, "c": 3}, {"a": 1, "b": 5, "c": 5}, False, "question a dropped by 2.00"),
    ({"a": 3, "b": 3}, {"a": 1.25, "b": 5}, True, "R_s"),                       # a drop of 1.75 is allowed
    ({"a": 3}, {"z": 5}, False, "no validation question"),
])
def test_gate(base, trial, kept, why):
    verdict, reason, _ = gate(base, trial, delta=0.05)
    assert verdict is kept and why in reason


# --- the scripted world -------------------------------------------------------------------------

def _records(prefix: str, n: int, video) -> list[EvalRecord]:
    return [EvalRecord(id=f"{prefix}{i}", video=str(video), question=f"{prefix} question {i}?",
                       gold="the grasper", type="VTR", split=prefix) for i in range(n)]


def orchestrator(lessons: dict[str, dict], categories: dict[str, str], tag_for):
    """Diagnoses and lessons from tables; episodes answer with `tag_for(system prompt)`."""

    def reply(request) -> str:
        system = eval_scripted.system_of(request)
        question = eval_scripted.text_of(request.messages[-1]).rsplit("Question: ", 1)[-1].split("\n")[0]
        if system.startswith(DIAGNOSE_SYSTEM[:40]):
            return json.dumps({"category": categories[question], "reason": "looked at the wrong window"})
        if system.startswith(LESSON_SYSTEM[:40]):
            return json.dumps({"thought": "", "tool": "skill_manage",
                               "args": {"action": "create", **lessons[question]}})
        answer = f"{tag_for(system)} answer to {eval_scripted.question_of(request)}"
        return json.dumps({"thought": "", "tool": "final_answer", "args": {"text": answer, "evidence_times": [1.0]}})

    return reply


def judge(scores):
    """`scores(tag, question_index) -> (CI, DO, CU, TU)`, the tag being the answer's first word."""

    def reply(request) -> str:
        prompt = eval_scripted.text_of(request.messages[0])
        answer = prompt.split("\nCandidate answer: ", 1)[1]
        tag, index = answer.split()[0], int(answer.split(" question ")[1].split("?")[0])
        values = scores(tag, index)
        return json.dumps({"rationale": "scripted", **dict(zip(("CI", "DO", "CU", "TU"), values))})

    return reply


def run(tmp_path, synth_video, orchestrator_script, judge_script, mine_n, val_n, library,
        val_records=None, **cfg):
    orch = ScriptedBackend(orchestrator_script, model_name="scripted-llm")
    judge_backend = ScriptedBackend(judge_script, model_name="scripted-judge", model_revision="j1")
    runtime = eval_scripted.scripted_runtime(tmp_path / "models", orch, judge_backend)
    engines = dict(runtime.live_backends())
    config = EpisodeConfig(trace_dir=str(tmp_path / "unused"), concurrency=4)
    import asyncio

    report = asyncio.run(distill(
        _records("mine", mine_n, synth_video.path),
        val_records or _records("val", val_n, synth_video.path),
        runtime, config, Judge(judge_backend), library_dir=library, out_dir=tmp_path / "out",
        config=DistillConfig(**cfg), run_id="test-run"))
    assert runtime.live_backends() == engines          # the same engines served every pass
    return report


GOOD = {"name": "good-skill", "description": "Check the middle frame of each phase.",
        "trigger": "Which phase is shown at a given time.", "body": "1. Call view_full_video.\n2. Call select_video_frame."}
RISKY = {"name": "risky-skill", "description": "Guess from the phase timeline.",
         "trigger": "Counting questions about clips.", "body": "1. Call view_full_video only."}


def test_gate_keeps_plus_006_and_rejects_plus_010_with_one_large_drop(tmp_path, synth_video):
    def tag_for(system):
        return "good" if "good-skill" in system else "risky" if "risky-skill" in system else "base"

    def scores(tag, q):
        if tag == "good" and q in (0, 1):
            return (4, 4, 4, 3)                      # +0.75 on two of 25 questions: mean +0.06
        if tag == "risky" and q == 0:
            return (1, 1, 1, 1)                      # one question drops by 2 ...
        if tag == "risky" and 1 <= q <= 9:
            return (4, 4, 3, 3)                      # ... nine rise by 0.5: mean +0.10
        return (3, 3, 3, 3)

    stages = set(Path(tempfile.gettempdir()).glob("medclaw-skill-stage-*"))
    library = tmp_path / "library"
    categories = {"mine question 0?": "A", "mine question 1?": "A", "mine question 2?": "B"}
    lessons = {"mine question 0?": GOOD, "mine question 1?": RISKY}
    report = run(tmp_path, synth_video, orchestrator(lessons, categories, tag_for), judge(scores),
                 3, 25, library, delta=0.05)

    assert report.R_0 == 3.0
    good, risky = report.verdicts
    assert (good.name, good.kept, good.R_s, good.gain) == ("good-skill", True, 3.06, 0.06)
    assert (risky.name, risky.kept, risky.R_s, risky.gain) == ("risky-skill", False, 3.1, 0.1)
    assert risky.worst_drop == 2.0 and risky.worst_question == "val0" and "dropped by 2.00" in risky.reason
    kept = parse_skill(library / "good-skill" / "SKILL.md")
    assert kept.created_by == "distillation:test-run" and kept.version == 1
    assert kept.provenance["source_traces"] == ["mine-mine0"]
    assert (kept.provenance["R_0"], kept.provenance["R_s"], kept.provenance["delta"]) == (3.0, 3.06, 0.05)
    assert kept.provenance["date"] and kept.provenance["previous_version"] is None
    # the rejected candidate left no skill file anywhere, and no staging folder survived
    everywhere = [p.parent.name for p in tmp_path.rglob("SKILL.md")]
    assert everywhere == ["good-skill"]
    assert set(Path(tempfile.gettempdir()).glob("medclaw-skill-stage-*")) == stages
    mining = [json.loads(line) for line in (tmp_path / "out" / "mine" / "mining.jsonl").read_text().splitlines()]
    assert [m["diagnosis"]["category"] for m in mining] == ["A", "A", "B"]
    assert [m["lesson"] and m["lesson"]["skill"] for m in mining] == ["good-skill", "risky-skill", None]
    text = (tmp_path / "out" / "distill_report.md").read_text()
    assert "| good-skill | 1 | new | 1 | 3.000 | 3.060 | 0.060 |" in text and "rejected: question val0 dropped" in text
    assert json.loads((tmp_path / "out" / "distill_report.json").read_text())["candidates"][1]["kept"] is False


def test_repeated_lesson_updates_the_existing_skill_and_archives_it(tmp_path, synth_video):
    library = tmp_path / "library"
    SkillLibrary([]).add(Skill(name="count-events", description="Count repeated events phase by phase.",
                               trigger="The question asks how many times something happened.",
                               version=1, created_by="human", tags=["count"],
                               body="# Count\n\n1. Call view_full_video."), library)
    lesson = {"name": "count-occurrences", "description": "Count repeated events phase by phase.",
              "trigger": "The question asks how many times something happened in the video.",
              "body": "# Count\n\n1. Call crop_video phase by phase and count each event."}
    categories = {f"mine question {i}?": "A" for i in range(2)}
    lessons = {f"mine question {i}?": lesson for i in range(2)}

    def tag_for(system):
        return "new" if "count-events (v2)" in system else "base"

    report = run(tmp_path, synth_video, orchestrator(lessons, categories, tag_for),
                 judge(lambda tag, q: (4, 4, 4, 4) if tag == "new" else (3, 3, 3, 3)), 2, 4, library)

    [verdict] = report.verdicts                     # one candidate, not a near-duplicate second one
    assert (verdict.name, verdict.version, verdict.base_version, verdict.kept) == ("count-events", 2, 1, True)
    assert verdict.sources == ["mine-mine0", "mine-mine1"]
    installed = parse_skill(library / "count-events" / "SKILL.md")
    assert installed.version == 2 and "crop_video phase by phase" in installed.body
    assert installed.provenance["previous_version"] == 1
    assert installed.provenance["source_traces"] == ["mine-mine0", "mine-mine1"]
    archived = parse_skill(library / ARCHIVE_DIR / "v1" / "count-events" / "SKILL.md")
    assert archived.version == 1 and archived.created_by == "human"      # archived, not deleted
    assert not (library / "count-occurrences").exists()
    mining = [json.loads(line) for line in (tmp_path / "out" / "mine" / "mining.jsonl").read_text().splitlines()]
    assert all("already covers this" in m["lesson"]["actions"][-1]["result"] for m in mining)


def test_no_lesson_no_validation_pass(tmp_path, synth_video):
    categories = {"mine question 0?": "C"}
    report = run(tmp_path, synth_video, orchestrator({}, categories, lambda s: "base"),
                 judge(lambda tag, q: (5, 5, 5, 5)), 1, 3, tmp_path / "library")
    assert report.verdicts == [] and report.R_0 is None
    assert not (tmp_path / "out" / "val").exists()
    assert "No candidate skill was proposed." in (tmp_path / "out" / "distill_report.md").read_text()


@pytest.mark.parametrize("reward, kept", [("judge", False), ("exact", True)])
def test_exact_reward_sees_what_a_constant_judge_cannot(tmp_path, synth_video, reward, kept):
    """A judge that scores every answer alike (the miniature's untrained one) can never pass a
    candidate; gated on exact match (1 + 4 * match), the skill that turns two of 25 answers
    right is kept: R_0 1.0, R_s 1.32."""
    from dataclasses import replace

    val = [replace(r, gold_value="grasper", choices=["grasper", "scissors"])
           for r in _records("val", 25, synth_video.path)]

    def tag_for(system):
        return "good" if "good-skill" in system else "base"

    script = orchestrator({"mine question 0?": GOOD}, {"mine question 0?": "A"}, tag_for)

    def answers(request):            # right on questions 0 and 1 with the skill, else wrong
        reply = json.loads(script(request))
        if reply.get("tool") == "final_answer":
            text = reply["args"]["text"]
            right = text.startswith("good") and text.split(" question ")[1] in ("0?", "1?")
            reply["args"]["text"] = "grasper" if right else "scissors"
        return json.dumps(reply)

    report = run(tmp_path, synth_video, answers, lambda request: json.dumps(
        {"rationale": "same for all", "CI": 3, "DO": 3, "CU": 3, "TU": 3}),
        1, 25, tmp_path / "library", val_records=val, reward=reward)
    (verdict,) = report.verdicts
    assert verdict.kept is kept
    assert (report.R_0, verdict.R_s) == ((3.0, 3.0) if reward == "judge" else (1.0, 1.32))
    assert (tmp_path / "library" / "good-skill" / "SKILL.md").exists() is kept
    saved = json.loads((tmp_path / "out" / "distill_report.json").read_text())
    assert saved["reward"] == reward
    if kept:
        assert parse_skill(tmp_path / "library" / "good-skill" / "SKILL.md").provenance["reward"] == "exact"


def test_exact_reward_needs_exact_gold_on_every_validation_question(tmp_path, synth_video):
    from medclaw.errors import ConfigError

    with pytest.raises(ConfigError, match="--reward exact needs exact gold"):
        run(tmp_path, synth_video, orchestrator({}, {}, lambda s: "base"),
            judge(lambda tag, q: (3, 3, 3, 3)), 1, 2, tmp_path / "library", reward="exact")
    assert not (tmp_path / "library").exists() and not (tmp_path / "out").exists()


def test_cli_refuses_exact_reward_without_exact_gold_before_any_engine(tmp_path, synth_video, capsys):
    from medclaw import cli

    data = tmp_path / "set.jsonl"
    data.write_text(json.dumps({"id": "q1", "video": str(synth_video.path), "question": "Which?", "type": "VTR",
                                "gold": "the grasper"}) + "\n")
    assert cli.main(["distill", "--mine", str(data), "--val", str(data), "--library",
                     str(tmp_path / "lib"), "--out", str(tmp_path / "out"), "--reward", "exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--reward exact needs exact gold" in err and "q1" in err
    assert not (tmp_path / "lib").exists() and not (tmp_path / "out").exists()
