"""Split a model's raw output into the answer and the reasoning, per `ModelSpec.output_format`.

- `plain`: the whole text is the answer; no reasoning.
- `think_answer` (Video-R1 style): `<think>…</think><answer>…</answer>`. The reasoning is kept for
  the trace (`GenResult.reasoning`); the answer is what callers read (`GenResult.text`).

Tolerant by contract — model output is never trusted to be well formed, and this never raises:
a missing `<think>` opener (templates that put it in the prompt) or closer, a missing `<answer>`
wrapper or an unclosed `<answer>` all still yield the best available split. A reply that opened
`<think>` and never closed it (ran out of tokens) has no answer: everything is reasoning.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


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
