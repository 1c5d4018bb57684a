"""`medclaw ask`: answer one question about a video, or a batch of them, with local models.

    medclaw ask VIDEO "QUESTION" [--profile P] [--config F] [--model ROLE=PATH ...] [--kb INDEX]
                [--skills DIR] [--trace-dir D] [--max-steps N] [--json]
    medclaw ask --batch FILE.jsonl [same options] [--concurrency N]

Every input is checked before any engine starts: the batch file, each video (probed: a missing,
corrupt or stream-less file fails in seconds with a one-line error), the config, the model
folders and the KB index. Then the engines start (lazily, on first use) and the episode runs with
a progress line on stderr (step n/N, tool, latency). Output on stdout:

- single: the answer, status and trace path; with `--json` one object
  `{"answer", "status", "steps", "trace"}`;
- batch: one JSON line per item as it finishes, `{"id", "video", "question", "answer", "status",
  "steps", "trace"}`. Items run concurrently on the shared engines; a failing item (bad video, a
  crash) is reported as `failed: …` and the others go on.

Exit status: 0 when every episode ended with an answer (answered or forced), 1 when any failed,
2 for bad input before anything ran.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("video", nargs="?", help="video file (omit with --batch)")
    parser.add_argument("question", nargs="?", help="the question, in quotes (omit with --batch)")
    parser.add_argument("--batch", metavar="FILE.jsonl",
                        help='many questions: one JSON object per line {"video", "question", "id"?}')
    add_runtime_arguments(parser)
    parser.add_argument("--decode-device", metavar="DEVICE",
                        help="decode frames on cpu or cuda[:N] (NVDEC; default: the config's "
                             "decode: device, else cpu)")
    parser.add_argument("--trace-dir", help="where episode traces go (default: artifacts/traces)")
    parser.add_argument("--max-steps", type=int, help="orchestrator steps before a forced answer")
    parser.add_argument("--concurrency", type=int, help="episodes in flight at once (batch)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
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


def _handle(args) -> int:
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.episode import BatchItem
    from medclaw.errors import ConfigError

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

    # 1. videos — before anything heavy. A single bad video is a user error (exit 2); in a batch
    #    it fails only its own items.
    from medclaw.kernels.probe import probe_video
    from medclaw.errors import MedClawError

    infos, bad = {}, {}
    for video in dict.fromkeys(item.video for item in items):
        try:
            infos[video] = probe_video(video)
        except MedClawError as err:
            if not args.batch:
                raise
            bad[video] = str(err)
    # 2. models, KB, skills — resolved and checked; no engine starts here.
    from medclaw.engine.runtime import open_runtime
    from medclaw.models.registry import parse_overrides

    runtime = open_runtime(profile=args.profile, config_path=args.config,
                           overrides=parse_overrides(args.model), kb_dir=args.kb,
                           skills_dir=args.skills, decode_device=args.decode_device)
    import asyncio

    if args.batch:
        return asyncio.run(_run_batch(items, infos, bad, runtime, config))
    return asyncio.run(_run_single(items[0], infos[items[0].video], runtime, config, args.json))


async def _run_single(item, info, runtime, config, as_json: bool) -> int:
    from rich.console import Console

    from medclaw.engine.episode import run_episode

    console = Console(stderr=True)
    with console.status("starting engines…") as status:
        def on_step(step, budget):
            call = step.orchestrator_call
            latency = (call.latency_s if call else 0.0) + step.tool_latency_s
            tool = step.tool or "(unparseable output)"
            mark = " ✗" if step.error else ""
            console.log(f"step {step.index}/{config.max_steps} {tool}{mark} {latency:.1f}s")
            status.update(f"step {step.index + 1}/{config.max_steps}: thinking…")

        try:
            result = await run_episode(item.question, item.video, runtime, config,
                                       video_info=info, on_step=on_step)
        finally:
            await runtime.close()
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"Answer: {result.answer}")
        print(f"Status: {result.status}  ({result.steps} steps)")
        print(f"Trace:  {result.trace_path}   (medclaw trace show {result.trace_path})")
    return 1 if result.status.startswith("failed") else 0


async def _run_batch(items, infos, bad, runtime, config) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from medclaw.engine.episode import run_batch

    failed = 0

    def emit(item, result) -> None:
        nonlocal failed
        failed += result.status.startswith("failed")
        row = {"id": item.id, "video": item.video, "question": item.question, **result.to_dict()}
        print(json.dumps(row), flush=True)

    for item in items:                                 # bad videos: reported up front
        if item.video in bad:
            from medclaw.engine.episode import EpisodeResult

            emit(item, EpisodeResult(answer=None, status=f"failed: {bad[item.video]}", steps=0,
                                     trace_path=None, episode_id=item.id))
    runnable = [item for item in items if item.video not in bad]
    columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[last]}"))
    with Progress(*columns, transient=False, console=_stderr_console()) as progress:
        task = progress.add_task("batch", total=len(runnable), last="starting engines…")

        def on_result(item, result) -> None:
            emit(item, result)
            progress.update(task, advance=1, last=f"{item.id}: {result.status}")

        def on_step(step, budget) -> None:
            progress.update(task, last=f"step {step.index} {step.tool or '?'}")

        try:
            await run_batch(runnable, runtime, config, video_infos=infos, on_result=on_result,
                            on_step=on_step)
        finally:
            await runtime.close()
    return 1 if failed else 0


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


if __name__ == "__main__":                             # vLLM spawns processes: keep a main guard
    from medclaw.cli import main

    sys.exit(main(["ask", *sys.argv[1:]]))
