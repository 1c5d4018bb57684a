"""The results file of one evaluation run: one JSON line per question, crash-safe, resumable.

    log = ResultsLog.open(path, resume=True)    # repairs a torn tail, reads the ids already done
    log.done                                     # {id: row}
    log.append(row)                              # one write() of the whole line, then fsync

Guarantee: after `kill -9` at any moment, reopening with `resume=True` and answering the ids not
in `done` gives every id exactly once. A line is written only when its question is complete
(answered and judged), in a single `os.write` on an O_APPEND descriptor followed by `fsync`, so the
file holds whole lines plus at most one torn last line — which `open` truncates away (that
question is simply redone). An unparsable line *before* the last one is corruption, not a crash
artefact: `ResultsError`. Without `resume`, an existing non-empty file is refused (no silent mixing
of two runs).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from medclaw.errors import MedClawError


class ResultsError(MedClawError):
    """A results file cannot be used (exists without --resume, corrupt, duplicate ids)."""


def repair_torn_tail(path: Path) -> int:
    """Cut a partial last line (no trailing newline) off `path`; returns the bytes removed."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as file:
        # Scan back from the end for the last newline (blocks, so huge files stay cheap).
        end, block = size, 1 << 16
        while end > 0:
            start = max(0, end - block)
            file.seek(start)
            chunk = file.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        else:
            keep = 0
        if keep < size:
            file.truncate(keep)
            file.flush()
            os.fsync(file.fileno())
        return size - keep


def read_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ResultsError(f"{path}:{number}: not valid JSON ({err.msg}); the results file "
                                   "is corrupt (not a torn last line)") from None
            if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                raise ResultsError(f"{path}:{number}: not a result row (no string id)")
            rows.append(row)
    return rows


class ResultsLog:
    __slots__ = ("path", "done", "_fd", "repaired_bytes")

    def __init__(self, path: Path, done: dict[str, dict], repaired_bytes: int):
        self.path = path
        self.done = done
        self.repaired_bytes = repaired_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @classmethod
    def open(cls, path: str | Path, *, resume: bool) -> "ResultsLog":
        path = Path(path)
        done: dict[str, dict] = {}
        repaired = 0
        if path.exists() and path.stat().st_size > 0:
            if not resume:
                raise ResultsError(f"{path} already holds results; pass --resume to continue that "
                                   "run, or choose another --out")
            repaired = repair_torn_tail(path)
            for row in read_rows(path):
                if row["id"] in done:
                    raise ResultsError(f"{path}: id {row['id']!r} appears twice")
                done[row["id"]] = row
        return cls(path, done, repaired)

    def append(self, row: dict) -> None:
        if row["id"] in self.done:
            raise RuntimeError(f"result for {row['id']!r} written twice")
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        if written != len(data):            # a full disk: never leave half a line unreported
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        os.fsync(self._fd)
        self.done[row["id"]] = row

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ResultsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
