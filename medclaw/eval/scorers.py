"""Exact scorers, for gold that is exact (synthetic sets, labelled benchmarks).

    exact_scores(record, answer, evidence_times) -> {"match": float | None, "match_kind": str | None,
                                                     "tiou": float | None}

- `match` by the type of `record.gold_value` (a table, `SCORERS`):
    int        count   the first number in the answer (digits or a number word) equals it: 1 / 0
    str        label   the gold label is named and no other label of `record.choices` is: 1 / 0
    list[str]  set     F1 between the labels of `record.choices` named and the gold set (an empty
                       gold set: 1 when the answer names none of them, else 0)
  None when the record has no `gold_value`.
- `tiou`: temporal IoU between the answer's evidence window — [min, max] of its evidence times; a
  single time counts as `POINT_WIDTH_S` centred on it — and `record.gold_window_s`. No evidence:
  0.0. None when the record has no gold window.

Labels are compared normalised: lower case, `_`/`-` as spaces, whole words only ("hook" is not
found in "hooked"). Scores are in [0, 1].
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

POINT_WIDTH_S = 1.0
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_RE = re.compile(r"\b(\d+|" + "|".join(_NUMBER_WORDS) + r")\b")


def normalise(text: str) -> str:
    text = re.sub(r"[_\-]+", " ", str(text).lower())
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def names(answer: str, label: str) -> bool:
    """True when `label` occurs in `answer` as whole words (both normalised)."""
    label = normalise(label)
    return bool(label) and re.search(rf"\b{re.escape(label)}\b", normalise(answer)) is not None


def first_number(answer: str) -> int | None:
    match = _NUMBER_RE.search(normalise(answer))
    if match is None:
        return None
    token = match.group(1)
    return int(token) if token.isdigit() else _NUMBER_WORDS[token]


def score_count(answer: str, gold: int, choices: Sequence[str]) -> float:
    return float(first_number(answer) == gold)


def score_label(answer: str, gold: str, choices: Sequence[str]) -> float:
    if not names(answer, gold):
        return 0.0
    others = [c for c in choices if normalise(c) != normalise(gold) and not names(gold, c)]
    return 0.0 if any(names(answer, c) for c in others) else 1.0


def score_set(answer: str, gold: Sequence[str], choices: Sequence[str]) -> float:
    vocabulary = list(dict.fromkeys([*choices, *gold]))
    said = {normalise(c) for c in vocabulary if names(answer, c)}
    truth = {normalise(g) for g in gold}
    if not truth:
        return float(not said)
    hits = len(said & truth)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(said), hits / len(truth)
    return round(2 * precision * recall / (precision + recall), 4)


# gold_value type → (match kind, scorer)
SCORERS: dict[type, tuple[str, Callable]] = {
    int: ("count", score_count),
    str: ("label", score_label),
    list: ("set", score_set),
}


def evidence_window(times: Sequence[float]) -> tuple[float, float] | None:
    values = [float(t) for t in times if t is not None]
    if not values:
        return None
    start, end = min(values), max(values)
    if end - start < POINT_WIDTH_S:
        middle = (start + end) / 2
        start, end = middle - POINT_WIDTH_S / 2, middle + POINT_WIDTH_S / 2
    return max(0.0, start), end


def temporal_iou(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    if a is None or b is None:
        return 0.0
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return round(inter / union, 4) if union > 0 else 0.0


def exact_scores(record, answer: str | None, evidence_times: Sequence[float]) -> dict:
    """See the module docstring. A missing answer scores 0 where gold exists."""
    answer = answer or ""
    out: dict = {"match": None, "match_kind": None, "tiou": None}
    if record.gold_value is not None:
        kind, scorer = SCORERS[type(record.gold_value)]
        out["match_kind"] = kind
        out["match"] = scorer(answer, record.gold_value, record.choices) if answer else 0.0
    if record.gold_window_s is not None:
        out["tiou"] = temporal_iou(evidence_window(evidence_times), tuple(record.gold_window_s))
    return out
