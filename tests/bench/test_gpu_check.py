"""benchmarks/gpu_check.sh --device cpu: the same script a GPU host runs, on this CPU host (tiny
checkpoint instead of the 7B), writes one JSON with every part measured or skipped with a reason."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), "--device", "cpu",
                           "--minutes", "0.5", "--out", str(out)],
                          capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["host"]["torch"] and data["wall_s"] > 0

    cases = data["decode"]["cases"]
    assert set(cases) == {"coarse", "window", "sparse", "seek"}
    for case, row in cases.items():
        cpu = row["cpu"]
        assert cpu["frame_accuracy"] == 1.0 and cpu["seconds"] > 0 and cpu["frames"] >= 1, case
        assert "cuda" not in row                       # no NVDEC on this host: not faked
    assert cases["sparse"]["cpu"]["frames"] == 64 and cases["seek"]["cpu"]["frames"] == 1

    model = data["model"]
    assert model["name"].startswith("tiny-vlm")
    clip = model["clip"]
    assert clip["visual_tokens"] == (32 // 2) * (224 // 28) ** 2 == 1024
    assert clip["prompt_tokens"] > clip["visual_tokens"]
    bf16, four = model["runs"]["bf16"], model["runs"]["bnb-4bit"]
    for run in (bf16, four):
        assert run["prefill_tokens_per_s"] > 0 and run["visual_tokens_per_s"] > 0
    assert four["quantised_layers"] == 2 * 7           # 2 layers x (q, k, v, o, gate, up, down)
    assert four["weights_bytes"] < bf16["weights_bytes"]
    assert "skipped" in data["vllm"] and "GPU" in data["vllm"]["skipped"]
