"""The trace a real episode writes, read back through the typed API (`Trace.load`).

Same setup as test_episode.py (scripted models, real tools, real video and frame source): the
header's provenance is checked against what the models were actually sent, the typed steps against
the clips the video expert actually received, the replay against the orchestrator's last prompt,
and one episode id used twice in one second must give two trace files.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import medclaw
from medclaw.engine import episode as episode_module
from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.engine.episode import run_episode
from medclaw.engine.trace import (
    FrameRef, ModelCall, Trace, config_digest, software_version,
)
from test_episode import QUESTION, config, make_runtime, relook_orchestrator, video_expert


@pytest.fixture(scope="module")
def skills():
    from medclaw.skills.library import SkillLibrary

    return SkillLibrary()


def _git_describe() -> str | None:
    """What `git describe` says of this checkout, found independently of the code under test."""
    root = Path(medclaw.__file__).resolve().parent.parent
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


async def test_episode_trace_reads_back_typed_with_provenance_and_exact_replay(
        tmp_path, synth_video, skills):
    orchestrator = ScriptedBackend(relook_orchestrator, model_name="scripted-llm")
    vlm = ScriptedBackend(video_expert(synth_video.gt), model_name="scripted-vlm")
    runtime = make_runtime(tmp_path, orchestrator, vlm, skills)
    episode_config = config(tmp_path)
    software_version.cache_clear()
    described_before = _git_describe()
    result = await run_episode(QUESTION, str(synth_video.path), runtime, episode_config)
    assert result.status == "answered"
    trace = Trace.load(result.trace_path)
    header, sent = trace.header, orchestrator.requests

    # --- header: who, what, with which configuration -------------------------------------------
    assert header.medclaw_version == medclaw.__version__
    # (a commit landing during the episode may change it: before or after, never anything else)
    assert header.git_describe in {described_before, _git_describe()}
    system = sent[0].messages[0]["content"][0]["text"]
    assert header.system_prompt == system
    assert header.system_prompt_sha256 == hashlib.sha256(system.encode()).hexdigest()
    assert {(s.name, s.version) for s in header.skills} == \
        {(name, skills.get(name).version) for name in skills.names()}
    assert "directed-relook" in {s.name for s in header.skills}
    assert header.config == episode_config.to_dict()
    specs = {role: spec.to_dict() for role, spec in runtime.specs.items()}
    assert header.model_specs == json.loads(json.dumps(specs))
    assert header.config_sha256 == config_digest(episode_config.to_dict(), specs)
    assert {r.seed for r in sent + vlm.requests} == {header.seed}   # the seed every call used
    assert header.models["video_expert"].name == "scripted-vlm"
    assert header.video.sha256 == trace.steps[0].frames[0].video_sha256 and header.video.duration_s > 0

    # --- steps: typed frames, sub-agent calls and windows, as the models received them ---------
    view, skill, crop, final = trace.steps
    assert [s.tool for s in trace.steps] == ["view_full_video", "load_skill", "crop_video", "final_answer"]
    assert all(isinstance(f, FrameRef) for s in trace.steps for f in s.frames)
    assert all(isinstance(c, ModelCall) for s in trace.steps for c in s.model_calls)
    stage1, stage2, crop_request = vlm.requests
    assert [c.model_name for c in view.model_calls] == ["scripted-vlm", "scripted-vlm"]
    assert view.model_calls[0].text == video_expert(synth_video.gt)(stage1)   # reply verbatim
    clip = crop_request.media[-1]
    assert [(f.frame_index, f.timestamp_s) for f in crop.frames] == \
        list(zip(clip.frame_indices, clip.timestamps_s))

    whole, rewatched = [w for w in view.windows if w.kind == "inspected"]
    clip1, clip2 = stage1.media[-1], stage2.media[-1]
    assert (whole.start_s, whole.end_s, whole.num_frames) == \
        (clip1.timestamps_s[0], clip1.timestamps_s[-1], len(clip1.timestamps_s))
    assert (rewatched.start_s, rewatched.end_s, rewatched.num_frames) == \
        (clip2.timestamps_s[0], clip2.timestamps_s[-1], len(clip2.timestamps_s))
    named = {w.kind: (w.start_s, w.end_s) for w in view.windows if w.kind != "inspected"}
    assert named["search_window"][0] <= rewatched.start_s <= rewatched.end_s <= named["search_window"][1]
    assert "window" in named and "candidate_window" in named
    [crop_inspected] = [w for w in crop.windows if w.kind == "inspected"]
    [crop_window] = [w for w in crop.windows if w.kind == "window"]
    assert crop_window.start_s == pytest.approx(crop.args["start_s"])
    assert crop_window.start_s <= crop_inspected.start_s <= crop_inspected.end_s <= crop_window.end_s
    assert skill.windows == [] and final.windows == []

    # --- replay: the conversation the orchestrator's last call saw, then its reply --------------
    reply = {"role": "assistant", "content": [{"type": "text", "text": final.raw_output}]}
    assert trace.to_messages() == sent[-1].messages + [reply]
    assert trace.is_complete and trace.footer.outcome == "answered"
    assert trace.footer.totals.sub_agents.calls == 3


def test_trace_show_reads_a_real_episode_trace(tmp_path, synth_video, skills, capsys, monkeypatch):
    from medclaw import cli
    from medclaw.cli import main

    monkeypatch.setattr(cli, "COMMANDS", {"trace": cli.COMMANDS["trace"]})
    orchestrator = ScriptedBackend(relook_orchestrator, model_name="scripted-llm")
    vlm = ScriptedBackend(video_expert(synth_video.gt), model_name="scripted-vlm")
    runtime = make_runtime(tmp_path, orchestrator, vlm, skills)
    result = asyncio.run(run_episode(QUESTION, str(synth_video.path), runtime, config(tmp_path)))
    assert main(["trace", "show", result.trace_path, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert Trace.model_validate(printed) == Trace.load(result.trace_path)
    assert main(["trace", "show", result.trace_path]) == 0
    text = capsys.readouterr().out
    relook = f"directed-relook v{skills.get('directed-relook').version}"
    assert relook in text and "search_window" in text and "scripted-vlm@none" in text


async def test_same_episode_id_in_the_same_second_gives_two_trace_files(
        tmp_path, synth_video, skills, monkeypatch):
    # Freeze the clock part of the name: both episodes ask for the very same file.
    monkeypatch.setattr(episode_module, "trace_path_for",
                        lambda trace_dir, episode_id: Path(trace_dir) / f"stamp-{episode_id}.jsonl")
    paths = []
    for answer in ("first", "second"):
        final = json.dumps({"thought": "", "tool": "final_answer",
                            "args": {"text": answer, "evidence_times": []}})
        runtime = make_runtime(tmp_path, ScriptedBackend([final]), ScriptedBackend([]), skills)
        result = await run_episode(f"{answer} question?", str(synth_video.path), runtime,
                                   config(tmp_path), episode_id="same")
        paths.append(result.trace_path)
    assert paths[0] != paths[1]
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["stamp-same-2.jsonl",
                                                                       "stamp-same.jsonl"]
    for path, answer in zip(paths, ("first", "second")):
        trace = Trace.load(path)
        assert trace.header.question == f"{answer} question?" and trace.footer.answer == answer


def test_software_version_never_fails_without_git_or_checkout(tmp_path, monkeypatch):
    software_version.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))             # no git executable anywhere
    assert software_version() == (medclaw.__version__, None)
    software_version.cache_clear()
    monkeypatch.undo()
    # An installed copy (no .git beside the package) does not describe some other repository.
    monkeypatch.setattr(medclaw, "__file__", str(tmp_path / "site-packages" / "medclaw" / "__init__.py"))
    assert software_version() == (medclaw.__version__, None)
    software_version.cache_clear()
