#!/usr/bin/env bash
# `medclaw distill` on the trained miniature (`tiny-trained`): mine the agent's failures on held-out
# synthetic zoom questions, let the profile's distiller (tiny-trained-distiller, the orchestrator
# fine-tuned to review: `medclaw models train-distiller`) diagnose them and write lessons, and gate
# every candidate skill on a validation set (R_0, R_s, verdict for each). The gate's reward is
# exact match (`--reward exact`): the profile's judge is the untrained tiny LLM, which gives every
# answer the same Avg, so under it no candidate could pass. The distiller diagnoses 0.60 of its
# held-out reviews right (its distiller-report.json), so which lessons get written is partly luck:
# the run shows the method end to end on this profile and what a candidate does to the agent.
#
#   benchmarks/tiny_trained_distill.sh [OUT_DIR] [FIRST_SEED]     (default artifacts/distill-tiny, 6000)
#
# Renders 4 mining videos (seeds FIRST_SEED..) and 2 validation videos (FIRST_SEED+100..), 0.5 min
# each, never trained on (`medclaw models train-tiny` trains on seeds 1000-1047), 4 small-object
# and look-alike questions each, asked at whole seconds ("at 17 s": `--whole-seconds`, the form
# whose time the trained orchestrator miscopies, so its failures are ones a lesson could fix; asked
# at tenths it answers these sets right), and writes OUT_DIR/run/distill_report.{md,json}, then
# OUT_DIR/run/review_check.json: each diagnosis beside the scripted reviewer's on the same turn
# (`benchmarks/distill_review_check.py`). The library grown is OUT_DIR/library (the shipped
# skills apply too); nothing outside OUT_DIR is written.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-artifacts/distill-tiny}"
SEED="${2:-6000}"
MEDCLAW="${MEDCLAW:-.venv/bin/medclaw}"
rm -rf "$OUT"
"$MEDCLAW" eval make-synthetic "$OUT/mine" --videos 4 --minutes 0.5 --seed "$SEED" --zoom \
  --whole-seconds --families small_object,look_alike
"$MEDCLAW" eval make-synthetic "$OUT/val" --videos 2 --minutes 0.5 --seed "$((SEED + 100))" --zoom \
  --whole-seconds --families small_object,look_alike
"$MEDCLAW" distill --mine "$OUT/mine/dataset.jsonl" --val "$OUT/val/dataset.jsonl" \
  --library "$OUT/library" --profile tiny-trained --out "$OUT/run" --max-candidates 3 \
  --reward exact
cat "$OUT/run/distill_report.md"
"${PYTHON:-.venv/bin/python}" benchmarks/distill_review_check.py "$OUT/run" "$OUT/mine/dataset.jsonl" \
  > "$OUT/run/review_check.json"
"${PYTHON:-.venv/bin/python}" -c "import json, sys; r = json.load(open(sys.argv[1])); print(
    f'diagnoses agreeing with the scripted reviewer: {r[\"agreed\"]} of {r[\"questions\"]}',
    r['expected_to_got'])" "$OUT/run/review_check.json"
