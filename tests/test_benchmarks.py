"""benchmarks/plot_decode.py turns a decode JSON into a chart, and says what is wrong with bad JSON."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_decode", ROOT / "benchmarks" /
                                                  "plot_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plots_the_committed_result(tmp_path):
    plot_decode = _plot_module()
    out = tmp_path / "decode.png"
    assert plot_decode.main([str(ROOT / "benchmarks/results/cpu-2core-decode.json"),
                             str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_partial_result_without_baseline(tmp_path):
    plot_decode = _plot_module()
    source = tmp_path / "ours-only.json"
    source.write_text(json.dumps({"video": "v.mp4", "device": "cpu", "cases": {
        "sparse": {"ours_s": 0.9, "baseline_s": None, "speedup": None, "ffmpeg_all_s": 2.6,
                   "num_frames": 64, "frame_accuracy": None}}}))
    assert plot_decode.main([str(source)]) == 0
    assert (tmp_path / "ours-only.png").exists()


@pytest.mark.parametrize("text", ["not json", json.dumps({"cases": {}}), json.dumps([1, 2])])
def test_bad_input_is_one_line(tmp_path, text):
    plot_decode = _plot_module()
    source = tmp_path / "bad.json"
    source.write_text(text)
    with pytest.raises(SystemExit) as err:
        plot_decode.main([str(source)])
    message = str(err.value)
    assert message.startswith("plot_decode:") and "\n" not in message
