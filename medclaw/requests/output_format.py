"""Split a model's raw output into the answer and the reasoning, per `ModelSpec.output_format`.

- `plain`: the whole text is the answer; no reasoning.
- `think_answer` (Video-R1 style): `<think>…</think><answer>…</answer>`. The reasoning is kept for
  the trace (`GenResult.reasoning`); the answer is what callers read (`GenResult.text`).

Tolerant by contract — model output is never trusted to be well formed, and this never raises:
a missing `<think>` opener (templates that put it in the prompt) or closer, a missing `<answer>`
wrapper or an unclosed `<answer>` all still yield the best available split. A reply that opened
`<think>` and never closed it (ran out of tokens) has no answer: everything is reasoning.

`first_json_object(text)` finds the first JSON object in free model text (tool calls, judge
scores, failure diagnoses all come back as one object, with whatever a model writes around it).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
MAX_OBJECT_STARTS = 64           # candidate `{` positions tried before giving up
# strict=False: raw control characters inside strings (which xgrammar's JSON grammar lets a model
# emit) are accepted rather than failing the whole object.
_DECODER = json.JSONDecoder(strict=False)


@dataclass(slots=True, frozen=True)
class SplitOutput:
    answer: str
    reasoning: str = ""


def split_plain(text: str) -> SplitOutput:
    return SplitOutput(answer=text.strip())


def split_think_answer(text: str) -> SplitOutput:
    """`<think>R</think><answer>A</answer>` → (A, R), tolerating missing or unclosed tags."""
    reasoning, rest = "", text
    close = text.find(_THINK_CLOSE)
    if close >= 0:
        head = text[:close]
        open_at = head.find(_THINK_OPEN)
        # No opener: the template put `<think>` into the prompt; everything before `</think>` is it.
        reasoning = head[open_at + len(_THINK_OPEN):] if open_at >= 0 else head
        rest = text[close + len(_THINK_CLOSE):]
    elif (open_at := text.find(_THINK_OPEN)) >= 0:
        # Opened and never closed: the model ran out of tokens while thinking, unless an answer
        # block follows anyway (some models forget the closer).
        after = text[open_at + len(_THINK_OPEN):]
        match = _ANSWER_RE.search(after)
        if match is None:
            return SplitOutput(answer="", reasoning=after.strip())
        return SplitOutput(answer=match.group(1).strip(), reasoning=after[:match.start()].strip())
    match = _ANSWER_RE.search(rest)
    answer = match.group(1) if match is not None else rest
    return SplitOutput(answer=answer.strip(), reasoning=reasoning.strip())


# output_format name (ModelSpec.OUTPUT_FORMATS) → splitter
SPLITTERS: dict[str, Callable[[str], SplitOutput]] = {
    "plain": split_plain,
    "think_answer": split_think_answer,
}


def split_output(text: str, output_format: str) -> SplitOutput:
    """Split `text` according to `output_format` (a key of `SPLITTERS`)."""
    try:
        splitter = SPLITTERS[output_format]
    except KeyError:
        raise ValueError(f"unknown output_format {output_format!r}; "
                         f"choose one of {sorted(SPLITTERS)}") from None
    return splitter(text)


# --- JSON objects in free model text (tool calls, judge scores, diagnoses) -------------------------

def json_object_at(text: str, start: int) -> dict | None:
    """The JSON object that starts at `text[start]`, or None."""
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):          # RecursionError: absurdly nested garbage
        return None
    return value if isinstance(value, dict) else None


def first_json_object(text: str) -> dict | None:
    """The first `{...}` in `text` that decodes to a JSON object, or None; never raises.

    At most `MAX_OBJECT_STARTS` candidate braces are tried, so pathological output (thousands of
    nested openers) costs bounded time.
    """
    start = (text or "").find("{")
    for _ in range(MAX_OBJECT_STARTS):
        if start < 0:
            break
        if (value := json_object_at(text, start)) is not None:
            return value
        start = text.find("{", start + 1)
    return None
