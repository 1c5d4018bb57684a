"""`medclaw ask`: answer one question about a video, or a batch of them, with local models.

    medclaw ask VIDEO "QUESTION" [--profile P] [--config F] [--model ROLE=PATH ...] [--kb INDEX]
                [--skills DIR] [--trace-dir D] [--max-steps N] [--assume-fps F] [--json]
    medclaw ask --batch FILE.jsonl [same options] [--concurrency N]

Three phases, in this order:
1. every input is checked: the batch file, each video (probed: a missing, corrupt or stream-less
   file fails in seconds with a one-line error; a raw elementary stream such as `.h264`, which
   has no timestamps, needs `--assume-fps F`, else the times in the answer would be a guess),
   the config, the model folders and the KB index;
2. every role's engine starts (and the KB's encoder), one line per engine on stderr — the
   episode budgets do not count this;
3. the episodes run, with a progress line per step on stderr ("step n/N tool latency"; n never
   passes N: the forced answer, when needed, is step N).

Output on stdout:
- single: the answer, status and trace path; with `--json` exactly one object
  `{"answer", "status", "steps", "trace", "error"}` — always, also when the run fails (status
  `failed: …`, the trace path when an episode had begun) or the input is refused (status
  `refused`, trace null);
- batch: one JSON line per item as it finishes, `{"id", "video", "question", "answer", "status",
  "steps", "trace", "error"}`. Items run concurrently on the shared engines; a failing item (bad
  video, a crash, a lost engine) is reported as `failed: …` and the others go on.

Exit status (see `medclaw --help`): 0 answered, or a forced answer; 2 input refused before any
engine ran (for a batch: some items refused, none failed at run time); 3 a failure at run time —
an engine or server lost, decoding failed, no usable answer — with the trace path on stderr;
1 a bug in MedClaw (traceback on stderr, the trace saved as failed).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("video", nargs="?", help="video file (omit with --batch)")
    parser.add_argument("question", nargs="?", help="the question, in quotes (omit with --batch)")
    parser.add_argument("--batch", metavar="FILE.jsonl",
                        help='many questions: one JSON object per line {"video", "question", "id"?}')
    add_runtime_arguments(parser)
    parser.add_argument("--trace-dir", help="where episode traces go (default: artifacts/traces)")
    parser.add_argument("--max-steps", type=int, help="orchestrator steps before a forced answer")
    parser.add_argument("--concurrency", type=int, help="episodes in flight at once (batch)")
    parser.add_argument("--assume-fps", type=float, default=None, metavar="F",
                        help="frame rate of a video stream without timestamps (raw .h264/.hevc; "
                             "required for those); files with timestamps ignore it")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON result, failures included")
    from medclaw.cli import EXIT_STATUS

    parser.epilog, parser.formatter_class = EXIT_STATUS, argparse.RawDescriptionHelpFormatter
    parser.set_defaults(handler=_handle)


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Model / KB / skill options shared with other commands that build a Runtime."""
    parser.add_argument("--profile", default=None,
                        help="model profile (default: the config's, else tiny-cpu — tiny random-weight "
                             "test models)")
    parser.add_argument("--config", help="YAML config file (models: and episode: sections)")
    parser.add_argument("--model", action="append", default=[], metavar="ROLE=PATH",
                        help="override one role's model with a preset name or local folder")
    parser.add_argument("--kb", metavar="INDEX", help="knowledge-base index folder (medclaw kb build)")
    parser.add_argument("--skills", metavar="DIR", help="skill library folder (default: shipped)")
    add_decode_device_argument(parser)


def add_decode_device_argument(parser: argparse.ArgumentParser) -> None:
    """--decode-device: where frames are decoded, over the config's `decode: device`."""
    parser.add_argument("--decode-device", metavar="DEVICE",
                        help="decode frames on cpu or cuda[:N] (NVDEC; default: the config's "
                             "decode: device, else cpu)")


def read_batch(path: str) -> list:
    """Parse a batch JSONL file into `BatchItem`s; a malformed line is a one-line ConfigError."""
    from pathlib import Path

    from medclaw.engine.episode import BatchItem
    from medclaw.errors import ConfigError
    from medclaw.jsonl import iter_objects

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"batch file not found: {file}")
    items = []
    for number, row in iter_objects(file, ConfigError):
        if not isinstance(row.get("video"), str) or not isinstance(row.get("question"), str) \
                or not row["question"].strip():
            raise ConfigError(f'{file}:{number}: need {{"video": str, "question": str, "id"?: str}}')
        items.append(BatchItem(video=row["video"], question=row["question"],
                               id=str(row.get("id") or f"line{number}")))
    if not items:
        raise ConfigError(f"batch file {file} holds no questions")
    return items


@dataclass(slots=True)
class _Work:
    """What phase 1 checked: the items, each video's probe (or why it was refused), the runtime
    (resolved, no engine started) and the episode config."""

    items: list
    infos: dict
    refused: dict                   # video path -> one-line reason (batch only)
    runtime: object
    config: object


def _handle(args) -> int:
    import asyncio

    from medclaw.errors import MedClawError

    try:
        work = _check_inputs(args)
    except MedClawError as err:
        if args.json and not args.batch:
            _print_json(_refused(err))
        raise
    if args.batch:
        return asyncio.run(_run_batch(work))
    return asyncio.run(_run_single(work, args.json))


def _check_inputs(args) -> _Work:
    """Phase 1: every input checked, nothing started. Raises MedClawError (exit 2)."""
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.episode import BatchItem
    from medclaw.errors import ConfigError, MedClawError

    if args.assume_fps is not None and not (0 < args.assume_fps < float("inf")):
        raise ConfigError(f"--assume-fps must be a positive frame rate, got {args.assume_fps}")
    if args.batch:
        if args.video or args.question:
            raise ConfigError("give either VIDEO QUESTION or --batch FILE, not both")
        items = read_batch(args.batch)
    else:
        if not args.video or not args.question:
            raise ConfigError('usage: medclaw ask VIDEO "QUESTION" (or --batch FILE.jsonl)')
        items = [BatchItem(video=args.video, question=args.question, id="")]
    config = load_episode_config(args.config, profile=args.profile, trace_dir=args.trace_dir,
                                 max_steps=args.max_steps, concurrency=args.concurrency)
    # videos — before anything heavy. A single bad video is refused (exit 2); in a batch it
    # fails only its own items.
    from medclaw.kernels.probe import probe_video

    infos, refused = {}, {}
    for video in dict.fromkeys(item.video for item in items):
        try:
            info = probe_video(video, assumed_fps=args.assume_fps)
            if info.fps_is_assumed and args.assume_fps is None:
                raise ConfigError(f"{video}: a video stream without timestamps (raw {info.codec}; "
                                  f"it declares {info.fps:g} fps): give its frame rate with "
                                  f"--assume-fps F")
            infos[video] = info
        except MedClawError as err:
            if not args.batch:
                raise
            refused[video] = str(err)
    # models, KB, skills — resolved and checked; no engine starts here.
    from medclaw.engine.runtime import open_runtime
    from medclaw.models.registry import parse_overrides

    runtime = open_runtime(profile=args.profile, config_path=args.config,
                           overrides=parse_overrides(args.model), kb_dir=args.kb,
                           skills_dir=args.skills, decode_device=args.decode_device)
    return _Work(items, infos, refused, runtime, config)


async def start_engines(runtime, console) -> None:
    """Phase 2: every role's engine (and the KB encoder), one line per engine on stderr."""
    with console.status("starting engines…"):
        await runtime.start(on_engine=lambda ready: console.log(ready.line()))


def _failure(err: BaseException, started: bool) -> BaseException:
    """What the command raises for `err`: a refusal before any engine ran keeps its exit status
    2; later, anything but a bug becomes a run-time failure (exit 3)."""
    from medclaw.errors import MedClawError, as_run_failure

    if not started and isinstance(err, MedClawError) and err.exit_code == 2:
        return err
    return as_run_failure(err)


def _refused(err) -> dict:
    return {"answer": None, "status": "refused", "steps": 0, "trace": None, "error": str(err)}


def _print_json(row: dict) -> None:
    print(json.dumps(row), flush=True)


async def _run_single(work: _Work, as_json: bool) -> int:
    from medclaw.engine.episode import EpisodeResult, run_episode
    from medclaw.errors import RunFailedError

    console = _stderr_console()
    config, item = work.config, work.items[0]
    started, failure = False, None
    try:
        await start_engines(work.runtime, console)
        started = True
        with console.status("step 1: thinking…") as status:
            def on_step(step, budget):
                call = step.orchestrator_call
                latency = (call.latency_s if call else 0.0) + step.tool_latency_s
                tool = "answer (forced)" if step.kind == "forced_answer" else \
                    (step.tool or "(unparseable output)")
                mark = " ✗" if step.error else ""
                console.log(f"step {step.index}/{config.max_steps} {tool}{mark} {latency:.1f}s")
                if step.index < config.max_steps:
                    status.update(f"step {step.index + 1}/{config.max_steps}: thinking…")

            result = await run_episode(item.question, item.video, work.runtime, config,
                                       video_info=work.infos[item.video], on_step=on_step)
    except Exception as err:             # reported below as the one result, then raised
        failure = _failure(err, started)
        result = EpisodeResult.from_exception(err)
    finally:
        await work.runtime.close()
    refused = failure is not None and getattr(failure, "exit_code", None) == 2
    if as_json:
        _print_json(_refused(failure) if refused else result.to_dict())
    else:
        print(f"Answer: {result.answer}")
        print(f"Status: {result.status}  ({result.steps} steps)")
        if result.trace_path:
            print(f"Trace:  {result.trace_path}   (medclaw trace show {result.trace_path})")
    if failure is not None:
        raise failure
    if result.status.startswith("failed"):
        error = RunFailedError(result.error or result.status)
        error.medclaw_trace = (result.trace_path, result.steps)
        raise error
    return 0


async def _run_batch(work: _Work) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from medclaw.engine.episode import EpisodeResult, run_batch

    counts = {"failed": 0, "refused": 0}

    def emit(item, result) -> None:
        counts["failed"] += result.status.startswith("failed")
        row = {"id": item.id, "video": item.video, "question": item.question, **result.to_dict()}
        _print_json(row)

    for item in work.items:                                 # refused videos: reported up front
        if item.video in work.refused:
            counts["refused"] += 1
            reason = work.refused[item.video]
            print(json.dumps({"id": item.id, "video": item.video, "question": item.question,
                              **EpisodeResult(answer=None, status=f"failed: {reason}", steps=0,
                                              trace_path=None, episode_id=item.id,
                                              error=reason).to_dict()}), flush=True)
    runnable = [item for item in work.items if item.video not in work.refused]
    if not runnable:                       # every input refused: no engine needs to run
        await work.runtime.close()
        return 2
    console = _stderr_console()
    try:
        await start_engines(work.runtime, console)
    except Exception as err:               # every item gets its line, then the command fails
        for item in runnable:
            emit(item, EpisodeResult.from_exception(err, item.id))
        await work.runtime.close()
        raise _failure(err, started=False)
    columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[last]}"))
    with Progress(*columns, transient=False, console=console) as progress:
        task = progress.add_task("batch", total=len(runnable), last="")

        def on_result(item, result) -> None:
            emit(item, result)
            progress.update(task, advance=1, last=f"{item.id}: {result.status}")

        def on_step(step, budget) -> None:
            progress.update(task, last=f"step {step.index} {step.tool or '?'}")

        try:
            await run_batch(runnable, work.runtime, work.config, video_infos=work.infos,
                            on_result=on_result, on_step=on_step)
        finally:
            await work.runtime.close()
    if counts["failed"]:
        return 3
    return 2 if counts["refused"] else 0


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True, log_path=False)


if __name__ == "__main__":                             # vLLM spawns processes: keep a main guard
    from medclaw.cli import main

    sys.exit(main(["ask", *sys.argv[1:]]))
