"""End to end on the real tiny vLLM CPU engines (the session's, shared with every engine test):
make-synthetic → eval agent → eval oneshot → eval compare → distill, through the real `medclaw`
command in this process, and the reproducibility check. Random weights: the answers are noise,
so this checks structure, flow, that every judge reply parses, and that a rerun repeats."""
from __future__ import annotations

import json

import pytest

from medclaw import cli

pytestmark = pytest.mark.engine


@pytest.fixture
def medclaw(monkeypatch, on_session_engines):
    """`medclaw` whose runtimes resolve the tiny-cpu profile for real but run on the session's
    engines (owned by the fixtures, so no command closes or restarts them)."""
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("eval", "distill")})
    cli.main.runtimes = on_session_engines
    return cli.main


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_compare_distill_end_to_end_on_tiny_engines(medclaw, tmp_path, capsys, llm_engine, vlm_engine):
    import yaml

    from medclaw.engine.trace import Trace
    from medclaw.eval.repro import canonical_trace, differences

    data_dir = tmp_path / "set"
    assert medclaw(["eval", "make-synthetic", str(data_dir), "--videos", "1", "--minutes", "0.25",
                    "--per-video", "2"]) == 0
    dataset = data_dir / "dataset.jsonl"
    # Greedy orchestrator (the tools and the judge are greedy already): a rerun must repeat.
    config = tmp_path / "medclaw.yaml"
    config.write_text(yaml.safe_dump({"profile": "tiny-cpu", "episode": {
        "orchestrator_temperature": 0.0, "max_steps": 3, "concurrency": 1}}))
    run = tmp_path / "run"
    common = ["--config", str(config)]
    # Both agent runs start from cold caches: a prefix cached by whichever tests ran before on
    # these session engines holds KV computed in other chunks, floats that can differ in their
    # last bits, which random weights' near-tied logits turn into other tokens.
    cold = lambda: [engine.reset_caches() for engine in (llm_engine, vlm_engine)]   # noqa: E731
    cold()
    assert medclaw(["eval", str(dataset), "--out", str(run), *common]) == 0
    assert medclaw(["eval", str(dataset), "--out", str(run), "--mode", "oneshot", *common]) == 0
    rerun = tmp_path / "rerun"
    cold()
    assert medclaw(["eval", str(dataset), "--out", str(rerun), *common]) == 0
    capsys.readouterr()

    ids = [json.loads(line)["id"] for line in dataset.read_text().splitlines()]
    for mode in ("agent", "oneshot"):
        rows = _rows(run / mode / "results.jsonl")
        assert sorted(r["id"] for r in rows) == sorted(ids)
        for row in rows:
            judge = row["judge"]
            assert row["status"].split(":")[0] in ("answered", "forced_answer", "failed")
            if judge["judged"]:                          # every reply the judge wrote parses
                assert judge["parsed"], judge["raw"]
                assert all(1 <= judge[d] <= 5 for d in ("CI", "DO", "CU", "TU"))
                assert (judge["model"], judge["revision"]) == ("tiny-llm", llm_engine.model_revision)
            trace = Trace.load(run / mode / row["trace"])
            assert trace.footer is not None and trace.header.models["video_expert"].name == "tiny-vlm"
    assert sum(r["judge"]["judged"] for r in _rows(run / "agent" / "results.jsonl")) >= 1
    summary = json.loads((run / "report.json").read_text())
    assert summary["judge"]["parsed"] == summary["judge"]["judged"] > 0
    assert summary["deltas"] and (run / "report.png").is_file()
    oneshot_trace = Trace.load(run / "oneshot" / _rows(run / "oneshot" / "results.jsonl")[0]["trace"])
    assert oneshot_trace.steps[0].frames and oneshot_trace.steps[0].model_calls[0].model_name == "tiny-vlm"

    # reproducibility: same inputs, same seed → the same traces and the same judge scores
    first = {r["id"]: r for r in _rows(run / "agent" / "results.jsonl")}
    second = {r["id"]: r for r in _rows(rerun / "agent" / "results.jsonl")}
    for qid in ids:
        a = canonical_trace(Trace.load(run / "agent" / first[qid]["trace"]))
        b = canonical_trace(Trace.load(rerun / "agent" / second[qid]["trace"]))
        assert differences(a, b) == []
        assert first[qid]["judge"]["raw"] == second[qid]["judge"]["raw"]

    cmp_dir = tmp_path / "cmp"
    assert medclaw(["eval", "compare", str(run), str(rerun), "--out", str(cmp_dir)]) == 0
    compared = json.loads((cmp_dir / "compare.json").read_text())
    assert [r["models"]["roles"]["video_expert"] for r in compared["runs"]] == \
        [[f"tiny-vlm@{vlm_engine.model_revision}"]] * 2

    # distill: 1 mining question, 1 validation question, at most 1 candidate
    lines = dataset.read_text().splitlines()
    (data_dir / "mine.jsonl").write_text(lines[0] + "\n")       # beside the videos: relative paths
    (data_dir / "val.jsonl").write_text("\n".join(lines[1:]) + "\n")
    # The profile's sampling (temperature 1): greedy random weights repeat one failing lesson call.
    sampled = tmp_path / "distill.yaml"
    sampled.write_text(yaml.safe_dump({"profile": "tiny-cpu", "episode": {"max_steps": 3, "concurrency": 2}}))
    library, out = tmp_path / "library", tmp_path / "distill"
    assert medclaw(["distill", "--mine", str(data_dir / "mine.jsonl"), "--val", str(data_dir / "val.jsonl"),
                    "--library", str(library), "--max-candidates", "1", "--out", str(out),
                    "--config", str(sampled)]) == 0
    report = json.loads((out / "distill_report.json").read_text())
    [mined] = report["mining"]
    assert mined["diagnosis"]["parsed"] and mined["diagnosis"]["category"] in ("A", "B", "C")
    assert mined["diagnosis"]["model"] == "tiny-llm"
    for verdict in report["candidates"]:
        installed = library / verdict["name"] / "SKILL.md"
        assert installed.exists() == verdict["kept"]
        for row in _rows(out / "val" / f"{verdict['name']}-v{verdict['version']}" / "results.jsonl"):
            assert not row["judge"]["judged"] or row["judge"]["parsed"]
    assert [p.parent.name for p in library.rglob("SKILL.md")] == \
        [v["name"] for v in report["candidates"] if v["kept"]]
    # every command ran on the session's engines: none built its own
    assert all(set(map(id, r.live_backends().values())) <= {id(llm_engine), id(vlm_engine)}
               for r in medclaw.runtimes)
