"""`medclaw bench kv` judges itself: each figure against its target, exit status 1 on a miss.
(The measurements themselves run on the real engines in tests/engine/test_backend_vllm.py.)"""
from __future__ import annotations

from medclaw.bench.kv import TARGETS, judge

PASSING = {"repeat_question_cached_fraction": 0.93, "stage2_cached_fraction": 0.97,
           "turn_cached_fraction": 0.99, "concurrent_requests_ok": "16/16",
           "constrained_tool_calls_parsed": "100/100", "cached_equals_cold": True}


def test_every_target_is_judged():
    checks = judge(PASSING)
    assert set(checks) == set(TARGETS) and all(c["ok"] for c in checks.values())


def test_each_miss_is_caught():
    misses = {"repeat_question_cached_fraction": 0.89, "stage2_cached_fraction": 0.5,
              "turn_cached_fraction": 0.0, "concurrent_requests_ok": "15/16",
              "constrained_tool_calls_parsed": "99/100", "cached_equals_cold": False}
    for key, bad in misses.items():
        checks = judge({**PASSING, key: bad})
        assert [k for k, c in checks.items() if not c["ok"]] == [key], key
