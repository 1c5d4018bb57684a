"""Trace files: typed records written line by line, read back validated (also when torn or killed),
created exclusively, totals, and `medclaw trace show` (text and --json)."""
from __future__ import annotations

import json

import pytest

from medclaw.engine.trace import (
    TRACE_FORMAT, Footer, FrameRef, Header, ModelCall, Step, Trace, TraceWriter, compute_totals,
    config_digest, sha256_text, trace_path_for,
)
from medclaw.errors import MedClawError
from medclaw.types import FrameRef as EngineFrameRef
from medclaw.types import GenResult

SHA = "ab" * 32
VIDEO = {"path": "v.mp4", "sha256": SHA, "duration_s": 60.0, "fps": 25.0, "num_frames": 1500,
         "width": 320, "height": 180, "codec": "h264"}


def _header(**changes) -> Header:
    config = {"max_steps": 4}
    fields = dict(episode_id="e1", question="q?", video=VIDEO, medclaw_version="0.1.0",
                  seed=0, config=config, model_specs={}, config_sha256=config_digest(config, {}),
                  models={"orchestrator": {"name": "tiny-llm", "backend": "vllm", "path": "/m",
                                           "revision": "r"}},
                  tools=["crop_video", "final_answer"], system_prompt="You are MedClaw.",
                  system_prompt_sha256=sha256_text("You are MedClaw."))
    return Header(**{**fields, **changes})


def _call(prompt, cached, completion=10, latency=0.5, name="m"):
    return GenResult(text="x", model_name=name, model_revision="rev1", num_prompt_tokens=prompt,
                     num_completion_tokens=completion, num_cached_tokens=cached, latency_s=latency)


def _step(index, tool="crop_video", frames=(), calls=(), error=None, data=None):
    # The engine's own dataclasses go in, as in the episode loop; the step validates them.
    return Step(index=index, tool=tool, args={"start_s": 1.0, "end_s": 2.0}, thought="look",
                prompt_turn=f"turn {index}", raw_output='{"tool": "crop_video"}',
                observation="[00:01-00:02] grasper", error=error, frames=list(frames),
                model_calls=list(calls), orchestrator_call=_call(1000, 800 if index > 1 else 0),
                tool_latency_s=0.25, data=data or {})


def _write(path, steps=(), footer=True) -> None:
    writer = TraceWriter(path)
    writer.header(_header())
    for step in steps:
        writer.step(step)
    if footer:
        writer.footer(answer="a", status="answered", totals=compute_totals(list(steps),
                      visual_tokens_used=0, wall_s=1.0))
    else:
        writer.close()


def test_writer_flushes_each_line_and_load_reads_back_typed(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.header(_header())
    frame = EngineFrameRef(video_sha256=SHA, frame_index=25, timestamp_s=1.0, width=64, height=36,
                           crop_box=(0.1, 0.2, 0.5, 0.6))
    writer.step(_step(1, frames=[frame], calls=[_call(500, 100, name="vlm")]))
    # Before the footer is written the file must already hold both lines (crash safety), and a
    # trace without footer (a killed process) loads, flagged incomplete.
    partial = Trace.load(path)
    assert partial.footer is None and not partial.is_complete and len(partial.steps) == 1
    step = partial.steps[0]
    assert isinstance(step, Step) and isinstance(step.frames[0], FrameRef)
    assert step.frames[0].frame_index == 25 and step.frames[0].crop_box == (0.1, 0.2, 0.5, 0.6)
    assert isinstance(step.model_calls[0], ModelCall) and step.model_calls[0].model_name == "vlm"
    assert step.model_calls[0].num_cached_tokens == 100
    assert step.orchestrator_call.model_revision == "rev1"
    assert step["tool"] == "crop_video" and step.get("frames")[0]["frame_index"] == 25  # dict-style reads
    writer.footer(answer="a", status="answered", totals=compute_totals([step], visual_tokens_used=7,
                                                                       wall_s=1.0))
    assert writer.closed
    full = Trace.load(path)
    assert full.is_complete and full.footer.status == "answered" and full.footer.outcome == "answered"
    assert full.footer.totals.visual_tokens_used == 7 and full.footer.totals.sub_agents.cached_tokens == 100
    assert full.header.question == "q?" and full.header.format == TRACE_FORMAT
    assert full.header.video.sha256 == SHA and full.header.models["orchestrator"].revision == "r"
    assert full.steps == partial.steps                  # what was written is what reads back
    assert [r.type for r in full.records()] == ["header", "step", "footer"]
    assert [r.type for r in partial.records()] == ["header", "step"]


def test_windows_are_typed_from_frames_and_tool_data(tmp_path):
    frames = [EngineFrameRef(SHA, i * 25, float(i), 64, 36) for i in range(0, 60, 10)]   # 0..50 s
    frames += [EngineFrameRef(SHA, 500 + i, 20.0 + i / 25, 64, 36) for i in range(0, 50, 5)]
    data = {"stage_frames": [6, 10], "search_window": [19.5, 22.5], "window": [20.0, 21.0],
            "refined_window": None, "timeline": []}
    path = tmp_path / "t.jsonl"
    _write(path, [_step(1, tool="view_full_video", frames=frames, data=data)])
    [step] = Trace.load(path).steps
    windows = [(w.kind, w.start_s, w.end_s, w.num_frames) for w in step.windows]
    assert windows == [("inspected", 0.0, 50.0, 6), ("inspected", 20.0, 21.8, 10),
                       ("search_window", 19.5, 22.5, 0), ("window", 20.0, 21.0, 0)]
    # The raw JSON carries them too, for readers that do not use this module (the web viewer).
    row = json.loads(path.read_text().splitlines()[1])
    assert [w["kind"] for w in row["windows"]] == ["inspected", "inspected", "search_window", "window"]


def test_replay_renders_the_conversation_and_skips_a_cancelled_call(tmp_path):
    cancelled = Step(index=2, prompt_turn="turn 2", error="the orchestrator call ran past the "
                     "wall-time budget and was cancelled")                # no reply, no message
    path = tmp_path / "t.jsonl"
    _write(path, [_step(1), cancelled, _step(3)])
    text = [(m["role"], m["content"][0]["text"]) for m in Trace.load(path).to_messages()]
    reply = '{"tool": "crop_video"}'
    assert text == [("system", "You are MedClaw."), ("user", "turn 1"), ("assistant", reply),
                    ("user", "turn 3"), ("assistant", reply)]


def test_load_tolerates_torn_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, [_step(1)], footer=False)
    with open(path, "a") as f:
        f.write('{"type": "step", "ind')               # killed mid-write
    trace = Trace.load(path)
    assert len(trace.steps) == 1 and trace.footer is None and not trace.is_complete
    assert json.loads(trace.to_json())["complete"] is False      # what `trace show --json` says

    with pytest.raises(MedClawError, match="not found"):
        Trace.load(tmp_path / "missing.jsonl")


def _rows(*changes) -> bytes:
    """A valid trace's lines, with `(line, key, value)` changes applied."""
    rows = [_header().to_dict(), _step(1).to_dict(), _step(2).to_dict(),
            Footer(status="answered").to_dict()]
    for line, key, value in changes:
        rows[line][key] = value
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


# Not a trace: a one-line error naming the file (and line), never a traceback.
NOT_TRACES = [
    (b"not json\n{}\n", "bad.jsonl:1: not valid JSON"),
    (b'{"type": "header"}\n', "bad.jsonl:1: no medclaw-trace/2 header"),
    (b'{"type": "header", "format": "medclaw-trace/1"}\n', "found 'medclaw-trace/1'"),
    (bytes(range(128, 256)) * 8, "not UTF-8"),                 # a video passed by mistake
    (b"[1, 2]\n{}\n", "not a JSON object"),
    (b"", "empty file"),
    (_rows((1, "frames", [{"frame_index": "x"}])), "bad.jsonl:2: bad step record: frames.0"),
    (_rows((2, "index", 3)), "bad.jsonl:3: step 3 where step 2 was due"),
    (_rows((1, "type", "stpe")), "bad.jsonl:2: unknown line type 'stpe'"),
    (_rows() + (json.dumps(_step(3).to_dict()) + "\n").encode(),
     "bad.jsonl:5: a 'step' line after the footer"),
    (_rows((0, "system_prompt", "edited")), "system_prompt_sha256 does not match"),
    (_rows((0, "config", {"max_steps": 99})), "config_sha256 does not match"),
    (_rows((1, "surprise", 1)), "bad step record: surprise: Extra inputs"),
]


@pytest.mark.parametrize("content,message", NOT_TRACES)
def test_not_a_trace_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(MedClawError, match=message) as err:
        Trace.load(path)
    assert "\n" not in str(err.value)


def test_the_valid_rows_of_the_table_load(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_bytes(_rows())
    trace = Trace.load(path)
    assert [s.index for s in trace.steps] == [1, 2] and trace.is_complete


def test_unwritable_trace_dir_is_a_config_error(tmp_path):
    from medclaw.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write trace"):
        TraceWriter(blocker / "traces" / "t.jsonl")          # a file where a folder must go


def test_trace_files_are_created_exclusively_never_overwritten(tmp_path):
    # The same episode id twice in one second gives the same preferred name: both traces stay.
    first_path = trace_path_for(tmp_path, "same-id")
    first = TraceWriter(first_path)
    first.header(_header(question="first?"))
    second = TraceWriter(first_path)
    second.header(_header(question="second?"))
    first.close(), second.close()
    assert first.path == first_path and second.path != first_path
    assert second.path.name == first_path.stem + "-2.jsonl"
    assert Trace.load(first.path).header.question == "first?"
    assert Trace.load(second.path).header.question == "second?"


def test_totals_count_tokens_cache_frames_and_tools():
    f1 = EngineFrameRef(SHA, 10, 0.4, 64, 36)
    f2 = EngineFrameRef(SHA, 20, 0.8, 64, 36)
    steps = [_step(1, frames=[f1, f2], calls=[_call(400, 0)]),
             _step(2, tool="crop_video", frames=[f2], calls=[_call(400, 300)]),
             _step(3, tool=None, error="no JSON object found")]
    totals = compute_totals(steps, visual_tokens_used=1234, wall_s=3.5)
    assert totals.steps == 3 and totals.errors == 1
    assert totals.tools == {"crop_video": 2}
    assert totals.unique_frames == 2 and totals.frame_refs == 3
    assert totals.orchestrator.prompt_tokens == 3000
    assert totals.orchestrator.cached_tokens == 1600
    assert totals.sub_agents.cached_tokens == 300
    assert totals.cached_hit_rate == pytest.approx((1600 + 300) / (3000 + 800), abs=1e-4)
    assert totals.visual_tokens_used == 1234
    assert totals.model_revisions == ["m@rev1"]


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
    writer.header(_header(episode_id="ep[1]", question="What was used [before] the clip?"))
    writer.step(_step(1, frames=[EngineFrameRef(SHA, 10, 0.4, 64, 36)], calls=[_call(100, 50)],
                      data={"window": [1.0, 2.0]}))
    writer.step(_step(2, tool=None, error="unknown tool 'zoom'"))
    writer.footer(answer="the hook", status="answered", evidence_times=[12.0],
                  totals=compute_totals([], visual_tokens_used=0, wall_s=1.0),
                  error="Traceback: KeyError['x']")
    assert main(["trace", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "What was used [before] the clip?" in out       # brackets are not eaten as markup
    assert "Traceback: KeyError['x']" in out and "[red]" not in out
    assert "crop_video" in out and "unknown tool 'zoom'" in out and "the hook" in out
    assert "answered" in out and "0.1.0" in out

    assert main(["trace", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The printed trace is the validated one: it validates again, equal to what load returns.
    assert Trace.model_validate(data) == Trace.load(path)
    assert data["complete"] is True and data["header"]["format"] == TRACE_FORMAT
    assert [s["index"] for s in data["steps"]] == [1, 2]
    assert data["steps"][0]["windows"][-1] == {"kind": "window", "start_s": 1.0, "end_s": 2.0,
                                               "num_frames": 0}
    assert data["footer"]["answer"] == "the hook"

    assert main(["trace", "show", str(tmp_path / "nope.jsonl")]) == 2
    assert "trace file not found" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"type": "header"}\n')
    assert main(["trace", "show", str(tmp_path / "bad.jsonl"), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no medclaw-trace/2 header" in err and "\n" not in err
