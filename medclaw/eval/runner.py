"""Run an evaluation: answer every question (agent or one-shot), judge it, score it, log it.

    rows = await evaluate(records, runtime, episode_config, judge, log, mode="agent",
                          concurrency=4, video_infos=infos, on_result=callback)

Per question, at most `concurrency` at a time on the shared engines: answer (`ANSWERERS[mode]`:
the agent episode, or the one-shot baseline), judge (`eval.judge`), exact scores
(`eval.scorers`), then ONE line appended to the results log (`eval.results`, fsynced) holding the
trace path. Questions already in the log are skipped, so a killed run resumes where it stopped
and every id ends up exactly once.

What is written as a result: every question that got an outcome — answered, forced answer, or a
failure the *input* caused (a `MedClawError`, e.g. a prompt past the model's context; it scores 1
everywhere). A crash of our code or of an engine is not a result: nothing is written, the error is
counted in `EvalOutcome.crashed`, and `--resume` retries that question.

The result row (`result_row`): id, split, type, subtype, question, gold, gold_window_s, mode,
answer, status, evidence_times, steps, trace, wall_s, judge (JudgeScore.to_dict(): CI, DO, CU,
TU, avg, rationale, model, revision, prompt version + sha256), exact (match, match_kind, tiou).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from medclaw.eval.dataset import EvalRecord, safe_id

MODES = ("agent", "oneshot")


async def answer_agent(record: EvalRecord, runtime, config, video_info, episode_id: str):
    from medclaw.engine.episode import run_episode

    return await run_episode(record.question, record.video, runtime, config,
                             episode_id=episode_id, video_info=video_info)


async def answer_oneshot(record: EvalRecord, runtime, config, video_info, episode_id: str):
    from medclaw.eval.oneshot import run_oneshot

    return await run_oneshot(record.question, video_info, runtime, config, episode_id=episode_id)


ANSWERERS: dict[str, Callable] = {"agent": answer_agent, "oneshot": answer_oneshot}

# Roles each mode needs running (engines are started before the clock).
MODE_ROLES: dict[str, tuple[str, ...]] = {
    "agent": ("orchestrator", "video_expert", "frame_verifier", "judge"),
    "oneshot": ("video_expert", "judge"),
}


@dataclass(slots=True)
class EvalOutcome:
    rows: list[dict] = field(default_factory=list)       # written in this call
    skipped: int = 0                                     # already in the log (resume)
    crashed: dict[str, str] = field(default_factory=dict)  # id -> error (not written; retry)


def result_row(record: EvalRecord, mode: str, result, score, wall_s: float) -> dict:
    from medclaw.eval.scorers import exact_scores

    return {
        "id": record.id, "split": record.split, "type": record.type, "subtype": record.subtype,
        "question": record.question, "gold": record.gold,
        "gold_window_s": list(record.gold_window_s) if record.gold_window_s else None,
        "mode": mode, "answer": result.answer, "status": result.status,
        "evidence_times": [float(t) for t in result.evidence_times], "steps": result.steps,
        "trace": result.trace_path, "wall_s": round(wall_s, 3),
        "judge": score.to_dict(),
        "exact": exact_scores(record, result.answer, result.evidence_times),
    }


async def evaluate(records: list[EvalRecord], runtime, config, judge, log, *, mode: str,
                   concurrency: int = 1, video_infos: dict | None = None,
                   on_result: Callable[[dict], None] | None = None,
                   on_crash: Callable[[EvalRecord, BaseException], None] | None = None,
                   id_prefix: str = "") -> EvalOutcome:
    """Answer, judge and log every record not yet in `log` (see module docstring)."""
    from medclaw.engine.episode import EpisodeResult
    from medclaw.errors import MedClawError
    from medclaw.kernels.probe import probe_video

    if mode not in ANSWERERS:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    answer = ANSWERERS[mode]
    infos = dict(video_infos or {})
    outcome = EvalOutcome(skipped=sum(1 for r in records if r.id in log.done))
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(record: EvalRecord) -> None:
        async with limit:
            started = time.monotonic()
            episode_id = f"{id_prefix}{safe_id(record.id)}"
            try:
                try:
                    info = infos.get(record.video)
                    if info is None:
                        info = infos[record.video] = await asyncio.to_thread(probe_video, record.video)
                    result = await answer(record, runtime, config, info, episode_id)
                except MedClawError as err:           # the input's fault: a scored failure
                    trace_path, steps = getattr(err, "medclaw_trace", (None, 0))
                    result = EpisodeResult(answer=None, status=f"failed: {err}", steps=steps,
                                           trace_path=trace_path, episode_id=episode_id)
                score = await judge.score(record, result.answer, result.evidence_times)
            except asyncio.CancelledError:
                raise
            except Exception as err:                  # noqa: BLE001 — not written: resume retries
                outcome.crashed[record.id] = f"{type(err).__name__}: {err}"
                if on_crash is not None:
                    on_crash(record, err)
                return
            row = result_row(record, mode, result, score, time.monotonic() - started)
            row["trace"] = relative_trace(row["trace"], log.path.parent)
            log.append(row)
            outcome.rows.append(row)
            if on_result is not None:
                on_result(row)

    await asyncio.gather(*(one(r) for r in records if r.id not in log.done))
    return outcome


def relative_trace(trace: str | None, root) -> str | None:
    """A trace path relative to the results file's folder when it lies inside it (a run
    directory can be moved or copied whole); `resolve_trace` turns it back."""
    from pathlib import Path

    if trace is None:
        return None
    try:
        return str(Path(trace).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(trace)


def resolve_trace(trace: str | None, root) -> str | None:
    from pathlib import Path

    if trace is None:
        return None
    path = Path(trace)
    return str(path if path.is_absolute() else Path(root) / path)
