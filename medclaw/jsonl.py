"""Reading JSON Lines files: one reader for traces, KB corpora, KB passage stores and ask batches.

    iter_objects(path, error, *, hint="", torn_tail_ok=False) -> yields (line_number, dict)

Blank lines are skipped; every other line must be one JSON object. Anything else raises `error`
(the caller's exception class, so each command keeps its own error type) with one line naming the
file and line: "PATH:LINE: not valid JSON (reason)", "PATH:LINE: not a JSON object",
"PATH: not UTF-8 text", each followed by "; HINT" when a hint is given. What the fields of each
object mean is the caller's business.

`torn_tail_ok`: a writer killed mid-line (a trace is flushed after every step) leaves an
unparsable last line; with this flag that line is dropped instead of raising. An unparsable line
with more lines after it is still an error.

`on_bad(line_number, reason)`: given, a line that is not one JSON object is handed to it and
skipped instead of raising (readers that report every bad line and let the user choose to skip
them or stop, e.g. evaluation datasets). Unreadable files still raise.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator


def iter_objects(path: str | Path, error: type[Exception], *, hint: str = "",
                 torn_tail_ok: bool = False,
                 on_bad: Callable[[int, str], None] | None = None) -> Iterator[tuple[int, dict]]:
    suffix = f"; {hint}" if hint else ""
    bad: tuple[int, str] | None = None          # the first unparsable line: (number, reason)
    bad_is_last = True
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                if bad is not None:
                    bad_is_last = False
                    break
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    if on_bad is not None:
                        on_bad(number, f"not valid JSON ({err.msg})")
                        continue
                    bad = (number, err.msg)
                    continue
                if not isinstance(row, dict):
                    if on_bad is not None:
                        on_bad(number, "not a JSON object")
                        continue
                    raise error(f"{path}:{number}: not a JSON object{suffix}")
                yield number, row
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text{suffix}") from None
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror or err}){suffix}") from None
    if bad is not None and not (torn_tail_ok and bad_is_last):
        raise error(f"{path}:{bad[0]}: not valid JSON ({bad[1]}){suffix}")
