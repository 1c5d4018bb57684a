"""The auditable record of one episode: one JSONL file, written as the episode runs.

Layout (one JSON object per line, each with a `type`):

- `header` — format version, episode id, question, video (path, sha256, probe facts), the episode
  config, and every model by role (name, local path, backend, revision when known);
- `step` (one per orchestrator turn) — tool, args, thought, raw orchestrator output, observation
  text or error, the evidence `FrameRef`s (frame indices, timestamps, video sha256, crop box), every
  sub-agent model call behind the step, the orchestrator call itself (model + revision, prompt /
  completion / cached tokens, latency) and the budget state after the step;
- `footer` — answer, status (`answered`, `forced_answer`, `failed: <why>`), evidence times and
  totals (tokens, cached-token hit rate, frames, visual tokens, wall time).

`TraceWriter` flushes after every line, so a crash loses at most the step in progress, and a
failed episode still gets its footer (the episode loop writes it before re-raising). `Trace.load`
reads a file back, tolerating a missing footer (a process that was killed).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from medclaw.types import FrameRef, GenResult

TRACE_FORMAT = "medclaw-trace/1"


@dataclass(slots=True)
class Step:
    index: int                              # 1-based orchestrator turn
    kind: str = "action"                    # "action" | "forced_answer"
    tool: str | None = None                 # None when the output could not be parsed
    args: dict = field(default_factory=dict)
    thought: str = ""
    raw_output: str = ""                    # the orchestrator's text, verbatim
    observation: str = ""
    error: str | None = None                # for the model: malformed output, bad args, tool error
    frames: list[FrameRef] = field(default_factory=list)
    model_calls: list[GenResult] = field(default_factory=list)   # sub-agent calls of the tool
    orchestrator_call: GenResult | None = None
    data: dict = field(default_factory=dict)                     # tool's structured extras
    started_at_s: float = 0.0               # seconds since episode start
    tool_latency_s: float = 0.0
    budget: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "type": "step",
            "index": self.index,
            "kind": self.kind,
            "tool": self.tool,
            "args": self.args,
            "thought": self.thought,
            "raw_output": self.raw_output,
            "observation": self.observation,
            "error": self.error,
            "frames": [f.to_dict() for f in self.frames],
            "model_calls": [c.to_dict() for c in self.model_calls],
            "orchestrator_call": self.orchestrator_call.to_dict() if self.orchestrator_call else None,
            "data": _jsonable(self.data),
            "started_at_s": round(self.started_at_s, 4),
            "tool_latency_s": round(self.tool_latency_s, 4),
            "budget": self.budget,
        }


@dataclass(slots=True)
class Trace:
    """A whole episode in memory (as written, or as read back by `Trace.load`)."""

    header: dict
    steps: list[dict] = field(default_factory=list)      # Step.to_dict() rows
    footer: dict | None = None                           # None: the episode never finished

    def to_dict(self) -> dict:
        return {"header": self.header, "steps": self.steps, "footer": self.footer}

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        from medclaw.errors import MedClawError
        from medclaw.jsonl import iter_objects

        path = Path(path)
        if not path.is_file():
            raise MedClawError(f"trace file not found: {path}")
        header, steps, footer = None, [], None
        # A killed writer can leave a torn last line: dropped, the steps before it still count.
        for _, row in iter_objects(path, MedClawError, hint="is this a medclaw trace?",
                                   torn_tail_ok=True):
            kind = row.get("type")
            if kind == "header":
                header = row
            elif kind == "step":
                steps.append(row)
            elif kind == "footer":
                footer = row
        if header is None or header.get("format") != TRACE_FORMAT:
            raise MedClawError(f"{path}: no {TRACE_FORMAT} header; is this a medclaw trace?")
        return cls(header=header, steps=steps, footer=footer)


def compute_totals(steps: list[Step], *, visual_tokens_used: int, wall_s: float) -> dict:
    """Token, cache, frame and timing totals over the steps of one episode."""
    orch = [s.orchestrator_call for s in steps if s.orchestrator_call is not None]
    subs = [c for s in steps for c in s.model_calls]

    def tally(calls: list[GenResult]) -> dict:
        prompt = sum(c.num_prompt_tokens for c in calls)
        cached = sum(c.num_cached_tokens for c in calls)
        return {"calls": len(calls), "prompt_tokens": prompt,
                "completion_tokens": sum(c.num_completion_tokens for c in calls),
                "cached_tokens": cached,
                "cached_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
                "latency_s": round(sum(c.latency_s for c in calls), 4)}

    all_calls = tally(orch + subs)
    tools: dict[str, int] = {}
    for s in steps:
        if s.tool:
            tools[s.tool] = tools.get(s.tool, 0) + 1
    frames = {(f.video_sha256, f.frame_index) for s in steps for f in s.frames}
    return {
        "steps": len(steps),
        "errors": sum(1 for s in steps if s.error),
        "tools": tools,
        "orchestrator": tally(orch),
        "sub_agents": tally(subs),
        "all_models": all_calls,
        "cached_hit_rate": all_calls["cached_hit_rate"],
        "unique_frames": len(frames),
        "frame_refs": sum(len(s.frames) for s in steps),
        "visual_tokens_used": visual_tokens_used,
        "wall_s": round(wall_s, 3),
        "model_revisions": sorted({f"{c.model_name}@{c.model_revision}" for c in orch + subs}),
    }


class TraceWriter:
    """Append-only JSONL writer; one line per record, flushed immediately."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")
        except OSError as err:         # a bad --trace-dir is the user's input, not our bug
            from medclaw.errors import ConfigError

            raise ConfigError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        self.closed = False

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(_jsonable(record), ensure_ascii=False) + "\n")
        self._file.flush()

    def header(self, **fields) -> None:
        self.write({"type": "header", "format": TRACE_FORMAT, "created_at": _now_iso(), **fields})

    def step(self, step: Step) -> None:
        self.write(step.to_dict())

    def footer(self, **fields) -> None:
        self.write({"type": "footer", "ended_at": _now_iso(), **fields})
        self.close()

    def close(self) -> None:
        if not self.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self.closed = True


def trace_path_for(trace_dir: str | Path, episode_id: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in episode_id)[:80] or "episode"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(trace_dir) / f"{stamp}-{safe}.jsonl"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _jsonable(value):
    """Tuples → lists, dataclasses with to_dict → dicts, anything else unknown → str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    if hasattr(value, "tolist"):                 # numpy scalars / small arrays in tool data
        return value.tolist()
    return str(value)
