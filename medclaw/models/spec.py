"""ModelSpec: everything the engine needs to know to serve one model in one role.

Swapping a backbone is editing one config entry (or passing `--preset`/`--model ROLE=PATH`), never
code. `path` is always a local folder; nothing is ever fetched from a hub. `extra` reaches an
engine only through the allowlist of `engine_args.EXTRA_KEYS`; a remote backend's `endpoints`
are plain URLs from the config file, loopback (`engine_args.DEFAULT_ENDPOINT`) when none is given.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from medclaw.errors import ConfigError
from medclaw.models.engine_args import check_endpoints, check_extra

ROLES = ("orchestrator", "video_expert", "frame_verifier", "judge", "encoder", "distiller")
# Roles a profile, a config or `--model` may leave unassigned: they then take the model of the
# role named here (the same spec, so the same engine). `distiller` diagnoses mining episodes and
# writes lessons as skills in `medclaw distill` (`skills.distill`).
ROLE_FALLBACK = {"distiller": "orchestrator"}
OUTPUT_FORMATS = ("plain", "think_answer")          # think_answer: <think>…</think><answer>…</answer>
QUANTIZATIONS = (None, "awq", "gptq", "fp8", "bnb-4bit", "bnb-8bit", "bitsandbytes")


@dataclass(slots=True)
class ModelSpec:
    name: str                      # preset or user name, e.g. "qwen2.5-vl-7b"
    path: str                      # local folder with config.json + weights + tokenizer
    architecture: str = ""         # e.g. "Qwen2_5_VLForConditionalGeneration"
    backend: str = "vllm"          # key of medclaw.engine.backends.BACKENDS
    max_model_len: int = 32768
    # visual budgets (VLMs only), same meaning as qwen-vl-utils
    min_pixels: int = 4 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    total_pixels: int = 24576 * 28 * 28
    fps: float = 2.0
    max_frames: int = 768
    quantization: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    output_format: str = "plain"
    endpoints: list[str] = field(default_factory=list)   # remote backend: OpenAI-compatible base URLs
    chat_template_kwargs: dict = field(default_factory=dict)  # e.g. Qwen3 {enable_thinking: false}
    extra: dict = field(default_factory=dict)             # backend-specific engine arguments

    def __post_init__(self) -> None:
        if self.output_format not in OUTPUT_FORMATS:
            raise ConfigError(f"model {self.name!r}: output_format must be one of {OUTPUT_FORMATS}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"model {self.name!r}: quantization must be one of {QUANTIZATIONS}")
        if not (0 < self.min_pixels <= self.max_pixels):
            raise ConfigError(f"model {self.name!r}: need 0 < min_pixels <= max_pixels")
        if self.fps <= 0 or self.max_frames < 2:
            raise ConfigError(f"model {self.name!r}: need fps > 0 and max_frames >= 2")
        # what may reach an engine, and where a remote backend may connect (engine_args.py)
        check_extra(self.name, self.backend, self.extra)
        if self.backend == "remote":
            self.endpoints = check_endpoints(self.name, self.endpoints)

    def to_dict(self) -> dict:
        return asdict(self)
