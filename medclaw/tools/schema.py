"""Bounded JSON-schema building blocks shared by the tools' `parameters`.

Every field is bounded (numbers with minimum/maximum, strings with maxLength, arrays with maxItems)
so that xgrammar-constrained decoding of even a random-weight model always yields parseable
arguments. Bounds here are *syntactic*: the tools check times against the real video duration
and answer with an error observation when they fall outside it.
"""
from __future__ import annotations

from functools import lru_cache
import json

MAX_TIME_S = 86_400.0          # 24 h: longer than any procedure; the real check is the duration
MAX_QUERY_CHARS = 500
MAX_ANSWER_CHARS = 4000
MAX_EVIDENCE_TIMES = 16
MAX_PROBLEMS_SHOWN = 3         # schema errors named in one message to the model


def time_field(description: str) -> dict:
    return {"type": "number", "minimum": 0, "maximum": MAX_TIME_S, "description": description}


def unit_field(description: str) -> dict:
    return {"type": "number", "minimum": 0, "maximum": 1, "description": description}


def text_field(description: str, max_length: int = MAX_QUERY_CHARS) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_length, "description": description}


def object_schema(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


# --- the one tool-argument validator (the orchestrator's parser and the registry both call it) ---

@lru_cache(maxsize=256)
def _validator(schema_json: str):
    from jsonschema import Draft202012Validator   # light, but only the tools need it

    return Draft202012Validator(json.loads(schema_json))


def argument_problem(tool_name: str, schema: dict, args: object) -> str | None:
    """One line, written for the model, saying why `args` do not fit `schema`; None when they do.

    Validators are cached by the schema's canonical JSON, so the per-turn cost is the check alone.
    """
    if not isinstance(args, dict):
        return f"arguments of {tool_name} must be a JSON object, got {type(args).__name__}"
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
    if not errors:
        return None
    shown = "; ".join(f"{'/'.join(str(p) for p in err.path) or '(arguments)'}: {err.message}"
                      for err in errors[:MAX_PROBLEMS_SHOWN])
    more = f" (+{len(errors) - MAX_PROBLEMS_SHOWN} more)" if len(errors) > MAX_PROBLEMS_SHOWN else ""
    return f"invalid arguments for {tool_name}: {shown}{more}"
