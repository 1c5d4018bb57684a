"""The episode loop on real tools, a real synthetic video and the real frame source.

Only the *models* are scripted (agent logic, docs/architecture.md "Testing"): the orchestrator follows the
shipped directed-relook skill by reading its observations, and the video expert describes what
the synthetic video's ground truth says is in the clip it was actually sent. Everything else —
probing, frame planning and decoding, tool schemas, the registry, the trace — is the real code.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.engine.config import EpisodeConfig
from medclaw.engine.episode import BatchItem, run_batch, run_episode
from medclaw.engine.runtime import Runtime
from medclaw.engine.trace import Trace
from medclaw.models.spec import ModelSpec
from medclaw.requests.conversation import message_text as _text
from medclaw.tools.timeline import find_windows

QUESTION = "Which instrument was brought in just before the vessel was cut?"


# --- scripted models ----------------------------------------------------------------------------

def _mmss(t: float) -> str:
    return f"{int(t // 60):02d}:{t % 60:04.1f}"



def video_expert(gt):
    """A VLM stand-in that reports the ground truth of the clip it was sent (from the request)."""
    cut = next(e for e in gt.events if e["kind"] == "cut")

    def reply(request) -> str:
        prompt = _text(request.messages[-1])
        media = request.media[-1]
        assert media.kind == "video" and len(media.timestamps_s) >= 2, "tools must send a decoded clip"
        lo, hi = media.timestamps_s[0], media.timestamps_s[-1]
        if "dense timeline" in prompt:                          # view_full_video stage 1
            lines = [f"[{_mmss(p['start_s'])}-{_mmss(p['end_s'])}] {p['name']} phase" for p in gt.phases]
            lines.append(f"WINDOW: [{_mmss(max(0, cut['time_s'] - 2))}-{_mmss(cut['time_s'] + 2)}]")
            return "\n".join(lines)
        if "re-watches" in prompt:                              # stage 2
            return f"WINDOW: [{_mmss(cut['time_s'] - 0.5)}-{_mmss(cut['time_s'] + 0.5)}]\nScissors cut the vessel."
        # crop_video: what enters within the frames actually decoded
        lines = [f"[{_mmss(e['time_s'])}-{_mmss(e['time_s'] + 0.5)}] {e['instrument']} enters the view"
                 for e in gt.events if e["kind"] == "instrument_in" and lo <= e["time_s"] <= hi]
        return "\n".join(lines) or f"[{_mmss(lo)}-{_mmss(hi)}] nothing enters"

    return reply


def relook_orchestrator(request) -> str:
    """Follows directed-relook: localise the anchor, load the skill, crop BEFORE it, answer."""
    turns = [_text(m) for m in request.messages]
    n_assistant = sum(1 for m in request.messages if m["role"] == "assistant")
    if n_assistant == 0:
        return json.dumps({"thought": "find the cut", "tool": "view_full_video",
                           "args": {"query": "the vessel is cut with scissors"}})
    if n_assistant == 1:
        return json.dumps({"thought": "before/after question", "tool": "load_skill",
                           "args": {"name": "directed-relook"}})
    best = next(line for t in turns for line in t.splitlines() if line.startswith("Best window:"))
    [window] = find_windows(best, lenient=True)
    start, end = window.start_s, window.end_s
    if n_assistant == 2:
        assert "Directed re-look" in turns[-1]                   # the skill body came back
        length = min(60.0, max(10.0, end - start))
        return json.dumps({"thought": "re-look at the preceding window", "tool": "crop_video",
                           "args": {"start_s": max(0.0, start - length), "end_s": start + 2,
                                    "query": "which instruments enter the view"}})
    entries = [(find_windows(line, lenient=True)[0].start_s, line)
               for line in turns[-1].splitlines() if "enters" in line]
    before = [(t, line) for t, line in entries if t < start]
    t, line = before[-1]
    instrument = line.split(" enters")[0].split()[-1]
    return json.dumps({"thought": "last arrival before the cut", "tool": "final_answer",
                       "args": {"text": instrument, "evidence_times": [round(t, 2), round(start, 2)]}})


# --- fixtures -----------------------------------------------------------------------------------

def _specs(tmp_path) -> dict:
    vlm = dict(backend="fake", fps=1.0, max_frames=64, min_pixels=4 * 28 * 28,
               max_pixels=64 * 28 * 28, total_pixels=2048 * 28 * 28, max_model_len=32768)
    return {"orchestrator": ModelSpec(name="scripted-llm", path=str(tmp_path / "llm"), backend="fake"),
            "video_expert": ModelSpec(name="scripted-vlm", path=str(tmp_path / "vlm"), **vlm),
            "frame_verifier": ModelSpec(name="scripted-vlm", path=str(tmp_path / "vlm"), **vlm)}


@pytest.fixture(scope="module")
def skills():
    from medclaw.skills.library import SkillLibrary

    return SkillLibrary()


def make_runtime(tmp_path, orchestrator, vlm, skills):
    return Runtime(_specs(tmp_path), skills=skills,
                   backends={"orchestrator": orchestrator, "video_expert": vlm, "frame_verifier": vlm})


def config(tmp_path, **kw) -> EpisodeConfig:
    return EpisodeConfig(trace_dir=str(tmp_path / "traces"), **kw)


# --- the happy path -----------------------------------------------------------------------------

async def test_before_question_follows_directed_relook_and_traces_frames(tmp_path, synth_video, skills):
    gt = synth_video.gt
    cut = next(e for e in gt.events if e["kind"] == "cut")
    expected = next(r for r in gt.relations if r["event"] == "cut")["instrument_in_before"]
    orchestrator = ScriptedBackend(relook_orchestrator, model_name="scripted-llm")
    vlm = ScriptedBackend(video_expert(gt), model_name="scripted-vlm")
    runtime = make_runtime(tmp_path, orchestrator, vlm, skills)

    result = await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path))

    assert result.status == "answered"
    assert result.answer == expected["instrument"]
    trace = Trace.load(result.trace_path)
    tools = [s["tool"] for s in trace.steps]
    assert tools == ["view_full_video", "load_skill", "crop_video", "final_answer"]
    assert all(s["error"] is None for s in trace.steps)
    sha = trace.header["video"]["sha256"]
    assert trace.header["question"] == QUESTION and len(sha) == 64

    view, skill, crop, final = trace.steps
    # view_full_video: stage 1 over the whole video + stage 2 around the cut, frames recorded.
    assert len(view["model_calls"]) == 2 and view["frames"]
    assert {f["video_sha256"] for f in view["frames"]} == {sha}
    assert min(f["timestamp_s"] for f in view["frames"]) < 5.0 < cut["time_s"]
    # crop_video looked at the PRECEDING window, and its evidence frames lie inside it.
    start, end = crop["args"]["start_s"], crop["args"]["end_s"]
    assert start < cut["time_s"] - 5 and end <= cut["time_s"] + 2
    times = [f["timestamp_s"] for f in crop["frames"]]
    assert times and all(start - 0.05 <= t <= end + 0.05 for t in times)
    assert all(f["frame_index"] == round(f["timestamp_s"] * gt.fps) for f in crop["frames"])
    assert skill["frames"] == [] and "Directed re-look" in skill["observation"]
    assert final["data"]["is_final"] is True
    # the orchestrator saw each observation as the next user turn, on an append-only prompt
    prompts = [r.messages for r in orchestrator.requests]
    for earlier, later in zip(prompts, prompts[1:]):
        assert later[:len(earlier)] == earlier
    system = _text(prompts[0][0])
    assert "directed-relook" in system and "crop_video" in system
    assert _text(prompts[0][1]).rstrip().endswith(QUESTION)      # question LAST

    footer = trace.footer
    assert footer["status"] == "answered" and footer["answer"] == expected["instrument"]
    assert footer["totals"]["tools"]["crop_video"] == 1
    assert footer["totals"]["unique_frames"] == len({f["frame_index"] for s in trace.steps for f in s["frames"]})
    assert footer["totals"]["visual_tokens_used"] > 0
    await runtime.close()


# --- model mistakes never crash -----------------------------------------------------------------

async def test_malformed_unknown_and_out_of_range_become_error_observations(tmp_path, synth_video, skills):
    duration = synth_video.duration_s
    script = [
        "I think the answer is the hook.",                                  # no JSON at all
        '{"thought": "zoom", "tool": "zoom_in", "args": {}}',                # unknown tool
        json.dumps({"thought": "x", "tool": "crop_video",                    # past the end
                    "args": {"start_s": duration + 30, "end_s": duration + 40, "query": "q"}}),
        '{"tool": "crop_video", "args": {"start_s": 5}}',                   # missing arguments
        json.dumps({"thought": "done", "tool": "final_answer", "args": {"text": "hook", "evidence_times": [1.0]}}),
    ]
    orchestrator = ScriptedBackend(script)
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, max_consecutive_failures=5))
    assert result.status == "answered" and result.answer == "hook" and result.steps == 5
    steps = Trace.load(result.trace_path).steps
    errors = [s["error"] for s in steps]
    assert "no JSON object" in errors[0]
    assert "unknown tool 'zoom_in'" in errors[1]
    assert "outside the video" in errors[2] and steps[2]["tool"] == "crop_video"
    assert errors[3] and "end_s" in errors[3]
    assert errors[4] is None
    # each error was shown to the model in the next turn
    for k in range(1, 5):
        assert "Error at step" in _text(orchestrator.requests[k].messages[-1])


async def test_repeated_failures_force_an_answer(tmp_path, synth_video, skills):
    orchestrator = ScriptedBackend(["garbage"] * 3 + [
        json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "unsure", "evidence_times": []}})])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, max_consecutive_failures=3))
    assert result.status == "forced_answer" and result.answer == "unsure"
    assert "3 failed tool calls in a row" in _text(orchestrator.requests[-1].messages[-1])


# --- budgets ------------------------------------------------------------------------------------

class SchemaScripted(ScriptedBackend):
    """A scripted backend that claims constrained decoding, to check which schema it is given."""

    supports_json_schema = True


async def test_step_budget_warns_then_forces_a_final_answer(tmp_path, synth_video, skills):
    load = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "a grasper", "evidence_times": [2.0]}})
    orchestrator = SchemaScripted([load] * 4 + [final])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    seen = []
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, max_steps=5, warn_at=0.75),
                               on_step=lambda step, budget: seen.append((step.index, budget.steps_used)))
    assert result.status == "forced_answer" and result.answer == "a grasper"
    # the forced answer is the 5th call of 5: the step counter never passes its limit
    assert result.steps == 5 and seen == [(i, i) for i in range(1, 6)]
    requests = orchestrator.requests
    # normal turns may call any tool; the forced turn is constrained to final_answer only
    assert "anyOf" in requests[0].json_schema
    forced_schema = requests[-1].json_schema
    assert forced_schema["properties"]["tool"]["enum"] == ["final_answer"]
    assert "steps budget spent" in _text(requests[-1].messages[-1])
    warned = [i for i, r in enumerate(requests) if "BUDGET WARNING" in _text(r.messages[-1])]
    assert warned and warned[0] == 3                # after step 3 of 4 (75 %)
    trace = Trace.load(result.trace_path)
    assert trace.steps[-1]["kind"] == "forced_answer"
    assert trace.footer["forced_reason"] == "steps budget spent"


async def test_wall_time_budget_and_unusable_forced_answer_fail_explicitly(tmp_path, synth_video, skills):
    orchestrator = ScriptedBackend(["still not json"])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, max_wall_s=1e-6))
    assert result.status.startswith("failed: no usable answer after wall time budget spent")
    assert result.answer is None and result.steps == 1
    assert Trace.load(result.trace_path).footer["status"] == result.status


async def test_visual_budget_errors_are_observations(tmp_path, synth_video, skills):
    view = json.dumps({"thought": "", "tool": "view_full_video", "args": {"query": "the cut"}})
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "unknown", "evidence_times": []}})
    orchestrator = ScriptedBackend([view, final])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, visual_token_budget=1))
    steps = Trace.load(result.trace_path).steps
    assert result.status == "answered"
    assert "visual budget" in steps[0]["error"]


# --- our bugs: trace saved, exception raised ----------------------------------------------------

async def test_crash_mid_episode_leaves_a_failed_trace(tmp_path, synth_video, skills):
    def boom(request):
        raise RuntimeError("engine died")

    first = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
    orchestrator = ScriptedBackend([first, boom])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    with pytest.raises(RuntimeError, match="engine died"):
        await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path),
                          episode_id="crashy")
    [path] = (tmp_path / "traces").glob("*crashy.jsonl")
    trace = Trace.load(path)
    assert len(trace.steps) == 1 and trace.steps[0]["tool"] == "load_skill"
    assert trace.footer["status"] == "failed: RuntimeError: engine died"
    assert "engine died" in trace.footer["error"]


async def test_engine_start_is_not_charged_to_the_episode(tmp_path, synth_video, skills, monkeypatch):
    """Engines start before the clock: a slow engine start never spends the wall-time budget."""
    import time as time_module

    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "hook", "evidence_times": []}})

    def slow_engine(spec):
        time_module.sleep(1.5)                   # an engine start, longer than the whole budget
        return ScriptedBackend([final] if spec.name == "scripted-llm" else [], model_name=spec.name)

    monkeypatch.setattr(Runtime, "_construct", staticmethod(slow_engine))
    runtime = Runtime(_specs(tmp_path), skills=skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path, max_wall_s=1.0))
    assert result.status == "answered" and result.answer == "hook"
    assert Trace.load(result.trace_path).footer["totals"]["wall_s"] < 1.0
    await runtime.close()


async def test_bad_video_fails_before_any_model_call(tmp_path, skills):
    from medclaw.kernels.errors import NotAFileError

    orchestrator = ScriptedBackend([])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    with pytest.raises(NotAFileError):
        await run_episode(QUESTION, str(tmp_path / "missing.mp4"), runtime, config(tmp_path))
    assert orchestrator.requests == []


# --- concurrency ----------------------------------------------------------------------------------

async def test_batch_of_eight_runs_concurrently_and_isolates_failures(tmp_path, synth_video, skills):
    gt = synth_video.gt
    orchestrator = ScriptedBackend(relook_orchestrator, model_name="scripted-llm")
    vlm = ScriptedBackend(video_expert(gt), model_name="scripted-vlm")
    runtime = make_runtime(tmp_path, orchestrator, vlm, skills)
    items = [BatchItem(video=str(synth_video.path), question=QUESTION, id=f"q{i}") for i in range(8)]
    items.insert(3, BatchItem(video=str(tmp_path / "nope.mp4"), question=QUESTION, id="bad"))
    finished = []
    results = await run_batch(items, runtime, config(tmp_path, concurrency=8),
                              on_result=lambda item, result: finished.append(item.id))

    by_id = {item.id: r for item, r in zip(items, results)}
    assert by_id["bad"].status.startswith("failed:") and "nope.mp4" in by_id["bad"].status
    expected = next(r for r in gt.relations if r["event"] == "cut")["instrument_in_before"]["instrument"]
    good = [by_id[f"q{i}"] for i in range(8)]
    assert all(r.status == "answered" and r.answer == expected for r in good)
    assert len({r.trace_path for r in good}) == 8 and sorted(finished) == sorted(by_id)
    # Overlap: the shared orchestrator saw requests of different episodes interleaved, i.e. some
    # episode's first request came before another episode's last one.
    order = [r.request_id.rsplit("-s", 1)[0] for r in orchestrator.requests]
    assert len(order) == 8 * 4
    spans = {ep: (order.index(ep), len(order) - 1 - order[::-1].index(ep)) for ep in set(order)}
    overlapping = sum(1 for a in spans.values() for b in spans.values()
                      if a is not b and a[0] < b[0] < a[1])
    assert overlapping >= 7, f"episodes ran one after another: {order}"
    # the VLM was shared by all episodes too
    assert len(vlm.requests) == 8 * 3
    await runtime.close()


async def test_concurrency_limit_is_respected(tmp_path, synth_video, skills):
    in_flight, peak = 0, 0

    class Counting(ScriptedBackend):
        async def generate(self, requests):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            try:
                return await super().generate(requests)
            finally:
                in_flight -= 1

    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "x", "evidence_times": []}})
    orchestrator = Counting(lambda request: final)
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    items = [BatchItem(video=str(synth_video.path), question=QUESTION, id=f"c{i}") for i in range(6)]
    results = await run_batch(items, runtime, config(tmp_path, concurrency=2))
    assert all(r.status == "answered" for r in results)
    assert peak == 2


async def test_context_window_forces_an_answer_before_overflowing(tmp_path, synth_video, skills):
    load = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "hook", "evidence_times": []}})
    probe_backend = ScriptedBackend([final])
    runtime = make_runtime(tmp_path, probe_backend, ScriptedBackend([]), skills)
    await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path))
    first_prompt = probe_backend.requests[0]
    first_tokens = sum(len(str(m.get("content", ""))) for m in first_prompt.messages) // 4

    orchestrator = ScriptedBackend([load, final])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    # room for the first turn and its reply, not for the skill body on top of it
    runtime.specs["orchestrator"].max_model_len = first_tokens + 512 + 200
    result = await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path))
    assert result.status == "forced_answer" and result.steps == 2
    assert "context window nearly full" in _text(orchestrator.requests[-1].messages[-1])


def test_generation_schema_tightens_times_strings_and_arrays(tool_specs):
    from medclaw.engine.episode import generation_schema
    from medclaw.tools.schema import MAX_TIME_S

    config = EpisodeConfig(thought_max_chars=20, max_string_chars=30, max_array_items=2)
    schema = generation_schema(tool_specs, config, duration_s=61.5)
    branches = {b["properties"]["tool"]["enum"][0]: b for b in schema["anyOf"]}
    crop = branches["crop_video"]["properties"]
    assert crop["thought"]["maxLength"] == 20
    assert crop["args"]["properties"]["start_s"]["maximum"] == 61.5
    assert crop["args"]["properties"]["query"]["maxLength"] == 30
    final = branches["final_answer"]["properties"]["args"]["properties"]
    assert final["evidence_times"]["maxItems"] == 2
    assert final["evidence_times"]["items"]["maximum"] == 61.5
    # the tools' own schemas are untouched (arguments are validated against those)
    crop_spec = next(s for s in tool_specs if s["name"] == "crop_video")
    assert crop_spec["parameters"]["properties"]["start_s"]["maximum"] == MAX_TIME_S
    # no caps configured: only the time bound changes
    loose = generation_schema(tool_specs, EpisodeConfig(), duration_s=61.5)
    loose_final = next(b for b in loose["anyOf"] if b["properties"]["tool"]["enum"] == ["final_answer"])
    assert loose_final["properties"]["args"]["properties"]["text"]["maxLength"] > 30


async def test_control_characters_in_strings_are_tolerated(tmp_path, synth_video, skills):
    reply = '{"thought":"a\x14b","tool":"final_answer","args":{"text":"hook\x0e","evidence_times":[]}}'
    runtime = make_runtime(tmp_path, ScriptedBackend([reply]), ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path))
    assert result.status == "answered" and result.answer.startswith("hook")
    assert Trace.load(result.trace_path).steps[0]["raw_output"] == reply      # raw kept verbatim


async def test_min_tool_steps_withholds_final_answer(tmp_path, synth_video, skills):
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "x", "evidence_times": []}})
    load = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
    orchestrator = SchemaScripted([final, load, final])
    runtime = make_runtime(tmp_path, orchestrator, ScriptedBackend([]), skills)
    result = await run_episode(QUESTION, str(synth_video.path), runtime,
                               config(tmp_path, min_tool_steps=2))
    assert result.status == "answered" and result.steps == 3
    first, second, third = (r.json_schema for r in orchestrator.requests)
    offered = lambda schema: {b["properties"]["tool"]["enum"][0] for b in schema["anyOf"]}
    assert "final_answer" not in offered(first) and "final_answer" not in offered(second)
    assert "final_answer" in offered(third)
    steps = Trace.load(result.trace_path).steps
    assert "not available yet" in steps[0]["error"]


class Hanging(ScriptedBackend):
    """Never answers its first `hangs` requests (a stuck engine); scripted afterwards."""

    def __init__(self, script, hangs=1):
        super().__init__(script)
        self.hangs = hangs

    async def generate(self, requests):
        if self.hangs > 0:
            self.hangs -= 1
            await asyncio.sleep(3600)
        return await super().generate(requests)


@pytest.mark.parametrize("stuck", ["orchestrator", "video_expert"])
async def test_a_stuck_engine_cannot_hang_the_episode(tmp_path, synth_video, skills, stuck):
    view = json.dumps({"thought": "", "tool": "view_full_video", "args": {"query": "the cut"}})
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "late", "evidence_times": []}})
    if stuck == "orchestrator":
        orchestrator, vlm = Hanging([final]), ScriptedBackend([])
    else:
        orchestrator, vlm = ScriptedBackend([view, final]), Hanging([], hangs=10)
    runtime = make_runtime(tmp_path, orchestrator, vlm, skills)
    result = await asyncio.wait_for(
        run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path, max_wall_s=2.0)), 60)
    assert result.status == "forced_answer" and result.answer == "late"
    steps = Trace.load(result.trace_path).steps
    assert "wall-time budget" in steps[0]["error"]
    assert steps[-1]["kind"] == "forced_answer"


# --- whatever a tool raises on the model's arguments is an observation ---------------------------


def _zeroed_middle(src, dst):
    """A copy of `src` whose middle third of bytes are zeros (its index still intact)."""
    data = bytearray(src.read_bytes())
    third = len(data) // 3
    data[third:2 * third] = bytes(third)
    dst.write_bytes(bytes(data))


CROP = {"start_s": 20.0, "end_s": 36.0, "query": "which instrument enters"}


@pytest.mark.parametrize("case", ["thin region on 1080p", "corrupt mid-file", "changed after probe",
                                  "decode timeout"])
async def test_what_a_tool_raises_on_the_models_arguments_is_an_observation(
        tmp_path, synth_video, hd_video, skills, case):
    import dataclasses

    from medclaw.kernels.probe import probe_video

    video, info, frame_source = synth_video.path, None, {}
    if case == "thin region on 1080p":      # 1920 x 8.1 source pixels: aspect ratio 237 > 200
        video, tool = hd_video, "crop_video_frame"
        args = {"time_s": 1.0, "x1": 0, "y1": 0, "x2": 1, "y2": 0.0075, "query": "is there a clip"}
        expected = "aspect ratio"
    elif case == "corrupt mid-file":        # bad bytes past the probe's test-decodes, like a bad disk
        broken = tmp_path / "broken.mp4"
        _zeroed_middle(synth_video.path, broken)
        info = dataclasses.replace(probe_video(synth_video.path), path=str(broken))
        tool, args, expected = "crop_video", CROP, "decoding failed at frame"
    elif case == "changed after probe":     # a plan names frames of a file that is not there now
        broken = tmp_path / "broken.mp4"
        _zeroed_middle(synth_video.path, broken)
        info = dataclasses.replace(probe_video(synth_video.path), path=str(broken), sha256="b" * 64)
        tool, args, expected = "crop_video", CROP, "changed after it was probed"
    else:
        frame_source = {"timeout_s": 1e-4, "cache_mb": 0}
        tool, args, expected = "crop_video", CROP, "took longer than"
    act = json.dumps({"thought": "", "tool": tool, "args": args})
    final = json.dumps({"thought": "", "tool": "final_answer", "args": {"text": "hook", "evidence_times": []}})
    orchestrator = ScriptedBackend([act, final])
    vlm = ScriptedBackend(lambda request: "[00:00-00:01] a grasper enters the view")
    runtime = Runtime(_specs(tmp_path), skills=skills, frame_source_kwargs=frame_source,
                      backends={"orchestrator": orchestrator, "video_expert": vlm, "frame_verifier": vlm})
    result = await run_episode(QUESTION, str(video), runtime, config(tmp_path), video_info=info)
    assert result.status == "answered" and result.steps == 2
    first = Trace.load(result.trace_path).steps[0]
    assert first["tool"] == tool and expected in first["error"], first["error"]
    assert expected in _text(orchestrator.requests[1].messages[-1])     # the model was told
    assert vlm.requests == []                                           # nothing reached a model
    await runtime.close()


async def test_a_lost_engine_inside_a_tool_ends_the_episode(tmp_path, synth_video, skills):
    from medclaw.errors import EngineLostError

    def gone(request):
        raise EngineLostError("model 'scripted-vlm': cannot reach http://127.0.0.1:9/v1")

    act = json.dumps({"thought": "", "tool": "crop_video", "args": CROP})
    runtime = make_runtime(tmp_path, ScriptedBackend([act]), ScriptedBackend(gone), skills)
    with pytest.raises(EngineLostError) as info:
        await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path), episode_id="lost")
    path, steps = info.value.medclaw_trace
    trace = Trace.load(path)
    assert steps == 1 and trace.steps[0]["error"].startswith("engine lost in crop_video: model")
    assert trace.footer["status"].startswith("failed: EngineLostError")


async def test_a_tool_bug_is_traced_then_raised(tmp_path, synth_video, skills, monkeypatch):
    from medclaw.tools.skills import LoadSkillTool

    async def broken(self, ctx, args):
        raise TypeError("tool bug")

    monkeypatch.setattr(LoadSkillTool, "run", broken)
    load = json.dumps({"thought": "", "tool": "load_skill", "args": {"name": "directed-relook"}})
    runtime = make_runtime(tmp_path, ScriptedBackend([load]), ScriptedBackend([]), skills)
    with pytest.raises(TypeError):
        await run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path), episode_id="bug")
    [path] = (tmp_path / "traces").glob("*bug.jsonl")
    trace = Trace.load(path)
    assert trace.steps[0]["tool"] == "load_skill" and "internal error" in trace.steps[0]["error"]
    assert trace.steps[0]["orchestrator_call"] is not None
    assert trace.footer["status"].startswith("failed: TypeError")
