"""One agent episode: question + video → reason-act loop over the tools → answer + trace.

    result = await run_episode(question, video_path, runtime, config)

The loop, each step three verbs — *think* (one orchestrator call on the append-only
conversation, schema-constrained when the backend enforces JSON schemas), *act* (parse the
action, run the tool), *record* (append the observation as the next user turn, write the trace
step). It ends in exactly one of:

- `answered`       the orchestrator called final_answer;
- `forced_answer`  a budget (steps, visual tokens, wall time, the orchestrator's context window)
                   was spent, or the model failed N calls in a row: one last orchestrator call
                   constrained to final_answer (it gets `forced_answer_grace_s`);
- `failed: <why>`  no answer could be obtained (the forced call was unusable: the result says so),
                   or our code raised or an engine was lost (the registry lets only those out
                   of a tool) — then the trace is saved with that status and the exception
                   propagates, carrying `medclaw_trace = (trace path, steps)`.

Model mistakes (malformed JSON, unknown tool, bad arguments, a tool's `Observation.error`, any
exception a tool raised on the model's arguments, final_answer before `min_tool_steps`) are
appended as error observations and the loop continues. At most `max_steps` orchestrator calls are
made, a forced answer included (see `Budget`).
Every orchestrator call and tool run is bounded by the wall time left, so a stuck engine or
decoder is cancelled instead of hanging the episode. The generation schema is the tools' action
schema tightened per episode (`generation_schema`: times ≤ the video's duration, optional string /
array caps). The video is probed first (off the event loop), so a bad path fails in seconds,
before any engine is asked for; then `runtime.start()` makes every engine ready (a no-op once
done), and only then does the episode's clock start: budgets time the episode, not engine
start-up. `run_batch` runs many episodes concurrently on shared engines.
"""
from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from medclaw.engine.budget import Budget
from medclaw.engine.config import EpisodeConfig
from medclaw.engine.orchestrator_prompt import (
    build_question_turn, build_system_prompt, forced_answer_turn, format_observation,
)
from medclaw.engine.trace import (
    Step, TraceWriter, compute_totals, episode_header, trace_path_for,
)
from medclaw.requests.conversation import message_text
from medclaw.types import DEFAULT_SEED, Observation, VideoInfo

FINAL_TOOL = "final_answer"


@dataclass(slots=True)
class EpisodeResult:
    answer: str | None
    status: str                      # "answered" | "forced_answer" | "failed: <why>"
    steps: int
    trace_path: str | None
    episode_id: str = ""
    evidence_times: list = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    error: str | None = None         # one line when status is failed, else None

    def to_dict(self) -> dict:
        """The `medclaw ask --json` shape."""
        return {"answer": self.answer, "status": self.status, "steps": self.steps,
                "trace": self.trace_path, "error": self.error}

    @classmethod
    def from_exception(cls, err: BaseException, episode_id: str = "") -> "EpisodeResult":
        """The failed result of an episode that raised `err` (trace path and steps from the
        `medclaw_trace` it carries, when the episode had begun)."""
        from medclaw.errors import describe

        trace_path, steps = getattr(err, "medclaw_trace", (None, 0))
        return cls(answer=None, status=f"failed: {_one_line(describe(err))}", steps=steps,
                   trace_path=trace_path, episode_id=episode_id, error=_one_line(describe(err)))


StepCallback = Callable[[Step, "Budget"], None]


async def run_episode(question: str, video_path: str, runtime, config: EpisodeConfig, *,
                      episode_id: str | None = None, video_info: VideoInfo | None = None,
                      on_step: StepCallback | None = None) -> EpisodeResult:
    """Answer `question` about `video_path` with the engines of `runtime` (see module docstring)."""
    if not question or not question.strip():
        from medclaw.errors import MedClawError

        raise MedClawError("the question is empty")
    if video_info is None:
        from medclaw.kernels.probe import probe_video

        # Probing hashes the file and may run a decoder: keep it off the event loop so that
        # concurrent episodes keep going meanwhile.
        video_info = await asyncio.to_thread(probe_video, video_path)
    await runtime.start()           # engines first: the budget's clock starts after them
    episode_id = episode_id or uuid.uuid4().hex[:12]
    episode = _Episode(question, video_info, runtime, config, episode_id, on_step)
    return await episode.run()


class _Episode:
    """State of one running episode; `run` is the loop."""

    def __init__(self, question, video, runtime, config, episode_id, on_step):
        from medclaw.requests.conversation import Conversation
        from medclaw.tools.base import ToolContext

        self.question, self.video, self.runtime, self.config = question, video, runtime, config
        self.episode_id, self.on_step = episode_id, on_step
        self.registry = runtime.registry
        self.tool_specs = self.registry.specs()
        self.final_specs = [s for s in self.tool_specs if s["name"] == FINAL_TOOL]
        if not self.final_specs:
            raise RuntimeError(f"tool registry has no {FINAL_TOOL!r} tool")
        self.ctx = ToolContext(
            video=video, question=question, backends=runtime.backends_view(), specs=runtime.specs,
            frames=runtime.frames, knowledge_base=runtime.knowledge_base, skills=runtime.skills,
            visual_token_budget=config.visual_token_budget,
            sub_agent_max_tokens=config.sub_agent_max_tokens)
        orchestrator_spec = runtime.specs.get("orchestrator")
        self.budget = Budget(config=config, ctx=self.ctx, reply_tokens=config.orchestrator_max_tokens,
                             max_context_tokens=getattr(orchestrator_spec, "max_model_len", 0) or 0)
        skill_index = runtime.skills.index_text() if runtime.skills is not None else None
        self.system_prompt = build_system_prompt(self.tool_specs, skill_index)
        self.conversation = Conversation(system=self.system_prompt)
        self.conversation.add_user(build_question_turn(video, question))
        self.steps: list[Step] = []
        self.trace_path = trace_path_for(config.trace_dir, episode_id)
        self.writer: TraceWriter | None = None
        self.answer: str | None = None
        self.evidence_times: list = []
        self.forced_reason: str | None = None      # why the loop stopped early, if it did

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> EpisodeResult:
        self.writer = TraceWriter(self.trace_path)
        self.trace_path = self.writer.path       # the next free name if this one was taken
        self.writer.header(episode_header(
            episode_id=self.episode_id, question=self.question, video=self.video,
            config=self.config, runtime=self.runtime, system_prompt=self.system_prompt,
            tools=[s["name"] for s in self.tool_specs], seed=DEFAULT_SEED))
        try:
            status = await self._loop()
        except BaseException as err:         # our bug, or cancellation: save, then re-raise
            self._finish(f"failed: {type(err).__name__}: {_one_line(err)}",
                         error=traceback.format_exc(limit=8))
            try:                             # let batch runners report where the trace is
                err.medclaw_trace = (str(self.trace_path), len(self.steps))
            except AttributeError:
                pass
            raise
        self._finish(status)
        error = status.split(": ", 1)[1] if status.startswith("failed") else None
        return EpisodeResult(answer=self.answer, status=status, steps=len(self.steps),
                             trace_path=str(self.trace_path), episode_id=self.episode_id,
                             evidence_times=self.evidence_times, totals=self._totals(),
                             error=error)

    async def _loop(self) -> str:
        orchestrator = await self.runtime.get_backend("orchestrator")
        constrained = orchestrator.supports_json_schema
        schema = self._generation_schema(self.tool_specs) if constrained else None
        # Before `min_tool_steps` steps, final_answer is left out of the generation schema.
        gather_specs = [s for s in self.tool_specs if s["name"] != FINAL_TOOL]
        gather_schema = self._generation_schema(gather_specs) if constrained and gather_specs else schema
        failures = 0
        while True:
            reason = self.budget.exhausted()
            if reason is None and failures >= self.config.max_consecutive_failures:
                reason = f"{failures} failed tool calls in a row"
            if reason is not None:
                return await self._forced_answer(orchestrator, reason)
            early = len(self.steps) < min(self.config.min_tool_steps, self.config.max_steps - 1)
            step = await self._step(orchestrator, gather_schema if early else schema, self.tool_specs,
                                    kind="action", final_allowed=not early)
            if step.error is None and step.data.get("is_final"):
                return "answered"
            failures = failures + 1 if step.error else 0
            if step.orchestrator_call is None:       # cancelled: no reply to attach the turn to
                continue
            turn = format_observation(step.index, step.tool, _obs_of(step), self.budget.warning())
            self.conversation.add_user(turn)
            self.budget.context_tokens = _next_prompt_tokens(step.orchestrator_call, turn)

    async def _forced_answer(self, orchestrator, reason: str) -> str:
        self.forced_reason = reason
        schema = self._generation_schema(self.final_specs) if orchestrator.supports_json_schema else None
        self.conversation.add_user(forced_answer_turn(reason))
        step = await self._step(orchestrator, schema, self.final_specs, kind="forced_answer",
                                max_tokens=self.config.forced_answer_max_tokens)
        if step.error is None and step.data.get("is_final"):
            return "forced_answer"
        return f"failed: no usable answer after {reason} ({_one_line(step.error or 'no answer')})"

    def _generation_schema(self, specs: list[dict]) -> dict:
        return generation_schema(specs, self.config, self.video.duration_s)

    async def _step(self, orchestrator, schema, specs, *, kind, max_tokens=None,
                    final_allowed=True) -> Step:
        """Think (one orchestrator call), act (parse + tool), record (trace line)."""
        from medclaw.engine.toolcall import ActionError, parse_action

        step = Step(index=len(self.steps) + 1, kind=kind, started_at_s=self.budget.elapsed_s)
        grace = kind == "forced_answer"
        request = self.conversation.to_request(
            max_tokens=max_tokens or self.config.orchestrator_max_tokens,
            temperature=self.config.orchestrator_temperature, json_schema=schema,
            request_id=f"{self.episode_id}-s{step.index}")
        step.prompt_turn = _last_user_text(request)
        self.budget.steps_used += 1
        try:
            result = await self._bounded(orchestrator.generate_one(request), grace)
        except _WallTimeout:
            step.error = "the orchestrator call ran past the wall-time budget and was cancelled"
            return self._record(step)
        self.conversation.add_assistant(result.text)
        step.orchestrator_call, step.raw_output = result, result.text

        action = parse_action(result.text, specs)     # tolerant; never raises on model output
        if isinstance(action, ActionError):
            step.error = action.message
            return self._record(step)
        step.tool, step.args, step.thought = action.tool, action.args, action.thought
        if action.tool == FINAL_TOOL and not final_allowed:
            step.error = (f"{FINAL_TOOL} is not available yet: gather evidence with at least "
                          f"{self.config.min_tool_steps} tool call(s) first")
            return self._record(step)
        started = time.monotonic()
        try:
            obs = await self._bounded(self.registry.run(self.ctx, action.tool, action.args), grace)
        except _WallTimeout:
            obs = Observation(text="", error=f"{action.tool} ran past the wall-time budget and was cancelled")
        except BaseException as err:
            # A bug in a tool or a lost engine (the registry observes everything else): keep the
            # call that led to it in the trace, then let it propagate.
            from medclaw.errors import ABORT, LOST, describe, error_kind

            what = {LOST: "engine lost", ABORT: "cancelled"}.get(error_kind(err), "internal error")
            step.error = f"{what} in {action.tool}: {_one_line(describe(err))}"
            step.tool_latency_s = time.monotonic() - started
            self._record(step)
            raise
        step.tool_latency_s = time.monotonic() - started
        step.observation, step.error = obs.text, obs.error
        step.frames, step.model_calls, step.data = list(obs.frames), list(obs.model_calls), dict(obs.data)
        if obs.error is None and obs.data.get("is_final"):
            self.answer = obs.data.get("answer", obs.text)
            self.evidence_times = list(obs.data.get("evidence_times") or [])
        return self._record(step)

    async def _bounded(self, awaitable, grace: bool):
        """Await within the wall-time budget left (the forced answer gets its own grace period),
        so that a stuck engine or decoder can never hang the episode."""
        if grace:
            limit = self.config.forced_answer_grace_s
        else:
            limit = max(0.0, self.config.max_wall_s - self.budget.elapsed_s)
        try:
            async with asyncio.timeout(limit) as scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise _WallTimeout() from None
            raise

    def _record(self, step: Step) -> Step:
        step.budget = self.budget.to_dict()
        self.steps.append(step)
        self.writer.step(step)
        if self.on_step is not None:
            self.on_step(step, self.budget)
        return step

    # --- bookkeeping --------------------------------------------------------------------------
    def _totals(self) -> dict:
        return compute_totals(self.steps, visual_tokens_used=self.ctx.visual_tokens_used,
                              wall_s=self.budget.elapsed_s)

    def _finish(self, status: str, error: str | None = None) -> None:
        if self.writer is None or self.writer.closed:
            return
        fields = dict(answer=self.answer, status=status, evidence_times=self.evidence_times,
                      forced_reason=self.forced_reason, totals=self._totals())
        if error:
            fields["error"] = error
        self.writer.footer(**fields)


def generation_schema(tool_specs: list[dict], config: EpisodeConfig, duration_s: float) -> dict:
    """The schema the orchestrator's output is constrained to for one episode.

    `action_schema` over the tools, tightened: time fields (maximum = the tools' MAX_TIME_S) get
    the video's duration as maximum, and free strings / arrays the config's caps. Only generation
    is tightened; parsed arguments are still validated against each tool's own schema.
    """
    from medclaw.engine.toolcall import action_schema, schema_node_types, visit_schema
    from medclaw.tools.schema import MAX_TIME_S

    schema = action_schema(tool_specs, thought_max_chars=config.thought_max_chars)

    def tighten(node: dict) -> None:
        kinds = schema_node_types(node)
        if kinds & {"number", "integer"} and node.get("maximum") == MAX_TIME_S:
            node["maximum"] = round(float(duration_s), 3)
        if "string" in kinds and config.max_string_chars and "maxLength" in node:
            node["maxLength"] = min(node["maxLength"], config.max_string_chars)
            node["minLength"] = min(node.get("minLength", 0), node["maxLength"])
        if "array" in kinds and config.max_array_items and "maxItems" in node:
            node["maxItems"] = min(node["maxItems"], config.max_array_items)
            node["minItems"] = min(node.get("minItems", 0), node["maxItems"])

    visit_schema(schema, tighten)
    return schema


class _WallTimeout(Exception):
    """Our own wall-time limit expired (not a TimeoutError raised by the awaited code)."""


def _next_prompt_tokens(call, turn: str) -> int:
    """An upper bound on the next orchestrator prompt: this prompt and reply (exact counts from
    the engine) + the new turn at one token per UTF-8 byte — the worst case of a byte-level BPE
    (Qwen's tokenizers), reached by the garbage text of random-weight models. Only the newest turn
    is estimated, so the slack never accumulates."""
    return call.num_prompt_tokens + call.num_completion_tokens + len(turn.encode("utf-8")) + 16


def _last_user_text(request) -> str:
    """The text of the turn an orchestrator call answers (its last user message), for the trace."""
    message = next(m for m in reversed(request.messages) if m["role"] == "user")
    return message_text(message, sep="")


def _obs_of(step: Step) -> Observation:
    return Observation(text=step.observation, frames=step.frames, error=step.error)


def _one_line(value) -> str:
    text = " ".join(str(value).split())
    return text[:300]


# ------------------------------------------------------------------------------------- batches

@dataclass(slots=True)
class BatchItem:
    video: str
    question: str
    id: str = ""


async def run_batch(items: list[BatchItem], runtime, config: EpisodeConfig, *,
                    video_infos: dict[str, VideoInfo] | None = None,
                    on_result: Callable[[BatchItem, EpisodeResult], None] | None = None,
                    on_step: StepCallback | None = None) -> list[EpisodeResult]:
    """Run many episodes concurrently on the shared engines (at most `config.concurrency` at once).

    One failing item never sinks the others: a user-input error or a crash becomes that item's
    `failed: …` result (a crash's trace is already saved by the episode). Results come back in
    item order; `on_result` is called as each finishes.
    """
    limit = asyncio.Semaphore(config.concurrency)
    infos = video_infos or {}

    async def one(index: int, item: BatchItem) -> EpisodeResult:
        episode_id = item.id or f"item{index}-{uuid.uuid4().hex[:8]}"
        async with limit:
            try:
                result = await run_episode(item.question, item.video, runtime, config,
                                           episode_id=episode_id, video_info=infos.get(item.video),
                                           on_step=on_step)
            except asyncio.CancelledError:
                raise
            except Exception as err:     # noqa: BLE001 — isolate items; the trace keeps details
                result = EpisodeResult.from_exception(err, episode_id)
        if on_result is not None:
            on_result(item, result)
        return result

    return list(await asyncio.gather(*(one(i, item) for i, item in enumerate(items))))
