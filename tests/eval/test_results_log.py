"""The results log: whole lines only, a torn tail repaired on resume, no silent mixing of runs."""
from __future__ import annotations

import json

import pytest

from medclaw.eval.results import ResultsError, ResultsLog


def test_append_resume_and_torn_tail(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultsLog.open(path, resume=False) as log:
        log.append({"id": "a", "x": 1})
        log.append({"id": "b", "x": 2})
    with open(path, "ab") as file:                  # a writer killed mid-line
        file.write(b'{"id": "c", "x"')
    with pytest.raises(ResultsError, match="pass --resume"):
        ResultsLog.open(path, resume=False)
    with ResultsLog.open(path, resume=True) as log:
        assert sorted(log.done) == ["a", "b"] and log.repaired_bytes == len(b'{"id": "c", "x"')
        log.append({"id": "c", "x": 3})
        with pytest.raises(RuntimeError, match="written twice"):
            log.append({"id": "a"})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"]


def test_corruption_before_the_last_line_is_an_error(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a"}\n{"id": \n{"id": "b"}\n')
    with pytest.raises(ResultsError, match=":2: not valid JSON"):
        ResultsLog.open(path, resume=True)
    path.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(ResultsError, match="appears twice"):
        ResultsLog.open(path, resume=True)
