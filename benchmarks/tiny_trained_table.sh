#!/usr/bin/env bash
# The paper's Table III in miniature: agent vs one-shot on the trained miniature (`tiny-trained`),
# on held-out synthetic zoom questions (small objects, look-alikes), with `medclaw eval`.
#
#   benchmarks/tiny_trained_table.sh [OUT_DIR] [FIRST_SEED] [CHECKPOINTS]
#                                      (default artifacts/table3, 5000, the committed checkpoints)
#
# CHECKPOINTS, a `medclaw models train-tiny` output folder, replaces the profile's three trained
# roles (orchestrator = CHECKPOINTS/llm, video expert and frame verifier = CHECKPOINTS/vlm; each
# keeps the profile's budgets): the same table for a miniature trained on another seed.
#
# Renders 12 held-out videos (seeds FIRST_SEED.., 0.5 min, never trained on when FIRST_SEED is
# 5000 or more: `medclaw models train-tiny` trains on seeds 1000-1047), asks each video's two
# small-object and two look-alike questions in both modes, and writes OUT_DIR/run/report.{md,json}
# (exact accuracy, evidence-window IoU, the four judge dimensions, per mode and the Δ row).
# The judge of `tiny-trained` is the untrained tiny LLM: its four scores are noise here.
set -euo pipefail
CHECKPOINTS="${3:+$(realpath "$3")}"          # before the cd: relative to where it was called
cd "$(dirname "$0")/.."
OUT="${1:-artifacts/table3}"
SEED="${2:-5000}"
MEDCLAW="${MEDCLAW:-.venv/bin/medclaw}"
MODELS=()
if [ -n "$CHECKPOINTS" ]; then
  for part in llm vlm; do
    [ -f "$CHECKPOINTS/$part/config.json" ] ||
      { echo "no trained miniature at $3 (no $part/config.json)" >&2; exit 2; }
  done
  MODELS=(--model "orchestrator=$CHECKPOINTS/llm" --model "video_expert=$CHECKPOINTS/vlm"
          --model "frame_verifier=$CHECKPOINTS/vlm")
fi
rm -rf "$OUT"
"$MEDCLAW" eval make-synthetic "$OUT/data" --videos 12 --minutes 0.5 --seed "$SEED" --zoom \
  --families small_object,look_alike
for mode in agent oneshot; do
  "$MEDCLAW" eval "$OUT/data/dataset.jsonl" --out "$OUT/run" --profile tiny-trained --mode "$mode" \
    "${MODELS[@]}"
done
cat "$OUT/run/report.md"
