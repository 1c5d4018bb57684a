"""`medclaw bench e2e`: pass figures from episode results and traces, argument checks, and a real
run of every pass (agent, one-shot, prefix caching off) on the session's tiny vLLM engines."""
from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from medclaw import cli
from medclaw.bench.e2e import (
    CACHE_OFF_PASS, PASSES, add_caching_compare, questions_of, run_cache_off, run_passes,
    summarise, without_prefix_caching,
)
from medclaw.bench.e2e_figures import trace_figures
from medclaw.engine.episode import EpisodeResult
from medclaw.engine.trace import ModelCall, Step


def _result(status, steps, wall, prompt, cached, calls=3):
    return EpisodeResult(answer="x", status=status, steps=steps, trace_path=None,
                         totals={"wall_s": wall, "all_models": {"calls": calls,
                                                                "prompt_tokens": prompt,
                                                                "cached_tokens": cached}})


def test_summarise_counts_steps_tokens_frames_and_statuses():
    results = [_result("answered", 4, 2.0, 1000, 800), _result("forced_answer", 6, 4.0, 3000, 2000),
               _result("failed: boom", 1, 1.0, 0, 0, calls=0)]
    row = summarise(results, wall_s=5.0, frames_before={"frames_decoded": 10, "hits": 3},
                    frames_after={"frames_decoded": 70, "hits": 23})
    assert row["episodes"] == 3 and row["steps"] == 11
    assert row["steps_per_s"] == pytest.approx(2.2) and row["episodes_per_min"] == pytest.approx(36)
    assert row["statuses"] == {"answered": 1, "forced_answer": 1, "failed": 1}
    assert row["episode_wall_p50_s"] == 2.0 and row["episode_wall_p95_s"] == 4.0
    assert (row["prompt_tokens"], row["cached_tokens"], row["model_calls"]) == (4000, 2800, 6)
    assert row["cached_hit_rate"] == pytest.approx(0.7)
    assert (row["frames_decoded"], row["frame_cache_hits"]) == (60, 20)


def _call(ttft, latency=1.0):
    return ModelCall(model_name="m", ttft_s=ttft, latency_s=latency)


def test_trace_figures_ttft_per_role_and_latency_per_tool():
    steps = [
        Step(index=1, tool="crop_video", tool_latency_s=2.0, orchestrator_call=_call(0.1),
             model_calls=[_call(0.5), _call(None)]),                # remote: not measured
        Step(index=2, tool="crop_video", tool_latency_s=4.0, orchestrator_call=_call(0.3)),
        Step(index=6, tool="crop_video", tool_latency_s=0.001, error="start must be < end"),
        Step(index=3, tool="final_answer", orchestrator_call=_call(0.2)),  # refused: never ran
        Step(index=4, tool=None, orchestrator_call=_call(0.4)),        # output did not parse
        Step(index=5, tool="final_answer", tool_latency_s=0.01, orchestrator_call=None),
    ]
    figures = trace_figures(steps)
    orch, subs = figures["ttft"]["orchestrator"], figures["ttft"]["sub_agents"]
    assert (orch["calls"], orch["measured"], orch["p50_s"], orch["max_s"]) == (4, 4, 0.25, 0.4)
    assert (subs["calls"], subs["measured"], subs["p50_s"]) == (2, 1, 0.5)
    tools = figures["tool_latency"]
    assert tools["crop_video"] == {"count": 3, "p50_s": 2.0, "p95_s": 4.0, "mean_s": 2.0003,
                                   "max_s": 4.0, "errors": 1, "not_run": 0}
    final = tools["final_answer"]
    assert (final["count"], final["errors"], final["not_run"]) == (1, 0, 1)
    assert set(tools) == {"crop_video", "final_answer"}
    empty = trace_figures([])
    assert empty["ttft"]["orchestrator"]["p50_s"] is None and empty["tool_latency"] == {}


def test_cache_off_specs_change_only_vllm_engines(tiny_cpu_specs):
    off = without_prefix_caching({**tiny_cpu_specs, "remote": dataclasses.replace(
        tiny_cpu_specs["video_expert"], backend="remote", endpoints=["http://127.0.0.1:1/v1"])})
    for role, spec in tiny_cpu_specs.items():
        if spec.backend == "vllm":
            assert off[role].extra["enable_prefix_caching"] is False
            assert {k: v for k, v in off[role].extra.items() if k != "enable_prefix_caching"} \
                == spec.extra
        else:
            assert off[role] == spec
    assert "enable_prefix_caching" not in off["remote"].extra


def test_questions_cycle_through_the_ground_truth(synth_video):
    qa = json.loads(synth_video.gt_path.read_text())["qa"]
    questions = questions_of(synth_video.gt_path, len(qa) + 2)
    assert questions[:len(qa)] == [q["question"] for q in qa]
    assert questions[len(qa):] == questions[:2]


@pytest.mark.parametrize("flags,message", [(["--questions", "0"], "--questions"),
                                           (["--concurrency", "0"], "--concurrency"),
                                           (["--minutes", "99"], "--minutes"),
                                           (["--max-steps", "0"], "--max-steps")])
def test_bad_arguments_are_one_line_errors_before_any_engine(tmp_path, capsys, flags, message):
    rc = cli.main(["bench", "e2e", "--out-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())             # nothing synthesised, nothing started


@pytest.mark.engine
@pytest.mark.slow
def test_every_pass_on_tiny_engines(tmp_path, tiny_cpu_specs, llm_engine, vlm_engine):
    """Agent passes, the one-shot pass, and the sequential pass again with the orchestrator's engine
    started without prefix caching (one extra tiny engine; the sub-agents keep the session VLM)."""
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.runtime import Runtime
    from medclaw.engine.trace import Trace
    from medclaw.eval.oneshot import MAX_TOKENS, ROLE
    from medclaw.kernels.probe import probe_video
    from medclaw.synth.video import synthesize
    from medclaw.tools.base import ToolContext
    from medclaw.tools.media import plan_clip
    from medclaw.tools.timeline import Window

    videos = [synthesize(tmp_path / f"v{seed}.mp4", minutes=0.25, seed=seed, width=320,
                         height=180, fps=25, progress=False) for seed in (0, 1)]
    vlm_roles = {"video_expert": vlm_engine, "frame_verifier": vlm_engine}
    runtime = Runtime(tiny_cpu_specs, backends={"orchestrator": llm_engine, "judge": llm_engine,
                                                **vlm_roles})
    runtime_off = Runtime(without_prefix_caching(tiny_cpu_specs), backends=vlm_roles)
    config = load_episode_config(profile="tiny-cpu", max_steps=3,
                                 trace_dir=str(tmp_path / "traces"))
    questions_a = questions_of(videos[0].gt_path, 2)

    async def go():
        try:
            out = await run_passes(runtime, config, str(videos[0].path), str(videos[1].path),
                                   questions_a, questions_of(videos[1].gt_path, 2), concurrency=2)
            off = await run_cache_off(runtime_off, config, str(videos[0].path), questions_a)
        finally:
            await runtime.close()
            await runtime_off.close()          # closes the cache-off engine it built
        add_caching_compare(out, off)
        return out

    out = asyncio.run(go())
    assert set(out["passes"]) == {*PASSES, CACHE_OFF_PASS} and out["engine_start_s"] >= 0
    for name, row in out["passes"].items():
        assert row["episodes"] == 2 and row["steps"] >= 2, name
        assert set(row["statuses"]) <= {"answered", "forced_answer"}, (name, row["statuses"])
        assert row["prompt_tokens"] > 0 and 0 <= row["cached_hit_rate"] <= 1, name
    assert out["passes"]["sequential"]["concurrency"] == 1
    assert out["passes"]["concurrent"]["concurrency"] == 2
    assert out["ratios"]["concurrent_vs_sequential_steps_per_s"] > 0
    traces: dict[str, list] = {}
    for path in sorted((tmp_path / "traces").glob("*.jsonl")):
        trace = Trace.load(path)
        traces.setdefault(trace.header.episode_id.rsplit("-", 1)[0], []).append(trace)
    assert {name: len(t) for name, t in traces.items()} == {name: 2 for name in out["passes"]}

    # time to first token: measured on every call, inside the call, and aggregated per role
    for name, pass_traces in traces.items():
        steps = [s for t in pass_traces for s in t.steps]
        calls = {"orchestrator": [s.orchestrator_call for s in steps if s.orchestrator_call],
                 "sub_agents": [c for s in steps for c in s.model_calls]}
        for role, role_calls in calls.items():
            assert all(0 < c.ttft_s <= c.latency_s for c in role_calls), (name, role)
            figures = out["passes"][name]["ttft"][role]
            assert figures["calls"] == figures["measured"] == len(role_calls), (name, role)
            if role_calls:
                assert 0 < figures["p50_s"] <= figures["p95_s"] <= max(c.latency_s
                                                                       for c in role_calls)
        # per-tool latency: every step naming a tool, counted once
        named: dict[str, int] = {}
        for step in steps:
            if step.tool:
                named[step.tool] = named.get(step.tool, 0) + 1
        tools = out["passes"][name]["tool_latency"]
        assert {t: v["count"] + v["not_run"] for t, v in tools.items()} == named, name
        errors = {t: sum(1 for s in steps if s.tool == t and s.error and s.tool_latency_s > 0)
                  for t in tools}
        assert {t: v["errors"] for t, v in tools.items()} == errors, name
    assert out["passes"]["oneshot"]["tool_latency"]["oneshot"]["count"] == 2
    assert out["passes"]["sequential"]["ttft"]["sub_agents"]["calls"] > 0

    # visual tokens: the one-shot pass sends exactly what the planner plans for the whole video
    info = probe_video(str(videos[0].path))
    ctx = ToolContext(video=info, question="q", backends={}, specs=tiny_cpu_specs, frames=None,
                      visual_token_budget=config.visual_token_budget)
    planned = plan_clip(ctx, ROLE, Window(0.0, info.duration_s), max_tokens=MAX_TOKENS)
    visual = out["visual_tokens"]
    assert visual["oneshot"] == 2 * planned.num_visual_tokens > 0
    assert visual["harness"] == out["passes"]["sequential"]["visual_tokens"] == sum(
        t.footer.totals.visual_tokens_used for t in traces["sequential"])
    assert visual["harness_vs_oneshot"] == pytest.approx(visual["harness"] / visual["oneshot"],
                                                         abs=1e-3)

    # prefix caching: the orchestrator's engine reports it off, and serves no cached token then
    caching = out["prefix_caching"]
    assert caching["engines"]["orchestrator"] == {"on": True, "off": False}
    assert caching["engines"]["video_expert"] == {"on": True, "off": True}   # the session VLM
    assert caching["on"]["orchestrator"]["cached_tokens"] > 0
    assert caching["off"]["orchestrator"]["cached_tokens"] == 0
    assert caching["off"]["orchestrator"]["prompt_tokens"] > 0
    assert caching["ratios"]["steps_per_s_on_vs_off"] > 0
