#!/usr/bin/env bash
# The GPU check: NVDEC vs CPU decoding (coarse, window, sparse, seek) on one synthetic video, and
# the real-size Qwen2.5-VL-7B (published config, random weights) prefill tokens/s, visual tokens/s
# and peak GPU memory in bf16 and 4-bit (bitsandbytes), plus vLLM's prefill when vLLM is there.
#
#   benchmarks/gpu_check.sh [--device cuda|cpu] [--out FILE|-] [--minutes M] [--skip decode,model,vllm]
#
# Needs only this repository, Python with torch + transformers (bitsandbytes, torchcodec/PyAV and
# ffmpeg for the parts that use them; a missing one is reported as skipped in the JSON). Nothing
# is downloaded. At most 8 minutes: parts that would not fit are skipped. `--device cpu` runs the
# same script on a CPU host, with the tiny checkpoint in place of the 7B. JSON goes to
# artifacts/gpu-check-DEVICE.json unless --out says otherwise (see medclaw/bench/gpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_HOST_IP=127.0.0.1
exec timeout --kill-after=10 480 "$PY" -m medclaw.bench.gpu "$@"
