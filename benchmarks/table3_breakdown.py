"""Per-kind breakdown of a `benchmarks/tiny_trained_table.sh` run, with the spread between the two
halves of the held-out videos (videos 0-5 and 6-11): exact accuracy, evidence-window IoU and the
judge's four dimensions per mode and question kind, as JSON on stdout. `blind_guess` gives, per
kind, the best exact accuracy a constant answer could reach on the set (the most frequent gold
answer): the floor a mode must clear to have seen anything.

    python benchmarks/table3_breakdown.py artifacts/table3/run > benchmarks/results/cpu-2core-tiny-trained-table3.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


DIMENSIONS = ("CI", "DO", "CU", "TU", "avg")      # the judge's four scores and their mean


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def breakdown(run_dir: Path) -> dict:
    runs = {results.parent.name: [json.loads(line) for line in results.read_text().splitlines()
                                  if line.strip()]
            for results in sorted(run_dir.glob("*/results.jsonl"))}
    out: dict = {"run_dir": str(run_dir), "modes": {mode: by_kind(rows) for mode, rows in runs.items()}}
    if runs:                                   # every mode answers the same questions
        out["blind_guess"] = blind_guess(next(iter(runs.values())))
    return out


def by_kind(rows: list[dict]) -> dict:
    """One mode's scores per question kind, overall and per half of the videos."""
    table: dict = {}
    for kind in sorted({r["subtype"] for r in rows}):
        mine = [r for r in rows if r["subtype"] == kind]
        halves = [[r for r in mine if (int(r["id"].split("-")[0][1:]) >= 6) == upper]
                  for upper in (False, True)]
        by_half = [_mean([r["exact"]["match"] for r in half]) for half in halves]
        table[kind] = {"n": len(mine),
                       "exact": _mean([r["exact"]["match"] for r in mine]),
                       "tiou": _mean([r["exact"]["tiou"] for r in mine]),
                       "exact_by_half": by_half,
                       "judge": {d: _mean([r["judge"][d] for r in mine]) for d in DIMENSIONS},
                       "answered": sum(r["status"] == "answered" for r in mine)}
    return table


def blind_guess(rows: list[dict]) -> dict:
    """Per kind: the most frequent gold answer and the exact accuracy of always giving it."""
    guess = {}
    for kind in sorted({r["subtype"] for r in rows}):
        golds = [r["gold"].strip().lower() for r in rows if r["subtype"] == kind]
        best = max(sorted(set(golds)), key=golds.count)
        guess[kind] = {"answer": best, "exact": _mean([g == best for g in golds])}
    return guess


if __name__ == "__main__":
    print(json.dumps(breakdown(Path(sys.argv[1])), indent=1))
