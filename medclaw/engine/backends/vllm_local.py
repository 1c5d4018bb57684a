"""In-process vLLM backend: one `AsyncLLM` engine per model, shared by every caller.

Contract:
- `VLLMBackend(spec)` starts the engine (blocking, ~40 s on CPU) on a dedicated background thread
  that runs its own asyncio loop. `await backend.generate(requests)` works from *any* event loop
  (test loops, the CLI's loop, server workers): each request is submitted to the engine loop with
  `run_coroutine_threadsafe` and awaited through `wrap_future`, so concurrent episodes land in one
  engine and vLLM batches them. Cancelling the awaiting task aborts the request in vLLM.
- Prompts are rendered with the model's own chat template (media parts become the vision
  placeholders), media travel as `multi_modal_data` (video: `(uint8 (T,H,W,3), metadata)`, image:
  uint8 (H,W,3)) with `multi_modal_uuids` = `MediaItem.uuid`, so prefix caching recognises a clip
  by identity, not pixels (docs/architecture.md rule 2). Prefix caching is on unless
  `extra.enable_prefix_caching` is false (the cache-off baseline of `medclaw bench e2e`).
- `GenRequest.json_schema` is enforced by xgrammar with `disable_any_whitespace=True` (without
  it random weights fill the grammar's whitespace until `max_tokens`).
- Fidelity: the engine's prompt token count must equal the planned one (`base.PromptPlan`);
  otherwise `FidelityError` (base.check_prompt_tokens).
- Each `GenResult` carries prompt / completion / cached tokens (`RequestOutput.num_cached_tokens`),
  latency, time to first token (submission → the first streamed output holding a token), the
  model name and `revision_hash(spec.path)`, the finish reason, and the answer / reasoning split
  of `spec.output_format`.
- `close()` (or `shutdown()`) stops the engine core process and the loop thread; it also runs at
  interpreter exit, so a forgotten backend does not hang the process.

Engine arguments come from the spec (max_model_len, tensor/data parallel sizes, quantization,
gpu_memory_utilization) plus `spec.extra`, passed through verbatim to `AsyncEngineArgs` (e.g.
`block_size`, `kv_cache_memory_bytes`, `enforce_eager`, `load_format: dummy`, `limit_mm_per_prompt`).
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import os
import threading
import time
import uuid
from pathlib import Path

from medclaw.engine.backends.base import (
    Backend, PromptPlan, RequestRejectedError, check_prompt_tokens, is_multimodal, load_chat_tokenizer,
    media_in_order, render_prompt, set_offline_env, video_metadata,
)
from medclaw.engine.backends.cpu_binding import (
    BIND_VARIABLE, bound_as_asked, construct_with_env, worker_cores,
)
from medclaw.engine.backends.shared_memory import release_shared_memory, shared_memory_of
from medclaw.requests.output_format import split_output
from medclaw.errors import ConfigError, EngineLostError, RunFailedError, first_line
from medclaw.models.quantization import check_vllm_loaded, vllm_quantization
from medclaw.models.spec import ModelSpec
from medclaw.types import GenRequest, GenResult

# Per-prompt media limits for VLMs: view_full_video stage 2 carries the stage-1 video plus the
# hi-res window; frame tools send a handful of images. vLLM profiles memory for this many items.
DEFAULT_MM_LIMITS = {"video": 2, "image": 8}
# vLLM on CPU defaults to 128-token KV blocks; prefix caching reuses whole blocks only, so up to
# 127 tokens of every shared prefix would be recomputed. 32 is the smallest size the CPU attention
# runs at full speed (it prefers multiples of 32). GPUs keep vLLM's own default (16).
CPU_BLOCK_SIZE = 32
# vLLM's CPU build otherwise sizes its KV cache as gpu_memory_utilization of the NUMA node's RAM
# less what the worker already holds: on a 20 GB node 0.05 came out negative and no engine
# started. A CPU engine gets a fixed size instead (`cpu_kv_cache_bytes`): this many sequences of
# max_model_len tokens. In eager mode an explicit size also skips the CPU worker's warm-up pass.
CPU_KV_SEQUENCES = 4
# vLLM's CPU build runs the model worker in a process of its own below the engine core. Running it
# inside the engine core instead (executor "uni", V1 multiprocessing off) starts an engine in 0.65x
# the time but serves 8 concurrent requests 2.3x slower (benchmarks/engine_start.py,
# benchmarks/results/cpu-2core-engine-start.json), so vLLM's default stays.
START_TIMEOUT_S = 1800.0
SHUTDOWN_TIMEOUT_S = 60.0
# vLLM 0.32's CPU model worker does not exit after its shutdown request (it logs "exiting" and
# stays), so its engine core waits on it until vLLM kills both after a 5 s grace: 5 s at every
# engine shutdown. The engine core leaves its loop at once (the same second of its log); on CPU
# both are killed after this grace instead. GPU engines keep vLLM's default.
CPU_SHUTDOWN_GRACE_S = 1.0


def import_engine() -> bool:
    """Import what an engine build imports (torch, transformers, vLLM: seconds) and say whether
    this vLLM is its CPU build. Builds in parallel threads call this first: transformers' lazy
    imports are not thread-safe (base.load_chat_tokenizer)."""
    from transformers import AutoTokenizer  # noqa: F401
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    return current_platform.is_cpu()


def cpu_kv_cache_bytes(spec: ModelSpec) -> int:
    """The KV cache a CPU engine of `spec` gets: CPU_KV_SEQUENCES full-length sequences of its
    architecture (read from the model folder), in 16-bit K and V."""
    from medclaw.models.model_size import architecture_of_spec, kv_bytes_per_token

    per_token = kv_bytes_per_token(architecture_of_spec(spec), spec.tensor_parallel_size)
    return per_token * spec.max_model_len * CPU_KV_SEQUENCES


def cpu_engine_args(spec: ModelSpec) -> dict:
    """The engine arguments every CPU engine of `spec` gets, in-process and served alike."""
    return {"block_size": CPU_BLOCK_SIZE, "kv_cache_memory_bytes": cpu_kv_cache_bytes(spec)}


def engine_kwargs(spec: ModelSpec, on_cpu: bool = False) -> dict:
    """AsyncEngineArgs keyword arguments for `spec` (without the config objects)."""
    kwargs: dict = {
        "model": spec.path,
        "tokenizer": spec.path,
        "served_model_name": spec.name,
        "max_model_len": spec.max_model_len,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "data_parallel_size": spec.data_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
        "seed": 0,
    }
    if (quant := vllm_quantization(spec, on_cpu)) is not None:
        kwargs["quantization"] = quant
    if is_multimodal(spec.path):
        kwargs["limit_mm_per_prompt"] = dict(DEFAULT_MM_LIMITS)
    if on_cpu:
        kwargs.update(cpu_engine_args(spec))
    kwargs.update(spec.extra)
    return kwargs


class VLLMBackend(Backend):
    supports_json_schema = True
    supports_media = True

    def __init__(self, spec: ModelSpec, *, cpu_binding: str | None = None):
        """Start `spec`'s engine (blocking). `cpu_binding`: on vLLM's CPU build, the cores its model
        worker computes on (a `VLLM_CPU_OMP_THREADS_BIND` value; `cpu_binding.core_shares`);
        None leaves the environment's setting, else vLLM's own choice."""
        if not (Path(spec.path) / "config.json").is_file():
            raise ConfigError(f"model {spec.name!r}: no config.json in {spec.path}")
        from medclaw.models.store import revision_hash

        set_offline_env()
        # vLLM logs to stdout by default; stdout is reserved for results (JSON) in medclaw. Set
        # before vLLM is imported (its logger is configured at import); worker processes inherit it.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        # vLLM's INFO lines (hundreds per engine start) drown the progress display; warnings and
        # errors still show. `VLLM_LOGGING_LEVEL=INFO medclaw …` brings them back.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.spec = spec
        self.model_name = spec.name
        self.model_revision = revision_hash(spec.path)
        self._engine = None
        self._closed = False
        self._on_cpu = False           # set at start: CPU engines seed per engine, shut down sooner
        self.block_size = 0            # KV block size the engine runs with (prefix-cache granularity)
        self.prefix_caching = None     # whether the engine runs with prefix caching (vLLM's report)
        self.quantization = None       # the method vLLM reports after loading (None: full precision)
        self.cpu_binding = cpu_binding
        self.worker_cores: list[int] | None = None   # CPU engines: read from the worker process
        self._engine_core_pid: int | None = None     # CPU engines: reaped at shutdown
        self._tokenizer = load_chat_tokenizer(spec.path)
        self._plan = PromptPlan(self._tokenizer, spec.name)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=f"vllm-{spec.name}", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ engine thread side

    async def _start(self) -> None:
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        on_cpu = self._on_cpu = current_platform.is_cpu()
        kwargs = engine_kwargs(self.spec, on_cpu=on_cpu)
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as err:
            raise ConfigError(f"model {self.spec.name!r}: bad engine argument in extra: {err}") from None
        construct = lambda: AsyncLLM.from_engine_args(args)      # noqa: E731
        try:
            if on_cpu:
                # every CPU engine spawns through construct_with_env, one at a time, so that
                # engines built in parallel threads each start with their own binding
                env = {BIND_VARIABLE: self.cpu_binding} if self.cpu_binding else {}
                self._engine, core_pid = construct_with_env(construct, env)
            else:
                self._engine, core_pid = construct(), None
        except RuntimeError as err:
            # vLLM's engine process has already logged the root cause above (e.g. too little
            # memory for the KV cache it was asked for); one line here instead of its traceback.
            raise RunFailedError(f"model {self.spec.name!r}: the vLLM engine did not start "
                                 f"({first_line(err)}); its log above says why") from None
        self.block_size = self._engine.vllm_config.cache_config.block_size
        self.prefix_caching = bool(self._engine.vllm_config.cache_config.enable_prefix_caching)
        # what vLLM really loaded: a quantisation asked for and not applied is an error
        self.quantization = self._engine.vllm_config.model_config.quantization
        check_vllm_loaded(self.spec, self.quantization)
        self._engine_core_pid = core_pid
        self.worker_cores = worker_cores(core_pid)
        if not bound_as_asked(self.cpu_binding, self.worker_cores):
            # slower, not wrong: every answer stands; say so rather than trust the binding
            logging.getLogger(__name__).warning(
                "model %r: asked for CPU cores %s, its vLLM worker computes on %s",
                self.spec.name, self.cpu_binding, self.worker_cores)

    async def _run(self, prompt: dict, params, request_id: str):
        """(final RequestOutput, perf_counter time of the first output holding a token or None).

        vLLM streams a cumulative output per engine step to this loop (the loop its output handler
        runs on, so the time is taken as the token arrives, not when a caller gets round to it).
        `RequestOutput.metrics` would carry the engine's own figure, but only with stats logging on.
        """
        final, first_token_at = None, None
        async for output in self._engine.generate(
                prompt, params, request_id=request_id,
                # the chat template already wrote BOS / special tokens; don't add them twice
                tokenization_kwargs={"add_special_tokens": False}):
            if first_token_at is None and output.outputs and output.outputs[0].token_ids:
                first_token_at = time.perf_counter()
            final = output
        return final, first_token_at

    async def _stop(self) -> None:
        if self._engine is not None:
            self._engine.shutdown(timeout=CPU_SHUTDOWN_GRACE_S if self._on_cpu else None)
            self._engine = None

    # ------------------------------------------------------------------ caller side

    def render(self, request: GenRequest) -> dict:
        """The vLLM prompt dict for `request`: text with placeholders, media data and uuids."""
        text = render_prompt(self._tokenizer, request, self.spec.chat_template_kwargs)
        prompt: dict = {"prompt": text}
        data: dict[str, list] = {}
        uuids: dict[str, list] = {}
        for item in media_in_order(request):
            if item.kind == "video":
                data.setdefault("video", []).append((item.frames, video_metadata(item)))
            else:
                data.setdefault("image", []).append(item.frames)
            uuids.setdefault(item.kind, []).append(item.uuid)
        if data:
            prompt["multi_modal_data"] = data
            prompt["multi_modal_uuids"] = uuids
        return prompt

    def sampling_params(self, request: GenRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = (StructuredOutputsParams(json=request.json_schema)
                      if request.json_schema is not None else None)
        # vLLM 0.32 CPU: a seeded request whose prefill gets chunked (many requests in flight)
        # kills the engine ("CPU Generator does not use offset"). On CPU, sampling is seeded once
        # per engine (`seed=0`) instead of per request.
        seed = request.seed if not self._on_cpu and request.temperature > 0 else None
        return SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature,
                              seed=seed, structured_outputs=structured)

    async def _generate_one(self, request: GenRequest) -> GenResult:
        if self._closed or self._engine is None:
            raise EngineLostError(f"vLLM backend {self.model_name!r} is closed")
        prompt, params = self.render(request), self.sampling_params(request)
        planned = self._plan.planned_tokens(prompt["prompt"], media_in_order(request))
        request_id = f"{request.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(self._run(prompt, params, request_id), self._loop)
        try:
            output, first_token_at = await asyncio.wrap_future(future)
        except Exception as err:
            from vllm.exceptions import VLLMValidationError

            if not isinstance(err, VLLMValidationError):
                raise
            # e.g. a question longer than the context window: the user's input, not our bug
            raise RequestRejectedError(f"model {self.model_name!r} rejected the request: "
                                       f"{first_line(err)}") from None
        latency = time.perf_counter() - started
        check_prompt_tokens(self.model_name, request, planned, len(output.prompt_token_ids or ()))
        completion = output.outputs[0]
        split = split_output(completion.text, self.spec.output_format)
        return GenResult(
            text=split.answer, reasoning=split.reasoning,
            model_name=self.model_name, model_revision=self.model_revision,
            num_prompt_tokens=len(output.prompt_token_ids or ()),
            num_completion_tokens=len(completion.token_ids),
            num_cached_tokens=int(output.num_cached_tokens or 0),
            latency_s=latency, finish_reason=str(completion.finish_reason or ""),
            ttft_s=None if first_token_at is None else first_token_at - started)

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    def reset_caches(self) -> None:
        """Drop every cached prefix, processed media item and vision-encoder output (blocking):
        the engine is cold again, as if just started (benchmarks compare cached vs cold output)."""
        if self._closed or self._engine is None:
            raise RuntimeError(f"vLLM backend {self.model_name!r} is closed")

        async def reset() -> None:
            await self._engine.reset_mm_cache()
            await self._engine.reset_encoder_cache()
            if not await self._engine.reset_prefix_cache():
                raise RuntimeError(f"vLLM backend {self.model_name!r}: prefix cache not reset "
                                   "(requests still running)")

        asyncio.run_coroutine_threadsafe(reset(), self._loop).result(SHUTDOWN_TIMEOUT_S)

    def shutdown(self) -> None:
        """Stop the engine and its loop thread (blocking; safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        # read while the engine runs: a killed engine leaves its message queues behind
        segments = shared_memory_of(self._engine_core_pid) if self._engine_core_pid else set()
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(SHUTDOWN_TIMEOUT_S)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(SHUTDOWN_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
        self._reap_engine_core()
        release_shared_memory(segments)

    def _reap_engine_core(self) -> None:
        """vLLM kills its engine core process without joining it, so it stayed a zombie below
        this process until the next multiprocessing call: join it now."""
        for child in multiprocessing.active_children():       # joins those already ended
            if child.pid == self._engine_core_pid:
                child.join(SHUTDOWN_TIMEOUT_S)                  # killed: ends at once

    async def close(self) -> None:
        await asyncio.to_thread(self.shutdown)

