#!/usr/bin/env bash
# Table III in miniature across training seeds: is the agent's margin over one-shot larger than
# the spread between miniatures trained on different seeds?
#
#   benchmarks/tiny_trained_seeds.sh OUT_DIR FIRST_SEED SEED...      (each seed ~25 min on 2 cores)
#
# For each SEED: `medclaw models train-tiny OUT_DIR/train-SEED --seed SEED` (skipped when that
# folder holds a finished run, its MANIFEST.sha256: a crash loses only the seed in progress), then
# benchmarks/tiny_trained_table.sh on it (held-out set FIRST_SEED..FIRST_SEED+11) and its
# breakdown, OUT_DIR/table-FIRST_SEED-SEED.json (another FIRST_SEED reuses the trained seeds).
# Then benchmarks/table3_seeds.py sums them up on stdout, e.g.
#
#   benchmarks/tiny_trained_seeds.sh artifacts/seeds 5000 1 2
#
# Seed 0 is the committed miniature (`train-tiny --seed 0` gives it byte for byte): its table is
# benchmarks/tiny_trained_table.sh's; the results JSON in benchmarks/results/ adds that breakdown
# to table3_seeds.py's inputs (see its docstring).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '5p' "$0" >&2; exit 2; }
cd "$(dirname "$0")/.."
OUT="$1"; FIRST="$2"; shift 2
MEDCLAW="${MEDCLAW:-.venv/bin/medclaw}"
PYTHON="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
inputs=()
for seed in "$@"; do
  train="$OUT/train-$seed"
  if [ ! -f "$train/MANIFEST.sha256" ]; then
    rm -rf "$train"
    "$MEDCLAW" models train-tiny "$train" --seed "$seed" >&2
  fi
  table="$OUT/table-$FIRST-$seed"
  benchmarks/tiny_trained_table.sh "$table" "$FIRST" "$train" >&2
  "$PYTHON" benchmarks/table3_breakdown.py "$table/run" > "$table.json"
  inputs+=("seed$seed=$table.json:$train/train-report.json")
done
"$PYTHON" benchmarks/table3_seeds.py "${inputs[@]}"
