"""The shared JSON Lines reader: objects with line numbers, one-line errors of the caller's type."""
from __future__ import annotations

import pytest

from medclaw.jsonl import iter_objects


class ReaderError(Exception):
    pass


def _read(path, **kwargs):
    return list(iter_objects(path, ReaderError, **kwargs))


def test_objects_with_line_numbers_blank_lines_skipped(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"b": "é"}\n', encoding="utf-8")
    assert _read(path) == [(1, {"a": 1}), (4, {"b": "é"})]


@pytest.mark.parametrize("text,message", [
    ('{"a": 1}\nnot json\n{"b": 2}\n', "bad.jsonl:2: not valid JSON (Expecting value)"),
    ('{"a": 1}\n[1, 2]\n', "bad.jsonl:2: not a JSON object"),
    ('"just a string"\n', "bad.jsonl:1: not a JSON object"),
])
def test_bad_lines_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ReaderError) as err:
        _read(path, hint="is this the right file?")
    assert str(err.value) == f"{path.parent}/{message}; is this the right file?"


def test_torn_last_line_dropped_only_when_allowed(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"type": "st')          # writer killed mid-line
    assert _read(path, torn_tail_ok=True) == [(1, {"a": 1}), (2, {"b": 2})]
    with pytest.raises(ReaderError, match=":3: not valid JSON"):
        _read(path)
    path.write_text('{"a": 1}\n{"type": "st\n{"b": 2}\n')      # torn, then more: corrupt
    with pytest.raises(ReaderError, match=":2: not valid JSON"):
        _read(path, torn_tail_ok=True)


def test_binary_and_missing_files(tmp_path):
    binary = tmp_path / "video.mp4"
    binary.write_bytes(bytes(range(128, 256)) * 8)
    with pytest.raises(ReaderError, match="video.mp4: not UTF-8 text$"):
        _read(binary)
    with pytest.raises(ReaderError, match="missing.jsonl: cannot read"):
        _read(tmp_path / "missing.jsonl")


def test_on_bad_reports_every_bad_line_and_goes_on(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1]\n{"b": 2}\n{"torn')
    bad = []
    rows = _read(path, on_bad=lambda number, reason: bad.append((number, reason)))
    assert rows == [(1, {"a": 1}), (4, {"b": 2})]
    assert [n for n, _ in bad] == [2, 3, 5]
    assert bad[1][1] == "not a JSON object" and bad[0][1].startswith("not valid JSON")
