"""Trace files: written line by line, read back (also when torn), totals, and `medclaw trace show`."""
from __future__ import annotations

import json

import pytest

from medclaw.engine.trace import Step, Trace, TraceWriter, compute_totals, trace_path_for
from medclaw.errors import MedClawError
from medclaw.types import FrameRef, GenResult


def _call(prompt, cached, completion=10, latency=0.5, name="m"):
    return GenResult(text="x", model_name=name, model_revision="rev1", num_prompt_tokens=prompt,
                     num_completion_tokens=completion, num_cached_tokens=cached, latency_s=latency)


def _step(index, tool="crop_video", frames=(), calls=(), error=None):
    return Step(index=index, tool=tool, args={"start": 1.0, "end": 2.0}, thought="look",
                raw_output='{"tool": "crop_video"}', observation="[00:01-00:02] grasper",
                error=error, frames=list(frames), model_calls=list(calls),
                orchestrator_call=_call(1000, 800 if index > 1 else 0), tool_latency_s=0.25)


def test_writer_flushes_each_line_and_load_reads_back(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.header(episode_id="e1", question="q?", video={"path": "v.mp4", "sha256": "ab"}, config={},
                  models={})
    frame = FrameRef(video_sha256="ab", frame_index=25, timestamp_s=1.0, width=64, height=36,
                     crop_box=(0.1, 0.2, 0.5, 0.6))
    writer.step(_step(1, frames=[frame], calls=[_call(500, 100, name="vlm")]))
    # Before the footer is written the file must already hold both lines (crash safety).
    partial = Trace.load(path)
    assert partial.footer is None and len(partial.steps) == 1
    step = partial.steps[0]
    assert step["frames"][0]["frame_index"] == 25
    assert step["frames"][0]["crop_box"] == [0.1, 0.2, 0.5, 0.6]
    assert step["model_calls"][0]["model_name"] == "vlm"
    assert step["orchestrator_call"]["model_revision"] == "rev1"
    writer.footer(answer="a", status="answered", totals={})
    assert writer.closed
    full = Trace.load(path)
    assert full.footer["status"] == "answered" and full.header["question"] == "q?"


def test_load_tolerates_torn_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.header(episode_id="e1", question="q", video={}, config={}, models={})
    writer.step(_step(1))
    writer.close()
    with open(path, "a") as f:
        f.write('{"type": "step", "ind')               # killed mid-write
    trace = Trace.load(path)
    assert len(trace.steps) == 1 and trace.footer is None

    with pytest.raises(MedClawError, match="not found"):
        Trace.load(tmp_path / "missing.jsonl")


# Not a trace: a one-line error naming the file (and line), never a traceback.
NOT_TRACES = [
    (b"not json\n{}\n", "bad.jsonl:1: not valid JSON"),
    (b'{"type": "header"}\n', "no medclaw-trace"),
    (bytes(range(128, 256)) * 8, "not UTF-8"),                 # a video passed by mistake
    (b"[1, 2]\n{}\n", "not a JSON object"),
]


@pytest.mark.parametrize("content,message", NOT_TRACES)
def test_not_a_trace_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(MedClawError, match=message) as err:
        Trace.load(path)
    assert "\n" not in str(err.value)

def test_unwritable_trace_dir_is_a_config_error(tmp_path):
    from medclaw.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write trace"):
        TraceWriter(blocker / "traces" / "t.jsonl")          # a file where a folder must go


def test_totals_count_tokens_cache_frames_and_tools():
    f1 = FrameRef("ab", 10, 0.4, 64, 36)
    f2 = FrameRef("ab", 20, 0.8, 64, 36)
    steps = [_step(1, frames=[f1, f2], calls=[_call(400, 0)]),
             _step(2, tool="crop_video", frames=[f2], calls=[_call(400, 300)]),
             _step(3, tool=None, error="no JSON object found")]
    totals = compute_totals(steps, visual_tokens_used=1234, wall_s=3.5)
    assert totals["steps"] == 3 and totals["errors"] == 1
    assert totals["tools"] == {"crop_video": 2}
    assert totals["unique_frames"] == 2 and totals["frame_refs"] == 3
    assert totals["orchestrator"]["prompt_tokens"] == 3000
    assert totals["orchestrator"]["cached_tokens"] == 1600
    assert totals["sub_agents"]["cached_tokens"] == 300
    assert totals["cached_hit_rate"] == pytest.approx((1600 + 300) / (3000 + 800), abs=1e-4)
    assert totals["visual_tokens_used"] == 1234
    assert totals["model_revisions"] == ["m@rev1"]


def test_trace_path_is_sanitised(tmp_path):
    path = trace_path_for(tmp_path, "../../etc/passwd x")
    assert path.parent == tmp_path and "/" not in path.name and path.suffix == ".jsonl"


def test_trace_show_cli_text_and_json(tmp_path, capsys, monkeypatch):
    from medclaw import cli
    from medclaw.cli import main

    # Only this command: the test must not depend on other commands' modules.
    monkeypatch.setattr(cli, "COMMANDS", {"trace": cli.COMMANDS["trace"]})

    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.header(episode_id="ep[1]", question="What was used [before] the clip?",
                  video={"path": "v.mp4", "sha256": "ab" * 32, "duration_s": 60.0, "fps": 25.0,
                         "width": 320, "height": 180},
                  config={}, models={"orchestrator": {"name": "tiny-llm", "backend": "vllm",
                                                      "path": "/m", "revision": "r"}})
    writer.step(_step(1, frames=[FrameRef("ab", 10, 0.4, 64, 36)], calls=[_call(100, 50)]))
    writer.step(_step(2, tool=None, error="unknown tool 'zoom'"))
    writer.footer(answer="the hook", status="answered", evidence_times=[12.0],
                  totals=compute_totals([], visual_tokens_used=0, wall_s=1.0),
                  error="Traceback: KeyError['x']")
    assert main(["trace", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "What was used [before] the clip?" in out       # brackets are not eaten as markup
    assert "Traceback: KeyError['x']" in out and "[red]" not in out
    assert "crop_video" in out and "unknown tool 'zoom'" in out and "the hook" in out
    assert "answered" in out

    assert main(["trace", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["index"] for s in data["steps"]] == [1, 2]
    assert data["footer"]["answer"] == "the hook"

    assert main(["trace", "show", str(tmp_path / "nope.jsonl")]) == 2
    assert "trace file not found" in capsys.readouterr().err
