"""`medclaw eval` on scripted models (agent-logic fakes) and everything else real: results lines
with traces, the report with its Δ row, bad input refused before engines, compare reading the
models from the traces, and kill -9 at any moment followed by --resume giving every id once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from medclaw import cli
from medclaw.eval.dataset import EvalRecord, write_dataset

import eval_scripted

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture
def medclaw(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("eval", "trace")})
    return cli.main


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    import medclaw.engine.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "open_runtime", runtime_module.open_runtime)  # restored after
    return eval_scripted.install(tmp_path / "models")


def make_dataset(folder: Path, video, n: int, split: str = "test") -> Path:
    records = [EvalRecord(id=f"q{i}", video=str(video), question=f"Question number {i}: which instrument?",
                          gold="grasper", type="VTR" if i % 2 else "VPR", subtype="before_after",
                          split=split, gold_window_s=(0.5, 2.5), gold_value="grasper",
                          choices=["grasper", "hook"]) for i in range(n)]
    folder.mkdir(parents=True, exist_ok=True)
    return write_dataset(folder / "data.jsonl", records)


def config_file(folder: Path, **episode) -> Path:
    import yaml

    path = folder / "medclaw.yaml"
    path.write_text(yaml.safe_dump({"episode": {"min_tool_steps": 0, "concurrency": 2, **episode}}))
    return path


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_agent_and_oneshot_then_report_with_delta(medclaw, scripted, tmp_path, synth_video, capsys):
    from medclaw.engine.trace import Trace

    data = make_dataset(tmp_path, synth_video.path, 4)
    out = tmp_path / "run"
    config = config_file(tmp_path)
    assert medclaw(["eval", str(data), "--out", str(out), "--config", str(config)]) == 0
    assert medclaw(["eval", str(data), "--out", str(out), "--mode", "oneshot", "--config", str(config)]) == 0
    report_md = capsys.readouterr().out
    for mode in ("agent", "oneshot"):
        rows = rows_of(out / mode / "results.jsonl")
        assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2", "q3"]
        for row in rows:
            trace = Trace.load(out / mode / row["trace"])           # relative to the mode folder
            assert trace.header.question == row["question"] and trace.footer.answer == row["answer"]
            assert row["judge"]["model"] == "scripted-judge" and row["judge"]["revision"] == "j1"
            assert row["judge"]["prompt_version"] == "judge_v1" and row["judge"]["parsed"]
            assert row["exact"]["match"] == 1.0 and row["exact"]["match_kind"] == "label"
        meta = json.loads((out / mode / "run.json").read_text())
        assert meta["mode"] == mode and meta["models"]["video_expert"]["name"] == "scripted-vlm"
    oneshot = rows_of(out / "oneshot" / "results.jsonl")[0]
    assert oneshot["evidence_times"] == [1.0, 3.0] and oneshot["exact"]["tiou"] == pytest.approx(0.6)
    trace = Trace.load(out / "oneshot" / oneshot["trace"])
    assert [s.tool for s in trace.steps] == ["oneshot"] and trace.steps[0].frames     # it saw frames
    assert trace.steps[0].model_calls[0].model_name == "scripted-vlm"

    summary = json.loads((out / "report.json").read_text())
    assert {(g["split"], g["type"], g["mode"]) for g in summary["groups"]} == \
        {("test", t, m) for t in ("VTR", "VPR") for m in ("agent", "oneshot")}
    agent_vtr = next(g for g in summary["groups"] if (g["type"], g["mode"]) == ("VTR", "agent"))
    assert agent_vtr["n"] == 2 and agent_vtr["Avg"] == 4.0 and agent_vtr["CI"] == 4.0
    assert [(d["type"], d["Avg"], d["n"]) for d in summary["deltas"]] == [("VPR", 0.0, 2), ("VTR", 0.0, 2)]
    assert summary["judge"] == {"judged": 8, "parsed": 8, "models": ["scripted-judge@j1"]}
    assert "| VTR | Δ agent − one-shot | 2 |" in report_md and "## Split `test`" in report_md
    assert (out / "report.png").stat().st_size > 1000 and (out / "report.md").is_file()


def test_compare_reads_models_from_traces(medclaw, scripted, tmp_path, synth_video, capsys, monkeypatch):
    data = make_dataset(tmp_path, synth_video.path, 2)
    config = config_file(tmp_path)
    runs = []
    for revision in ("v1", "v2"):                       # two backbones (VLM revisions)
        eval_scripted.install(tmp_path / "models", vlm_revision=revision)
        runs.append(tmp_path / f"run-{revision}")
        assert medclaw(["eval", str(data), "--out", str(runs[-1]), "--mode", "oneshot",
                        "--config", str(config)]) == 0
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert medclaw(["eval", "compare", *map(str, runs), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    summary = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in summary["runs"]] == ["run-v1", "run-v2"]
    assert [r["models"]["roles"]["video_expert"] for r in summary["runs"]] == \
        [["scripted-vlm@v1"], ["scripted-vlm@v2"]]
    assert "scripted-vlm@v1" in summary["runs"][0]["models"]["calls"]
    assert "scripted-vlm@v1" in table and "scripted-vlm@v2" in table
    assert (out / "compare.png").stat().st_size > 1000


@pytest.mark.parametrize("setup, message", [
    (lambda d, out: d.write_text(d.read_text() + "{broken\n"), "1 bad record(s): line 3: not valid JSON"),
    (lambda d, out: d.write_text(d.read_text().replace('"q1"', '"q0"')), "duplicate id 'q0' (first on line 1)"),
    (lambda d, out: d.write_text(d.read_text().replace("procedure.mp4", "missing.mp4", 1)), "unusable video"),
    (lambda d, out: (out / "agent").mkdir(parents=True) or (out / "agent" / "results.jsonl").write_text('{"id": "q0"}\n'),
     "already holds results; pass --resume"),
])
def test_bad_input_is_refused_before_engines(medclaw, tmp_path, synth_video, monkeypatch, capsys, setup, message):
    import medclaw.engine.runtime as runtime_module

    def refuse(**kwargs):
        raise AssertionError("engines must not be set up before the inputs are checked")

    monkeypatch.setattr(runtime_module, "open_runtime", refuse)
    data = make_dataset(tmp_path, synth_video.path, 2)
    out = tmp_path / "run"
    setup(data, out)
    assert medclaw(["eval", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_on_bad_record_skip_goes_on(medclaw, scripted, tmp_path, synth_video, capsys):
    data = make_dataset(tmp_path, synth_video.path, 3)
    data.write_text(data.read_text() + "not json\n")
    out = tmp_path / "run"
    assert medclaw(["eval", str(data), "--out", str(out), "--config", str(config_file(tmp_path)),
                    "--on-bad-record", "skip"]) == 0
    assert "skipped line 4: not valid JSON" in capsys.readouterr().err
    assert sorted(r["id"] for r in rows_of(out / "agent" / "results.jsonl")) == ["q0", "q1", "q2"]
    assert json.loads((out / "agent" / "run.json").read_text())["left_out"] == \
        ["line 4: not valid JSON (Expecting value)"]


WRAPPER = """
import sys
sys.path.insert(0, {here!r})
import eval_scripted
eval_scripted.install({models!r}, delay_s=0.05)
from medclaw.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_at_any_moment_then_resume_gives_every_id_once(tmp_path, synth_video):
    """A real `medclaw eval` subprocess, killed with SIGKILL three times at different points
    (after 1, 4 and 9 results), then resumed to the end: every id exactly once."""
    n = 14
    data = make_dataset(tmp_path, synth_video.path, n)
    out = tmp_path / "run"
    config = config_file(tmp_path, concurrency=3)
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER.format(here=str(HERE), models=str(tmp_path / "models")))
    results = out / "agent" / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(wrapper), "eval", str(data), "--out", str(out), "--config", str(config)]

    def lines() -> int:
        return len(results.read_bytes().splitlines()) if results.exists() else 0

    for kill_after in (1, 4, 9):
        proc = subprocess.Popen(argv + (["--resume"] if results.exists() else []), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while lines() < kill_after and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read().decode()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert 1 <= lines() < n
    done = subprocess.run(argv + ["--resume"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["id"] for r in rows_of(results)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)) and len(ids) == n
    meta = json.loads((out / "agent" / "run.json").read_text())
    assert len(meta["resumed_at"]) == 3


def test_make_synthetic_zoom_families_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "zoom"
    assert cli.main(["eval", "make-synthetic", str(out), "--videos", "1", "--minutes", "0.5",
                     "--seed", "5000", "--zoom", "--families", "small_object, look_alike"]) == 0
    rows = [json.loads(line) for line in (out / "dataset.jsonl").read_text().splitlines()]
    assert sorted(r["subtype"] for r in rows) == ["look_alike"] * 2 + ["small_object"] * 2
    capsys.readouterr()
    assert cli.main(["eval", "make-synthetic", str(tmp_path / "x"), "--videos", "1",
                     "--minutes", "0.5", "--families", "small_object"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "zoom families need zoom" in err
    assert cli.main(["eval", "make-synthetic", str(tmp_path / "y"), "--videos", "1",
                     "--minutes", "0.5", "--whole-seconds"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "add --zoom" in err
    assert not (tmp_path / "y").exists()
