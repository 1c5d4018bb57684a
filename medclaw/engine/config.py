"""Episode / runtime configuration: one slots dataclass, validated on construction.

`EpisodeConfig` holds everything that bounds one agent episode (steps, visual tokens, wall time),
how the orchestrator samples, where traces go and how many episodes may run at once. Values come,
lowest priority first, from the dataclass defaults, the `episode:` section of a user YAML config
file (the same file whose `models:` section `medclaw.models.registry` reads), then CLI flags.
Unknown keys and out-of-range values raise `ConfigError` with a one-line message.

`DecodeConfig` is the `decode:` section (where and how frames are decoded: `device: cpu | cuda[:N]`,
`decoder`, `cache_mb`); `--decode-device` overrides its device. `check_available()` refuses a CUDA
device on a host without one, in one line, before any engine starts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from medclaw.config_file import profile_name, read_config_file
from medclaw.errors import ConfigError


@dataclass(slots=True)
class EpisodeConfig:
    max_steps: int = 8                   # orchestrator turns before a forced answer
    visual_token_budget: int = 200_000   # visual tokens all tools of one episode may spend
    max_wall_s: float = 900.0            # wall-clock seconds before a forced answer
    warn_at: float = 0.75                # fraction of any budget at which the model is warned
    max_consecutive_failures: int = 3    # malformed / failed tool calls in a row → forced answer
    min_tool_steps: int = 0              # steps before final_answer is offered (evidence first;
                                         # capped at max_steps - 1)
    orchestrator_max_tokens: int = 512
    # Cap on every sub-agent reply (timelines, stage-2 windows, frame and region descriptions, the
    # one-shot answer); None = each tool's own budget (medclaw/tools/prompts.py).
    sub_agent_max_tokens: int | None = None
    orchestrator_temperature: float = 0.0
    forced_answer_max_tokens: int = 256
    forced_answer_grace_s: float = 120.0  # the forced-answer call may run this long past max_wall_s
    trace_dir: str = "artifacts/traces"
    concurrency: int = 8                 # episodes in flight at once in a batch
    # Bounds of the *generation* schema only (arguments are still validated against each tool's
    # own schema). Weak or random-weight models fill every free string to its maxLength, so a
    # tight cap is what lets their JSON close within max_tokens. None = the tools' own bounds.
    thought_max_chars: int = 400
    max_string_chars: int | None = None
    max_array_items: int | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.max_steps, int) and self.max_steps >= 1, "max_steps must be an integer >= 1")
        _check(isinstance(self.visual_token_budget, int) and self.visual_token_budget >= 1,
               "visual_token_budget must be an integer >= 1")
        _check(_is_number(self.max_wall_s) and self.max_wall_s > 0, "max_wall_s must be > 0")
        _check(_is_number(self.forced_answer_grace_s) and self.forced_answer_grace_s > 0,
               "forced_answer_grace_s must be > 0")
        _check(_is_number(self.warn_at) and 0 < self.warn_at <= 1, "warn_at must be in (0, 1]")
        _check(isinstance(self.max_consecutive_failures, int) and self.max_consecutive_failures >= 1,
               "max_consecutive_failures must be an integer >= 1")
        _check(isinstance(self.min_tool_steps, int) and self.min_tool_steps >= 0,
               "min_tool_steps must be an integer >= 0")
        _check(isinstance(self.orchestrator_max_tokens, int) and self.orchestrator_max_tokens >= 16,
               "orchestrator_max_tokens must be an integer >= 16")
        _check(self.sub_agent_max_tokens is None or (isinstance(self.sub_agent_max_tokens, int)
                                                     and self.sub_agent_max_tokens >= 16),
               "sub_agent_max_tokens must be an integer >= 16 (or null: the tools' own budgets)")
        _check(isinstance(self.forced_answer_max_tokens, int) and self.forced_answer_max_tokens >= 16,
               "forced_answer_max_tokens must be an integer >= 16")
        _check(_is_number(self.orchestrator_temperature) and 0 <= self.orchestrator_temperature <= 2,
               "orchestrator_temperature must be in [0, 2]")
        _check(isinstance(self.trace_dir, str) and self.trace_dir != "", "trace_dir must be a non-empty path")
        _check(isinstance(self.concurrency, int) and self.concurrency >= 1, "concurrency must be an integer >= 1")
        _check(isinstance(self.thought_max_chars, int) and self.thought_max_chars >= 1,
               "thought_max_chars must be an integer >= 1")
        for name in ("max_string_chars", "max_array_items"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
                   f"{name} must be null or an integer >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "EpisodeConfig":
        """Build from a mapping (e.g. the `episode:` YAML section); unknown keys are errors."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"episode config: unknown key(s) {unknown}; known: {sorted(known)}")
        # YAML gives ints for "600"; accept ints where floats are expected.
        for name in ("max_wall_s", "warn_at", "orchestrator_temperature", "forced_answer_grace_s"):
            if isinstance(data.get(name), int) and not isinstance(data.get(name), bool):
                data[name] = float(data[name])
        return cls(**data)

    def replace(self, **overrides) -> "EpisodeConfig":
        """A copy with `overrides` applied (None values are ignored: unset CLI flags)."""
        merged = self.to_dict()
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return EpisodeConfig.from_dict(merged)


# Episode settings a model profile needs to work at all (a table, not a branch per profile): the
# tiny random-weight models need tight generation bounds or their JSON never closes (STACK.md).
PROFILE_EPISODE_DEFAULTS: dict[str, dict] = {
    # min_tool_steps: a random model picks final_answer at once otherwise, and the demo would show
    # no tool, frame or cache at work; temperature 1 varies its choices instead of repeating one
    # failing call until the failure limit (which calls it makes is noise either way).
    # sub_agent_max_tokens: a random VLM fills every reply budget with noise (a 1024-token
    # timeline took 9-20 s of a 2-core host); 64 tokens take every tool's path all the same.
    "tiny-cpu": dict(thought_max_chars=32, max_string_chars=32, max_array_items=2,
                     orchestrator_max_tokens=768, forced_answer_max_tokens=512, min_tool_steps=2,
                     orchestrator_temperature=1.0, sub_agent_max_tokens=64),
}


def load_episode_config(config_path: str | Path | None = None, *, profile: str | None = None,
                        **overrides) -> EpisodeConfig:
    """Defaults ← the profile's row of PROFILE_EPISODE_DEFAULTS ← `episode:` section of
    `config_path` (if given) ← non-None `overrides` (CLI flags).

    The profile is resolved like the model registry does: `profile` > the config's `profile:` >
    "tiny-cpu".
    """
    doc = read_config_file(config_path)
    section = doc.get("episode") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"config file {config_path}: `episode:` must be a mapping")
    profile = profile_name(profile, doc)
    merged = {**PROFILE_EPISODE_DEFAULTS.get(profile, {}), **section}
    return EpisodeConfig.from_dict(merged).replace(**overrides)


@dataclass(slots=True)
class DecodeConfig:
    device: str = "cpu"                  # "cpu", or "cuda[:N]": NVDEC decoding + GPU resizing
    decoder: str = "auto"                # a medclaw.kernels.decoders.DECODERS name, or auto
    cache_mb: float = 1024               # decoded-frame cache (on the decode device)

    def __post_init__(self) -> None:
        from medclaw.kernels.decoders import DECODERS

        if not (isinstance(self.device, str)
                and (self.device == "cpu" or self.device == "cuda"
                     or (self.device.startswith("cuda:") and self.device[5:].isdigit()))):
            raise ConfigError(f"decode device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.decoder != "auto" and self.decoder not in DECODERS:
            raise ConfigError(f"decode: unknown decoder {self.decoder!r}; choose auto or one of "
                              f"{sorted(DECODERS)}")
        if not _is_number(self.cache_mb) or self.cache_mb < 0:
            raise ConfigError(f"decode: cache_mb must be a number >= 0, got {self.cache_mb!r}")

    def frame_source_kwargs(self) -> dict:
        return {"device": self.device, "decoder": self.decoder, "cache_mb": float(self.cache_mb)}

    def check_available(self) -> None:
        """ConfigError (one line) when the device is a GPU this host does not have, or no decoder
        runs on it. Imports torch only for a CUDA device."""
        if self.device == "cpu":
            return
        import importlib.util

        count = 0
        if importlib.util.find_spec("torch") is not None:
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(self.device.partition(":")[2] or 0)
        if count == 0:
            raise ConfigError(f"decode device {self.device!r}: this host has no CUDA GPU; decode on "
                              "the CPU (--decode-device cpu, or decode: {device: cpu} in the config)")
        if index >= count:
            raise ConfigError(f"decode device {self.device!r}: this host has {count} CUDA GPU(s)")
        from medclaw.kernels.decoders import resolve

        resolve(self.decoder, self.device)       # ConfigError when no CUDA decoder is installed


def load_decode_config(config_path: str | Path | None = None, *, device: str | None = None) -> DecodeConfig:
    """The `decode:` section of `config_path` (if given) ← `device` (the --decode-device flag)."""
    section = read_config_file(config_path).get("decode") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"config file {config_path}: `decode:` must be a mapping")
    unknown = sorted(set(section) - {f.name for f in fields(DecodeConfig)})
    if unknown:
        raise ConfigError(f"decode config: unknown key(s) {unknown}; known: "
                          f"{sorted(f.name for f in fields(DecodeConfig))}")
    if device is not None:
        section = {**section, "device": device}
    return DecodeConfig(**section)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"episode config: {message}")
