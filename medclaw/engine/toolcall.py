"""Orchestrator tool calls: the JSON schema one action must follow, and a tolerant parser.

One action is `{"thought": "<short>", "tool": "<name>", "args": {...}}`. `action_schema` builds it
as an `anyOf` with one branch per tool, so that constrained decoding (vLLM + xgrammar) can only
emit a known tool with arguments of that tool's shape. Fields are *bounded* (the thought and every
free string get a `maxLength`, arrays a `maxItems`, objects `additionalProperties: false`): with
weak or random weights an unbounded field is filled until `max_tokens` runs out and the JSON never
closes (STACK.md). The bounds only tighten the *generation* schema; arguments are validated
against the tool's own schema.

`parse_action` never raises on model output. It accepts what the model wrote (code fences,
`<think>` blocks, prose around the JSON, hermes-style `<tool_call>{"name", "arguments"}</tool_call>`,
`{"tool", "args"}`, OpenAI-style `{"function": {"name", "arguments": "<json string>"}}`) and returns
an `Action`, or an `ActionError` whose message the orchestrator reads on its next turn.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field

from medclaw.requests.output_format import first_json_object, json_object_at, split_think_answer
from medclaw.tools.schema import argument_problem

THOUGHT_MAX_CHARS = 400          # a short rationale; long reasoning belongs in <think> (not here)
STRING_MAX_CHARS = 256           # default cap for tool string arguments without maxLength
ARRAY_MAX_ITEMS = 16             # default cap for arrays without maxItems

_FENCE_RE = re.compile(r"```(?:json|JSON)?")
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(slots=True, frozen=True)
class Action:
    """A parsed, schema-valid tool call."""

    tool: str
    args: dict = field(default_factory=dict)
    thought: str = ""

    def to_dict(self) -> dict:
        return {"thought": self.thought, "tool": self.tool, "args": self.args}


@dataclass(slots=True, frozen=True)
class ActionError:
    """Why the model's output is not a valid action; `message` is written for the model to read."""

    message: str
    raw: str = ""

    def to_dict(self) -> dict:
        return {"error": self.message, "raw": self.raw}


# ---------------------------------------------------------------------------------------- schema

def schema_node_types(node: dict) -> set[str]:
    """The JSON types a schema node allows (`"type"` may be a string or a list)."""
    kinds = node.get("type")
    return set(kinds) if isinstance(kinds, list) else {kinds} if isinstance(kinds, str) else set()


def visit_schema(node, visit) -> None:
    """Call `visit(subschema)` on every schema node below `node`, parents first (in place)."""
    if isinstance(node, list):
        for item in node:
            visit_schema(item, visit)
        return
    if not isinstance(node, dict):
        return
    visit(node)
    for key in ("properties", "$defs", "definitions"):          # maps of name → schema
        for sub in (node.get(key) or {}).values():
            visit_schema(sub, visit)
    for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not"):
        if key in node:
            visit_schema(node[key], visit)


def _bounded(schema: dict) -> dict:
    """A copy of a JSON schema with free strings, arrays and objects given finite bounds."""
    out = copy.deepcopy(schema)

    def bound(node: dict) -> None:
        kinds = schema_node_types(node)
        if "string" in kinds and "enum" not in node and "const" not in node and "pattern" not in node:
            node.setdefault("maxLength", STRING_MAX_CHARS)
        if "array" in kinds:
            node.setdefault("maxItems", ARRAY_MAX_ITEMS)
        if "object" in kinds and "properties" in node:
            node.setdefault("additionalProperties", False)

    visit_schema(out, bound)
    return out


def action_schema(tool_specs: list[dict], thought_max_chars: int = THOUGHT_MAX_CHARS) -> dict:
    """JSON schema of one orchestrator action over `tool_specs` (each a `Tool.spec()` dict)."""
    if not tool_specs:
        raise ValueError("action_schema needs at least one tool spec")
    if thought_max_chars < 1:
        raise ValueError("thought_max_chars must be >= 1")
    branches = []
    for spec in tool_specs:
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        branches.append({
            "type": "object",
            # Property order is generation order: the thought comes before the choice it explains.
            "properties": {
                "thought": {"type": "string", "maxLength": thought_max_chars},
                "tool": {"type": "string", "enum": [spec["name"]]},
                "args": _bounded(params),
            },
            "required": ["thought", "tool", "args"],
            "additionalProperties": False,
        })
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def describe_tools(tool_specs: list[dict]) -> str:
    """The tool list for a system prompt: one stable block (same specs → same text → cache hit)."""
    lines = ['Reply with exactly one JSON object: {"thought": "<why, briefly>", "tool": "<name>", '
             '"args": {...}}. Tools:']
    for spec in tool_specs:
        params = json.dumps(spec.get("parameters") or {}, sort_keys=True, separators=(",", ":"))
        lines.append(f"- {spec['name']}: {spec.get('description', '').strip()} args schema: {params}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- parse

_DECODER = json.JSONDecoder(strict=False)   # see output_format.first_json_object


def _find_call(raw: str) -> dict | None:
    """The call object in `raw`, trying the strictest reading first.

    Order matters: a schema-constrained reply *is* one JSON object, and its free-text fields may
    contain `<think>`, `<tool_call>` or fences (random weights emit anything), so a reply that
    parses as a whole is never cut by tag handling. Only otherwise: a hermes `<tool_call>` block,
    then the first object in the answer part (outside `<think>`) and code fences, then any object at all.
    """
    stripped = raw.strip()
    if stripped.startswith("{") and (obj := json_object_at(stripped, 0)) is not None:
        return obj
    # The one <think>/<answer> parser: the answer part, or "" when a <think> never closed (then
    # the last resort below still searches the whole reply, which may hold the call).
    without_think = split_think_answer(raw).answer
    hermes = _TOOL_CALL_RE.search(without_think)
    if hermes is not None and (obj := first_json_object(_FENCE_RE.sub(" ", hermes.group(1)))):
        return obj
    return first_json_object(_FENCE_RE.sub(" ", without_think)) or first_json_object(raw)


def _normalise(obj: dict) -> tuple[str | None, object, str]:
    """(tool name, args, thought) from any of the accepted call shapes."""
    if isinstance(obj.get("function"), dict):               # OpenAI tool_calls entry
        inner = obj["function"]
        return inner.get("name"), inner.get("arguments", {}), str(obj.get("thought") or "")
    name = obj.get("tool", obj.get("name"))
    args = obj.get("args", obj.get("arguments", obj.get("parameters", {})))
    return name, args, str(obj.get("thought") or "")


def _without_replacement_chars(value):
    """Drop U+FFFD from every string in `value`.

    The grammar bounds strings in *characters*, but a byte-level tokenizer can emit a token whose
    bytes are half of a multi-byte character; the detokenizer then writes one or more U+FFFD for
    it, and a string the grammar kept within maxLength comes back longer. U+FFFD never carries
    meaning in a tool argument, so it is removed before validation.
    """
    if isinstance(value, str):
        return value.replace("\ufffd", "")
    if isinstance(value, list):
        return [_without_replacement_chars(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_replacement_chars(item) for key, item in value.items()}
    return value


def parse_action(text: str, tool_specs: list[dict]) -> Action | ActionError:
    """Parse one tool call from model output; never raises on what the model wrote."""
    raw = text if isinstance(text, str) else str(text)
    specs = {spec["name"]: spec for spec in tool_specs}
    names = ", ".join(specs)
    obj = _find_call(raw)
    if obj is None:
        return ActionError('no JSON object found; reply with one JSON object like '
                           '{"thought": "...", "tool": "<name>", "args": {...}}', raw)
    name, args, thought = _normalise(obj)
    if not isinstance(name, str) or not name:
        return ActionError(f'the JSON object has no "tool" name; available tools: {names}', raw)
    if name not in specs:
        return ActionError(f"unknown tool {name!r}; available tools: {names}", raw)
    if isinstance(args, str):                                # arguments sent as a JSON string
        try:
            args = _DECODER.decode(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ActionError(f'"args" for {name} is not valid JSON: {args[:200]!r}', raw)
    if args is None:
        args = {}

    args = _without_replacement_chars(args)
    problem = argument_problem(name, specs[name].get("parameters") or {"type": "object"}, args)
    if problem is not None:
        return ActionError(problem, raw)
    return Action(tool=name, args=args, thought=thought.strip())
