"""Heuristic Skill Distillation: mine failures, write lessons as skills, keep only what helps.

    report = await distill(mine, val, runtime, episode_config, judge, library_dir=DIR,
                           out_dir=OUT, config=DistillConfig(delta=0.05, max_candidates=5))

1. Mine. Each mining question is answered blind by the agent with the test-time tools (a normal
   episode on the library as it is). Then the `distiller` role's model (the orchestrator's unless a
   profile or config assigns one) sees the gold and diagnoses the gap
   (schema-constrained): A operational (another way of looking would have caught it), B
   unreachable (narration, intent, pathology, pixels the backbone cannot resolve) or C already
   correct. Only A yields a lesson.
2. Write. For each A, the distiller writes the lesson through the `skill_manage` tool
   (`skills.manage`), which shows it the library first and turns a near-duplicate into an update
   of the existing skill; at most `max_candidates` candidates. Nothing is written to disk yet.
3. Gate. R_0 = mean judge Avg over the validation set with the library as it is. Each candidate
   is then installed ALONE (a staged copy of the library plus that skill, swapped into the running
   runtime — engines are not restarted), the validation set re-answered and re-judged: R_s. A
   candidate is kept only if R_s > R_0 + delta AND no validation question's Avg drops by
   `max_drop` (2) points or more. Scores are compared per question, on the questions both passes
   scored. The staged copy is removed after each pass, so a rejected candidate leaves no SKILL.md
   anywhere (its validation traces stay in OUT as the evidence of the verdict).
4. Install. Kept skills are written into DIR with provenance (created_by "distillation:<run>",
   source mining episodes, R_0, R_s, delta, date, version, previous version); a skill they replace
   is moved to DIR/.archive, never deleted. OUT/distill_report.{md,json} lists every candidate
   with its figures and verdict; OUT/mine/mining.jsonl every diagnosis and lesson.

Per question, R is the judge's Avg of CI, DO, CU, TU (1–5) — the same judge, prompt and
settings for every pass. `reward="exact"` gates on the exact scorer instead (`REWARDS`), for
validation sets with exact gold where the judge cannot be trusted (an untrained judge gives every
answer the same score, so no candidate could ever pass); it is put on the judge's 1–5 scale, so
delta and max_drop keep their meaning (a right answer turned wrong drops 4 points).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from medclaw.requests.output_format import first_json_object
from medclaw.skills.library import SkillLibrary, staged_library, use_library
from medclaw.skills.manage import CandidateSet, SkillManageTool

CATEGORIES = ("A", "B", "C")
# R of one validation row (`eval.runner`), on the judge's 1-5 scale: its Avg, or exact match
# (0..1, `eval.scorers`) as 1 + 4 * match.
REWARDS = {"judge": lambda row: row["judge"]["avg"],
           "exact": lambda row: 1 + 4 * row["exact"]["match"]}


@dataclass(slots=True)
class DistillConfig:
    delta: float = 0.05
    max_candidates: int = 5
    max_drop: float = 2.0
    lesson_steps: int = 4               # distiller turns to write one lesson
    reason_max_chars: int = 300
    reward: str = "judge"               # REWARDS key

    def __post_init__(self) -> None:
        from medclaw.errors import ConfigError

        if self.reward not in REWARDS:
            raise ConfigError(f"--reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if not 0 <= self.delta < 4:
            raise ConfigError(f"--delta must be in [0, 4), got {self.delta}")
        if not 1 <= self.max_candidates <= 50:
            raise ConfigError(f"--max-candidates must be in [1, 50], got {self.max_candidates}")


@dataclass(slots=True)
class Verdict:
    name: str
    version: int
    base_version: int | None
    sources: list[str]
    R_0: float | None = None
    R_s: float | None = None
    gain: float | None = None
    worst_drop: float | None = None
    worst_question: str | None = None
    questions: int = 0
    kept: bool = False
    reason: str = ""
    path: str | None = None
    description: str = ""
    trigger: str = ""


@dataclass(slots=True)
class DistillReport:
    run_id: str
    library: str
    R_0: float | None
    mining: list[dict] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    reward: str = "judge"

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "library": self.library, "reward": self.reward, "R_0": self.R_0,
                "mining": self.mining, "candidates": [asdict(v) for v in self.verdicts]}


def gate(base: dict[str, float], trial: dict[str, float], delta: float,
         max_drop: float = 2.0) -> tuple[bool, str, dict]:
    """Keep a candidate? Per-question rewards without (`base`) and with it (`trial`), by id."""
    common = sorted(set(base) & set(trial))
    if not common:
        return False, "no validation question was scored in both passes", {}
    r0 = sum(base[q] for q in common) / len(common)
    rs = sum(trial[q] for q in common) / len(common)
    drops = {q: base[q] - trial[q] for q in common}
    worst = max(common, key=lambda q: (drops[q], q))
    figures = {"R_0": round(r0, 4), "R_s": round(rs, 4), "gain": round(rs - r0, 4),
               "worst_drop": round(drops[worst], 4), "worst_question": worst, "questions": len(common)}
    if drops[worst] >= max_drop - 1e-9:
        return False, f"question {worst} dropped by {drops[worst]:.2f} (>= {max_drop:g})", figures
    if not rs > r0 + delta + 1e-9:
        return False, f"R_s {rs:.3f} is not above R_0 {r0:.3f} + delta {delta:g}", figures
    return True, f"R_s {rs:.3f} > R_0 {r0:.3f} + {delta:g}, no question dropped by {max_drop:g}", figures


# --- 1. mining --------------------------------------------------------------------------------------

def _schema_diagnosis(reason_max_chars: int) -> dict:
    return {"type": "object",
            "properties": {"category": {"type": "string", "enum": list(CATEGORIES)},
                           "reason": {"type": "string", "minLength": 1, "maxLength": reason_max_chars}},
            "required": ["category", "reason"], "additionalProperties": False}


def _parse_diagnosis(text: str) -> dict | None:
    data = first_json_object(text or "")
    if data is None or data.get("category") not in CATEGORIES:
        return None
    return {"category": data["category"], "reason": str(data.get("reason", ""))}


async def diagnose(model, record, answer, summary, config, episode_config) -> dict:
    """The model's diagnosis of one mining episode (schema-constrained where the backend can)."""
    from medclaw.requests.conversation import Conversation
    from medclaw.skills.prompts import DIAGNOSE_SYSTEM, diagnose_turn

    limit = min(config.reason_max_chars, episode_config.max_string_chars or config.reason_max_chars)
    conversation = Conversation(system=DIAGNOSE_SYSTEM)
    conversation.add_user(diagnose_turn(record, answer, summary))
    schema = _schema_diagnosis(limit) if model.supports_json_schema else None
    result = await model.generate_one(conversation.to_request(
        max_tokens=episode_config.orchestrator_max_tokens, temperature=0.0, json_schema=schema,
        request_id=f"diagnose-{record.id}"))
    parsed = _parse_diagnosis(result.text)
    return {"category": parsed["category"] if parsed else None,
            "reason": parsed["reason"] if parsed else "", "parsed": parsed is not None,
            "raw": result.text, "model": result.model_name, "revision": result.model_revision}


async def write_lesson(model, tool: SkillManageTool, record, answer, reason, summary,
                       config, episode_config) -> dict:
    """The lesson-writing loop: at most `lesson_steps` skill_manage calls, until one writes."""
    from medclaw.engine.episode import generation_schema
    from medclaw.engine.orchestrator_prompt import tool_section
    from medclaw.engine.toolcall import ActionError, parse_action
    from medclaw.requests.conversation import Conversation
    from medclaw.skills.prompts import LESSON_SYSTEM, lesson_turn

    specs = [tool.spec()]
    conversation = Conversation(system=LESSON_SYSTEM + "\n\n" + tool_section(specs))
    listing = (await tool.run(None, {"action": "list"})).text      # the library, read first
    conversation.add_user(lesson_turn(record, answer, reason, summary, listing))
    schema = generation_schema(specs, episode_config, 0.0) if model.supports_json_schema else None
    actions = []
    for turn in range(config.lesson_steps):
        result = await model.generate_one(conversation.to_request(
            max_tokens=episode_config.orchestrator_max_tokens,
            temperature=episode_config.orchestrator_temperature, json_schema=schema,
            request_id=f"lesson-{record.id}-{turn + 1}"))
        conversation.add_assistant(result.text)
        action = parse_action(result.text, specs)
        if isinstance(action, ActionError):
            text, error, data = "", action.message, {}
        else:
            from medclaw.tools.base import ToolError

            try:
                obs = await tool.run(None, action.args)
                text, error, data = obs.text, obs.error, obs.data
            except ToolError as err:
                text, error, data = "", str(err), {}
        actions.append({"args": None if isinstance(action, ActionError) else action.args,
                        "result": error or text, "error": error is not None})
        if data.get("written"):
            return {"skill": data["skill"], "version": data["version"], "actions": actions}
        conversation.add_user(f"Error: {error}\nReply with one JSON object." if error
                              else f"Observation: {text}")
    return {"skill": None, "version": None, "actions": actions}


async def mine(records, runtime, episode_config, candidates: CandidateSet, out_dir: Path,
               config: DistillConfig, video_infos: dict | None = None, on_event=None) -> list[dict]:
    """Step 1 and 2 over the mining records (episodes concurrently, lessons in record order)."""
    from dataclasses import replace

    from medclaw.engine.episode import BatchItem, run_batch
    from medclaw.engine.trace import Trace
    from medclaw.eval.dataset import safe_id
    from medclaw.skills.prompts import episode_summary

    cfg = replace(episode_config, trace_dir=str(out_dir / "mine" / "traces"))
    items = [BatchItem(video=r.video, question=r.question, id=f"mine-{safe_id(r.id)}") for r in records]
    results = await run_batch(items, runtime, cfg, video_infos=video_infos)
    distiller = await runtime.get_backend("distiller")
    tool = SkillManageTool(candidates)
    rows = []
    for record, item, result in zip(records, items, results):
        row = {"id": record.id, "episode_id": item.id, "trace": result.trace_path,
               "status": result.status, "answer": result.answer}
        summary = "(no trace)"
        if result.trace_path and Path(result.trace_path).is_file():
            summary = episode_summary(Trace.load(result.trace_path))
        row["diagnosis"] = await diagnose(distiller, record, result.answer, summary, config, cfg)
        row["lesson"] = None
        if row["diagnosis"]["category"] == "A":
            tool.source = item.id
            row["lesson"] = await write_lesson(distiller, tool, record, result.answer,
                                               row["diagnosis"]["reason"], summary, config, cfg)
        rows.append(row)
        if on_event is not None:
            on_event(f"mined {record.id}: {row['diagnosis']['category'] or 'unparsed'}"
                     + (f" → {row['lesson']['skill']}" if row["lesson"] and row["lesson"]["skill"] else ""))
    return rows


# --- 3. gate ----------------------------------------------------------------------------------------

def check_reward_gold(reward: str, val_records) -> None:
    """ConfigError when `reward` is "exact" and a validation record has no exact gold
    (`gold_value`): the exact scorer could not score it."""
    from medclaw.errors import ConfigError

    missing = [r.id for r in val_records if r.gold_value is None] if reward == "exact" else []
    if missing:
        raise ConfigError(f"--reward exact needs exact gold (gold_value) on every validation "
                          f"question; {len(missing)} have none, e.g. {missing[0]}")


async def _val_pass(name: str, records, runtime, episode_config, judge, out_dir: Path,
                    video_infos, reward: str = "judge") -> dict[str, float]:
    from dataclasses import replace

    from medclaw.eval.results import ResultsLog
    from medclaw.eval.runner import evaluate

    folder = out_dir / "val" / name
    cfg = replace(episode_config, trace_dir=str(folder / "traces"))
    with ResultsLog.open(folder / "results.jsonl", resume=False) as log:
        outcome = await evaluate(records, runtime, cfg, judge, log, mode="agent",
                                 concurrency=cfg.concurrency, video_infos=video_infos,
                                 id_prefix=f"{name}-")
        if outcome.crashed:
            raise RuntimeError(f"validation pass {name!r}: {len(outcome.crashed)} question(s) "
                               f"crashed: {next(iter(outcome.crashed.values()))}")
        return {qid: REWARDS[reward](row) for qid, row in log.done.items()}


async def distill(mine_records, val_records, runtime, episode_config, judge, *, library_dir,
                  out_dir, config: DistillConfig, run_id: str | None = None,
                  video_infos: dict | None = None, on_event=None) -> DistillReport:
    """The whole method (see module docstring); engines of `runtime` are reused throughout."""
    library_dir, out_dir = Path(library_dir), Path(out_dir)
    check_reward_gold(config.reward, val_records)
    library_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S")
    say = on_event or (lambda line: None)
    base = SkillLibrary([library_dir])
    use_library(runtime, base)
    candidates = CandidateSet(base, config.max_candidates, created_by=f"distillation:{run_id}")
    mining = await mine(mine_records, runtime, episode_config, candidates, out_dir, config,
                        video_infos, on_event=say)
    (out_dir / "mine").mkdir(parents=True, exist_ok=True)
    (out_dir / "mine" / "mining.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in mining))

    report = DistillReport(run_id=run_id, library=str(library_dir), R_0=None, mining=mining,
                           reward=config.reward)
    if not candidates.candidates:
        say("no candidate skills (no A diagnosis produced a lesson)")
        return _finish(report, out_dir)
    say("validation pass R_0 (library as it is)")
    base_scores = await _val_pass("base", val_records, runtime, episode_config, judge, out_dir,
                                  video_infos, config.reward)
    report.R_0 = round(sum(base_scores.values()) / len(base_scores), 4) if base_scores else None
    kept = []
    for name, candidate in candidates.candidates.items():
        skill = candidate.skill
        verdict = Verdict(name=name, version=skill.version, base_version=candidate.base_version,
                          sources=list(candidate.sources), description=skill.description,
                          trigger=skill.trigger)
        say(f"validation pass with candidate {name} v{skill.version}")
        try:
            with staged_library([library_dir], [skill]) as staged:
                use_library(runtime, staged)
                scores = await _val_pass(f"{name}-v{skill.version}", val_records, runtime,
                                         episode_config, judge, out_dir, video_infos, config.reward)
        finally:
            use_library(runtime, base)
        verdict.kept, verdict.reason, figures = gate(base_scores, scores, config.delta, config.max_drop)
        for key, value in figures.items():
            setattr(verdict, key, value)
        say(f"{name}: {'kept' if verdict.kept else 'rejected'} ({verdict.reason})")
        report.verdicts.append(verdict)
        if verdict.kept:
            kept.append((verdict, candidate))
    for verdict, candidate in kept:                   # 4. install with provenance, archive old
        from dataclasses import replace

        skill = replace(candidate.skill, provenance={
            "run_id": run_id, "source_traces": list(candidate.sources), "R_0": verdict.R_0,
            "R_s": verdict.R_s, "reward": config.reward, "delta": config.delta,
            "val_questions": verdict.questions,
            "date": time.strftime("%Y-%m-%d"), "previous_version": candidate.base_version})
        verdict.path = str(base.install(skill, library_dir))
    use_library(runtime, SkillLibrary([library_dir]))
    return _finish(report, out_dir)


def _finish(report: DistillReport, out_dir: Path) -> DistillReport:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "distill_report.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    (out_dir / "distill_report.md").write_text(to_markdown(report) + "\n")
    return report


REWARD_WORDS = {"judge": "the judge's Avg of CI, DO, CU, TU (1-5)",
                "exact": "exact match on the judge's scale (1 wrong, 5 right)"}


def to_markdown(report: DistillReport) -> str:
    counts = {c: sum(1 for m in report.mining if m["diagnosis"]["category"] == c) for c in CATEGORIES}
    unparsed = sum(1 for m in report.mining if m["diagnosis"]["category"] is None)
    lines = [f"# Skill distillation {report.run_id}", "",
             f"- library: `{report.library}`",
             f"- mining: {len(report.mining)} question(s): A {counts['A']}, B {counts['B']}, "
             f"C {counts['C']}, unparsed {unparsed}",
             f"- R per question: {REWARD_WORDS[report.reward]}",
             f"- R_0 (validation, library as it was): "
             f"{'–' if report.R_0 is None else f'{report.R_0:.3f}'}", ""]
    if not report.verdicts:
        lines.append("No candidate skill was proposed.")
        return "\n".join(lines)
    lines += ["| candidate | version | updates | sources | R_0 | R_s | gain | worst drop | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for v in report.verdicts:
        fmt = lambda x: "–" if x is None else f"{x:.3f}"       # noqa: E731
        drop = "–" if v.worst_drop is None else f"{v.worst_drop:.2f} ({v.worst_question})"
        lines.append(f"| {v.name} | {v.version} | {'v' + str(v.base_version) if v.base_version else 'new'} "
                     f"| {len(v.sources)} | {fmt(v.R_0)} | {fmt(v.R_s)} | {fmt(v.gain)} | {drop} "
                     f"| {'kept' if v.kept else 'rejected'}: {v.reason} |")
    return "\n".join(lines)
