"""`medclaw bench e2e`: pass figures from episode results, argument checks, and a real run of both
passes on the session's tiny vLLM engines."""
from __future__ import annotations

import asyncio
import json

import pytest

from medclaw import cli
from medclaw.bench.e2e import PASSES, questions_of, run_passes, summarise
from medclaw.engine.episode import EpisodeResult


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
def test_both_passes_on_tiny_engines(tmp_path, tiny_cpu_specs, llm_engine, vlm_engine):
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.runtime import Runtime
    from medclaw.synth.video import synthesize

    videos = [synthesize(tmp_path / f"v{seed}.mp4", minutes=0.25, seed=seed, width=320,
                         height=180, fps=25, progress=False) for seed in (0, 1)]
    runtime = Runtime(tiny_cpu_specs, backends={"orchestrator": llm_engine, "judge": llm_engine,
                                                "video_expert": vlm_engine,
                                                "frame_verifier": vlm_engine})
    config = load_episode_config(profile="tiny-cpu", max_steps=3,
                                 trace_dir=str(tmp_path / "traces"))

    async def go():
        try:
            return await run_passes(runtime, config, str(videos[0].path), str(videos[1].path),
                                    questions_of(videos[0].gt_path, 2),
                                    questions_of(videos[1].gt_path, 2), concurrency=2)
        finally:
            await runtime.close()

    out = asyncio.run(go())
    assert set(out["passes"]) == set(PASSES) and out["engine_start_s"] >= 0
    for name, row in out["passes"].items():
        assert row["episodes"] == 2 and row["steps"] >= 2, name
        assert set(row["statuses"]) <= {"answered", "forced_answer"}, (name, row["statuses"])
        assert row["prompt_tokens"] > 0 and 0 <= row["cached_hit_rate"] <= 1, name
    assert out["passes"]["sequential"]["concurrency"] == 1
    assert out["passes"]["concurrent"]["concurrency"] == 2
    ratios = out["ratios"]
    assert ratios["concurrent_vs_sequential_steps_per_s"] > 0
    assert len(list((tmp_path / "traces").glob("*.jsonl"))) == 4     # every episode traced
