"""User-facing errors.

A `MedClawError` means the *input* was wrong (bad video, bad time range, missing model folder, …),
not our code. The CLI prints its message as one line and exits with status 2; no traceback.
Errors in our own code are ordinary exceptions and keep their tracebacks.
"""
from __future__ import annotations


class MedClawError(Exception):
    """Base class for errors caused by user input or configuration. str(err) is one line."""

    exit_code = 2


class ConfigError(MedClawError):
    """A configuration file or CLI flag is invalid."""


class ModelNotFoundError(MedClawError):
    """A model reference does not point at a usable local folder."""


def first_line(err: object, default: str | None = None) -> str:
    """The first line of an exception's message (or of any text), for a one-line error built on
    top of it; when it is empty, `default` or else the type name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else (default or type(err).__name__)
