"""benchmarks/table3_seeds.py: the spread across training seeds and the agent's smallest margin,
from two breakdowns written as `table3_breakdown.py` writes them."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "table3_seeds.py"


def _module():
    spec = importlib.util.spec_from_file_location("table3_seeds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _breakdown(agent: dict, oneshot: dict, blind: dict) -> dict:
    return {"modes": {"agent": {k: {"exact": v} for k, v in agent.items()},
                      "oneshot": {k: {"exact": v} for k, v in oneshot.items()}},
            "blind_guess": {k: {"answer": "x", "exact": v} for k, v in blind.items()}}


def test_spread_and_smallest_margins_across_seeds(tmp_path):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(_breakdown({"small": 1.0, "look": 0.7}, {"small": 0.0, "look": 0.1},
                                       {"small": 0.5, "look": 0.6})))
    b.write_text(json.dumps(_breakdown({"small": 0.9, "look": 0.8}, {"small": 0.2, "look": 0.0},
                                       {"small": 0.5, "look": 0.6})))
    out = _module().main([f"s0={a}", f"s1={b}"])
    assert set(out["seeds"]) == {"s0", "s1"}
    small, look = out["summary"]["small"], out["summary"]["look"]
    assert small["agent"] == {"min": 0.9, "max": 1.0, "spread": 0.1}
    assert small["oneshot"]["spread"] == 0.2
    assert small["margin_over_oneshot_min"] == 0.7          # seed s1: 0.9 - 0.2
    assert look["margin_over_oneshot_min"] == 0.6           # seed s0: 0.7 - 0.1
    assert look["margin_over_blind_guess_min"] == 0.1


def test_a_malformed_argument_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="LABEL=BREAKDOWN.json"):
        _module().main(["no-label-here"])
