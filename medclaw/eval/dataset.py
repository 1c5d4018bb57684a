"""Evaluation datasets: JSON Lines files of questions about videos, with gold answers.

    records, problems = read_dataset(path, format="auto", on_bad="stop")

One record per line. The native (`medclaw`) format is

    {"id": "q1", "video": "videos/v0.mp4", "question": "...", "gold": "grasper",
     "type": "VTR" | "VPR", "subtype": "before_after", "split": "test",
     "gold_window_s": [12.0, 18.5],      # optional: where the evidence is, video seconds
     "gold_value": "grasper",            # optional: exact gold for the exact scorers
     "choices": ["grasper", "hook"]}     # optional: the label vocabulary of the question

`type` is VTR (temporal reasoning: before/after, order, counting events over time) or VPR
(perception: what is visible, which phase, which instruments). `gold_value` picks the exact scorer
(`eval.scorers`): an integer is a count, a string a label, a list a set of labels. A relative
`video` path is relative to the dataset file's folder. Data stays where the user has it: nothing
is copied or downloaded.

Other formats are read through a field mapping (format only; which file you point at is yours):

- `medclawbench` (MedClawBench-style records): `qid`|`question_id` → id, `video_path`|`video` →
  video, `question`, `answer` → gold, `task` (VTR|VPR) → type, `category` → subtype, `split`,
  `time_window` [start, end] → gold_window_s.
- `svu31k` (SVU-31K-style LLaVA conversation records): `id`, `video`, `conversations` — the first
  `human` turn (its `<video>` placeholder removed) → question, the first `gpt` turn → gold;
  `timecodes` [start, end] (or [[start, end]]) → gold_window_s; `split` if present, else "train"
  (the release's files are training sets). SVU-31K carries no VTR/VPR label: a record with
  timecodes is VTR (its question is about a time window), one without is VPR; subtype "svu".

`format="auto"` picks by the first record's keys (`conversations` → svu31k; `qid`, `task` or
`video_path` → medclawbench; else medclaw). A JSON array file can be turned into JSON Lines with
`jq -c '.[]' file.json > file.jsonl`.

Bad records — a line that is not a JSON object, a missing or ill-typed field, a duplicate id — are
all collected with their line numbers. `on_bad="stop"` raises one `DatasetError` naming them
(the first few, and how many); `on_bad="skip"` returns the good records and the problems, so the
caller reports them (the first record of a duplicated id is kept).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medclaw.errors import MedClawError

TYPES = ("VTR", "VPR")
ON_BAD = ("stop", "skip")
MAX_PROBLEMS_SHOWN = 5


class DatasetError(MedClawError):
    """An evaluation dataset cannot be used as given. One line."""


@dataclass(slots=True)
class EvalRecord:
    id: str
    video: str                                  # absolute path (relative ones resolved on read)
    question: str
    gold: str
    type: str                                   # "VTR" | "VPR"
    subtype: str = ""
    split: str = "test"
    gold_window_s: tuple[float, float] | None = None
    gold_value: Any = None                      # int (count) | str (label) | list[str] (set)
    choices: list[str] = field(default_factory=list)
    line: int = 0                               # line in the dataset file

    def to_dict(self) -> dict:
        """The native record (what `medclaw eval make-synthetic` writes)."""
        row = {"id": self.id, "video": self.video, "question": self.question, "gold": self.gold,
               "type": self.type, "subtype": self.subtype, "split": self.split}
        if self.gold_window_s is not None:
            row["gold_window_s"] = list(self.gold_window_s)
        if self.gold_value is not None:
            row["gold_value"] = self.gold_value
        if self.choices:
            row["choices"] = list(self.choices)
        return row


@dataclass(slots=True)
class DatasetProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class _Bad(Exception):
    """A record's field problem (becomes a DatasetProblem with the line number)."""


# --- field mappings: format → row → native fields (a table, not a branch per format) ----------------

def _first(row: dict, *keys: str, default=None):
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    return default


def _native(row: dict) -> dict:
    return row


def _medclawbench(row: dict) -> dict:
    return {
        "id": _first(row, "qid", "question_id", "id"), "video": _first(row, "video_path", "video"),
        "question": row.get("question"), "gold": _first(row, "answer", "gold"),
        "type": _first(row, "task", "type"), "subtype": _first(row, "category", "subtype", default=""),
        "split": row.get("split", "test"),
        "gold_window_s": _first(row, "time_window", "gold_window_s"),
        "gold_value": row.get("gold_value"), "choices": row.get("choices") or [],
    }


def _svu31k(row: dict) -> dict:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise _Bad("conversations must be a list of {from, value} objects")
    human = next((t.get("value") for t in turns if t.get("from") == "human"), None)
    gpt = next((t.get("value") for t in turns if t.get("from") == "gpt"), None)
    if isinstance(human, str):
        human = human.replace("<video>", "").strip()
    window = row.get("timecodes")
    if isinstance(window, list) and len(window) == 1 and isinstance(window[0], list):
        window = window[0]
    return {"id": row.get("id"), "video": row.get("video"), "question": human, "gold": gpt,
            "type": "VTR" if window else "VPR", "subtype": "svu", "split": row.get("split", "train"),
            "gold_window_s": window or None}


FORMATS: dict[str, Callable[[dict], dict]] = {
    "medclaw": _native, "medclawbench": _medclawbench, "svu31k": _svu31k,
}


def detect_format(row: dict) -> str:
    if "conversations" in row:
        return "svu31k"
    if {"qid", "task", "video_path"} & set(row):
        return "medclawbench"
    return "medclaw"


# --- field checks ---------------------------------------------------------------------------------

def _text(fields: dict, key: str) -> str:
    value = fields.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "id":
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{key} must be a non-empty string")
    return value.strip()


def _window(value) -> tuple[float, float] | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise _Bad(f"gold_window_s must be [start, end] in seconds, got {value!r}")
    start, end = float(value[0]), float(value[1])
    if not 0 <= start <= end:
        raise _Bad(f"gold_window_s must have 0 <= start <= end, got {value!r}")
    return start, end


def _gold_value(value):
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise _Bad(f"gold_value must be an integer, a string or a list of strings, got {value!r}")


def make_record(fields: dict, base_dir: Path, line: int = 0) -> EvalRecord:
    """A checked EvalRecord from native fields; raises `_Bad` (via read_dataset: a problem)."""
    kind = fields.get("type")
    if kind not in TYPES:
        raise _Bad(f"type must be one of {', '.join(TYPES)}, got {kind!r}")
    video = Path(_text(fields, "video")).expanduser()
    if not video.is_absolute():
        video = base_dir / video
    subtype = fields.get("subtype") or ""
    split = fields.get("split") or "test"
    choices = fields.get("choices") or []
    if not isinstance(subtype, str) or not isinstance(split, str):
        raise _Bad("subtype and split must be strings")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise _Bad("choices must be a list of strings")
    return EvalRecord(id=_text(fields, "id"), video=str(video), question=_text(fields, "question"),
                      gold=_text(fields, "gold"), type=kind, subtype=subtype, split=split,
                      gold_window_s=_window(fields.get("gold_window_s")),
                      gold_value=_gold_value(fields.get("gold_value")), choices=list(choices),
                      line=line)


def read_dataset(path: str | Path, *, format: str = "auto",
                 on_bad: str = "stop") -> tuple[list[EvalRecord], list[DatasetProblem]]:
    """Read every record of `path` (see module docstring); problems per `on_bad`."""
    from medclaw.jsonl import iter_objects

    if format != "auto" and format not in FORMATS:
        raise DatasetError(f"unknown dataset format {format!r}; choose auto or one of {sorted(FORMATS)}")
    if on_bad not in ON_BAD:
        raise DatasetError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    base_dir = path.resolve().parent
    problems: list[DatasetProblem] = []
    records: list[EvalRecord] = []
    first_line_of: dict[str, int] = {}
    mapping = FORMATS.get(format)

    def bad(number: int, reason: str) -> None:
        problems.append(DatasetProblem(number, reason))

    for number, row in iter_objects(path, DatasetError, on_bad=bad):
        if mapping is None:
            mapping = FORMATS[detect_format(row)]
        try:
            record = make_record(mapping(row), base_dir, number)
        except _Bad as err:
            bad(number, str(err))
            continue
        if record.id in first_line_of:
            bad(number, f"duplicate id {record.id!r} (first on line {first_line_of[record.id]})")
            continue
        first_line_of[record.id] = number
        records.append(record)
    problems.sort(key=lambda p: p.line)
    if problems and on_bad == "stop":
        shown = "; ".join(str(p) for p in problems[:MAX_PROBLEMS_SHOWN])
        more = f"; and {len(problems) - MAX_PROBLEMS_SHOWN} more" if len(problems) > MAX_PROBLEMS_SHOWN else ""
        raise DatasetError(f"{path}: {len(problems)} bad record(s): {shown}{more} "
                           "(fix them, or pass --on-bad-record skip to leave them out)")
    if not records:
        raise DatasetError(f"{path}: no usable records")
    return records, problems


def write_dataset(path: str | Path, records: list[EvalRecord], *, relative_to: Path | None = None) -> Path:
    """Write native records as JSON Lines (videos relative to `relative_to` when inside it)."""
    import json

    path = Path(path)
    lines = []
    for record in records:
        row = record.to_dict()
        if relative_to is not None:
            try:
                row["video"] = str(Path(record.video).resolve().relative_to(relative_to.resolve()))
            except ValueError:
                pass
        lines.append(json.dumps(row, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_id(record_id: str) -> str:
    """An id usable in a file name (episode ids, trace names)."""
    return _SAFE.sub("_", record_id)[:80] or "item"
