"""The trace schema: one pydantic model per record kind, versioned by `TRACE_FORMAT`.

A trace file is JSON Lines, one record per line, in this order:

    Header                     once, first
    Step                       one per orchestrator turn (index 1, 2, …)
    Footer                     once, last — absent when the process was killed mid-episode

Nested records: `VideoRecord` (the probed video), `ModelInfo` (a role's model identity),
`SkillRef` (a skill name + version), `FrameRef` (one frame a model looked at), `ModelCall` (one
generation call: model name + revision, prompt / completion / cached tokens, latency, time to
first token), `TimeWindow` (a span of video time a step inspected or named), `BudgetState` and
`Totals`.

Every record is validated when built (the writer cannot write what the reader would refuse) and
when read back. `Record` subclasses read by attribute (`step.frames[0].timestamp_s`); they also
answer `record["name"]`, `record.get(name)` and `name in record` like the JSON rows of format 1,
so code written against the dict shape keeps working. `to_dict()` is the JSON row.

This module holds the types only; `medclaw.engine.trace` writes and reads files with them.
Changing a field's meaning or removing one needs a new `TRACE_FORMAT`; adding an optional field
does not (readers older than the field refuse files that carry it: unknown fields are errors).
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import (
    BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator,
)

TRACE_FORMAT = "medclaw-trace/2"


class Record(BaseModel):
    """Base of every trace record: strict about unknown fields, built from dataclasses too."""

    # from_attributes: the engine's dataclasses (FrameRef, GenResult, VideoInfo) validate into
    # records directly; validate_assignment: a step filled in field by field stays valid.
    model_config = ConfigDict(extra="forbid", from_attributes=True, validate_assignment=True)

    def __getitem__(self, name: str) -> Any:
        if name not in type(self).model_fields and name not in type(self).model_computed_fields:
            raise KeyError(name)
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in type(self).model_fields
                                          or name in type(self).model_computed_fields)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def to_dict(self) -> dict:
        """The JSON row (plain dicts, lists and scalars)."""
        return self.model_dump(mode="json")


# --- nested records ---------------------------------------------------------------------------

class VideoRecord(Record):
    """What the probe learned about the video (`medclaw.types.VideoInfo`)."""

    path: str
    sha256: str                     # of the file's bytes
    duration_s: float
    fps: float
    num_frames: int
    width: int
    height: int
    codec: str
    rotation: int = 0
    is_variable_fps: bool = False
    start_s: float = 0.0            # pts of the first frame; video time 0 is this frame
    fps_is_assumed: bool = False    # no timestamps in the stream: frames timed at `fps`


class ModelInfo(Record):
    """The model serving one role (`Runtime.model_info()`); extra identity keys are kept."""

    model_config = ConfigDict(extra="allow")

    name: str
    path: str
    backend: str
    architecture: str = ""
    revision: str | None = None     # the backend's, else the store's hash; None when unknown
    quantization: str | None = None  # what the engine loaded (bnb-4bit, awq, …); None: full precision
    shared_with: list[str] = Field(default_factory=list)   # roles served by the same engine


class SkillRef(Record):
    name: str
    version: int


class FrameRef(Record):
    """One frame a model looked at (`medclaw.types.FrameRef`): enough to find it again."""

    video_sha256: str
    frame_index: int = Field(ge=0)  # index in presentation order
    timestamp_s: float              # video time from the frame's pts: pts × time base − start_s
    width: int                      # size the model saw
    height: int
    crop_box: tuple[float, float, float, float] | None = None   # normalised (x1, y1, x2, y2)


class ModelCall(Record):
    """One generation call (`medclaw.types.GenResult`): an orchestrator turn or a sub-agent."""

    model_name: str
    model_revision: str | None = None
    text: str = ""                  # the reply, verbatim
    num_prompt_tokens: int = Field(0, ge=0)
    num_completion_tokens: int = Field(0, ge=0)
    num_cached_tokens: int = Field(0, ge=0)   # prompt tokens served from the prefix cache
    latency_s: float = 0.0
    finish_reason: str = ""
    reasoning: str = ""             # <think> content of reasoning models
    ttft_s: float | None = Field(None, ge=0)   # time to first token; None: not measured


class TimeWindow(Record):
    """A span of video time a step is about, for drawing on a timeline.

    `kind` "inspected": the span of the frames one model call was shown (from the step's frames);
    any other kind is the name of a `[start_s, end_s]` pair in the tool's `data` ("window",
    "candidate_window", "search_window", "refined_window"), whose meaning the tool documents.
    """

    kind: str
    start_s: float
    end_s: float
    num_frames: int = 0             # frames behind an "inspected" window; 0 for named windows


class BudgetState(Record):
    """What was spent after a step (`Budget.to_dict()`); unknown extra keys are kept."""

    model_config = ConfigDict(extra="allow")

    steps_used: int = 0
    max_steps: int = 0
    visual_tokens_used: int = 0
    visual_token_budget: int = 0
    elapsed_s: float = 0.0
    max_wall_s: float = 0.0
    context_tokens: int = 0
    max_context_tokens: int = 0


class CallTally(Record):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_hit_rate: float = 0.0
    latency_s: float = 0.0


class Totals(Record):
    """Episode totals (`medclaw.engine.trace.compute_totals`)."""

    steps: int = 0
    errors: int = 0
    tools: dict[str, int] = Field(default_factory=dict)     # tool → calls
    orchestrator: CallTally = Field(default_factory=CallTally)
    sub_agents: CallTally = Field(default_factory=CallTally)
    all_models: CallTally = Field(default_factory=CallTally)
    cached_hit_rate: float = 0.0
    unique_frames: int = 0
    frame_refs: int = 0
    visual_tokens_used: int = 0
    wall_s: float = 0.0
    model_revisions: list[str] = Field(default_factory=list)   # "name@revision"


# --- the three line kinds ---------------------------------------------------------------------

class Header(Record):
    """Everything fixed before the first step: what was asked, of which video, with what."""

    type: Literal["header"] = "header"
    format: Literal[TRACE_FORMAT] = TRACE_FORMAT
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    episode_id: str
    question: str
    video: VideoRecord
    medclaw_version: str
    git_describe: str | None = None     # `git describe --always --dirty` of a source checkout
    seed: int | None = None             # sampling seed of the episode's requests
    config: dict[str, Any]              # the resolved EpisodeConfig
    model_specs: dict[str, dict[str, Any]] = Field(default_factory=dict)   # role → ModelSpec
    config_sha256: str                  # config_digest(config, model_specs)
    models: dict[str, ModelInfo]
    tools: list[str]
    skills: list[SkillRef] = Field(default_factory=list)
    system_prompt: str
    system_prompt_sha256: str

    @model_validator(mode="after")
    def _hashes_match(self) -> "Header":
        # A header whose hashes disagree with its own content was edited or corrupted: refuse it.
        if sha256_text(self.system_prompt) != self.system_prompt_sha256:
            raise ValueError("system_prompt_sha256 does not match the system prompt")
        if config_digest(self.config, self.model_specs) != self.config_sha256:
            raise ValueError("config_sha256 does not match config + model_specs")
        return self

    def to_messages(self) -> list[dict]:
        """The system message every orchestrator call opened with."""
        return [_message("system", self.system_prompt)]


class Step(Record):
    """One orchestrator turn: the call, the action it chose, and what the tool returned.

    `prompt_turn` is the user turn this call answered (the question, the previous observation,
    or the forced-answer order), so `to_messages` renders the turn back exactly.
    """

    type: Literal["step"] = "step"
    index: int = Field(ge=1)            # 1-based orchestrator turn
    kind: Literal["action", "forced_answer"] = "action"
    tool: str | None = None             # None when the output could not be parsed
    args: dict[str, Any] = Field(default_factory=dict)
    thought: str = ""
    prompt_turn: str = ""
    raw_output: str = ""                # the orchestrator's reply, verbatim
    observation: str = ""
    error: str | None = None            # for the model: malformed output, bad args, tool error
    frames: list[FrameRef] = Field(default_factory=list)
    model_calls: list[ModelCall] = Field(default_factory=list)   # the tool's sub-agent calls
    orchestrator_call: ModelCall | None = None   # None: the call was cancelled (wall time)
    data: dict[str, Any] = Field(default_factory=dict)           # the tool's structured extras
    started_at_s: float = 0.0           # seconds since the episode started
    tool_latency_s: float = 0.0
    budget: BudgetState | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, value: Any) -> Any:
        # `windows` is written for readers of the raw JSON; Python derives it again.
        if isinstance(value, dict) and "windows" in value:
            value = {k: v for k, v in value.items() if k != "windows"}
        return value

    @field_validator("args", "data", mode="before")
    @classmethod
    def _plain_json(cls, value: Any) -> Any:
        return jsonable(value)

    @computed_field
    @property
    def windows(self) -> list[TimeWindow]:
        """Time spans this step inspected or named (see `TimeWindow`)."""
        return step_windows(self.frames, self.data)

    def to_messages(self) -> list[dict]:
        """The turn as the orchestrator's conversation holds it: [user prompt_turn, assistant
        reply]; empty when the call was cancelled (no reply; the next step re-sends the turn)."""
        if self.orchestrator_call is None:
            return []
        return [_message("user", self.prompt_turn), _message("assistant", self.raw_output)]


class Footer(Record):
    """How the episode ended: `status` is "answered", "forced_answer" or "failed: <why>"."""

    type: Literal["footer"] = "footer"
    ended_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    status: str
    answer: str | None = None
    evidence_times: list[float] = Field(default_factory=list)
    forced_reason: str | None = None    # which budget (or failure streak) forced the answer
    totals: Totals = Field(default_factory=Totals)
    error: str | None = None            # traceback of a failure in our code

    def to_messages(self) -> list[dict]:
        """Nothing: the final answer is the last step's reply."""
        return []

    @property
    def outcome(self) -> str:
        """"answered", "forced_answer" or "failed"."""
        return self.status.split(":", 1)[0]


# --- helpers ----------------------------------------------------------------------------------

def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_digest(config: dict, model_specs: dict) -> str:
    """sha256 of the resolved configuration (episode config + every role's model spec), over
    canonical JSON (sorted keys, no whitespace), so equal configs give equal digests."""
    canonical = json.dumps({"episode": jsonable(config), "models": jsonable(model_specs)},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sha256_text(canonical)


def step_windows(frames: list[FrameRef], data: dict) -> list[TimeWindow]:
    """"inspected" spans from the frames, then the tool's named windows from `data`.

    A tool that shows models several clips in one step (view_full_video: the whole video, then
    a re-watched window) lists each clip's frame count in `data["stage_frames"]`, in the order
    of `frames`; otherwise all the step's frames are one clip.
    """
    windows: list[TimeWindow] = []
    counts = data.get("stage_frames")
    if not (isinstance(counts, list) and all(isinstance(c, int) and c > 0 for c in counts)
            and sum(counts) == len(frames)):
        counts = [len(frames)] if frames else []
    start = 0
    for count in counts:
        clip = frames[start:start + count]
        start += count
        times = [f.timestamp_s for f in clip]
        windows.append(TimeWindow(kind="inspected", start_s=min(times), end_s=max(times),
                                  num_frames=len(clip)))
    for key, value in data.items():
        if (key == "window" or key.endswith("_window")) and _is_pair(value):
            windows.append(TimeWindow(kind=key, start_s=float(value[0]), end_s=float(value[1])))
    return windows


def _is_pair(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


def _message(role: str, text: str) -> dict:
    """A chat message in the shape `medclaw.requests.conversation.Conversation` builds."""
    return {"role": role, "content": [{"type": "text", "text": text}]}


def jsonable(value: Any) -> Any:
    """Tuples → lists, objects with to_dict → dicts, numpy scalars → numbers, else str."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    if hasattr(value, "tolist"):                 # numpy scalars / small arrays in tool data
        return value.tolist()
    return str(value)
