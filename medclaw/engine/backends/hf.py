"""Hugging Face transformers backend: the fallback when vLLM cannot serve a model or a machine.

Contract:
- `TransformersBackend(spec)` loads the model with accelerate's `device_map="auto"` (GPUs, then
  CPU RAM), `torch_dtype="auto"`. `spec.quantization` "bnb-4bit" (= "bitsandbytes") / "bnb-8bit"
  quantises on load with bitsandbytes, on GPU or CPU (needs the `bitsandbytes` package: a clear
  `ConfigError` otherwise); pre-quantised checkpoints (awq / gptq / fp8) load through their own
  `quantization_config`, which must match the spec (`models.quantization`). After loading,
  `self.quantization` is what the model really carries (bitsandbytes layers counted): asking for
  bitsandbytes and getting full precision is an error, never served.
- VLMs (a `vision_config` in config.json) load with `AutoModelForImageTextToText` and their
  processor; video parts go in as already-sampled frames (`do_sample_frames=False`), image parts
  as arrays. Text models load with `AutoModelForCausalLM`. Qwen2-VL / Qwen2.5-VL models get
  their reference positions for the text after a video (`models.mrope`; transformers 5 places
  it elsewhere), so a video request is answered as vLLM answers it.
- `generate` is awaitable from any event loop; generation runs on one dedicated worker thread
  (transformers' `generate` is not safe to run concurrently on one model), one request at a time.
- `GenRequest.json_schema` is enforced with xgrammar's transformers logits processor (compact
  JSON, no free whitespace, as in the vLLM backend) when the `xgrammar` package is installed
  (it comes with vLLM); without it `supports_json_schema` is False and callers use the tolerant
  parser. Compiled grammars are cached per schema (one episode reuses a few schemas every step).
- No prefix cache (`num_cached_tokens = 0`). Output is split per `spec.output_format`. Time to
  first token: from the call (prompt processing included) to the first token `generate` streams.
- Fidelity: the processor's prompt length must equal the planned one (`base.PromptPlan`), checked
  before generating; otherwise `FidelityError`.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from medclaw.engine.backends.base import (
    Backend, PromptPlan, check_prompt_tokens, is_multimodal, media_in_order, set_offline_env,
    template_messages, video_metadata,
)
from medclaw.requests.output_format import split_output
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec
from medclaw.types import GenRequest, GenResult

# ModelSpec.quantization → BitsAndBytesConfig keyword arguments (others need nothing at load)
BNB_CONFIGS: dict[str, dict] = {
    "bnb-4bit": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                 "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_use_double_quant": True},
    "bnb-8bit": {"load_in_8bit": True},
}
BNB_CONFIGS["bitsandbytes"] = BNB_CONFIGS["bnb-4bit"]     # vLLM's name; in-flight it means 4-bit


def _bnb_config(spec: ModelSpec):
    """BitsAndBytesConfig for `spec`, or None; a ConfigError when the machine cannot do it."""
    options = BNB_CONFIGS.get(spec.quantization or "")
    if options is None:
        return None
    import torch

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"model {spec.name!r}: quantization {spec.quantization} needs the "
                          "bitsandbytes package (pip install bitsandbytes)")
    from transformers import BitsAndBytesConfig

    options = dict(options)
    if "bnb_4bit_compute_dtype" in options:
        options["bnb_4bit_compute_dtype"] = getattr(torch, options["bnb_4bit_compute_dtype"])
    return BitsAndBytesConfig(**options)


GRAMMAR_CACHE_SIZE = 16      # compiled schemas kept per backend


class TransformersBackend(Backend):
    supports_json_schema = False     # per instance: True when xgrammar is installed
    supports_media = True

    def __init__(self, spec: ModelSpec):
        config_path = Path(spec.path) / "config.json"
        if not config_path.is_file():
            raise ConfigError(f"model {spec.name!r}: no config.json in {spec.path}")
        set_offline_env()
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, \
            AutoTokenizer

        from medclaw.models.mrope import use_reference_positions
        from medclaw.models.quantization import check_transformers, expect_quantized
        from medclaw.models.store import revision_hash

        check_transformers(spec)
        self.spec = spec
        self.model_name = spec.name
        self.model_revision = revision_hash(spec.path)
        self.is_multimodal = is_multimodal(spec.path)
        load_kwargs = {"device_map": "auto", "torch_dtype": "auto", **spec.extra}
        if (quantization := _bnb_config(spec)) is not None:
            load_kwargs["quantization_config"] = quantization
        model_class = AutoModelForImageTextToText if self.is_multimodal else AutoModelForCausalLM
        self.model = model_class.from_pretrained(spec.path, **load_kwargs).eval()
        use_reference_positions(self.model)
        self.quantization = expect_quantized(spec, self.model)     # what was really loaded
        self.tokenizer = AutoTokenizer.from_pretrained(spec.path)
        self._plan = PromptPlan(self.tokenizer, spec.name)
        self.processor = AutoProcessor.from_pretrained(spec.path) if self.is_multimodal else None
        self.supports_json_schema = importlib.util.find_spec("xgrammar") is not None
        self._compiler = None                          # xgrammar GrammarCompiler, built on first use
        self._grammars: dict[str, object] = {}         # schema JSON → CompiledGrammar
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hf-{spec.name}")
        self._closed = False

    def _grammar_processor(self, schema: dict):
        """A fresh xgrammar logits processor for `schema` (one per generate call: it is stateful).
        Runs on the worker thread only, so the compiler and cache need no lock."""
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor

        if self._compiler is None:
            # the output embedding's rows, not len(tokenizer): checkpoints pad the vocabulary
            vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab_size)
            self._compiler = xgr.GrammarCompiler(info)
        key = json.dumps(schema)               # key order matters: it is the output order
        compiled = self._grammars.get(key)
        if compiled is None:
            # any_whitespace=False: random or weak models otherwise fill whitespace to max_tokens;
            # compact separators, as vLLM's xgrammar backend writes (xgrammar's default is ", ")
            compiled = self._compiler.compile_json_schema(key, any_whitespace=False,
                                                          separators=(",", ":"))
            if len(self._grammars) >= GRAMMAR_CACHE_SIZE:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = compiled
        return LogitsProcessor(compiled), list(compiled.tokenizer_info.stop_token_ids)

    def _render(self, request: GenRequest) -> str:
        owner = self.processor if self.processor is not None and \
            getattr(self.processor, "chat_template", None) else self.tokenizer
        return owner.apply_chat_template(template_messages(request.messages), tokenize=False,
                                         add_generation_prompt=True,
                                         **self.spec.chat_template_kwargs)

    def _inputs(self, request: GenRequest):
        """(processor inputs, planned prompt tokens) for `request`."""
        text = self._render(request)
        media = media_in_order(request)
        if media and self.processor is None:
            raise ValueError(f"model {self.model_name!r} is text-only; the request carries media")
        planned = self._plan.planned_tokens(text, media)
        if not media:
            return self.tokenizer([text], return_tensors="pt", add_special_tokens=False), planned
        videos = [item for item in media if item.kind == "video"]
        images = [item.frames for item in media if item.kind == "image"]     # (H, W, 3) each
        kwargs = {}
        if videos:
            kwargs.update(videos=[item.frames for item in videos],           # (T, H, W, 3) each
                          # HF's VideoMetadata has no do_sample_frames field: it is a call kwarg
                          video_metadata=[{k: v for k, v in video_metadata(item).items()
                                           if k != "do_sample_frames"} for item in videos],
                          do_sample_frames=False)
        if images:
            kwargs["images"] = images
        return self.processor(text=[text], return_tensors="pt", add_special_tokens=False,
                              **kwargs), planned

    def _generate_sync(self, request: GenRequest) -> GenResult:
        import torch

        started = time.perf_counter()
        inputs, planned = self._inputs(request)
        check_prompt_tokens(self.model_name, request, planned, int(inputs["input_ids"].shape[1]))
        inputs = inputs.to(self.model.device)
        sampling = {"do_sample": False}
        if request.temperature > 0:
            sampling = {"do_sample": True, "temperature": request.temperature}
            if request.seed is not None:
                torch.manual_seed(request.seed)
        eos = self.tokenizer.eos_token_id
        stop_ids = _eos_ids(self.model, eos)
        if request.json_schema is not None:
            if not self.supports_json_schema:
                raise ValueError(f"model {self.model_name!r}: json_schema needs the xgrammar package")
            processor, grammar_stops = self._grammar_processor(request.json_schema)
            # stop where the grammar ends: its stop tokens must end generation too
            stop_ids |= set(grammar_stops)
            sampling.update(logits_processor=[processor], eos_token_id=sorted(stop_ids))
        pad = self.tokenizer.pad_token_id
        first_token = _FirstToken()
        with torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=request.max_tokens,
                                         pad_token_id=eos if pad is None else pad,
                                         streamer=first_token, **sampling)
        prompt_len = int(inputs["input_ids"].shape[1])
        new_ids = output[0, prompt_len:].tolist()
        stopped = bool(new_ids) and new_ids[-1] in stop_ids
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        split = split_output(text, self.spec.output_format)
        return GenResult(
            text=split.answer, reasoning=split.reasoning,
            model_name=self.model_name, model_revision=self.model_revision,
            num_prompt_tokens=prompt_len, num_completion_tokens=len(new_ids), num_cached_tokens=0,
            latency_s=time.perf_counter() - started,
            finish_reason="stop" if stopped or len(new_ids) < request.max_tokens else "length",
            ttft_s=None if first_token.at is None else first_token.at - started)

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        if self._closed:
            raise RuntimeError(f"transformers backend {self.model_name!r} is closed")
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(self._executor, self._generate_sync, request)
                for request in requests]

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        self.model = None

    async def close(self) -> None:
        await asyncio.to_thread(self.shutdown)


class _FirstToken:
    """A transformers streamer that only notes when the first generated token came out: `generate`
    hands a streamer the prompt ids once, then every new token as it is sampled."""

    def __init__(self):
        self.at: float | None = None
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
        elif self.at is None:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def _eos_ids(model, fallback: int | None) -> set[int]:
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    return {i for i in [*ids, fallback] if i is not None}
