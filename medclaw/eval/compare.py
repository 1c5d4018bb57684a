"""`medclaw eval compare RUN_DIR…`: the backbone-swap table and plot, runs side by side.

    summary = compare_runs([dir_a, dir_b, ...])       # -> {"runs": [...], "columns": [...]}
    write_compare(summary, out_dir)                   # compare.md, compare.json, compare.png

Each run directory is one backbone (one `medclaw eval … --out DIR`, agent and/or one-shot). Its
models are read from its TRACES, not from its configuration: every result's trace is loaded
(`medclaw.engine.trace.Trace`, the typed schema) and the header's role → model name@revision
collected, with the revisions of every model call. A run whose traces name more than one revision
for a role is marked "mixed" (it was resumed after the weights changed, for instance).

Columns: per (split, type, mode) the judge Avg, then per mode the overall Avg (mean over all of
that mode's questions). Rows keep the order the directories were given in.
"""
from __future__ import annotations

import json
from pathlib import Path

from medclaw.eval.report import MODES, grouped_bars, load_mode, mode_dir, summarise

ROLES_SHOWN = ("orchestrator", "video_expert", "frame_verifier", "judge")


def models_from_traces(run_dir: Path) -> dict:
    """role → sorted list of "name@revision" seen in the run's trace headers, plus the revisions
    of every model call (`calls`) and how many traces were read."""
    from medclaw.engine.trace import Trace
    from medclaw.eval.runner import resolve_trace

    roles: dict[str, set[str]] = {}
    calls: set[str] = set()
    read = 0
    for mode in MODES:
        loaded = load_mode(run_dir, mode)
        if loaded is None:
            continue
        for row in loaded[1]:
            path = resolve_trace(row.get("trace"), mode_dir(run_dir, mode))
            if path is None or not Path(path).is_file():
                continue
            trace = Trace.load(path)
            read += 1
            for role, info in trace.header.models.items():
                roles.setdefault(role, set()).add(f"{info.name}@{info.revision}")
            for step in trace.steps:
                for call in [*step.model_calls, *([step.orchestrator_call] if step.orchestrator_call else [])]:
                    calls.add(f"{call.model_name}@{call.model_revision}")
    return {"roles": {r: sorted(v) for r, v in sorted(roles.items())}, "calls": sorted(calls),
            "traces_read": read}


def _overall(run_dir: Path, mode: str) -> float | None:
    loaded = load_mode(run_dir, mode)
    if loaded is None or not loaded[1]:
        return None
    values = [r["judge"]["avg"] for r in loaded[1]]
    return round(sum(values) / len(values), 4)


def compare_runs(run_dirs: list[str | Path]) -> dict:
    from medclaw.errors import MedClawError

    if not run_dirs:
        raise MedClawError("give at least one run directory")
    runs, keys = [], set()
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise MedClawError(f"run directory not found: {run_dir}")
        summary = summarise(run_dir)
        cells = {f"{g['split']}/{g['type']}/{g['mode']}": g["Avg"] for g in summary["groups"]}
        keys |= set(cells)
        models = models_from_traces(run_dir)
        runs.append({"run_dir": str(run_dir), "name": run_dir.name, "models": models,
                     "cells": cells, "overall": {m: _overall(run_dir, m) for m in MODES},
                     "n": {m: sum(g["n"] for g in summary["groups"] if g["mode"] == m) for m in MODES}})
    return {"runs": runs, "columns": sorted(keys)}


def _model_cell(models: dict, role: str) -> str:
    names = models["roles"].get(role, [])
    if not names:
        return "–"
    shown = names[0] if len(names) == 1 else "mixed: " + ", ".join(names)
    name, _, revision = shown.partition("@")
    return f"{name}@{revision[:12]}" if len(names) == 1 else shown


def to_markdown(summary: dict) -> str:
    columns = summary["columns"]
    head = (["run", *ROLES_SHOWN, *columns, *(f"all/{m}" for m in MODES)])
    lines = ["# Backbone comparison (judge Avg, 1–5)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in summary["runs"]:
        cells = [run["name"], *(_model_cell(run["models"], r) for r in ROLES_SHOWN),
                 *(f"{run['cells'][c]:.2f}" if run["cells"].get(c) is not None else "–" for c in columns),
                 *(f"{run['overall'][m]:.2f}" if run["overall"][m] is not None else "–" for m in MODES)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Models are read from each run's traces (name@revision, revision cut to 12 hex)."]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [*summary["columns"], *(f"all/{m}" for m in MODES)]
    runs = summary["runs"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(columns) * max(1, len(runs)) * 0.5), 3.8))
    series = [(run["name"], [(run["cells"].get(c) if not c.startswith("all/")
                              else run["overall"][c[4:]]) or 0 for c in columns]) for run in runs]
    grouped_bars(ax, columns, series, ylabel="judge Avg (1–5)", rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_compare(summary: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "compare.md").write_text(to_markdown(summary) + "\n")
    plot(summary, out / "compare.png")
    return out
