"""The error table: what each kind of exception means for an episode and for the exit status."""
from __future__ import annotations

import asyncio

import pytest

from medclaw.errors import (
    ABORT, BUG, LOST, MODEL, ConfigError, EngineLostError, MedClawError, RunFailedError,
    as_run_failure, describe, error_kind,
)
from medclaw.kernels.errors import CorruptVideoError, DecodeTimeoutError, FrameTooLargeError


@pytest.mark.parametrize("err, kind", [
    (FrameTooLargeError("frame aspect ratio 240 exceeds 200"), MODEL),
    (CorruptVideoError("decoding failed at frame 700"), MODEL),
    (DecodeTimeoutError("took longer than 1 s"), MODEL),
    (ConfigError("x"), MODEL),
    (ValueError("bad value"), MODEL),
    (ZeroDivisionError("division by zero"), MODEL),
    (OSError("gone"), MODEL),
    (RuntimeError("sub-agent said no"), MODEL),
    (TypeError("x"), BUG), (AttributeError("x"), BUG), (NameError("x"), BUG),
    (UnboundLocalError("x"), BUG), (AssertionError(), BUG), (ImportError("x"), BUG),
    (ModuleNotFoundError("x"), BUG), (NotImplementedError(), BUG), (KeyError("k"), BUG),
    (IndexError("i"), BUG), (RecursionError(), BUG),
    (EngineLostError("server gone"), LOST), (RunFailedError("x"), LOST), (MemoryError(), LOST),
    (asyncio.CancelledError(), ABORT), (KeyboardInterrupt(), ABORT), (SystemExit(1), ABORT),
])
def test_error_kinds(err, kind):
    assert error_kind(err) == kind


def test_third_party_classes_by_name_without_importing_them():
    import torch
    from vllm.v1.engine.exceptions import EngineDeadError

    assert error_kind(torch.OutOfMemoryError("CUDA out of memory")) == LOST
    assert error_kind(EngineDeadError()) == LOST


def test_exit_codes_and_run_failures():
    assert MedClawError.exit_code == ConfigError.exit_code == 2
    assert RunFailedError.exit_code == EngineLostError.exit_code == 3
    source = RequestLike("model 'x' rejected the request: too long")
    source.medclaw_trace = ("/t/trace.jsonl", 3)
    failure = as_run_failure(source)
    assert isinstance(failure, RunFailedError) and failure.exit_code == 3
    assert str(failure) == "model 'x' rejected the request: too long"
    assert failure.medclaw_trace == ("/t/trace.jsonl", 3) and failure.__cause__ is source
    assert str(as_run_failure(RuntimeError("engine core died\nmore"))) == "RuntimeError: engine core died"
    bug = TypeError("oops")
    assert as_run_failure(bug) is bug                      # bugs keep their traceback
    lost = EngineLostError("gone")
    assert as_run_failure(lost) is lost
    assert describe(ValueError("a\nb")) == "ValueError: a" and describe(ConfigError("c")) == "c"


class RequestLike(MedClawError):
    """An input-type error (exit 2) raised after the engines started."""
