"""Table III in miniature across training seeds: per seed, the exact accuracy of each mode and
question kind (from `table3_breakdown.py`) and the miniature's held-out scores (its
`train-report.json`); then, per kind, the spread of each mode across seeds and the agent's
smallest margin over one-shot and over a blind guess. JSON on stdout.

    python benchmarks/table3_seeds.py LABEL=BREAKDOWN.json[:TRAIN_REPORT.json] ...

`benchmarks/tiny_trained_seeds.sh` calls it; the committed miniature (seed 0) joins as
`seed0=benchmarks/results/cpu-2core-tiny-trained-table3.json:medclaw/checkpoints/tiny-trained/train-report.json`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def seed_row(breakdown: dict, report: dict | None) -> dict:
    row = {"exact": {mode: {kind: scores["exact"] for kind, scores in kinds.items()}
                     for mode, kinds in breakdown["modes"].items()},
           "blind_guess": {kind: g["exact"] for kind, g in breakdown["blind_guess"].items()}}
    if report is not None:
        row["vlm"] = {kind: {"region": a["region"], "whole_frame": a["frame"]}
                      for kind, a in report["accuracy"].items()}
        held_out = report["orchestrator"]["held_out"]
        row["orchestrator_actions"] = {"all": held_out["action_accuracy"], **held_out["by_kind"]}
        row["targets_met"] = report["targets_met"]
        row["train_wall_s"] = report["wall_s"]
    return row


def summary(rows: dict) -> dict:
    """Per kind: each mode's min / max / spread over the seeds, and the agent's smallest margin."""
    kinds = sorted({k for row in rows.values() for k in row["exact"]["agent"]})
    out = {}
    for kind in kinds:
        per_mode = {}
        for mode in ("agent", "oneshot"):
            values = [row["exact"][mode][kind] for row in rows.values()]
            per_mode[mode] = {"min": min(values), "max": max(values),
                              "spread": round(max(values) - min(values), 4)}
        out[kind] = {**per_mode,
                     "margin_over_oneshot_min": round(min(
                         row["exact"]["agent"][kind] - row["exact"]["oneshot"][kind]
                         for row in rows.values()), 4),
                     "margin_over_blind_guess_min": round(min(
                         row["exact"]["agent"][kind] - row["blind_guess"][kind]
                         for row in rows.values()), 4)}
    return out


def main(args: list[str]) -> dict:
    rows = {}
    for arg in args:
        label, _, paths = arg.partition("=")
        table, _, report = paths.partition(":")
        if not label or not table:
            raise SystemExit(f"table3_seeds.py: expected LABEL=BREAKDOWN.json[:TRAIN_REPORT.json], got {arg!r}")
        rows[label] = seed_row(json.loads(Path(table).read_text()),
                               json.loads(Path(report).read_text()) if report else None)
    return {"seeds": rows, "summary": summary(rows)}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(json.dumps(main(sys.argv[1:]), indent=1))
