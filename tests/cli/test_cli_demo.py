"""`medclaw demo`: synth zoom video → KB from the shipped corpus → the video's first small-object
question → summary with the ground truth, right or wrong, and the evidence frames. The engine run
is `make demo`'s own command, on the committed trained miniature (`tiny-trained`), and must be
right with the right evidence: a regression in frames, prompts, caching or engine settings shows
up there as a wrong answer or a failed run. The other run scripts the orchestrator (agent-logic
fake) on random-weight labelling."""
from __future__ import annotations

import json
import os
import re

import pytest

from medclaw import cli
from medclaw.cli.demo import DEMO_KIND, RANDOM_WEIGHTS_LABEL, TRAINED_LABEL
from medclaw.engine.backends.cpu_binding import BIND_VARIABLE
from medclaw.engine.backends.fake import ScriptedBackend

LOAD = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
FINAL = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "the grasper", "evidence_times": [3.0]}})


@pytest.fixture
def medclaw(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("demo",)})
    return cli.main


def test_bad_minutes_is_a_one_line_error(medclaw, tmp_path, capsys):
    assert medclaw(["demo", "--out-dir", str(tmp_path), "--minutes", "0.1"]) == 2
    assert "--minutes" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_pipeline_and_summary(medclaw, serve_roles_with, tmp_path, capsys):
    def orchestrator(request):
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        return LOAD if turns < 2 else FINAL

    scripted = ScriptedBackend(orchestrator)
    opened = serve_roles_with({"orchestrator": scripted, "judge": scripted,
                               "video_expert": ScriptedBackend([]),
                               "frame_verifier": ScriptedBackend([])})
    out_dir = tmp_path / "demo"
    assert medclaw(["demo", "--out-dir", str(out_dir), "--minutes", "0.5", "--json",
                    "--profile", "tiny-cpu"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert "TINY RANDOM WEIGHTS" in captured.err              # labelled even in JSON mode
    assert summary["label"] == RANDOM_WEIGHTS_LABEL
    gt = json.loads((out_dir / "demo-procedure.json").read_text())
    qa = next(q for q in gt["zoom"]["qa"] if q["kind"] == DEMO_KIND)
    assert summary["question"] == qa["question"] and summary["ground_truth"] == qa["answer"]
    assert summary["answer"] == "the grasper" and summary["status"] == "answered"
    assert summary["correct"] is False and summary["evidence_times"] == [3.0]
    visit = summary["visit_s"]
    assert summary["evidence_in_visit"] is (visit[0] <= 3.0 < visit[1])
    assert summary["tools"] == ["load_skill", "load_skill", "final_answer"]
    assert set(summary["timings_s"]) == {"synth_s", "kb_build_s", "engine_start_s", "episode_s"}
    assert (out_dir / "kb" / "manifest.json").is_file() and opened[-1].knowledge_base is not None
    assert json.loads(open(summary["trace"]).readline())["type"] == "header"
    # the system prompt the orchestrator got lists the shipped skill
    assert "directed-relook" in scripted.requests[0].messages[0]["content"][0]["text"]
    # a second run in the same folder keeps the video and the knowledge base (same corpus, same
    # encoder: kb.build.current_index) and asks the same question
    manifest = (out_dir / "kb" / "manifest.json").read_text()
    assert medclaw(["demo", "--out-dir", str(out_dir), "--minutes", "0.5", "--json",
                    "--profile", "tiny-cpu"]) == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out)
    assert "passages (kept from" in captured.err and "kb_build_s" not in again["timings_s"]
    assert (out_dir / "kb" / "manifest.json").read_text() == manifest
    assert again["question"] == summary["question"] and opened[-1].knowledge_base is not None


@pytest.mark.engine
@pytest.mark.slow
def test_make_demo_is_right_with_its_evidence(tmp_path, capsys):
    """`make demo`'s command in a process of its own, as a user runs it (its engines once failed to
    start there while every test passed, under a KV-cache override the suite no longer sets)."""
    import subprocess
    import sys
    from pathlib import Path

    from medclaw.cli.demo import _print
    from medclaw.engine.trace import Trace

    out_dir = tmp_path / "demo"
    command = Path(sys.executable).with_name("medclaw")           # the venv's, as `make demo`
    # without the suite's core binding (tests/conftest.py), as a user's shell has none; wide, so
    # that the progress lines are not wrapped
    env = {k: v for k, v in os.environ.items() if k != BIND_VARIABLE} | {"COLUMNS": "300"}
    run = subprocess.run([str(command), "demo", "--out-dir", str(out_dir), "--json"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    # its two engines started together, each computing on its own share of the cores (read from
    # the worker processes: cpu_binding.core_shares)
    cores = [{int(c) for c in m.split(",")}
             for m in re.findall(r"ready in [\d.]+ s, on CPU cores ([\d,]+)", run.stderr)]
    assert len(cores) == 2, run.stderr[-3000:]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not cores[0] & cores[1], cores
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert "TRAINED MINIATURE" in run.stderr and summary["label"] == TRAINED_LABEL
    gt = json.loads((out_dir / "demo-procedure.json").read_text())
    qa = next(q for q in gt["zoom"]["qa"] if q["kind"] == DEMO_KIND)
    assert summary["status"] == "answered", summary
    assert summary["correct"] is True, (summary["answer"], qa["answer"])
    assert summary["evidence_in_visit"] is True, (summary["evidence_times"], summary["visit_s"])
    # the answer rests on a zoom into the object's box, at the asked time, in this video
    crops = [f for f in summary["evidence_frames"] if f["tool"] == "crop_video_frame"]
    assert crops, summary["tools"]
    t = qa["evidence_times_s"][0]
    fps = gt["fps"]
    for frame in crops:
        assert abs(frame["time_s"] - t) <= 1 / fps and frame["index"] == round(frame["time_s"] * fps)
        box = qa["box"]
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        x1, y1, x2, y2 = frame["crop_box"]
        assert x1 <= cx <= x2 and y1 <= cy <= y2
    # and the human-readable summary prints the same verdict
    _print(summary, Trace.load(summary["trace"]))
    out = capsys.readouterr().out
    assert "Right:        yes" in out and "Evidence:     crop_video_frame" in out
