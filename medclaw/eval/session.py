"""One `medclaw eval DATASET` run: check every input, then start engines, then evaluate.

    prepared = prepare(EvalRequest(...), warn=print)   # all checks; starts no engine
    status = run_prepared(prepared)                    # engines up front, progress bar, report
    outcome = await evaluate_prepared(prepared)        # the same on an event loop (tests share engines)

`prepare` reads the dataset (bad records per `on_bad_record`), probes every video (an unreadable
one is a bad record for every question on it), resolves the episode and judge configs and the
models, opens the results log (refusing to mix runs: `--resume` continues only the same dataset
and mode) and writes DIR/<mode>/run.json: dataset path + SHA-256, format, mode, profile, the
models by role with revisions, the judge prompt version + SHA-256, the records left out and why.
Engines start only in `evaluate_prepared`, before the first question, one role at a time.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from medclaw.eval.report import RESULTS_FILE, RUN_FILE


@dataclass(slots=True)
class EvalRequest:
    dataset: str
    out: str
    mode: str = "agent"
    resume: bool = False
    concurrency: int | None = None
    profile: str | None = None
    config: str | None = None
    models: list[str] = field(default_factory=list)      # --model ROLE=PATH
    kb: str | None = None
    skills: str | None = None
    decode_device: str | None = None                     # --decode-device (over the config's)
    format: str = "auto"
    on_bad_record: str = "stop"
    max_steps: int | None = None
    limit: int | None = None


@dataclass(slots=True)
class PreparedEval:
    request: EvalRequest
    records: list
    infos: dict
    episode_config: object
    judge_config: object
    log: object
    runtime: object
    meta: dict
    mode_dir: Path


def check_videos(records, on_bad: str, warn) -> tuple[list, dict, list[str]]:
    from medclaw.errors import MedClawError
    from medclaw.eval.dataset import DatasetError
    from medclaw.kernels.probe import probe_video

    infos, bad = {}, {}
    for video in dict.fromkeys(r.video for r in records):
        try:
            infos[video] = probe_video(video)
        except MedClawError as err:
            bad[video] = str(err)
    if not bad:
        return records, infos, []
    notes = []
    for video, why in bad.items():
        lines = [str(r.line) for r in records if r.video == video]
        notes.append(f"line(s) {', '.join(lines)}: video unusable: {why}")
    if on_bad == "stop":
        raise DatasetError(f"{len(bad)} unusable video(s): {notes[0]}"
                           + (f"; and {len(notes) - 1} more" if len(notes) > 1 else "")
                           + " (fix them, or pass --on-bad-record skip to leave them out)")
    for note in notes:
        warn(f"skipped {note}")
    return [r for r in records if r.video not in bad], infos, notes


def prepare(request: EvalRequest, warn=lambda line: None, runtime=None) -> PreparedEval:
    """Every check of a run (see module docstring). `runtime` may be given (tests share engines)."""
    import medclaw
    from medclaw.config_file import profile_name, read_config_file
    from medclaw.engine.config import load_episode_config
    from medclaw.errors import ConfigError
    from medclaw.eval.dataset import file_sha256, read_dataset
    from medclaw.eval.judge import judge_config_for, load_prompt
    from medclaw.eval.results import ResultsError, ResultsLog
    from medclaw.eval.runner import MODE_ROLES, MODES

    if request.mode not in MODES:
        raise ConfigError(f"--mode must be one of {MODES}, got {request.mode!r}")
    if request.concurrency is not None and request.concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {request.concurrency}")
    if request.limit is not None and request.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {request.limit}")
    records, problems = read_dataset(request.dataset, format=request.format,
                                     on_bad=request.on_bad_record)
    for problem in problems:
        warn(f"{request.dataset}: skipped {problem}")
    if request.limit is not None:
        records = records[:request.limit]
    records, infos, video_notes = check_videos(records, request.on_bad_record, warn)
    if not records:
        raise ConfigError(f"{request.dataset}: no question left to evaluate")

    doc = read_config_file(request.config)
    profile = profile_name(request.profile, doc)
    mode_dir = Path(request.out) / request.mode
    episode_config = load_episode_config(request.config, profile=request.profile,
                                         trace_dir=str(mode_dir / "traces"),
                                         max_steps=request.max_steps,
                                         concurrency=request.concurrency)
    judge_config = judge_config_for(profile, doc.get("judge"))
    dataset_sha = file_sha256(request.dataset)
    run_file = mode_dir / RUN_FILE
    previous = json.loads(run_file.read_text()) if request.resume and run_file.is_file() else None
    if previous is not None and (previous.get("dataset_sha256"), previous.get("mode")) != (dataset_sha, request.mode):
        raise ResultsError(f"{mode_dir} holds a {previous.get('mode')} run of another dataset "
                           f"({previous.get('dataset')}); --resume continues only the same run")
    log = ResultsLog.open(mode_dir / RESULTS_FILE, resume=request.resume)
    try:
        if runtime is None:
            from medclaw.engine.runtime import open_runtime
            from medclaw.models.registry import parse_overrides

            runtime = open_runtime(profile=request.profile, config_path=request.config,
                                   overrides=parse_overrides(request.models), kb_dir=request.kb,
                                   skills_dir=request.skills, decode_device=request.decode_device)
        missing = [role for role in MODE_ROLES[request.mode]
                   if role not in runtime.specs and role != "frame_verifier"]
        if missing:
            raise ConfigError(f"no model configured for role(s) {missing} ({request.mode} mode needs "
                              "them; the judge scores every answer)")
        _, prompt_sha = load_prompt(judge_config.prompt_version)
        meta = {
            "dataset": str(Path(request.dataset).resolve()), "dataset_sha256": dataset_sha,
            "format": request.format, "mode": request.mode, "profile": profile,
            "config": str(Path(request.config).resolve()) if request.config else None,
            "models": runtime.model_info(),
            "judge": {"prompt_version": judge_config.prompt_version, "prompt_sha256": prompt_sha,
                      "rationale_max_chars": judge_config.rationale_max_chars},
            "episode": episode_config.to_dict(),
            "questions": len(records),
            "left_out": [str(p) for p in problems] + video_notes,
            "created_at": (previous or {}).get("created_at") or _now(),
            "resumed_at": [*(previous or {}).get("resumed_at", []), *([_now()] if previous else [])],
            "medclaw_version": medclaw.__version__,
        }
        mode_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(run_file)
    except BaseException:
        log.close()
        raise
    return PreparedEval(request=request, records=records, infos=infos, episode_config=episode_config,
                        judge_config=judge_config, log=log, runtime=runtime, meta=meta,
                        mode_dir=mode_dir)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


async def evaluate_prepared(prepared: PreparedEval, *, on_result=None, on_crash=None,
                            on_engines=None):
    """Start the mode's engines (before the clock), then evaluate; returns the EvalOutcome."""
    from medclaw.eval.judge import Judge
    from medclaw.eval.runner import MODE_ROLES, evaluate

    runtime = prepared.runtime
    roles = [r for r in MODE_ROLES[prepared.request.mode] if r in runtime.specs]
    for role in roles:
        if on_engines is not None:
            on_engines(role)
        await runtime.get_backend(role)
    judge = Judge(await runtime.get_backend("judge"), prepared.judge_config)
    return await evaluate(prepared.records, runtime, prepared.episode_config, judge, prepared.log,
                          mode=prepared.request.mode,
                          concurrency=prepared.episode_config.concurrency,
                          video_infos=prepared.infos, on_result=on_result, on_crash=on_crash)


def run_prepared(prepared: PreparedEval) -> int:
    """The CLI path: progress bar on stderr, runtime closed, report written; the exit status."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from medclaw.eval.report import to_markdown, write_report

    console = Console(stderr=True)
    todo = sum(1 for r in prepared.records if r.id not in prepared.log.done)
    done_before = len(prepared.records) - todo
    columns = (TextColumn(f"eval {prepared.request.mode}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[last]}"))

    async def main():
        try:
            with Progress(*columns, console=console, transient=False) as progress:
                task = progress.add_task("eval", total=len(prepared.records), completed=done_before,
                                         last="starting engines…")

                def on_engines(role):
                    progress.update(task, last=f"starting the {role} engine…")

                def on_result(row):
                    progress.update(task, advance=1,
                                    last=f"{row['id']}: {row['status'].split(':')[0]} "
                                         f"avg {row['judge']['avg']:.2f}")

                def on_crash(record, err):
                    progress.update(task, advance=1, last=f"{record.id}: crashed")
                    console.print(f"[red]{record.id}: {type(err).__name__}: {err}[/red]")

                return await evaluate_prepared(prepared, on_result=on_result, on_crash=on_crash,
                                               on_engines=on_engines)
        finally:
            prepared.log.close()
            await prepared.runtime.close()

    outcome = asyncio.run(main())
    summary = write_report(prepared.request.out)
    print(to_markdown(summary))
    console.print(f"results: {prepared.log.path} ({len(prepared.log.done)} of "
                  f"{len(prepared.records)} questions; {outcome.skipped} from before --resume)")
    if outcome.crashed:
        console.print(f"[red]{len(outcome.crashed)} question(s) crashed and were not written; "
                      "rerun with --resume to retry them[/red]")
        return 3
    return 0
