"""ToolRegistry: schema checks at registration, argument validation and error observations."""
import asyncio
import json

import pytest

from medclaw.engine.backends.base import RequestRejectedError
from medclaw.errors import EngineLostError
from medclaw.kernels.errors import (
    CorruptVideoError, DecodeTimeoutError, FrameTooLargeError, TimeRangeError,
)
from medclaw.tools.base import Tool, ToolError
from medclaw.tools.registry import ToolRegistry, check_bounded, default_registry
from medclaw.types import Observation

EXPECTED_ORDER = ["view_full_video", "crop_video", "select_video_frame", "crop_video_frame",
                  "search_surgical_kb", "load_skill", "final_answer"]


class Echo(Tool):
    name = "echo"
    description = "echo the number"
    parameters = {"type": "object", "additionalProperties": False, "required": ["n"],
                  "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}

    def __init__(self, raise_exc=None):
        self.raise_exc = raise_exc
        self.calls = []

    async def run(self, ctx, args):
        self.calls.append(args)
        if self.raise_exc is not None:
            raise self.raise_exc
        return Observation(text=f"n={args['n']}")


def test_default_registry_order_and_schemas_are_stable():
    first, second = default_registry(), default_registry()
    assert first.names() == EXPECTED_ORDER
    # byte-identical specs → byte-identical orchestrator system prompt → prefix-cache hits
    assert json.dumps(first.specs(), sort_keys=False) == json.dumps(second.specs(), sort_keys=False)
    for spec in first.specs():
        check_bounded(spec["parameters"], where=spec["name"])
        assert set(spec["parameters"]["required"]) <= set(spec["parameters"]["properties"])


def test_default_registry_enums_from_kb_and_skills():
    registry = default_registry(kb_types=["anatomy", "instrument"], skill_names=["directed-relook"])
    kb = registry.get("search_surgical_kb").parameters["properties"]["type"]
    assert kb["enum"] == ["any", "anatomy", "instrument"]
    skill = registry.get("load_skill").parameters["properties"]["name"]
    assert skill["enum"] == ["directed-relook"]


@pytest.mark.parametrize("parameters, message", [
    ({"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False},
     "minimum and maximum"),
    ({"type": "object", "properties": {"s": {"type": "string"}}, "additionalProperties": False},
     "maxLength"),
    ({"type": "object", "properties": {}}, "additionalProperties"),
    ({"type": "object", "additionalProperties": False,
      "properties": {"a": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}}}},
     "maxItems"),
    ({"type": "objekt"}, "invalid JSON schema"),
])
def test_register_rejects_bad_schemas(parameters, message):
    tool = Echo()
    tool.parameters = parameters
    with pytest.raises(ValueError, match=message):
        ToolRegistry([tool])


def test_register_rejects_duplicates_and_bad_names():
    registry = ToolRegistry([Echo()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Echo())
    nameless = Echo()
    nameless.name = "not a name"
    with pytest.raises(ValueError, match="identifier"):
        registry.register(nameless)


async def test_run_valid_args(bare_ctx):
    tool = Echo()
    registry = ToolRegistry([tool])
    obs = await registry.run(bare_ctx, "echo", {"n": 3})
    assert obs.error is None and obs.text == "n=3" and tool.calls == [{"n": 3}]


@pytest.mark.parametrize("args, fragment", [
    ({"n": 10}, "maximum"),
    ({"n": "3"}, "is not of type 'integer'"),
    ({}, "'n' is a required property"),
    ({"n": 1, "extra": 2}, "Additional properties"),
    ([1], "must be a JSON object"),
])
async def test_run_invalid_args_become_error_observations(bare_ctx, args, fragment):
    tool = Echo()
    obs = await ToolRegistry([tool]).run(bare_ctx, "echo", args)
    assert obs.error is not None and fragment in obs.error
    assert obs.text == obs.error
    assert tool.calls == []          # the tool never ran


async def test_run_unknown_tool_lists_available(bare_ctx):
    obs = await ToolRegistry([Echo()]).run(bare_ctx, "ech0", {"n": 1})
    assert "unknown tool 'ech0'" in obs.error and "echo" in obs.error


@pytest.mark.parametrize("exc, shown", [
    (ToolError("bad region"), "bad region"),
    (TimeRangeError("t=99s past 60s"), "t=99s past 60s"),
    # what decoding a model-chosen region or window can raise: before, these left the episode
    (FrameTooLargeError("frame aspect ratio 240 exceeds 200"), "frame aspect ratio 240 exceeds 200"),
    (CorruptVideoError("v.mp4: corrupt data at frame 700 (28.00 s)"), "corrupt data at frame 700"),
    (DecodeTimeoutError("v.mp4: decoding 64 frames took longer than 1 s"), "took longer"),
    (RequestRejectedError("model 'vx' rejected the request: too long"), "rejected the request"),
    (ValueError("max_pixels must be >= min_pixels"), "ValueError: max_pixels"),
    (ZeroDivisionError("float division by zero"), "ZeroDivisionError: float division"),
    (OSError("No such file or directory"), "OSError: No such file"),
])
async def test_model_caused_errors_become_observations(bare_ctx, exc, shown):
    obs = await ToolRegistry([Echo(raise_exc=exc)]).run(bare_ctx, "echo", {"n": 1})
    assert obs.error.startswith("echo: ") and shown in obs.error and "\n" not in obs.error


@pytest.mark.parametrize("exc", [
    TypeError("bad operand"), AttributeError("no attribute"), NameError("x"), AssertionError(),
    ImportError("no module"), NotImplementedError(), KeyError("k"),        # our bugs
    EngineLostError("server gone"), MemoryError(),                            # lost engines/resources
    asyncio.CancelledError(),                                                 # cancellation
])
async def test_bugs_lost_engines_and_cancellation_propagate(bare_ctx, exc):
    with pytest.raises(type(exc)):
        await ToolRegistry([Echo(raise_exc=exc)]).run(bare_ctx, "echo", {"n": 1})
