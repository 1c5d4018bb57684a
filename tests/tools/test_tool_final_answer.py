"""final_answer: marks the episode final, checks evidence times against the real duration."""
from medclaw.tools.registry import default_registry


async def test_final_answer_marks_final(bare_ctx):
    obs = await default_registry().run(bare_ctx, "final_answer",
                                       {"text": "  The clip applier. ", "evidence_times": [12.5, 30]})
    assert obs.error is None
    assert obs.data == {"is_final": True, "answer": "The clip applier.", "evidence_times": [12.5, 30.0]}
    assert "12.50 s" in obs.text and "30.00 s" in obs.text
    assert obs.frames == [] and obs.model_calls == []


async def test_final_answer_without_evidence(bare_ctx):
    obs = await default_registry().run(bare_ctx, "final_answer", {"text": "No.", "evidence_times": []})
    assert obs.data["is_final"] is True and obs.data["evidence_times"] == []


async def test_final_answer_rejects_evidence_past_the_end(bare_ctx):
    obs = await default_registry().run(bare_ctx, "final_answer",
                                       {"text": "x", "evidence_times": [10, 61]})
    assert obs.error is not None and "61 s" in obs.error and "60.0 s" in obs.error
    assert not obs.data.get("is_final")


async def test_final_answer_rejects_nan_evidence(bare_ctx):
    # JSON `NaN` parses and slips through minimum/maximum; it must not reach the trace as a time
    obs = await default_registry().run(bare_ctx, "final_answer",
                                       {"text": "x", "evidence_times": [float("nan")]})
    assert obs.error is not None and "nan" in obs.error
    assert not obs.data.get("is_final")


async def test_final_answer_schema_errors(bare_ctx):
    registry = default_registry()
    missing = await registry.run(bare_ctx, "final_answer", {"text": "x"})
    assert "evidence_times" in missing.error
    blank = await registry.run(bare_ctx, "final_answer", {"text": "   ", "evidence_times": []})
    assert blank.error is not None and "empty" in blank.error
    too_many = await registry.run(bare_ctx, "final_answer",
                                  {"text": "x", "evidence_times": [1.0] * 17})
    assert too_many.error is not None and "too long" in too_many.error
