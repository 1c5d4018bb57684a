"""Bounded JSON-schema building blocks shared by the tools' `parameters`.

Every field is bounded (numbers with minimum/maximum, strings with maxLength, arrays with maxItems)
so that xgrammar-constrained decoding of even a random-weight model always yields parseable
arguments. Bounds here are *syntactic*: the tools check times against the real video duration
and answer with an error observation when they fall outside it.
"""
from __future__ import annotations

MAX_TIME_S = 86_400.0          # 24 h: longer than any procedure; the real check is the duration
MAX_QUERY_CHARS = 500
MAX_ANSWER_CHARS = 4000
MAX_EVIDENCE_TIMES = 16


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
