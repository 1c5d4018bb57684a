"""`medclaw ask`: inputs checked before engines, single and batch output shapes, and (engine-marked)
real tiny vLLM engines finishing episodes with well-formed traces, shared by a concurrent batch."""
from __future__ import annotations

import json

import pytest

from medclaw import cli
from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.engine.trace import Trace
from medclaw.errors import EngineLostError

QUESTION = "Which instrument was brought in just before the vessel was cut?"
FINAL = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "a grasper", "evidence_times": [1.0]}})
LOAD = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})


@pytest.fixture
def medclaw(monkeypatch):
    """`medclaw …` with only the commands under test registered (others are built in parallel)."""
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("ask", "trace")})
    return cli.main


@pytest.fixture
def no_engines(monkeypatch):
    """Fail the test if anything tries to resolve models / start engines."""
    import medclaw.engine.runtime as runtime_module

    def refuse(**kwargs):
        raise AssertionError("engines must not be set up before the inputs are checked")

    monkeypatch.setattr(runtime_module, "open_runtime", refuse)


def scripted_runtime(monkeypatch, orchestrator_script, tmp_path):
    """Make `medclaw ask` run on scripted models (agent-logic fakes), everything else real."""
    import medclaw.engine.runtime as runtime_module
    from medclaw.engine.runtime import Runtime
    from medclaw.models.spec import ModelSpec
    from medclaw.skills.library import SkillLibrary

    orchestrator = ScriptedBackend(orchestrator_script)
    seen = {}

    def fake_open_runtime(**kwargs):
        seen.update(kwargs)
        specs = {role: ModelSpec(name="scripted", path=str(tmp_path), backend="fake")
                 for role in ("orchestrator", "video_expert", "frame_verifier")}
        return Runtime(specs, skills=SkillLibrary(),
                       backends={"orchestrator": orchestrator, "video_expert": ScriptedBackend([])})

    monkeypatch.setattr(runtime_module, "open_runtime", fake_open_runtime)
    return orchestrator, seen


# --- input checks ---------------------------------------------------------------------------------

def test_missing_video_fails_fast_with_one_line(medclaw, no_engines, tmp_path, capsys):
    assert medclaw(["ask", str(tmp_path / "nope.mp4"), QUESTION]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medclaw: error:") and "nope.mp4" in err and "\n" not in err


def test_corrupt_video_fails_fast(medclaw, no_engines, tmp_path, synth_video, capsys):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(synth_video.path.read_bytes()[:4000])           # truncated
    assert medclaw(["ask", str(broken), QUESTION]) == 2
    assert "broken.mp4" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["ask"], "usage"),
    (["ask", "v.mp4"], "usage"),
    (["ask", "v.mp4", "q", "--batch", "b.jsonl"], "not both"),
    (["ask", "--batch", "missing.jsonl"], "batch file not found"),
    (["ask", "v.mp4", "q", "--model", "orchestrator"], "ROLE=PRESET_OR_PATH"),
    (["ask", "v.mp4", "q", "--max-steps", "0"], "max_steps"),
])
def test_bad_arguments_are_one_line_errors(medclaw, no_engines, argv, message, capsys, synth_video):
    argv = [str(synth_video.path) if a == "v.mp4" else a for a in argv]
    assert medclaw(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_model_override_role(medclaw, tmp_path, capsys, synth_video):
    assert medclaw(["ask", str(synth_video.path), QUESTION, "--model", "painter=/x"]) == 2
    assert "unknown role 'painter'" in capsys.readouterr().err


def test_malformed_batch_lines_name_the_line(medclaw, no_engines, tmp_path, capsys):
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"video": "a.mp4", "question": "q"}\n{"video": "a.mp4"\n')
    assert medclaw(["ask", "--batch", str(batch)]) == 2
    assert "b.jsonl:2" in capsys.readouterr().err
    batch.write_text('{"video": "a.mp4"}\n')
    assert medclaw(["ask", "--batch", str(batch)]) == 2
    assert "b.jsonl:1" in capsys.readouterr().err
    batch.write_text("\n")
    assert medclaw(["ask", "--batch", str(batch)]) == 2
    assert "no questions" in capsys.readouterr().err


# --- output shapes (scripted models) ---------------------------------------------------------------

def test_single_json_output(medclaw, monkeypatch, tmp_path, synth_video, capsys):
    # tiny-cpu withholds final_answer for min_tool_steps (2) steps
    orchestrator, seen = scripted_runtime(monkeypatch, [LOAD, LOAD, FINAL], tmp_path)
    rc = medclaw(["ask", str(synth_video.path), QUESTION, "--json", "--profile", "tiny-cpu",
                  "--trace-dir", str(tmp_path / "traces"), "--max-steps", "4",
                  "--model", "judge=/models/j"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"answer", "status", "steps", "trace", "error"}
    assert out["answer"] == "a grasper" and out["status"] == "answered" and out["steps"] == 3
    assert out["error"] is None
    trace = Trace.load(out["trace"])
    assert trace.header["config"]["max_steps"] == 4
    assert seen["profile"] == "tiny-cpu" and seen["overrides"] == {"judge": "/models/j"}


def test_batch_prints_one_line_per_item_and_isolates_bad_videos(medclaw, monkeypatch, tmp_path,
                                                               synth_video, capsys):
    scripted_runtime(monkeypatch, lambda request: FINAL, tmp_path)
    (tmp_path / "medclaw.yaml").write_text("profile: qwen-7b\n")           # no min_tool_steps
    batch = tmp_path / "b.jsonl"
    rows = [{"video": str(synth_video.path), "question": QUESTION, "id": "a"},
            {"video": str(tmp_path / "gone.mp4"), "question": QUESTION, "id": "b"},
            {"video": str(synth_video.path), "question": "What phase is at 30 s?"}]
    batch.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc = medclaw(["ask", "--batch", str(batch), "--trace-dir", str(tmp_path / "traces"),
                  "--config", str(tmp_path / "medclaw.yaml")])
    assert rc == 2                                       # one item refused, none failed later
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_id = {line["id"]: line for line in lines}
    assert set(by_id) == {"a", "b", "line3"}
    assert by_id["b"]["status"].startswith("failed:") and "gone.mp4" in by_id["b"]["status"]
    assert by_id["a"]["status"] == by_id["line3"]["status"] == "answered"
    assert by_id["line3"]["question"] == "What phase is at 30 s?"


def test_batch_with_an_item_failing_at_run_time_is_exit_3(medclaw, monkeypatch, tmp_path,
                                                         synth_video, capsys):
    def orchestrator(request):
        if "phase" in str(request.messages[1]["content"]):
            raise EngineLostError("model 'scripted': cannot reach http://127.0.0.1:9/v1")
        return FINAL

    scripted_runtime(monkeypatch, orchestrator, tmp_path)
    (tmp_path / "medclaw.yaml").write_text("profile: qwen-7b\n")           # no min_tool_steps
    batch = tmp_path / "b.jsonl"
    rows = [{"video": str(synth_video.path), "question": QUESTION, "id": "ok"},
            {"video": str(synth_video.path), "question": "What phase is at 30 s?", "id": "lost"}]
    batch.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc = medclaw(["ask", "--batch", str(batch), "--trace-dir", str(tmp_path / "traces"),
                  "--config", str(tmp_path / "medclaw.yaml")])
    by_id = {row["id"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rc == 3
    assert by_id["ok"]["status"] == "answered" and by_id["ok"]["error"] is None
    assert by_id["lost"]["status"].startswith("failed:") and "cannot reach" in by_id["lost"]["error"]
    assert by_id["lost"]["trace"] and Trace.load(by_id["lost"]["trace"]).footer["status"].startswith("failed")


# --- exit statuses, one JSON result, engines before the clock (scripted models) ----------------------

def test_help_documents_the_exit_statuses(medclaw, capsys):
    for argv in (["--help"], ["ask", "--help"]):
        with pytest.raises(SystemExit):
            medclaw(argv)
        text = capsys.readouterr().out
        assert "exit status:" in text
        for line in ("0    answered", "2    input refused before any engine ran",
                     "3    failure at run time"):
            assert line in text


def test_refused_input_still_prints_one_json_result(medclaw, no_engines, tmp_path, capsys):
    assert medclaw(["ask", str(tmp_path / "nope.mp4"), QUESTION, "--json"]) == 2
    captured = capsys.readouterr()
    [line] = captured.out.splitlines()
    out = json.loads(line)
    assert out["status"] == "refused" and "nope.mp4" in out["error"] and out["trace"] is None
    assert captured.err.startswith("medclaw: error:")


def test_a_thin_region_on_1080p_is_an_observation_not_bad_input(medclaw, monkeypatch, tmp_path,
                                                                hd_video, capsys):
    """The review's case: x1=0, y1=0, x2=1, y2=0.0075 on a 1080p video (1920x8 source pixels)
    left the episode as FrameTooLargeError and the command called it bad input (exit 2)."""
    monkeypatch.setenv("COLUMNS", "200")
    thin = json.dumps({"thought": "", "tool": "crop_video_frame", "args": {
        "time_s": 1.0, "x1": 0, "y1": 0, "x2": 1, "y2": 0.0075, "query": "is a clip visible"}})
    orchestrator, _ = scripted_runtime(monkeypatch, [thin, LOAD, FINAL], tmp_path)
    rc = medclaw(["ask", str(hd_video), QUESTION, "--json", "--trace-dir", str(tmp_path / "t")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out)
    assert out["status"] == "answered" and out["steps"] == 3
    first = Trace.load(out["trace"]).steps[0]
    assert first["tool"] == "crop_video_frame" and "aspect ratio" in first["error"]
    assert "aspect ratio" in orchestrator.requests[1].messages[-1]["content"][0]["text"]
    # phase 2 came first: one line per engine the command started (the given ones were up)
    assert "engine scripted (fake) for frame_verifier: ready in" in captured.err


def test_step_counter_never_passes_its_limit(medclaw, monkeypatch, tmp_path, synth_video, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    scripted_runtime(monkeypatch, [LOAD, LOAD, FINAL], tmp_path)
    rc = medclaw(["ask", str(synth_video.path), QUESTION, "--max-steps", "3",
                  "--trace-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert rc == 0
    assert "step 1/3 load_skill" in err and "step 2/3 load_skill" in err
    assert "step 3/3 answer (forced)" in err and "step 4/3" not in err


@pytest.mark.parametrize("raised, rc", [
    (lambda: EngineLostError("model 'scripted': cannot reach http://127.0.0.1:9/v1"), 3),
    (lambda: RuntimeError("engine core died unexpectedly"), 3),
], ids=["engine lost", "engine error"])
def test_a_failure_after_the_engines_started_is_exit_3_with_one_json_result(
        medclaw, monkeypatch, tmp_path, synth_video, capsys, raised, rc):
    def fail(request):
        raise raised()

    scripted_runtime(monkeypatch, [LOAD, fail], tmp_path)
    assert medclaw(["ask", str(synth_video.path), QUESTION, "--json",
                    "--trace-dir", str(tmp_path / "t")]) == rc
    captured = capsys.readouterr()
    [line] = captured.out.splitlines()
    out = json.loads(line)
    assert out["status"].startswith("failed:") and out["answer"] is None and out["steps"] == 1
    assert str(raised()).split(":")[0] in out["error"]
    assert f"medclaw: trace: {out['trace']}" in captured.err
    trace = Trace.load(out["trace"])
    assert trace.footer["status"].startswith("failed:") and len(trace.steps) == 1


def test_a_bug_keeps_its_traceback_and_still_prints_the_result(medclaw, monkeypatch, tmp_path,
                                                              synth_video, capsys):
    def bug(request):
        raise TypeError("unsupported operand")

    scripted_runtime(monkeypatch, [bug], tmp_path)
    with pytest.raises(TypeError):
        medclaw(["ask", str(synth_video.path), QUESTION, "--json", "--trace-dir", str(tmp_path / "t")])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["status"] == "failed: TypeError: unsupported operand" and out["trace"]
    assert "medclaw: trace:" in captured.err


def test_no_usable_answer_is_exit_3(medclaw, monkeypatch, tmp_path, synth_video, capsys):
    scripted_runtime(monkeypatch, ["not json"] * 8, tmp_path)
    rc = medclaw(["ask", str(synth_video.path), QUESTION, "--max-steps", "2",
                  "--trace-dir", str(tmp_path / "t")])
    captured = capsys.readouterr()
    assert rc == 3
    assert "Status: failed: no usable answer" in captured.out
    assert captured.err.count("medclaw: error: no usable answer") == 1
    assert "medclaw: trace:" in captured.err


# --- real tiny engines ----------------------------------------------------------------------------

def _runtime_on_session_engines(llm_engine, vlm_engine, **kwargs):
    """The tiny-cpu profile's specs, KB and skills (real resolution and checks), served by the
    session's engines so that no test starts an engine of its own."""
    from medclaw.engine.runtime import Runtime, open_runtime

    resolved = open_runtime(profile="tiny-cpu", **kwargs)
    backends = {"orchestrator": llm_engine, "judge": llm_engine,
                "video_expert": vlm_engine, "frame_verifier": vlm_engine}
    return Runtime(resolved.specs, backends=backends, knowledge_base=resolved.knowledge_base,
                   skills=resolved.skills)


def _check_well_formed(trace: Trace, max_steps: int, sha256: str) -> None:
    assert trace.header["video"]["sha256"] == sha256
    assert trace.footer is not None
    status = trace.footer["status"]
    assert status in ("answered", "forced_answer") or status.startswith("failed: no usable answer")
    assert 1 <= len(trace.steps) <= max_steps          # the forced answer included
    for step in trace.steps:
        call = step["orchestrator_call"]
        assert call["model_name"] == "tiny-llm" and call["num_prompt_tokens"] > 0
        assert call["model_revision"]
        for sub in step["model_calls"]:
            assert sub["model_name"] == "tiny-vlm" and sub["num_prompt_tokens"] > 0
        for frame in step["frames"]:
            assert frame["video_sha256"] == sha256
    if status != "answered" and status != "forced_answer":
        assert trace.footer["answer"] is None
    else:
        assert trace.footer["answer"]
    # KV rule 1: the stable system prompt is served from the prefix cache from the 2nd call on
    if len(trace.steps) >= 2:
        first = trace.steps[0]["orchestrator_call"]["num_prompt_tokens"]
        assert trace.steps[1]["orchestrator_call"]["num_cached_tokens"] >= first // 2


@pytest.mark.engine
def test_ask_on_tiny_engines_finishes_within_budget(medclaw, monkeypatch, tmp_path, synth_video,
                                                    llm_engine, vlm_engine, capsys):
    import medclaw.engine.runtime as runtime_module

    runtime = _runtime_on_session_engines(llm_engine, vlm_engine)
    monkeypatch.setattr(runtime_module, "open_runtime", lambda **kwargs: runtime)
    rc = medclaw(["ask", str(synth_video.path), QUESTION, "--json", "--max-steps", "4",
                  "--trace-dir", str(tmp_path / "traces")])
    out = json.loads(capsys.readouterr().out)
    assert rc == (3 if out["status"].startswith("failed") else 0)
    trace = Trace.load(out["trace"])
    from medclaw.kernels.probe import probe_video

    _check_well_formed(trace, 4, probe_video(synth_video.path).sha256)
    assert out["steps"] == len(trace.steps)


@pytest.mark.engine
async def test_batch_of_eight_shares_the_engines(tmp_path, synth_video, llm_engine, vlm_engine):
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.episode import BatchItem, run_batch
    from medclaw.kernels.probe import probe_video

    class InFlight:
        """Forwards to the real engine, counting requests in flight (no model logic faked)."""

        def __init__(self, engine):
            self.engine, self.now, self.peak = engine, 0, 0
            self.supports_json_schema = engine.supports_json_schema
            self.supports_media = engine.supports_media

        async def generate(self, requests):
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                return await self.engine.generate(requests)
            finally:
                self.now -= 1

        async def generate_one(self, request):
            return (await self.generate([request]))[0]

        async def close(self):
            pass

    llm, vlm = InFlight(llm_engine), InFlight(vlm_engine)
    runtime = _runtime_on_session_engines(llm, vlm)
    config = load_episode_config(None, profile="tiny-cpu", max_steps=3, concurrency=8,
                                 trace_dir=str(tmp_path / "traces"))
    questions = [QUESTION, "How many clips were placed?", "What phase is shown at 20 s?",
                 "Which instrument appeared just before the first suture?"]
    items = [BatchItem(video=str(synth_video.path), question=questions[i % 4], id=f"e{i}")
             for i in range(8)]
    results = await run_batch(items, runtime, config)
    sha = probe_video(synth_video.path).sha256
    assert len(results) == 8
    for result in results:
        _check_well_formed(Trace.load(result.trace_path), 3, sha)
    assert set(map(id, runtime.live_backends().values())) <= {id(llm), id(vlm)}
    assert llm.peak >= 2, "episodes did not overlap on the shared orchestrator engine"
    await runtime.close()


def test_a_raw_stream_needs_assume_fps_before_any_engine(medclaw, monkeypatch, tmp_path, capsys):
    """A raw .h264 has no timestamps: without --assume-fps it is refused in one line naming the
    flag (no engine touched); with it, it passes every pre-engine check, timed at that rate."""
    import medclaw.engine.runtime as runtime_module
    import medclaw.kernels.probe as probe_module
    from medclaw.errors import ConfigError
    from medclaw.synth.formats import make_format, missing_encoder

    if missing_encoder("h264"):
        pytest.skip(missing_encoder("h264"))
    raw = make_format("h264", tmp_path)
    reached = {}

    def checked(**kwargs):              # phase 1 is over: stop before any engine
        reached.update(kwargs)
        raise ConfigError("inputs checked")

    monkeypatch.setattr(runtime_module, "open_runtime", checked)
    assert medclaw(["ask", str(raw), QUESTION]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--assume-fps" in err and "h264.h264" in err and not reached
    assert medclaw(["ask", str(raw), QUESTION, "--assume-fps", "0"]) == 2
    assert "--assume-fps must be a positive" in capsys.readouterr().err and not reached
    probed = []
    real_probe = probe_module.probe_video
    monkeypatch.setattr(probe_module, "probe_video",
                        lambda *a, **k: probed.append(real_probe(*a, **k)) or probed[-1])
    assert medclaw(["ask", str(raw), QUESTION, "--assume-fps", "50"]) == 2
    assert "inputs checked" in capsys.readouterr().err and reached
    assert probed[0].fps_is_assumed and probed[0].fps == pytest.approx(50.0)
    assert probed[0].duration_s == pytest.approx(2.0)
