"""The `medclaw` command.

Each subcommand lives with the code it drives and is listed in `COMMANDS` as a lazily imported
`"module:register"` string. A command module's top level must stay light (argparse only): heavy
imports (torch, vLLM, decoders) happen inside its handler, so `medclaw --help` answers at once.

A handler returns an exit status (or None for 0). A `MedClawError` is printed as one line on
stderr and exits with its `exit_code` (`EXIT_STATUS` below, shown by `medclaw --help`): 2 for
input refused before any engine ran, 3 for a failure at run time. An error that carries
`medclaw_trace` (an episode had begun) also prints the trace path. Anything else is a bug and
keeps its traceback (exit status 1).
"""
from __future__ import annotations

import argparse
import importlib
import sys

import medclaw
from medclaw.errors import MedClawError

EXIT_STATUS = """exit status:
  0    answered, or a forced answer when a budget ran out
  1    a bug in MedClaw: traceback on stderr (the episode's trace is saved as failed)
  2    input refused before any engine ran: one line on stderr
  3    failure at run time (an engine or server lost, decoding failed, no usable answer):
       one line and the trace path on stderr
  130  interrupted"""

# name → (module:function that adds the subparser, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "ask": ("medclaw.cli.ask:register", "answer a question about a video (the agent)"),
    "models": ("medclaw.cli.models:register", "list presets, build tiny checkpoints, import weights"),
    "video": ("medclaw.cli.video:register", "synthesise and probe videos"),
    "kb": ("medclaw.cli.kb:register", "build and search the local surgical knowledge base"),
    "trace": ("medclaw.cli.trace:register", "show an episode trace"),
    "bench": ("medclaw.cli.bench:register", "benchmarks: decode, kv (JSON output)"),
    "demo": ("medclaw.cli.demo:register", "end-to-end demo on the trained miniature, checked against ground truth"),
    "eval": ("medclaw.cli.eval:register",
             "evaluate on a dataset (agent or one-shot), judge, report; make-synthetic; compare"),
    "distill": ("medclaw.cli.distill:register",
                "grow a skill library from failures, keeping only skills that help"),
    "serve": ("medclaw.cli.serve:register", "jobs API and audit viewer on loopback (bearer token)"),
    "doctor": ("medclaw.cli.doctor:register",
               "check offline settings, devices, decoders, models; --airgap -- COMMAND"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medclaw",
        description="MedClaw: answer questions about long surgical videos with local models only. "
                    "Nothing leaves this machine.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"medclaw {medclaw.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text) in COMMANDS.items():
        module_name, function_name = target.split(":")
        register = getattr(importlib.import_module(module_name), function_name)
        register(subparsers.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # A subcommand that passes unknown flags through (e.g. `models serve` → vLLM) sets
    # `pass_through=True`; everywhere else an unknown flag is the usual argparse error.
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "pass_through", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.passed_through = unknown
    handler = getattr(args, "handler", None)
    if handler is None:
        # `medclaw` or `medclaw GROUP` with no subcommand: show the relevant help.
        (getattr(args, "group_parser", None) or parser).print_help()
        return 0 if args.command is None else 2
    try:
        return int(handler(args) or 0)
    except MedClawError as err:
        print(f"medclaw: error: {err}", file=sys.stderr)
        _print_trace(err)
        return err.exit_code
    except KeyboardInterrupt:
        print("medclaw: interrupted", file=sys.stderr)
        return 130
    except BaseException as err:         # a bug: the traceback follows, the trace is saved
        _print_trace(err)
        raise


def _print_trace(err: BaseException) -> None:
    path = (getattr(err, "medclaw_trace", None) or (None,))[0]
    if path:
        print(f"medclaw: trace: {path}   (medclaw trace show {path})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
