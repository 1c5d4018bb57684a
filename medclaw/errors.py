"""User-facing errors, and the one table that says what any exception means for an episode.

A `MedClawError` is a failure explained in one line (str(err)); the `medclaw` command prints that
line and exits with the error's `exit_code` — no traceback:

- 2  the input was refused (bad video, time range, config, model folder, …) before any engine ran;
- 3  a failure at run time (`RunFailedError`: an engine or server lost, no usable answer, …).

Errors in our own code are ordinary exceptions and keep their tracebacks (exit status 1).

`error_kind(err)` looks an exception up in `ERROR_KINDS` (the most specific class of its MRO that
the table names wins) and says how an episode treats it when it is raised while a tool runs on the
arguments the model chose:

- MODEL  anything the model's choice can cause (a region too thin to resize, a corrupt stretch of
         the video, a decode timeout, a sub-agent request the engine rejects, …): an error
         observation the orchestrator reads and reacts to;
- BUG    a programming error (TypeError, AttributeError, …): whatever the model asked, the fault
         is ours — it propagates, the trace is saved as failed, the traceback is kept;
- LOST   an engine, server or resource is gone (engine process dead, server unreachable, out of
         memory): it propagates and the run fails with exit status 3;
- ABORT  cancellation, interrupts, exits: never caught.

The table names classes as "module:QualName" strings, so third-party exceptions (vLLM, torch)
are recognised without importing their packages.
"""
from __future__ import annotations

MODEL, BUG, LOST, ABORT = "model", "bug", "lost", "abort"


class MedClawError(Exception):
    """A failure explained in one line (str(err)); `exit_code` is what the CLI exits with.
    The base class (and most subclasses) mean the input or configuration was wrong: 2."""

    exit_code = 2


class ConfigError(MedClawError):
    """A configuration file or CLI flag is invalid."""


class ModelNotFoundError(MedClawError):
    """A model reference does not point at a usable local folder."""


class RunFailedError(MedClawError):
    """Something failed while running, not because of the input: exit status 3. The CLI prints
    the trace path with it when an episode had started (`medclaw_trace` on the exception)."""

    exit_code = 3


class EngineLostError(RunFailedError):
    """A generation engine or server stopped answering (process died, server killed or
    unreachable, runtime closed). Retrying the same call cannot help."""


ERROR_KINDS: dict[str, str] = {
    # programming errors: the fault is ours whatever the model asked
    "builtins:TypeError": BUG,
    "builtins:AttributeError": BUG,
    "builtins:NameError": BUG,                # and UnboundLocalError
    "builtins:AssertionError": BUG,
    "builtins:ImportError": BUG,              # and ModuleNotFoundError
    "builtins:NotImplementedError": BUG,
    "builtins:LookupError": BUG,              # KeyError, IndexError: arguments are schema-checked
    "builtins:SyntaxError": BUG,
    "builtins:RecursionError": BUG,
    # engines, servers and resources that are gone
    "medclaw.errors:RunFailedError": LOST,    # EngineLostError included
    "builtins:MemoryError": LOST,
    "torch:OutOfMemoryError": LOST,           # CUDA out of memory (a RuntimeError)
    "vllm.v1.engine.exceptions:EngineDeadError": LOST,
    # everything else raised on the model's arguments is the model's to read and react to
    "medclaw.errors:MedClawError": MODEL,
    "builtins:Exception": MODEL,
    # cancellation (asyncio.CancelledError), KeyboardInterrupt, SystemExit, GeneratorExit
    "builtins:BaseException": ABORT,
}


def error_kind(err: BaseException) -> str:
    """MODEL, BUG, LOST or ABORT for `err` (see the module docstring)."""
    for cls in type(err).__mro__:
        kind = ERROR_KINDS.get(f"{cls.__module__}:{cls.__qualname__}")
        if kind is not None:
            return kind
    return ABORT                               # not reached: every exception is a BaseException


def describe(err: BaseException) -> str:
    """One line for a reader: our own errors speak for themselves; others get their type name."""
    if isinstance(err, MedClawError):
        return first_line(err)
    return f"{type(err).__name__}: {first_line(err)}"


def as_run_failure(err: BaseException) -> BaseException:
    """What the CLI raises for `err` once engines have started: a bug or interrupt as itself (its
    traceback matters), a `RunFailedError` as itself, anything else as a `RunFailedError` (exit
    3) with the same one-line message. The episode's trace location travels with it."""
    if error_kind(err) in (BUG, ABORT) or isinstance(err, RunFailedError):
        return err
    failure = RunFailedError(describe(err))
    failure.__cause__ = err
    trace = getattr(err, "medclaw_trace", None)
    if trace is not None:
        failure.medclaw_trace = trace
    return failure


def first_line(err: object, default: str | None = None) -> str:
    """The first line of an exception's message (or of any text), for a one-line error built on
    top of it; when it is empty, `default` or else the type name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else (default or type(err).__name__)
