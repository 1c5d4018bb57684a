"""Action schema and the tolerant tool-call parser (no engine)."""
from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from medclaw.engine.toolcall import (
    Action, ActionError, action_schema, describe_tools, parse_action,
)

SPECS = [
    {"name": "crop_video", "description": "Watch a window.",
     "parameters": {"type": "object", "properties": {
         "start_s": {"type": "number", "minimum": 0, "maximum": 3600},
         "end_s": {"type": "number", "minimum": 0, "maximum": 3600},
         "query": {"type": "string"},
         "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}},
         "required": ["start_s", "end_s", "query"]}},
    {"name": "final_answer", "description": "Answer.",
     "parameters": {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 50}},
                    "required": ["answer"], "additionalProperties": False}},
]
GOOD = {"thought": "look at the cut", "tool": "crop_video",
        "args": {"start_s": 10, "end_s": 20, "query": "clip?"}}


def test_schema_is_valid_and_accepts_each_tool():
    schema = action_schema(SPECS)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    assert validator.is_valid(GOOD)
    assert validator.is_valid({"thought": "", "tool": "final_answer", "args": {"answer": "x"}})


def test_schema_rejects_mismatched_tool_and_args():
    validator = Draft202012Validator(action_schema(SPECS))
    assert not validator.is_valid({"thought": "", "tool": "final_answer", "args": GOOD["args"]})
    assert not validator.is_valid({"thought": "", "tool": "nope", "args": {}})
    assert not validator.is_valid({**GOOD, "extra": 1})
    assert not validator.is_valid({**GOOD, "thought": "x" * 401})


def test_schema_bounds_free_fields_without_touching_the_tool_specs():
    before = json.dumps(SPECS, sort_keys=True)
    schema = action_schema(SPECS, thought_max_chars=50)
    branch = schema["anyOf"][0]["properties"]
    assert branch["thought"]["maxLength"] == 50
    args = branch["args"]
    assert args["properties"]["query"]["maxLength"] > 0
    assert args["properties"]["tags"]["maxItems"] > 0
    assert "maxLength" not in args["properties"]["tags"]["items"]        # enum strings stay as is
    assert args["additionalProperties"] is False
    assert json.dumps(SPECS, sort_keys=True) == before                  # specs not mutated


def test_single_tool_schema_has_no_anyof():
    assert "anyOf" not in action_schema(SPECS[1:])
    with pytest.raises(ValueError):
        action_schema([])


@pytest.mark.parametrize("text", [
    json.dumps(GOOD),
    "```json\n" + json.dumps(GOOD) + "\n```",
    "<think>I should look at 10-20 s {not json}</think>\n" + json.dumps(GOOD),
    "Sure! Here is my call: " + json.dumps(GOOD) + " Hope it helps.",
    '<tool_call>{"name": "crop_video", "arguments": {"start_s": 10, "end_s": 20, "query": "clip?"}}'
    '</tool_call>',
    '{"function": {"name": "crop_video", "arguments": "{\\"start_s\\": 10, \\"end_s\\": 20, '
    '\\"query\\": \\"clip?\\"}"}}',
])
def test_parse_accepts_common_shapes(text):
    action = parse_action(text, SPECS)
    assert isinstance(action, Action), action
    assert action.tool == "crop_video"
    assert action.args == {"start_s": 10, "end_s": 20, "query": "clip?"}


def test_parse_keeps_tags_inside_a_constrained_reply():
    # a constrained reply whose thought contains tags and control characters is still one object
    text = json.dumps({**GOOD, "thought": "a <tool_call> b </think> c"}).replace("a <", "a\x02<")
    action = parse_action(text, SPECS)
    assert isinstance(action, Action) and action.thought.startswith("a\x02<tool_call>")


@pytest.mark.parametrize("text, fragment", [
    ("I think the answer is 3.", "no JSON object"),
    ('{"thought": "x", "tool": "zoom", "args": {}}', "unknown tool 'zoom'"),
    ('{"thought": "x", "args": {}}', 'no "tool"'),
    ('{"tool": "crop_video", "args": {"start_s": 10}}', "end_s"),
    ('{"tool": "crop_video", "args": {"start_s": -5, "end_s": 1, "query": "q"}}', "start_s"),
    ('{"tool": "crop_video", "args": "{broken"}', "not valid JSON"),
    ('{"tool": "final_answer", "args": ["x"]}', "must be a JSON object"),
    ('{"tool": "final_answer", "args": {"answer": "x", "more": 1}}', "more"),
])
def test_parse_errors_are_readable(text, fragment):
    result = parse_action(text, SPECS)
    assert isinstance(result, ActionError)
    assert fragment in result.message
    assert result.raw == text


@pytest.mark.parametrize("junk", ["", "{", "}{", "{{{{", "\x00\x01", '{"tool": null}', "[1, 2]",
                                  '{"tool": ["crop_video"]}', "<tool_call>", "<think>",
                                  "{" * 100_000, '{"a":' * 50_000])
def test_parse_never_raises(junk):
    assert isinstance(parse_action(junk, SPECS), ActionError)


def test_missing_args_means_empty_object():
    result = parse_action('{"tool": "final_answer"}', SPECS)
    assert isinstance(result, ActionError) and "answer" in result.message


def test_describe_tools_is_stable_and_complete():
    text = describe_tools(SPECS)
    assert text == describe_tools(json.loads(json.dumps(SPECS)))
    assert "crop_video" in text and "final_answer" in text and '"maximum":3600' in text


def test_replacement_chars_from_split_bytes_do_not_break_length_bounds():
    # A byte-level tokenizer can split a multi-byte character across tokens; the detokenizer then
    # writes U+FFFD, so a string the grammar kept within maxLength comes back longer.
    specs = [{"name": "look", "description": "", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 4}},
        "required": ["q"], "additionalProperties": False}}]
    action = parse_action('{"thought": "", "tool": "look", "args": {"q": "ab\ufffd\ufffd\ufffdcd"}}', specs)
    assert isinstance(action, Action) and action.args == {"q": "abcd"}
    too_long = parse_action('{"thought": "", "tool": "look", "args": {"q": "abcde"}}', specs)
    assert isinstance(too_long, ActionError) and "too long" in too_long.message
