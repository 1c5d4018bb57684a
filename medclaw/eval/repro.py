"""Reproducibility: traces compared modulo what legitimately differs between two runs.

    canonical_trace(Trace.load(path)) -> dict      # the trace without VOLATILE fields
    differences(a, b) -> list[str]                 # "path: x != y" for each field that differs

Two runs of the same inputs with the same seed must give equal canonical traces: the same
question, video hash, models and revisions, system prompt, every tool call and argument, every
frame index and timestamp, every model's text and token counts, the same answer. Left out
(`VOLATILE`): wall-clock stamps and latencies (time to first token too), how many prompt tokens
the prefix cache happened to serve (a second run finds the first one's KV), where the trace was
written (`trace_dir`, and the config digest that covers it) and the source checkout's
`git describe`.

On vLLM's CPU engines sampling is seeded per engine, not per request (per-request seeds break
chunked prefill there), so a run at temperature > 0 repeats exactly only on a fresh engine with
one episode at a time; at temperature 0 (the tools, the judge, and an orchestrator configured so)
it repeats on the same engines too.
"""
from __future__ import annotations

VOLATILE = frozenset({
    "created_at", "ended_at", "latency_s", "ttft_s", "tool_latency_s", "started_at_s", "wall_s",
    "elapsed_s",
    "num_cached_tokens", "cached_tokens", "cached_hit_rate", "trace_dir", "config_sha256",
    "git_describe",
})


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def canonical_trace(trace) -> dict:
    """`trace` (a `medclaw.engine.trace.Trace`) as a dict without VOLATILE fields."""
    return _strip(trace.to_dict())


def differences(a, b, path: str = "", limit: int = 20) -> list[str]:
    """Where two canonical values differ (at most `limit` entries)."""
    out: list[str] = []

    def walk(x, y, where: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                walk(x.get(key, "<missing>"), y.get(key, "<missing>"), f"{where}.{key}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{where}[{i}]")
        elif x != y:
            out.append(f"{where or '.'}: {str(x)[:120]!r} != {str(y)[:120]!r}")

    walk(a, b, path)
    return out
