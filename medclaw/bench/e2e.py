"""`medclaw bench e2e`: end-to-end episode throughput and cache reuse on the configured profile.

Two synthetic procedure videos of the same shape (seeds 0 and 1, as `medclaw video synth` makes
them) and N questions from each one's ground truth. The engines start once, timed apart
(`engine_start_s`); then two passes, each a `run_batch` of N episodes on the shared engines:

    sequential  video A, one episode at a time               the baseline
    concurrent  video B, --concurrency episodes at once      caches as cold as the baseline's

(Two videos, so that the second pass finds neither frames nor video KV left by the first.)
Per pass: wall_s, episodes_per_min, steps_per_s, statuses, episode wall time p50/p95, model calls,
prompt / cached tokens and hit rate, frames decoded and frame-cache hits. Ratios, same run:
concurrent / sequential steps per second and episodes per minute. Prefix reuse across repeated
questions is measured exactly by `medclaw bench kv`.

How long an episode is depends on what the orchestrator decides; on the tiny random-weight models
that is noise, so steps_per_s is the steadier throughput figure. Output: one JSON object on stdout
(`--json`) or a table; progress on stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from statistics import median

PASSES = ("sequential", "concurrent")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=None,
                        help="model profile (default: the config's, else tiny-cpu)")
    parser.add_argument("--config", default=None, metavar="FILE", help="medclaw.yaml to use")
    parser.add_argument("--questions", type=int, default=8, metavar="N",
                        help="episodes per pass (ground-truth questions, cycled; default 8)")
    parser.add_argument("--concurrency", type=int, default=4, metavar="C",
                        help="episodes at once in the concurrent pass (default 4)")
    parser.add_argument("--minutes", type=float, default=2.0, metavar="M",
                        help="length of each synthetic video (default 2)")
    parser.add_argument("--max-steps", type=int, default=6, metavar="N",
                        help="orchestrator steps before a forced answer (default 6)")
    parser.add_argument("--out-dir", default="artifacts/bench-e2e", metavar="DIR",
                        help="where the videos and traces go (default artifacts/bench-e2e)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.set_defaults(handler=_handler)


# --- measurement (engine-agnostic: tests pass a Runtime on the session's engines) ----------------

def questions_of(gt_path: str | Path, n: int) -> list[str]:
    """`n` questions from a synthetic video's ground truth, cycled when it holds fewer."""
    qa = json.loads(Path(gt_path).read_text())["qa"]
    return [qa[i % len(qa)]["question"] for i in range(n)]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summarise(results, wall_s: float, frames_before: dict, frames_after: dict) -> dict:
    """One pass's figures from its `EpisodeResult`s and the FrameSource stats around it."""
    steps = sum(r.steps for r in results)
    calls = [r.totals.get("all_models", {}) for r in results]
    prompt = sum(c.get("prompt_tokens", 0) for c in calls)
    cached = sum(c.get("cached_tokens", 0) for c in calls)
    walls = [r.totals["wall_s"] for r in results if "wall_s" in r.totals]
    statuses: dict[str, int] = {}
    for r in results:
        word = r.status.split(":")[0]
        statuses[word] = statuses.get(word, 0) + 1
    return {
        "episodes": len(results), "wall_s": round(wall_s, 3),
        "episodes_per_min": round(60 * len(results) / wall_s, 3),
        "steps": steps, "steps_per_s": round(steps / wall_s, 3), "statuses": statuses,
        "episode_wall_p50_s": round(median(walls), 3) if walls else None,
        "episode_wall_p95_s": round(_percentile(walls, 0.95), 3) if walls else None,
        "model_calls": sum(c.get("calls", 0) for c in calls),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "frames_decoded": frames_after["frames_decoded"] - frames_before["frames_decoded"],
        "frame_cache_hits": frames_after["hits"] - frames_before["hits"],
    }


async def run_passes(runtime, config, video_a: str, video_b: str, questions_a: list[str],
                     questions_b: list[str], concurrency: int, on_result=None,
                     on_engine=None) -> dict:
    """Start the engines (`on_engine` gets one `EngineReady` per engine), run the two passes,
    return {"engine_start_s", "passes", "ratios"}."""
    from dataclasses import replace

    from medclaw.engine.episode import BatchItem, run_batch

    started = time.perf_counter()
    await runtime.start(on_engine=on_engine)
    out: dict = {"engine_start_s": round(time.perf_counter() - started, 3), "passes": {}}
    plan = {"sequential": (video_a, questions_a, 1),
            "concurrent": (video_b, questions_b, concurrency)}
    for name in PASSES:
        video, questions, width = plan[name]
        items = [BatchItem(video=video, question=q, id=f"{name}-{i}")
                 for i, q in enumerate(questions)]
        before = runtime.frames.stats()
        started = time.perf_counter()
        results = await run_batch(items, runtime, replace(config, concurrency=width),
                                  on_result=on_result)
        wall = time.perf_counter() - started
        out["passes"][name] = {"concurrency": width,
                               **summarise(results, wall, before, runtime.frames.stats())}
    seq, conc = (out["passes"][p] for p in PASSES)
    out["ratios"] = {
        "concurrent_vs_sequential_steps_per_s": _ratio(conc["steps_per_s"], seq["steps_per_s"]),
        "concurrent_vs_sequential_episodes_per_min": _ratio(conc["episodes_per_min"],
                                                            seq["episodes_per_min"]),
    }
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


# --- CLI ------------------------------------------------------------------------------------------

def _check_args(args) -> None:
    from medclaw.errors import ConfigError

    if args.questions < 1:
        raise ConfigError(f"--questions must be >= 1, got {args.questions}")
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {args.concurrency}")
    if not 0.25 <= args.minutes <= 30:
        raise ConfigError(f"--minutes must be between 0.25 and 30, got {args.minutes:g}")
    if args.max_steps < 1:
        raise ConfigError(f"--max-steps must be >= 1, got {args.max_steps}")


def _videos(out: Path, minutes: float) -> tuple[Path, Path]:
    from medclaw.synth.video import synthesize

    out.mkdir(parents=True, exist_ok=True)
    return tuple(synthesize(out / f"video-{seed}.mp4", minutes=minutes, seed=seed, width=320,
                            height=180, fps=25, progress=False).path for seed in (0, 1))


def _handler(args) -> int:
    from rich.console import Console

    from medclaw.engine.config import load_episode_config
    from medclaw.engine.runtime import open_runtime

    _check_args(args)
    console = Console(stderr=True)
    out = Path(args.out_dir)
    config = load_episode_config(args.config, profile=args.profile, max_steps=args.max_steps,
                                 trace_dir=str(out / "traces"))
    runtime = open_runtime(profile=args.profile, config_path=args.config)  # checks, starts nothing
    with console.status("synthesising two procedure videos…"):
        video_a, video_b = _videos(out, args.minutes)
    questions_a = questions_of(video_a.with_suffix(".json"), args.questions)
    questions_b = questions_of(video_b.with_suffix(".json"), args.questions)
    done = {"n": 0}

    def on_result(item, result) -> None:
        done["n"] += 1
        console.log(f"{item.id}: {result.status.split(':')[0]} ({result.steps} steps) "
                    f"[{done['n']}/{len(PASSES) * args.questions}]")

    async def main() -> dict:
        try:
            with console.status("starting engines, then 2 passes…"):
                return await run_passes(runtime, config, str(video_a), str(video_b), questions_a,
                                        questions_b, args.concurrency, on_result,
                                        on_engine=lambda ready: console.log(ready.line()))
        finally:
            await runtime.close()

    models = {role: spec.name for role, spec in runtime.specs.items()}
    result = {"models": models, "questions": args.questions, "minutes": args.minutes,
              "max_steps": args.max_steps, **asyncio.run(main())}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"engine start: {result['engine_start_s']:.1f} s")
    header = ("pass", "conc", "wall_s", "ep/min", "steps/s", "p50_s", "hit_rate", "decoded",
              "cache_hits")
    print("  ".join(f"{h:>10}" for h in header))
    for name, row in result["passes"].items():
        cells = (name, row["concurrency"], row["wall_s"], row["episodes_per_min"],
                 row["steps_per_s"], row["episode_wall_p50_s"], row["cached_hit_rate"],
                 row["frames_decoded"], row["frame_cache_hits"])
        print("  ".join(f"{c!s:>10}" for c in cells))
    for key, value in result["ratios"].items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m medclaw.bench.e2e")
    register(parser)
    ns = parser.parse_args()
    sys.exit(ns.handler(ns))
