"""`medclaw eval`: evaluate the agent (or the one-shot baseline) on a dataset; make a synthetic set;
compare backbones.

    medclaw eval DATASET --out DIR [--mode agent|oneshot] [--concurrency N] [--resume]
                 [--profile P | --config F] [--model ROLE=PATH] [--kb INDEX] [--skills DIR]
                 [--format auto|medclaw|medclawbench|svu31k] [--on-bad-record stop|skip]
                 [--max-steps N] [--limit N]
    medclaw eval make-synthetic OUT_DIR --videos N --minutes M [--seed S] [--per-video K]
                                [--zoom [--whole-seconds]] [--families F,...]
    medclaw eval report DIR
    medclaw eval compare RUN_DIR... [--out DIR]

`medclaw eval DATASET` checks everything before any engine starts (the dataset, every video — a
bad record or video is reported with its line and, per --on-bad-record, skipped or fatal — the
results file, the config and model folders), then starts the engines it needs, then answers the
questions with a progress bar on stderr. Each finished question is one line appended (and fsynced)
to DIR/<mode>/results.jsonl with its trace path; `--resume` continues a killed run and leaves
every id exactly once. At the end DIR/report.{md,json,png} covers every mode run in DIR (run
agent and oneshot into the same DIR to get the Δ row). Exit status: 0 done; 2 bad input; 3 some
questions crashed (not written; `--resume` retries them).
"""
from __future__ import annotations

import argparse
import sys

SUBCOMMANDS = ("run", "make-synthetic", "report", "compare")


class _AnyFirstWord(dict):
    """The subcommand table, accepting any first word: argparse checks the choice before the
    action sees it, and a dataset path is not a subcommand name."""

    def __contains__(self, key) -> bool:
        return True


class _DefaultRun(argparse._SubParsersAction):
    """`medclaw eval DATASET …` means `medclaw eval run DATASET …` (the common case needs no verb)."""

    def accept_any_first_word(self) -> None:
        """Call once every subcommand is added (adding one checks its name is not taken)."""
        self._name_parser_map = self.choices = _AnyFirstWord(self._name_parser_map)

    def __call__(self, parser, namespace, values, option_string=None):
        if values and not dict.__contains__(self._name_parser_map, values[0]):
            values = ["run", *values]
        super().__call__(parser, namespace, values, option_string)


def register(parser: argparse.ArgumentParser) -> None:
    from medclaw.cli.ask import add_runtime_arguments

    parser.set_defaults(group_parser=parser)
    parser.register("action", "parsers_default_run", _DefaultRun)
    sub = parser.add_subparsers(dest="eval_command", metavar="DATASET | SUBCOMMAND",
                                action="parsers_default_run")

    run = sub.add_parser("run", help="evaluate on DATASET (the default: `medclaw eval DATASET`)",
                         description="Answer, judge and score every question of DATASET.")
    run.add_argument("dataset", metavar="DATASET", help="JSONL dataset (see medclaw.eval.dataset)")
    run.add_argument("--out", required=True, metavar="DIR", help="run directory (one per backbone)")
    run.add_argument("--mode", choices=("agent", "oneshot"), default="agent",
                     help="agent (tools, skills) or oneshot (the VLM sees the whole video once)")
    run.add_argument("--concurrency", type=int, default=None, metavar="N",
                     help="questions in flight at once (default: the episode config's)")
    run.add_argument("--resume", action="store_true", help="continue DIR/<mode>/results.jsonl")
    add_runtime_arguments(run)
    run.add_argument("--format", default="auto",
                     choices=("auto", "medclaw", "medclawbench", "svu31k"), help="dataset format")
    run.add_argument("--on-bad-record", choices=("stop", "skip"), default="stop",
                     help="a broken line, duplicate id or unreadable video: stop (default) or skip it")
    run.add_argument("--max-steps", type=int, help="orchestrator steps before a forced answer")
    run.add_argument("--limit", type=int, metavar="N", help="only the first N records")
    run.set_defaults(handler=_run)

    synth = sub.add_parser("make-synthetic", help="synthetic videos + a dataset with exact gold",
                           description="Render procedure videos and write OUT_DIR/dataset.jsonl "
                                       "from their ground truth.")
    synth.add_argument("out_dir", metavar="OUT_DIR")
    synth.add_argument("--videos", type=int, required=True, metavar="N")
    synth.add_argument("--minutes", type=float, required=True, metavar="M")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--per-video", type=int, default=None, metavar="K",
                       help="at most K questions per video (families interleaved)")
    synth.add_argument("--split", default="synthetic", help="split name of every record")
    synth.add_argument("--size", default="320x180", metavar="WxH", help="frame size (default 320x180)")
    synth.add_argument("--fps", type=float, default=25.0)
    synth.add_argument("--zoom", action="store_true",
                       help="add what only a closer look resolves (small objects, look-alikes told "
                            "apart by a small mark, short flashes) and its question families")
    synth.add_argument("--families", metavar="F[,F...]",
                       help="keep only these question families, e.g. small_object,look_alike "
                            "(default: all)")
    synth.add_argument("--whole-seconds", action="store_true",
                       help="with --zoom: ask small-object and look-alike questions at a whole "
                            "second inside the same visit ('at 17 s'), same answers")
    synth.set_defaults(handler=_make_synthetic)

    report = sub.add_parser("report", help="(re)write DIR/report.{md,json,png}")
    report.add_argument("run_dir", metavar="DIR")
    report.set_defaults(handler=_report)

    compare = sub.add_parser("compare", help="backbone-swap table and plot over run directories")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    compare.add_argument("--out", default="artifacts/eval-compare", metavar="DIR",
                         help="where compare.{md,json,png} go (default artifacts/eval-compare)")
    compare.set_defaults(handler=_compare)
    sub.accept_any_first_word()


# --- make-synthetic / report / compare ----------------------------------------------------------

def _make_synthetic(args) -> int:
    from medclaw.errors import ConfigError
    from medclaw.eval.synthetic import make_synthetic

    if not 1 <= args.videos <= 1000:
        raise ConfigError(f"--videos must be between 1 and 1000, got {args.videos}")
    if not 0.2 <= args.minutes <= 240:
        raise ConfigError(f"--minutes must be between 0.2 and 240, got {args.minutes:g}")
    if args.whole_seconds and not args.zoom:
        raise ConfigError("--whole-seconds changes the zoom questions: add --zoom")
    if args.per_video is not None and args.per_video < 1:
        raise ConfigError(f"--per-video must be >= 1, got {args.per_video}")
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--size must look like 320x180, got {args.size!r}") from None
    try:
        path = make_synthetic(args.out_dir, videos=args.videos, minutes=args.minutes, seed=args.seed,
                              width=width, height=height, fps=args.fps, split=args.split,
                              per_video=args.per_video, zoom=args.zoom,
                              whole_seconds=args.whole_seconds,
                              families=tuple(f.strip() for f in args.families.split(",") if f.strip())
                              if args.families else None)
    except ValueError as err:                       # the generator's size / length checks, families
        raise ConfigError(str(err)) from None
    count = sum(1 for line in path.read_text().splitlines() if line.strip())
    print(f"{path} ({count} questions over {args.videos} video(s))")
    return 0


def _report(args) -> int:
    from medclaw.eval.report import to_markdown, write_report

    print(to_markdown(write_report(args.run_dir)))
    return 0


def _compare(args) -> int:
    from medclaw.eval.compare import compare_runs, to_markdown, write_compare

    summary = compare_runs(args.run_dirs)
    out = write_compare(summary, args.out)
    print(to_markdown(summary))
    print(f"\n(written to {out}/compare.{{md,json,png}})", file=sys.stderr)
    return 0


# --- run ------------------------------------------------------------------------------------------

def _run(args) -> int:
    from medclaw.eval.session import EvalRequest, prepare, run_prepared

    request = EvalRequest(dataset=args.dataset, out=args.out, mode=args.mode, resume=args.resume,
                          concurrency=args.concurrency, profile=args.profile, config=args.config,
                          models=list(args.model), kb=args.kb, skills=args.skills,
                          decode_device=args.decode_device, format=args.format, on_bad_record=args.on_bad_record,
                          max_steps=args.max_steps, limit=args.limit)
    prepared = prepare(request, warn=lambda line: print(f"medclaw: warning: {line}", file=sys.stderr))
    return run_prepared(prepared)


if __name__ == "__main__":                             # vLLM spawns processes: keep a main guard
    from medclaw.cli import main

    sys.exit(main(["eval", *sys.argv[1:]]))
