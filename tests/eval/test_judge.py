"""The judge: a bounded schema, a versioned prompt, every score carrying model, revision and prompt."""
from __future__ import annotations

import json

import jsonschema
import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.eval.dataset import EvalRecord
from medclaw.eval.judge import DIMENSIONS, Judge, JudgeConfig, judge_schema, load_prompt, parse_reply

RECORD = EvalRecord(id="q1", video="v.mp4", question="Which instrument came before the cut?",
                    gold="scissors", type="VTR", gold_window_s=(7.2, 7.7))


def test_schema_is_bounded_everywhere():
    schema = judge_schema(40)
    assert schema["additionalProperties"] is False and schema["required"] == ["rationale", *DIMENSIONS]
    for dim in DIMENSIONS:
        assert schema["properties"][dim] == {"type": "integer", "minimum": 1, "maximum": 5}
    assert schema["properties"]["rationale"]["maxLength"] == 40
    good = {"rationale": "ok", "CI": 5, "DO": 1, "CU": 3, "TU": 2}
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "CI": 6}, schema)
    # max_tokens covers the longest string the schema allows, even written as JSON escapes
    assert JudgeConfig(rationale_max_chars=40).max_tokens >= 6 * 40


@pytest.mark.parametrize("text, ok", [
    ('{"rationale": "r", "CI": 4, "DO": 3, "CU": 5, "TU": 1}', True),
    ('Sure! ```json\n{"rationale": "r", "CI": 4, "DO": 3, "CU": 5, "TU": 1}\n```', True),
    ('{"rationale": "r", "CI": 0, "DO": 3, "CU": 5, "TU": 1}', False),
    ('{"rationale": "r", "CI": true, "DO": 3, "CU": 5, "TU": 1}', False),
    ('{"rationale": "r", "CI": 4}', False),
    ("no json", False),
])
def test_parse_reply(text, ok):
    assert (parse_reply(text) is not None) == ok


async def test_score_records_model_revision_prompt_and_rationale():
    seen = []

    def reply(request):
        seen.append(request)
        return json.dumps({"rationale": "names the right instrument", "CI": 5, "DO": 4, "CU": 5, "TU": 2})

    judge = Judge(ScriptedBackend(reply, model_name="judge-llm", model_revision="abc123"))
    score = await judge.score(RECORD, "The scissors, at 7.5 s.", [7.5])
    assert (score.CI, score.DO, score.CU, score.TU, score.avg) == (5, 4, 5, 2, 4.0)
    assert (score.model, score.revision, score.prompt_version) == ("judge-llm", "abc123", "judge_v1")
    assert score.prompt_sha256 == load_prompt("judge_v1")[1] and score.rationale and score.parsed
    prompt = seen[0].messages[0]["content"][0]["text"]
    assert "Reference answer: scissors" in prompt and "7.2-7.7" in prompt and "Candidate evidence times (seconds): 7.5" in prompt
    assert seen[0].json_schema is None              # the scripted backend enforces no schema


async def test_unparsable_reply_and_missing_answer():
    judge = Judge(ScriptedBackend(["I think it is fine."]))
    bad = await judge.score(RECORD, "scissors")
    assert not bad.parsed and bad.avg == 1.0 and bad.raw == "I think it is fine."
    none = await judge.score(RECORD, None)
    assert not none.judged and none.avg == 1.0


def test_unknown_prompt_version_is_a_config_error():
    from medclaw.errors import ConfigError

    with pytest.raises(ConfigError, match="no judge prompt 'judge_v9'"):
        JudgeConfig(prompt_version="judge_v9")
