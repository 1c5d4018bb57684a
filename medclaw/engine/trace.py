"""The auditable record of one episode: one JSONL file, written as the episode runs, read back typed.

Reading (evaluation, the audit viewer and `medclaw trace show` read traces only through this):

    trace = Trace.load(path)          # validated; MedClawError (one line) if it is not a trace
    trace.header.video.sha256         # Header: question, video, models + revisions, config and
                                      #   its sha256, seed, skills, system prompt + sha256, version
    for step in trace.steps:          # Step: tool, args, thought, raw output, observation/error,
        step.frames                   #   FrameRef (video sha256, frame index, pts time, size, crop)
        step.model_calls              #   ModelCall per sub-agent call (model, revision, tokens,
        step.orchestrator_call        #   cached tokens, latency), and the orchestrator's own call
        step.windows                  #   TimeWindow spans inspected / named, for a timeline
    trace.footer                      # Footer (answer, status, totals) or None if killed
    trace.is_complete                 # False: no footer (the writer was killed mid-episode)
    trace.records()                   # header, steps, footer in file order (a replay)
    trace.to_messages()               # the orchestrator's conversation, replayed exactly
    trace.to_dict() / to_json()       # the validated trace as one JSON object

The record types, `TRACE_FORMAT` and the on-disk layout are in `medclaw.engine.trace_schema` and
re-exported here. Loading checks, besides each record's fields: a header first and in the current
format, consecutive step indices, nothing after the footer. A torn last line (a writer killed
mid-line) is dropped; the steps before it still count.

Writing: `TraceWriter(path)` creates the file exclusively (O_EXCL): when the name is taken (the
same episode id twice in one second) it takes the next free `-2`, `-3`… name and `writer.path`
says which — an audit trail is never overwritten. Every record goes through the same models the
reader uses, one line each, flushed at once, so a crash loses at most the step in progress; a
failed episode still gets its footer (the episode loop writes it before re-raising).
"""
from __future__ import annotations

import functools
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from medclaw.engine.trace_schema import (
    TRACE_FORMAT, BudgetState, CallTally, Footer, FrameRef, Header, ModelCall, ModelInfo, Record,
    SkillRef, Step, TimeWindow, Totals, VideoRecord, config_digest, jsonable, sha256_text,
    step_windows,
)
from medclaw.errors import MedClawError

__all__ = [
    "TRACE_FORMAT", "Trace", "TraceWriter", "Header", "Step", "Footer", "FrameRef", "ModelCall",
    "ModelInfo", "SkillRef", "TimeWindow", "VideoRecord", "BudgetState", "CallTally", "Totals",
    "Record", "compute_totals", "episode_header", "trace_path_for", "config_digest", "sha256_text",
    "step_windows", "software_version",
]

NOT_A_TRACE = "is this a medclaw trace?"
ROW_TYPES = {"header": Header, "step": Step, "footer": Footer}


class Trace(BaseModel):
    """A whole episode (as written, or as read back by `Trace.load`)."""

    header: Header
    steps: list[Step] = []
    footer: Footer | None = None         # None: the episode never finished (killed process)

    @property
    def is_complete(self) -> bool:
        return self.footer is not None

    def to_dict(self) -> dict:
        return {**self.model_dump(mode="json"), "complete": self.is_complete}

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def records(self) -> Iterator[Record]:
        """Header, steps, footer (when there is one), in file order: a replay of the run."""
        yield self.header
        yield from self.steps
        if self.footer is not None:
            yield self.footer

    def to_messages(self) -> list[dict]:
        """The orchestrator's conversation as its last call saw it, plus that call's reply:
        system prompt, then per step the user turn and the assistant reply (chat-message dicts
        in the shape `Conversation` builds)."""
        return [message for record in self.records() for message in record.to_messages()]

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        from medclaw.jsonl import iter_objects

        path = Path(path)
        if not path.is_file():
            raise MedClawError(f"trace file not found: {path}")
        header, steps, footer = None, [], None
        for number, row in iter_objects(path, MedClawError, hint=NOT_A_TRACE, torn_tail_ok=True):
            where = f"{path}:{number}"
            kind = row.get("type")
            if header is None:
                if kind != "header" or row.get("format") != TRACE_FORMAT:
                    found = f" (found {row['format']!r})" if isinstance(row.get("format"), str) else ""
                    raise MedClawError(f"{where}: no {TRACE_FORMAT} header{found}; {NOT_A_TRACE}")
                header = _validate(Header, row, where)
                continue
            if footer is not None:
                raise MedClawError(f"{where}: a {kind!r} line after the footer; {NOT_A_TRACE}")
            if kind not in ("step", "footer"):
                raise MedClawError(f"{where}: unknown line type {kind!r}; {NOT_A_TRACE}")
            record = _validate(ROW_TYPES[kind], row, where)
            if kind == "footer":
                footer = record
            elif record.index != len(steps) + 1:
                raise MedClawError(f"{where}: step {record.index} where step {len(steps) + 1} "
                                   f"was due; {NOT_A_TRACE}")
            else:
                steps.append(record)
        if header is None:
            raise MedClawError(f"{path}: no {TRACE_FORMAT} header (empty file); {NOT_A_TRACE}")
        return cls(header=header, steps=steps, footer=footer)


def _validate(model: type[Record], row: dict, where: str) -> Record:
    try:
        return model.model_validate(row)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(record)"
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        message = " ".join(str(first["msg"]).split())
        raise MedClawError(f"{where}: bad {row.get('type')} record: {field}: {message}{more}; "
                           f"{NOT_A_TRACE}") from None


class TraceWriter:
    """Append-only JSONL writer over the schema's records; one line each, flushed immediately."""

    def __init__(self, path: str | Path):
        try:
            self._file, self.path = _create_exclusive(Path(path))
        except OSError as err:         # a bad --trace-dir is the user's input, not our bug
            from medclaw.errors import ConfigError

            raise ConfigError(f"cannot write trace {path}: {err.strerror or err}") from None
        self.closed = False

    def write(self, record: Record) -> None:
        self._file.write(record.model_dump_json() + "\n")
        self._file.flush()

    def header(self, header: Header | None = None, **fields) -> Header:
        header = header or Header(**fields)
        self.write(header)
        return header

    def step(self, step: Step) -> None:
        self.write(step)

    def footer(self, footer: Footer | None = None, **fields) -> Footer:
        footer = footer or Footer(**fields)
        self.write(footer)
        self.close()
        return footer

    def close(self) -> None:
        if not self.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self.closed = True


def _create_exclusive(path: Path, attempts: int = 1000):
    """Open a new file at `path`, or at `stem-2`, `stem-3`… when taken; never truncate one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, attempts + 1):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            return open(candidate, "x", encoding="utf-8"), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{attempts} trace files named {path.stem}-* already exist")


def trace_path_for(trace_dir: str | Path, episode_id: str) -> Path:
    """The preferred file name (a per-second stamp + the sanitised id); `TraceWriter` moves to
    the next free name when it is taken."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in episode_id)[:80] or "episode"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(trace_dir) / f"{stamp}-{safe}.jsonl"


# --- building records -------------------------------------------------------------------------

def episode_header(*, episode_id: str, question: str, video, config, runtime, system_prompt: str,
                   tools: Iterable[str], seed: int | None) -> Header:
    """The header of one episode: `video` a VideoInfo, `config` an EpisodeConfig, `runtime` the
    engine Runtime (model specs, identities, skills)."""
    config_dict = jsonable(config.to_dict())
    model_specs = {role: jsonable(spec.to_dict()) for role, spec in runtime.specs.items()}
    skills = runtime.skills
    skill_refs = [SkillRef(name=name, version=skills.get(name).version)
                  for name in (skills.names() if skills is not None else [])]
    version, describe = software_version()
    return Header(
        episode_id=episode_id, question=question, video=VideoRecord.model_validate(video),
        medclaw_version=version, git_describe=describe, seed=seed,
        config=config_dict, model_specs=model_specs,
        config_sha256=config_digest(config_dict, model_specs),
        models=runtime.model_info(), tools=list(tools), skills=skill_refs,
        system_prompt=system_prompt, system_prompt_sha256=sha256_text(system_prompt))


@functools.lru_cache(maxsize=1)
def software_version() -> tuple[str, str | None]:
    """(package version, `git describe --always --dirty` when medclaw runs from a git checkout,
    else None). Never raises: no git, no checkout, a slow or failing git all give None."""
    import medclaw

    root = Path(medclaw.__file__).resolve().parent.parent
    describe = None
    if (root / ".git").exists():     # our own checkout, not some repository we are installed in
        try:
            done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                  capture_output=True, text=True, timeout=10, check=False)
            if done.returncode == 0 and done.stdout.strip():
                describe = done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return medclaw.__version__, describe


def compute_totals(steps: list[Step], *, visual_tokens_used: int, wall_s: float) -> Totals:
    """Token, cache, frame and timing totals over the steps of one episode."""
    orch = [s.orchestrator_call for s in steps if s.orchestrator_call is not None]
    subs = [c for s in steps for c in s.model_calls]

    def tally(calls: list[ModelCall]) -> CallTally:
        prompt = sum(c.num_prompt_tokens for c in calls)
        cached = sum(c.num_cached_tokens for c in calls)
        return CallTally(calls=len(calls), prompt_tokens=prompt,
                         completion_tokens=sum(c.num_completion_tokens for c in calls),
                         cached_tokens=cached,
                         cached_hit_rate=round(cached / prompt, 4) if prompt else 0.0,
                         latency_s=round(sum(c.latency_s for c in calls), 4))

    all_calls = tally(orch + subs)
    tools: dict[str, int] = {}
    for s in steps:
        if s.tool:
            tools[s.tool] = tools.get(s.tool, 0) + 1
    frames = {(f.video_sha256, f.frame_index) for s in steps for f in s.frames}
    return Totals(
        steps=len(steps), errors=sum(1 for s in steps if s.error), tools=tools,
        orchestrator=tally(orch), sub_agents=tally(subs), all_models=all_calls,
        cached_hit_rate=all_calls.cached_hit_rate, unique_frames=len(frames),
        frame_refs=sum(len(s.frames) for s in steps), visual_tokens_used=visual_tokens_used,
        wall_s=round(wall_s, 3),
        model_revisions=sorted({f"{c.model_name}@{c.model_revision}" for c in orch + subs}))
