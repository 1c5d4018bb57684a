"""`medclaw bench e2e`: end-to-end episode throughput, latency and cache reuse on the configured
profile.

Two synthetic procedure videos of the same shape (seeds 0 and 1, as `medclaw video synth` makes
them) and N questions from each one's ground truth. The engines start once, timed apart
(`engine_start_s`); then passes on the shared engines:

    sequential            video A, one agent episode at a time       the baseline
    concurrent            video B, --concurrency episodes at once    caches as cold as the baseline's
    oneshot               video A's questions, the one-shot baseline (`medclaw.eval.oneshot`: the
                          VLM sees the whole video once), one at a time, after the sequential pass
    sequential_cache_off  the sequential pass again on engines started with prefix caching off
                          (`--prefix-caching-compare`, the default; the first engines are closed,
                          then every in-process vLLM engine starts again with
                          `extra.enable_prefix_caching: false`)

(Two videos, so that the concurrent pass finds neither frames nor video KV left by the first.)
Per pass (`medclaw.bench.e2e_figures`): wall_s, episodes_per_min, steps_per_s, statuses, episode
wall time p50/p95, model calls, prompt / cached tokens and hit rate (all, orchestrator,
sub_agents), visual tokens, frames decoded and frame-cache hits; from the traces, time to first
token per role (`ttft`: orchestrator, sub_agents; p50/p95 of the calls whose backend measured it)
and wall time per tool (`tool_latency`: count, p50/p95/mean/max, errors, not_run). Same run:
`ratios` (concurrent / sequential steps per second and episodes per minute), `visual_tokens`
(the agent's sequential episodes vs the one-shot pass on the same questions), `prefix_caching`
(sequential vs sequential_cache_off: tokens, hit rates, wall and steps/s ratios, TTFT p50 off/on,
and what every engine reported about its prefix cache). Prefix reuse across repeated questions is
measured exactly by `medclaw bench kv`.

How long an episode is depends on what the orchestrator decides; on the tiny random-weight models
that is noise (the cache-off pass need not take the same steps), so steps_per_s is the steadier
throughput figure and TTFT the direct measure of what the prefix cache saves. Output: one JSON
object on stdout (`--json`) or a table; progress on stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from medclaw.bench.e2e_figures import (
    ROLES, caching_compare, harness_vs_oneshot, load_steps, ratio as _ratio, summarise,
    trace_figures,
)

PASSES = ("sequential", "concurrent", "oneshot")
CACHE_OFF_PASS = "sequential_cache_off"
__all__ = ["PASSES", "CACHE_OFF_PASS", "summarise", "questions_of", "run_pass", "run_oneshot_pass",
           "run_passes", "run_cache_off", "add_caching_compare", "without_prefix_caching"]


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
    parser.add_argument("--prefix-caching-compare", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="repeat the sequential pass on engines started with prefix caching "
                             "off (default: on; it starts every vLLM engine a second time)")
    parser.add_argument("--out-dir", default="artifacts/bench-e2e", metavar="DIR",
                        help="where the videos and traces go (default artifacts/bench-e2e)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.set_defaults(handler=_handler)


# --- measurement (engine-agnostic: tests pass a Runtime on the session's engines) ----------------

def questions_of(gt_path: str | Path, n: int) -> list[str]:
    """`n` questions from a synthetic video's ground truth, cycled when it holds fewer."""
    qa = json.loads(Path(gt_path).read_text())["qa"]
    return [qa[i % len(qa)]["question"] for i in range(n)]


def _row(results, wall_s: float, before: dict, runtime, width: int) -> dict:
    return {"concurrency": width, **summarise(results, wall_s, before, runtime.frames.stats()),
            **trace_figures(load_steps(results))}


async def run_pass(runtime, config, name: str, video: str, questions: list[str], width: int,
                   on_result=None) -> dict:
    """One pass: `run_batch` of one episode per question, `width` at once; its figures."""
    from dataclasses import replace

    from medclaw.engine.episode import BatchItem, run_batch

    items = [BatchItem(video=video, question=q, id=f"{name}-{i}") for i, q in enumerate(questions)]
    before = runtime.frames.stats()
    started = time.perf_counter()
    results = await run_batch(items, runtime, replace(config, concurrency=width),
                              on_result=on_result)
    return _row(results, time.perf_counter() - started, before, runtime, width)


async def run_oneshot_pass(runtime, config, video: str, questions: list[str],
                           on_result=None) -> dict:
    """The one-shot baseline (`medclaw.eval.oneshot`) on the same questions, one at a time."""
    from medclaw.engine.episode import BatchItem
    from medclaw.eval.oneshot import run_oneshot
    from medclaw.kernels.probe import probe_video

    info = await asyncio.to_thread(probe_video, video)
    before = runtime.frames.stats()
    started = time.perf_counter()
    results = []
    for i, question in enumerate(questions):
        results.append(await run_oneshot(question, info, runtime, config, episode_id=f"oneshot-{i}"))
        if on_result is not None:
            on_result(BatchItem(video=video, question=question, id=f"oneshot-{i}"), results[-1])
    return _row(results, time.perf_counter() - started, before, runtime, 1)


def engine_caching(runtime) -> dict:
    """Role → whether its live engine runs with prefix caching (its own report; None: unknown)."""
    return {role: getattr(backend, "prefix_caching", None)
            for role, backend in sorted(runtime.live_backends().items())}


async def run_passes(runtime, config, video_a: str, video_b: str, questions_a: list[str],
                     questions_b: list[str], concurrency: int, on_result=None,
                     on_engine=None) -> dict:
    """Start the engines (`on_engine` gets one `EngineReady` per engine), run the three passes,
    return {"engine_start_s", "passes", "ratios", "visual_tokens", "prefix_caching_on"}."""
    started = time.perf_counter()
    await runtime.start(on_engine=on_engine)
    out: dict = {"engine_start_s": round(time.perf_counter() - started, 3), "passes": {}}
    passes = out["passes"]
    passes["sequential"] = await run_pass(runtime, config, "sequential", video_a, questions_a, 1,
                                          on_result)
    passes["concurrent"] = await run_pass(runtime, config, "concurrent", video_b, questions_b,
                                          concurrency, on_result)
    passes["oneshot"] = await run_oneshot_pass(runtime, config, video_a, questions_a, on_result)
    seq, conc = passes["sequential"], passes["concurrent"]
    out["ratios"] = {
        "concurrent_vs_sequential_steps_per_s": _ratio(conc["steps_per_s"], seq["steps_per_s"]),
        "concurrent_vs_sequential_episodes_per_min": _ratio(conc["episodes_per_min"],
                                                            seq["episodes_per_min"]),
    }
    out["visual_tokens"] = harness_vs_oneshot(seq, passes["oneshot"])
    out["prefix_caching_on"] = engine_caching(runtime)
    return out


def without_prefix_caching(specs: dict) -> dict:
    """The same specs with prefix caching switched off on every in-process vLLM engine (the one
    engine builder, through `extra`); other backends are left as they are."""
    from dataclasses import replace

    return {role: replace(spec, extra={**spec.extra, "enable_prefix_caching": False})
            if spec.backend == "vllm" else spec for role, spec in specs.items()}


async def run_cache_off(runtime_off, config, video: str, questions: list[str], on_result=None,
                        on_engine=None) -> dict:
    """The sequential pass again on `runtime_off` (engines built `without_prefix_caching`)."""
    started = time.perf_counter()
    await runtime_off.start(on_engine=on_engine)
    engine_start_s = round(time.perf_counter() - started, 3)
    row = await run_pass(runtime_off, config, CACHE_OFF_PASS, video, questions, 1, on_result)
    return {"engine_start_s": engine_start_s, "row": row, "caching": engine_caching(runtime_off)}


def add_caching_compare(out: dict, off: dict) -> None:
    """Put the cache-off pass (`run_cache_off`) into `out` beside the sequential pass it repeats."""
    out["passes"][CACHE_OFF_PASS] = off["row"]
    roles = sorted(set(out["prefix_caching_on"]) | set(off["caching"]))
    engines = {role: {"on": out["prefix_caching_on"].get(role), "off": off["caching"].get(role)}
               for role in roles}
    out["prefix_caching"] = {"engine_start_s_off": off["engine_start_s"],
                             **caching_compare(out["passes"]["sequential"], off["row"], engines)}


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
    compare = args.prefix_caching_compare and any(
        spec.backend == "vllm" for spec in runtime.specs.values())
    with console.status("synthesising two procedure videos…"):
        video_a, video_b = _videos(out, args.minutes)
    questions_a = questions_of(video_a.with_suffix(".json"), args.questions)
    questions_b = questions_of(video_b.with_suffix(".json"), args.questions)
    done = {"n": 0, "of": (len(PASSES) + compare) * args.questions}

    def on_result(item, result) -> None:
        done["n"] += 1
        console.log(f"{item.id}: {result.status.split(':')[0]} ({result.steps} steps) "
                    f"[{done['n']}/{done['of']}]")

    def on_engine(ready) -> None:
        console.log(ready.line())

    async def main() -> dict:
        try:
            with console.status(f"starting engines, then {len(PASSES)} passes…"):
                result = await run_passes(runtime, config, str(video_a), str(video_b),
                                          questions_a, questions_b, args.concurrency, on_result,
                                          on_engine=on_engine)
        finally:
            await runtime.close()          # before the cache-off engines take the memory
        if compare:
            runtime_off = open_runtime(profile=args.profile, config_path=args.config)
            runtime_off.specs.update(without_prefix_caching(runtime_off.specs))
            try:
                with console.status("starting engines with prefix caching off, then one pass…"):
                    off = await run_cache_off(runtime_off, config, str(video_a), questions_a,
                                              on_result, on_engine=on_engine)
            finally:
                await runtime_off.close()
            add_caching_compare(result, off)
        elif args.prefix_caching_compare:
            result["prefix_caching"] = {"skipped": "no in-process vLLM engine to start without "
                                                   "prefix caching"}
        return result

    models = {role: spec.name for role, spec in runtime.specs.items()}
    result = {"models": models, "questions": args.questions, "minutes": args.minutes,
              "max_steps": args.max_steps, **asyncio.run(main())}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)
    return 0


def _print_table(result: dict) -> None:
    print(f"engine start: {result['engine_start_s']:.1f} s")
    header = ("pass", "conc", "wall_s", "ep/min", "steps/s", "p50_s", "hit_rate", "vis_tok",
              "ttft_orch", "ttft_sub", "decoded", "cache_hits")
    print(f"{header[0]:<20}  " + "  ".join(f"{h:>10}" for h in header[1:]))
    for name, row in result["passes"].items():
        cells = (row["concurrency"], row["wall_s"], row["episodes_per_min"],
                 row["steps_per_s"], row["episode_wall_p50_s"], row["cached_hit_rate"],
                 row["visual_tokens"], *(row["ttft"][role]["p50_s"] for role in ROLES),
                 row["frames_decoded"], row["frame_cache_hits"])
        print(f"{name:<20}  " + "  ".join(f"{c!s:>10}" for c in cells))
    print("tool latency (sequential + concurrent passes, per pass):")
    for name in ("sequential", "concurrent"):
        for tool, stats in result["passes"][name]["tool_latency"].items():
            print(f"  {name:>10}  {tool:<22} n={stats['count']:<3} p50={stats['p50_s']} s "
                  f"p95={stats['p95_s']} s  errors={stats['errors']} not_run={stats['not_run']}")
    for key, value in result["ratios"].items():
        print(f"{key}: {value}")
    visual = result["visual_tokens"]
    print(f"visual tokens: harness {visual['harness']} vs one-shot {visual['oneshot']} "
          f"over {visual['questions']} questions (ratio {visual['harness_vs_oneshot']})")
    caching = result.get("prefix_caching")
    if caching and "skipped" not in caching:
        on, off = caching["on"], caching["off"]
        print(f"prefix caching on/off: hit rate {on['cached_hit_rate']}/{off['cached_hit_rate']}, "
              f"cached tokens {on['cached_tokens']}/{off['cached_tokens']}; "
              + ", ".join(f"{k} {v}" for k, v in caching["ratios"].items()))
    elif caching:
        print(f"prefix caching compare skipped: {caching['skipped']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m medclaw.bench.e2e")
    register(parser)
    ns = parser.parse_args()
    sys.exit(ns.handler(ns))
