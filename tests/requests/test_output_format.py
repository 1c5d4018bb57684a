"""Answer / reasoning split of model output (no engine)."""
from __future__ import annotations

import pytest

from medclaw.requests.output_format import split_output, split_think_answer


@pytest.mark.parametrize("text, answer, reasoning", [
    ("<think>look at 10 s</think><answer>B</answer>", "B", "look at 10 s"),
    ("<think>\nmulti\nline\n</think>\n<answer>\nThe clip.\n</answer>\n", "The clip.", "multi\nline"),
    ("look first</think><answer>B</answer>", "B", "look first"),           # opener in the prompt
    ("<think>r</think> plain answer", "plain answer", "r"),                  # no answer tags
    ("<answer>B</answer>", "B", ""),                                         # no reasoning
    ("<think>r</think><answer>unclosed", "unclosed", "r"),
    ("<think>ran out of tok", "", "ran out of tok"),                         # never closed
    ("<think>forgot the closer <answer>C</answer>", "C", "forgot the closer"),
    ("just text", "just text", ""),
    ("", "", ""),
])
def test_think_answer(text, answer, reasoning):
    out = split_think_answer(text)
    assert (out.answer, out.reasoning) == (answer, reasoning)


def test_plain_keeps_everything_as_answer():
    out = split_output(" <think>x</think> y ", "plain")
    assert out.answer == "<think>x</think> y" and out.reasoning == ""


def test_dispatch_and_unknown_format():
    assert split_output("<think>a</think><answer>b</answer>", "think_answer").answer == "b"
    with pytest.raises(ValueError):
        split_output("x", "xml")
