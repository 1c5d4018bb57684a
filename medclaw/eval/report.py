"""Evaluation reports: tables per split × VTR/VPR × the four judge dimensions + Avg.

A run directory (what `medclaw eval DATASET --out DIR` writes) holds one folder per mode:

    DIR/agent/{run.json, results.jsonl, traces/}      DIR/oneshot/{...}
    DIR/report.md, DIR/report.json, DIR/report.png    (written by `write_report(DIR)`)

`summarise(DIR)` reads the results of every mode present and returns:
- `groups`: per (split, type, mode) the number of questions and the means of CI, DO, CU, TU,
  Avg (judge), exact match and temporal IoU (over the questions that have that gold);
- `deltas`: per (split, type), agent − one-shot on the questions BOTH modes answered (paired), only
  when both ran on the same video model (name and revision, from run.json); else a note says why;
- `judge`: how many judge replies parsed, out of how many were judged, and the judge models.
Rows are sorted (split, type, mode), so the same results give the same report.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from medclaw.eval.judge import DIMENSIONS

COLUMNS = (*DIMENSIONS, "Avg")
MODES = ("agent", "oneshot")
RUN_FILE, RESULTS_FILE = "run.json", "results.jsonl"


def mode_dir(run_dir: Path, mode: str) -> Path:
    return Path(run_dir) / mode


def load_mode(run_dir: Path, mode: str) -> tuple[dict, list[dict]] | None:
    """(run.json, result rows) of one mode, or None when that mode never ran here."""
    from medclaw.eval.results import read_rows, repair_torn_tail

    folder = mode_dir(run_dir, mode)
    results = folder / RESULTS_FILE
    if not results.is_file():
        return None
    meta = json.loads((folder / RUN_FILE).read_text()) if (folder / RUN_FILE).is_file() else {}
    repair_torn_tail(results)
    return meta, read_rows(results)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def _figures(rows: list[dict]) -> dict:
    out = {"n": len(rows)}
    for dim in DIMENSIONS:
        out[dim] = _mean(r["judge"][dim] for r in rows)
    out["Avg"] = _mean(r["judge"]["avg"] for r in rows)
    out["exact"] = _mean(r["exact"].get("match") for r in rows)
    out["tiou"] = _mean(r["exact"].get("tiou") for r in rows)
    return out


def video_model(meta: dict) -> str | None:
    info = (meta.get("models") or {}).get("video_expert") or {}
    return f"{info.get('name')}@{info.get('revision')}" if info else None


def summarise(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    runs, by_mode = {}, {}
    for mode in MODES:
        loaded = load_mode(run_dir, mode)
        if loaded is not None:
            runs[mode], by_mode[mode] = loaded
    if not runs:
        from medclaw.errors import MedClawError

        raise MedClawError(f"{run_dir}: no results (expected {' or '.join(f'{m}/{RESULTS_FILE}' for m in MODES)})")
    groups = []
    cells: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for mode, rows in by_mode.items():
        for row in rows:
            cells[(row["split"], row["type"])][mode].append(row)
    for (split, kind) in sorted(cells):
        for mode in MODES:
            rows = cells[(split, kind)].get(mode)
            if rows:
                groups.append({"split": split, "type": kind, "mode": mode, **_figures(rows)})
    deltas, note = [], None
    if len(runs) == 2:
        models = {mode: video_model(meta) for mode, meta in runs.items()}
        if models["agent"] != models["oneshot"]:
            note = f"no Δ row: agent ran on {models['agent']}, one-shot on {models['oneshot']}"
        else:
            for (split, kind) in sorted(cells):
                agent = {r["id"]: r for r in cells[(split, kind)].get("agent", [])}
                oneshot = {r["id"]: r for r in cells[(split, kind)].get("oneshot", [])}
                common = sorted(set(agent) & set(oneshot))
                if not common:
                    continue
                a = _figures([agent[i] for i in common])
                b = _figures([oneshot[i] for i in common])
                deltas.append({"split": split, "type": kind, "n": len(common),
                               **{k: (round(a[k] - b[k], 4) if a[k] is not None and b[k] is not None
                                      else None) for k in (*COLUMNS, "exact", "tiou")}})
    judged = [r["judge"] for rows in by_mode.values() for r in rows if r["judge"].get("judged", True)]
    return {
        "run_dir": str(run_dir),
        "runs": {mode: {k: meta.get(k) for k in ("dataset", "dataset_sha256", "profile", "models",
                                                 "judge", "created_at", "medclaw_version")}
                 for mode, meta in runs.items()},
        "groups": groups, "deltas": deltas, "delta_note": note,
        "judge": {"judged": len(judged), "parsed": sum(1 for j in judged if j.get("parsed", True)),
                  "models": sorted({f"{j.get('model')}@{j.get('revision')}" for j in judged})},
    }


def _cell(value, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def to_markdown(summary: dict) -> str:
    lines = [f"# Evaluation report: {summary['run_dir']}", ""]
    for mode, meta in summary["runs"].items():
        lines.append(f"- {mode}: dataset `{meta.get('dataset')}`, profile `{meta.get('profile')}`, "
                     f"video model `{video_model(meta)}`")
    judge = summary["judge"]
    lines += [f"- judge: {judge['parsed']}/{judge['judged']} replies parsed; "
              f"models {', '.join(judge['models']) or '–'}", ""]
    header = "| type | mode | n | " + " | ".join(COLUMNS) + " | exact | tIoU |"
    rule = "|" + "---|" * (len(COLUMNS) + 5)
    for split in sorted({g["split"] for g in summary["groups"]}):
        lines += [f"## Split `{split}`", "", header, rule]
        for kind in ("VTR", "VPR"):
            for g in (g for g in summary["groups"] if g["split"] == split and g["type"] == kind):
                lines.append(f"| {kind} | {g['mode']} | {g['n']} | "
                             + " | ".join(_cell(g[c]) for c in COLUMNS)
                             + f" | {_cell(g['exact'])} | {_cell(g['tiou'])} |")
            for d in (d for d in summary["deltas"] if d["split"] == split and d["type"] == kind):
                lines.append(f"| {kind} | Δ agent − one-shot | {d['n']} | "
                             + " | ".join(_cell(d[c], True) for c in COLUMNS)
                             + f" | {_cell(d['exact'], True)} | {_cell(d['tiou'], True)} |")
        lines.append("")
    if summary.get("delta_note"):
        lines += [summary["delta_note"], ""]
    return "\n".join(lines)


def grouped_bars(ax, columns: list[str], series: list[tuple[str, list[float]]], *, ylabel: str,
                 **tick_style) -> None:
    """One group of bars per column, one bar per (label, values) series (labels may repeat: two
    runs can share a folder name); judge scores, so the axis runs to 5."""
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series):
        ax.bar([i + k * width for i in range(len(columns))], values, width, label=label)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(columns))], columns,
                  **tick_style)
    ax.set_ylim(0, 5)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def plot(summary: dict, path: Path) -> Path:
    """Grouped bars: per split × type, the five columns, one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(g["split"], g["type"]) for g in summary["groups"]})
    modes = [m for m in MODES if any(g["mode"] == m for g in summary["groups"])]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, (split, kind) in zip(axes[0], keys):
        series = []
        for mode in modes:
            g = next((g for g in summary["groups"]
                      if (g["split"], g["type"], g["mode"]) == (split, kind, mode)), None)
            series.append((mode, [(g or {}).get(c) or 0 for c in COLUMNS]))
        grouped_bars(ax, COLUMNS, series, ylabel="judge score (1–5)")
        ax.set_title(f"{split} · {kind}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dir: str | Path) -> dict:
    """Write report.md / report.json / report.png into `run_dir`; returns the summary."""
    run_dir = Path(run_dir)
    summary = summarise(run_dir)
    (run_dir / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    (run_dir / "report.md").write_text(to_markdown(summary) + "\n")
    plot(summary, run_dir / "report.png")
    return summary
