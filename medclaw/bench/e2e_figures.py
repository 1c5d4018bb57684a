"""The figures of `medclaw bench e2e`, from episode results and their traces (no engine here).

    summarise(results, wall_s, frames_before, frames_after)   one pass: throughput, tokens, frames
    trace_figures(steps)            time to first token per role, wall time per tool (from traces)
    harness_vs_oneshot(harness, oneshot)    visual tokens the agent sent vs the one-shot baseline
    caching_compare(on, off)        the same workload with prefix caching on and off

Latency figures are nearest-rank percentiles over what was measured: a model call whose backend
cannot see its first token (`ttft_s` None: the remote server answers in one piece) is counted
under `calls` but not `measured`. Tool latency is over every call that ran, `errors` of them
returning an error for the model (bad arguments fail at once; an unusable sub-agent reply only
after the sub-agent's call), and a step whose tool was refused before it ran (final_answer
before `min_tool_steps`) is counted under `not_run`, so `count + not_run` equals the trace's steps
naming that tool (output that did not parse names none).

Visual tokens are what the tools charged the episode's budget (`Totals.visual_tokens_used`): every
clip or still a tool planned and sent, once (stage 2 of view_full_video sends stage 1's clip again
as the prefix of its request; vLLM serves that from its cache, and the budget counts it once).
"""
from __future__ import annotations

from statistics import fmean, median

ROLES = ("orchestrator", "sub_agents")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency_stats(values: list[float]) -> dict:
    """{"count", "p50_s", "p95_s", "mean_s", "max_s"} (None figures when `values` is empty)."""
    if not values:
        return {"count": 0, "p50_s": None, "p95_s": None, "mean_s": None, "max_s": None}
    return {"count": len(values), "p50_s": round(median(values), 4),
            "p95_s": round(percentile(values, 0.95), 4), "mean_s": round(fmean(values), 4),
            "max_s": round(max(values), 4)}


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


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
    by_role = {}
    for role in ROLES:
        tallies = [r.totals.get(role, {}) for r in results]
        role_prompt = sum(t.get("prompt_tokens", 0) for t in tallies)
        role_cached = sum(t.get("cached_tokens", 0) for t in tallies)
        by_role[role] = {"calls": sum(t.get("calls", 0) for t in tallies),
                         "prompt_tokens": role_prompt, "cached_tokens": role_cached,
                         "cached_hit_rate": round(role_cached / role_prompt, 4) if role_prompt else 0.0}
    return {
        "episodes": len(results), "wall_s": round(wall_s, 3),
        "episodes_per_min": round(60 * len(results) / wall_s, 3),
        "steps": steps, "steps_per_s": round(steps / wall_s, 3), "statuses": statuses,
        "episode_wall_p50_s": round(median(walls), 3) if walls else None,
        "episode_wall_p95_s": round(percentile(walls, 0.95), 3) if walls else None,
        "model_calls": sum(c.get("calls", 0) for c in calls),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        **by_role,
        "visual_tokens": sum(r.totals.get("visual_tokens_used", 0) for r in results),
        "frames_decoded": frames_after["frames_decoded"] - frames_before["frames_decoded"],
        "frame_cache_hits": frames_after["hits"] - frames_before["hits"],
    }


def load_steps(results) -> list:
    """Every step of the results' traces (`Trace.load`, validated); results without a trace
    (an item refused before its episode started) have none."""
    from medclaw.engine.trace import Trace

    return [step for r in results if r.trace_path for step in Trace.load(r.trace_path).steps]


def trace_figures(steps) -> dict:
    """{"ttft": {role: {"calls", "measured", "p50_s", "p95_s", …}},
    "tool_latency": {tool: {"count", "p50_s", "p95_s", "mean_s", "max_s", "errors", "not_run"}}}."""
    calls = {"orchestrator": [s.orchestrator_call for s in steps if s.orchestrator_call is not None],
             "sub_agents": [c for s in steps for c in s.model_calls]}
    ttft = {}
    for role, role_calls in calls.items():
        measured = [c.ttft_s for c in role_calls if c.ttft_s is not None]
        stats = latency_stats(measured)
        ttft[role] = {"calls": len(role_calls), "measured": stats.pop("count"), **stats}
    ran: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    not_run: dict[str, int] = {}
    for step in steps:
        if not step.tool:
            continue
        if step.tool_latency_s <= 0:
            not_run[step.tool] = not_run.get(step.tool, 0) + 1
            continue
        ran.setdefault(step.tool, []).append(step.tool_latency_s)
        if step.error:
            errors[step.tool] = errors.get(step.tool, 0) + 1
    tools = {tool: {**latency_stats(ran.get(tool, [])), "errors": errors.get(tool, 0),
                    "not_run": not_run.get(tool, 0)}
             for tool in sorted(set(ran) | set(not_run))}
    return {"ttft": ttft, "tool_latency": tools}


def harness_vs_oneshot(harness: dict, oneshot: dict) -> dict:
    """Visual tokens the agent's episodes planned and sent vs the one-shot pass on the same
    questions (each a `summarise` row); ratio > 1: the harness looked at more."""
    return {
        "questions": harness["episodes"],
        "harness": harness["visual_tokens"], "oneshot": oneshot["visual_tokens"],
        "harness_per_question": round(harness["visual_tokens"] / harness["episodes"], 1)
        if harness["episodes"] else None,
        "oneshot_per_question": round(oneshot["visual_tokens"] / oneshot["episodes"], 1)
        if oneshot["episodes"] else None,
        "harness_vs_oneshot": ratio(harness["visual_tokens"], oneshot["visual_tokens"]),
        "prompt_tokens": {"harness": harness["prompt_tokens"], "oneshot": oneshot["prompt_tokens"]},
    }


def caching_compare(on: dict, off: dict, engines: dict) -> dict:
    """Prefix caching on vs off on the same workload (two `summarise` rows with `trace_figures`);
    `engines`: role → {"on": bool, "off": bool}, what each run's engines reported."""
    def side(row: dict) -> dict:
        return {"wall_s": row["wall_s"], "steps": row["steps"], "steps_per_s": row["steps_per_s"],
                "prompt_tokens": row["prompt_tokens"], "cached_tokens": row["cached_tokens"],
                "cached_hit_rate": row["cached_hit_rate"],
                **{role: {k: row[role][k] for k in ("prompt_tokens", "cached_tokens",
                                                    "cached_hit_rate")} for role in ROLES},
                "ttft_p50_s": {role: row["ttft"][role]["p50_s"] for role in ROLES}}

    a, b = side(on), side(off)
    return {
        "engines": engines, "on": a, "off": b,
        "ratios": {
            "steps_per_s_on_vs_off": ratio(a["steps_per_s"], b["steps_per_s"]),
            "wall_off_vs_on": ratio(b["wall_s"], a["wall_s"]),
            **{f"ttft_p50_off_vs_on_{role}": ratio(b["ttft_p50_s"][role], a["ttft_p50_s"][role])
               for role in ROLES},
        },
    }
