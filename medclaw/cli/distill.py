"""`medclaw distill`: grow a skill library from failures, keeping only skills that help.

    medclaw distill --mine M.jsonl --val V.jsonl --library DIR [--delta 0.05] [--max-candidates 5]
                    [--reward judge|exact] [--out OUT] [--profile P | --config F]
                    [--model ROLE=PATH] [--kb INDEX] [--format F] [--on-bad-record stop|skip]
                    [--max-steps N] [--concurrency N]

Mine M (answer blind, diagnose A/B/C against the gold, write A lessons as candidate skills), then
gate each candidate alone on V against the library as it is (R_s > R_0 + delta and no question
dropping by 2 or more), then install the kept ones into DIR with provenance (see
`medclaw.skills.distill`). Both datasets, every video, the config and the models are checked
before any engine starts; the engines then run once for every pass (libraries are swapped, not
engines restarted). OUT (default artifacts/distill/<run id>) gets the traces of every pass, the
mining log and distill_report.{md,json}; the report is also printed.
"""
from __future__ import annotations

import argparse
import sys


def register(parser: argparse.ArgumentParser) -> None:
    from medclaw.cli.ask import add_decode_device_argument

    parser.add_argument("--mine", required=True, metavar="M.jsonl", help="mining questions (with gold)")
    parser.add_argument("--val", required=True, metavar="V.jsonl", help="validation questions (with gold)")
    parser.add_argument("--library", required=True, metavar="DIR",
                        help="the skill library to grow (created if missing; shipped skills apply too)")
    parser.add_argument("--delta", type=float, default=0.05,
                        help="keep a candidate only if R_s > R_0 + delta (default 0.05)")
    parser.add_argument("--max-candidates", type=int, default=5, metavar="N",
                        help="candidate skills at most (default 5)")
    parser.add_argument("--reward", choices=("judge", "exact"), default="judge",
                        help="R per validation question: the judge's Avg (default), or exact match "
                             "scaled to 1-5 (needs exact gold, e.g. `medclaw eval make-synthetic` "
                             "sets; for a judge that cannot be trusted)")
    parser.add_argument("--out", metavar="OUT", help="run folder (default artifacts/distill/<run id>)")
    parser.add_argument("--profile", default=None,
                        help="model profile (default: the config's, else tiny-cpu)")
    parser.add_argument("--config", help="YAML config file (models:, episode:, judge: sections)")
    parser.add_argument("--model", action="append", default=[], metavar="ROLE=PATH",
                        help="override one role's model with a preset name or local folder")
    parser.add_argument("--kb", metavar="INDEX", help="knowledge-base index folder (medclaw kb build)")
    add_decode_device_argument(parser)
    parser.add_argument("--format", default="auto",
                        choices=("auto", "medclaw", "medclawbench", "svu31k"), help="dataset format")
    parser.add_argument("--on-bad-record", choices=("stop", "skip"), default="stop",
                        help="a broken line, duplicate id or unreadable video: stop (default) or skip it")
    parser.add_argument("--max-steps", type=int, help="orchestrator steps before a forced answer")
    parser.add_argument("--concurrency", type=int, help="episodes in flight at once")
    parser.set_defaults(handler=_handle)


def _read(path: str, args, warn):
    from medclaw.eval.dataset import read_dataset
    from medclaw.eval.session import check_videos

    records, problems = read_dataset(path, format=args.format, on_bad=args.on_bad_record)
    for problem in problems:
        warn(f"{path}: skipped {problem}")
    records, infos, _ = check_videos(records, args.on_bad_record, warn)
    return records, infos


def _handle(args) -> int:
    import asyncio
    import time
    from pathlib import Path

    from rich.console import Console

    from medclaw.config_file import profile_name, read_config_file
    from medclaw.engine.config import load_episode_config
    from medclaw.errors import ConfigError
    from medclaw.eval.judge import Judge, judge_config_for
    from medclaw.skills.distill import DistillConfig, check_reward_gold, distill, to_markdown

    console = Console(stderr=True)
    warn = lambda line: console.print(f"medclaw: warning: {line}")     # noqa: E731
    config = DistillConfig(delta=args.delta, max_candidates=args.max_candidates, reward=args.reward)
    library = Path(args.library)
    if library.exists() and not library.is_dir():
        raise ConfigError(f"--library {library} is not a folder")
    mine_records, infos = _read(args.mine, args, warn)
    val_records, val_infos = _read(args.val, args, warn)
    infos.update(val_infos)
    if not mine_records or not val_records:
        raise ConfigError("both --mine and --val need at least one usable question")
    check_reward_gold(config.reward, val_records)
    doc = read_config_file(args.config)
    judge_config = judge_config_for(profile_name(args.profile, doc), doc.get("judge"))
    run_id = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"artifacts/distill/{run_id}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} is not empty; choose a new folder")
    episode_config = load_episode_config(args.config, profile=args.profile,
                                         max_steps=args.max_steps, concurrency=args.concurrency,
                                         trace_dir=str(out / "traces"))
    from medclaw.engine.runtime import open_runtime
    from medclaw.models.registry import parse_overrides

    runtime = open_runtime(profile=args.profile, config_path=args.config,
                           overrides=parse_overrides(args.model), kb_dir=args.kb,
                           decode_device=args.decode_device)
    missing = [r for r in ("orchestrator", "video_expert", "judge") if r not in runtime.specs]
    if missing:
        raise ConfigError(f"distillation needs a model for role(s) {missing}")

    async def main():
        try:
            with console.status("starting engines…") as status:
                for role in ("orchestrator", "video_expert", "frame_verifier", "judge", "distiller"):
                    if role in runtime.specs:
                        status.update(f"starting the {role} engine…")
                        await runtime.get_backend(role)
                judge = Judge(await runtime.get_backend("judge"), judge_config)

                def on_event(line: str) -> None:
                    console.log(line)
                    status.update(line)

                return await distill(mine_records, val_records, runtime, episode_config, judge,
                                     library_dir=library, out_dir=out, config=config, run_id=run_id,
                                     video_infos=infos, on_event=on_event)
        finally:
            await runtime.close()

    report = asyncio.run(main())
    print(to_markdown(report))
    console.print(f"report: {out}/distill_report.md")
    return 0


if __name__ == "__main__":                             # vLLM spawns processes: keep a main guard
    from medclaw.cli import main

    sys.exit(main(["distill", *sys.argv[1:]]))
