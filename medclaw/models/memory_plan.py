"""GPU memory plans: will these roles' engines fit on these GPUs, and where does each one go?

    plan = plan_memory(specs, gpus=parse_gpus("4x80GB"), concurrency=2)  # never raises on a misfit
    plan.fits, plan.placement, plan.table()                                # placement or the reasons
    plan_profile("qwen-72b", "4x80GB")           # the same for a shipped profile (weights need not be here)
    check_before_start(specs)                    # the engine-start hook (engine.runtime.open_runtime):
                                                 # PlanError (one line) on a CUDA host where the engines
                                                 # cannot start; nothing on CPU hosts

One engine per distinct model (roles sharing a folder share it, as `engine.runtime` does). For each
engine, per GPU it spans (tensor parallel size t; the arithmetic is in `model_size.py`):

  weights      parameters × bytes per parameter / t. Quantised: the decoder's linear layers at their
               packed size (4-bit + group scales, 8-bit + row scales); embeddings, norms and the
               vision tower stay bf16. A folder on this machine is read exactly (safetensors
               headers); otherwise the published architecture values in `dummy.PUBLISHED` are used.
  kv cache     2 (K and V) × layers × KV heads (÷ t, at least 1) × head size × dtype bytes, for
               max_model_len tokens × concurrency sequences (every in-flight episode at full context).
  activations  the LLM's largest prefill chunk (max_num_batched_tokens) through one layer, the
               sampler's logits, and for VLMs the vision encoder over the largest clip any tool
               plans (the frame planner under the role's pixel/fps budgets and the context room).
               The vision tower attends with flash attention (memory linear in the patch count).
  overhead     CUDA context, cuBLAS/NCCL workspaces and CUDA graphs (a fixed estimate per engine).

vLLM engines must fit in `gpu_memory_utilization` × GPU memory (what vLLM claims), and the
utilisations of engines sharing a GPU must add up to at most `MAX_GPU_SHARE` minus what the frame
decoder reserves when it runs on the GPU. The transformers backend (accelerate device_map="auto")
spreads over every GPU and is counted as an even share. Remote/fake backends use no local GPU.

GPU sizes: "80GB" means 80 × 10⁹ bytes (a card sold as 80 GB has at least that), "80GiB" 80 × 2³⁰.
Figures are estimates from architecture values, deliberately on the safe side; vLLM's own profiling
at start-up remains the final word, and `check_before_start` runs before it so a plan that cannot
work is refused in one line with the numbers, before minutes of weight loading.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

from medclaw.errors import ConfigError
from medclaw.models.model_size import (  # noqa: F401 — re-exported: the plan's vocabulary
    Architecture, PlanError, architecture_from_config, architecture_of_spec, count_params,
    kv_bytes_per_token, lm_activation_bytes, vision_activation_bytes, weight_bytes,
)
from medclaw.models.model_size import _vision_params

GB = 10 ** 9
GIB = 2 ** 30
MAX_GPU_SHARE = 0.95           # of each GPU, for all engines on it (the rest: other processes)
ENGINE_OVERHEAD = 1.5 * GIB    # per engine per GPU: CUDA context, workspaces, NCCL buffers
CUDA_GRAPHS = 1.0 * GIB        # per vLLM engine per GPU unless enforce_eager
NVDEC_RESERVE = 0.5 * GIB      # decoder surfaces, on top of the frame cache, when decoding on GPU
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's default prefill chunk (max_num_batched_tokens) on GPUs
DEFAULT_MAX_SEQS = 256         # vLLM's default max_num_seqs (the sampler is profiled with it)
GPU_BACKENDS = ("vllm", "transformers")


# ---------------------------------------------------------------------------------------------
# inputs

def parse_gpus(text: str) -> list[int]:
    """"4x80GB" → [80e9] * 4; "1x24GiB", "80GB" (one GPU) and comma lists "80GB,24GB" too."""
    sizes: list[int] = []
    for part in str(text).replace(" ", "").split(","):
        match = re.fullmatch(r"(?:(\d+)[x×*])?(\d+(?:\.\d+)?)(GB|GiB|G)", part, re.IGNORECASE)
        if not match or (match.group(1) is not None and int(match.group(1)) < 1):
            raise ConfigError(f"--gpus {text!r}: write COUNTxSIZE, e.g. 4x80GB or 1x24GB")
        count = int(match.group(1) or 1)
        unit = GIB if match.group(3).lower() == "gib" else GB
        sizes += [int(float(match.group(2)) * unit)] * count
    return sizes


def gpus_text(sizes: list[int]) -> str:
    return ", ".join(f"{n}x{size / GB:.0f}GB" for size, n in _runs(sizes))


def _runs(sizes):
    out: list[tuple[int, int]] = []
    for size in sizes:
        if out and out[-1][0] == size:
            out[-1] = (size, out[-1][1] + 1)
        else:
            out.append((size, 1))
    return out


# ---------------------------------------------------------------------------------------------
# per-engine needs

def largest_clip_tokens(spec) -> tuple[int, int]:
    """(coarse pass, any tool): visual tokens of the largest clip the tools plan for this VLM.

    The frame planner itself, on a long 1080p video (the pixel/fps budgets then bind), under the
    context room a clip gets (`max_model_len` minus the reply and the text around it); stage 1 of
    view_full_video keeps `STAGE1_SHARE` of that room for stage 2, crop_video may use all of it.
    """
    from medclaw.kernels.planner import plan_frames
    from medclaw.tools.media import TEXT_RESERVE_TOKENS
    from medclaw.tools.prompts import TIMELINE_MAX_TOKENS
    from medclaw.tools.view_full_video import STAGE1_SHARE

    room = spec.max_model_len - TIMELINE_MAX_TOKENS - TEXT_RESERVE_TOKENS
    if room < 2:
        return 0, 0
    from medclaw.types import VideoInfo

    video = VideoInfo(path="(largest planned clip)", sha256="0" * 64, duration_s=7200.0, fps=30.0,
                      num_frames=30 * 7200, width=1920, height=1080, codec="h264")

    def tokens(limit: int) -> int:
        return plan_frames(video, 0.0, None, fps=spec.fps, max_frames=spec.max_frames,
                           min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
                           total_pixels=spec.total_pixels, max_visual_tokens=limit).num_visual_tokens

    return tokens(max(1, int(room * STAGE1_SHARE))), tokens(room)


@dataclass(slots=True)
class EngineNeed:
    """One engine: its roles, layout and the bytes it needs on each GPU it spans."""

    roles: list[str]
    model: str
    backend: str
    quantization: str | None
    tp: int
    dp: int
    utilization: float                 # what the spec asks vLLM to claim (transformers: derived)
    max_model_len: int
    concurrency: int
    weights: int                       # per GPU
    kv_cache: int                      # per GPU, max_model_len × concurrency
    activations: int                   # per GPU
    overhead: int                      # per GPU
    clip_tokens: int = 0               # largest clip the vision tower was sized for
    coarse_clip_tokens: int = 0
    arch_source: str = ""
    gpus: list[list[int]] = field(default_factory=list)   # GPU indices of each replica

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.overhead

    def min_utilization(self, gpu_bytes: int) -> float:
        return math.ceil(self.total / gpu_bytes * 100) / 100


def engine_need(roles: list[str], spec, concurrency: int) -> EngineNeed:
    arch = architecture_of_spec(spec)
    tp = spec.tensor_parallel_size if spec.backend == "vllm" else 1
    extra = spec.extra or {}
    eager = bool(extra.get("enforce_eager"))
    kv_dtype = 1 if str(extra.get("kv_cache_dtype", "auto")).startswith("fp8") else arch.dtype_bytes
    coarse, clip = largest_clip_tokens(spec) if arch.vision and _vision_params(arch.vision) else (0, 0)
    seqs = concurrency if spec.backend == "vllm" else 1        # transformers: one request at a time
    chunk = min(int(extra.get("max_num_batched_tokens", DEFAULT_BATCHED_TOKENS)), spec.max_model_len)
    if spec.backend != "vllm":
        chunk = spec.max_model_len                             # transformers prefills a prompt whole
    max_seqs = int(extra.get("max_num_seqs", DEFAULT_MAX_SEQS)) if spec.backend == "vllm" else 1
    return EngineNeed(
        roles=roles, model=spec.name, backend=spec.backend, quantization=spec.quantization,
        tp=tp, dp=spec.data_parallel_size if spec.backend == "vllm" else 1,
        utilization=float(spec.gpu_memory_utilization), max_model_len=spec.max_model_len,
        concurrency=seqs,
        weights=math.ceil(weight_bytes(arch, spec.quantization) / tp),
        kv_cache=kv_bytes_per_token(arch, tp, kv_dtype) * spec.max_model_len * seqs,
        activations=vision_activation_bytes(arch, clip) + lm_activation_bytes(arch, chunk, max_seqs, tp),
        overhead=int(ENGINE_OVERHEAD + (0 if eager or spec.backend != "vllm" else CUDA_GRAPHS)),
        clip_tokens=clip, coarse_clip_tokens=coarse, arch_source=arch.source)


# ---------------------------------------------------------------------------------------------
# the plan

@dataclass(slots=True)
class MemoryPlan:
    gpus: list[int]
    engines: list[EngineNeed]
    reserved: list[int]                # per GPU, outside any engine (frame decoding on GPU)
    problems: list[str]
    name: str = ""

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def placement(self) -> dict[str, dict]:
        """role → {gpus, tensor_parallel_size, gpu_memory_utilization} (fitting plans only)."""
        out = {}
        for engine in self.engines:
            for role in engine.roles:
                out[role] = {"model": engine.model, "gpus": engine.gpus,
                             "tensor_parallel_size": engine.tp, "data_parallel_size": engine.dp,
                             "gpu_memory_utilization": round(engine.utilization, 2)}
        return out

    def gpu_share(self) -> list[float]:
        share = [r / size for r, size in zip(self.reserved, self.gpus)]
        for engine in self.engines:
            for replica in engine.gpus:
                for gpu in replica:
                    share[gpu] += engine.utilization
        return share

    def to_dict(self) -> dict:
        return {
            "name": self.name, "fits": self.fits, "problems": self.problems,
            "gpus_gb": [round(g / GB, 1) for g in self.gpus],
            "gpu_share": [round(s, 3) for s in self.gpu_share()],
            "engines": [{
                "roles": e.roles, "model": e.model, "backend": e.backend,
                "quantization": e.quantization, "tensor_parallel_size": e.tp,
                "data_parallel_size": e.dp, "gpus": e.gpus,
                "gpu_memory_utilization": round(e.utilization, 2),
                "max_model_len": e.max_model_len, "concurrency": e.concurrency,
                "largest_clip_tokens": e.clip_tokens, "coarse_clip_tokens": e.coarse_clip_tokens,
                "per_gpu_gb": {"weights": _gb(e.weights), "kv_cache": _gb(e.kv_cache),
                               "activations": _gb(e.activations), "overhead": _gb(e.overhead),
                               "total": _gb(e.total)},
                "architecture_from": e.arch_source,
            } for e in self.engines],
            "placement": self.placement if self.fits else {},
        }

    def table(self) -> str:
        """Per engine and GPU: weights, KV, activations, overhead, total vs what it may claim."""
        head = (f"{'roles':<30} {'model':<22} {'quant':<12} {'TP':>2} {'DP':>2} "
                f"{'weights':>8} {'KV':>7} {'act':>6} {'other':>6} {'total':>7} "
                f"{'claims':>12} {'GPUs':<10}")
        lines = [f"plan {self.name} on {gpus_text(self.gpus)} (GB = 10^9 bytes, per GPU of each "
                 "engine)", head, "-" * len(head)]
        for e in self.engines:
            size = min(self.gpus) if self.gpus else 0
            claims = f"{e.utilization:.2f}={e.utilization * size / GB:.1f}" if e.backend == "vllm" \
                else f"~{e.utilization:.2f}"
            where = ";".join("+".join(map(str, r)) for r in e.gpus) or "-"
            lines.append(
                f"{','.join(e.roles):<30} {e.model[:22]:<22} {e.quantization or 'bf16':<12} "
                f"{e.tp:>2} {e.dp:>2} {_gb(e.weights):>8.1f} {_gb(e.kv_cache):>7.1f} "
                f"{_gb(e.activations):>6.1f} {_gb(e.overhead):>6.1f} {_gb(e.total):>7.1f} "
                f"{claims:>12} {where:<10}")
            note = f"   KV for {e.concurrency} x {e.max_model_len} tokens"
            if e.clip_tokens:
                note += (f"; vision sized for a {e.clip_tokens}-token clip (coarse pass "
                         f"{e.coarse_clip_tokens})")
            lines.append(note + f"; architecture from {e.arch_source}")
        if any(self.reserved):
            lines.append("reserved for frame decoding on GPU: "
                         + ", ".join(f"GPU{i} {_gb(r):.1f}" for i, r in enumerate(self.reserved) if r))
        share = self.gpu_share()
        lines.append("GPU share claimed: " + ", ".join(f"GPU{i} {s:.2f}" for i, s in enumerate(share))
                     + f" (limit {MAX_GPU_SHARE})")
        lines += [f"does not fit: {p}" for p in self.problems] or ["fits"]
        return "\n".join(lines)

    def raise_if_unfit(self) -> "MemoryPlan":
        if self.problems:
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise PlanError(f"{self.name or 'models'} does not fit on {gpus_text(self.gpus)}: "
                            f"{self.problems[0]}{more}", self.table())
        return self


def _gb(value: float) -> float:
    return round(value / GB, 1)


def plan_memory(specs: dict, gpus: list[int], concurrency: int = 1, *, name: str = "",
                decode_device: str = "cpu", frame_cache_mb: float = 1024) -> MemoryPlan:
    """Size every engine of `specs` (role → ModelSpec) and place it on `gpus` (bytes each)."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    engines = _engines(specs, concurrency)
    reserved = [0] * len(gpus)
    if gpus and str(decode_device).startswith("cuda"):
        index = int(decode_device.split(":")[1]) if ":" in decode_device else 0
        if index < len(gpus):
            reserved[index] = int(frame_cache_mb * 2 ** 20 + NVDEC_RESERVE)
    plan = MemoryPlan(gpus=list(gpus), engines=engines, reserved=reserved, problems=[], name=name)
    if not gpus and engines:
        plan.problems.append("no GPUs given")
        return plan
    load = [r / size for r, size in zip(reserved, gpus)]
    # largest claims first: they have the fewest places to go
    for engine in sorted(engines, key=lambda e: (-e.tp * e.dp, -e.total)):
        _place(engine, gpus, load, plan.problems)
    return plan


def _engines(specs: dict, concurrency: int) -> list[EngineNeed]:
    import os

    groups: dict[tuple, list[str]] = {}
    for role, spec in specs.items():
        if spec.backend not in GPU_BACKENDS or role == "encoder":
            continue
        key = (spec.backend, os.path.realpath(spec.path) if spec.path else spec.name, tuple(spec.endpoints))
        groups.setdefault(key, []).append(role)
    return [engine_need(roles, specs[roles[0]], concurrency) for roles in groups.values()]


def _place(engine: EngineNeed, gpus: list[int], load: list[float], problems: list[str]) -> None:
    count = len(gpus)
    if engine.backend == "transformers":           # device_map="auto": an even share of every GPU
        engine.tp, engine.utilization = count, 0.0
        engine.weights, engine.kv_cache, engine.activations = (
            math.ceil(engine.weights / count), math.ceil(engine.kv_cache / count),
            math.ceil(engine.activations / count))
        engine.utilization = max(engine.total / size for size in gpus)
        if any(load[i] + engine.utilization > MAX_GPU_SHARE for i in range(count)):
            problems.append(f"{engine.model} (transformers) needs {_gb(engine.total)} GB on each "
                            f"of {count} GPUs; free: " + ", ".join(
                                f"GPU{i} {_gb((MAX_GPU_SHARE - load[i]) * gpus[i])} GB" for i in range(count)))
        for i in range(count):
            load[i] += engine.utilization
        engine.gpus = [list(range(count))]
        return
    need_gpus = engine.tp * engine.dp
    if need_gpus > count:
        problems.append(f"{engine.model} needs {engine.tp} x {engine.dp} = {need_gpus} GPUs "
                        f"(tensor x data parallel), {count} given")
        return
    smallest = min(gpus)
    claim = engine.utilization * smallest
    if engine.total > claim:
        problems.append(
            f"{engine.model} needs {_gb(engine.total)} GB per GPU (weights {_gb(engine.weights)} + "
            f"KV {_gb(engine.kv_cache)} for {engine.concurrency} x {engine.max_model_len} tokens + "
            f"activations {_gb(engine.activations)} + overhead {_gb(engine.overhead)}) but "
            f"gpu_memory_utilization {engine.utilization:.2f} x {_gb(smallest)} GB gives "
            f"{_gb(claim)} GB (" + (f"needs >= {engine.min_utilization(smallest):.2f}"
                                    if engine.total <= MAX_GPU_SHARE * smallest
                                    else "more than the GPU has") + ")")
    for _ in range(engine.dp):
        groups = [list(range(start, start + engine.tp))
                  for start in range(0, count - engine.tp + 1, engine.tp)]
        free = [g for g in groups
                if all(load[i] + engine.utilization <= MAX_GPU_SHARE + 1e-9 for i in g)]
        if not free:
            problems.append(f"no {engine.tp} GPU(s) with {engine.utilization:.2f} of their memory "
                            f"left for {engine.model} (claimed so far: "
                            + ", ".join(f"GPU{i} {load[i]:.2f}" for i in range(count))
                            + f"; limit {MAX_GPU_SHARE})")
            return
        best = min(free, key=lambda g: max(load[i] for i in g))
        for i in best:
            load[i] += engine.utilization
        engine.gpus.append(best)


# ---------------------------------------------------------------------------------------------
# entry points

def profile_specs(profile: str | None = None, config_path: str | None = None,
                  overrides: dict[str, str] | None = None) -> dict:
    """role → ModelSpec of a profile (and config), without needing the weights on this machine."""
    from medclaw.models.registry import load_models

    return load_models(config_path, profile=profile, overrides=overrides, build=False)


def profile_hardware(profile: str) -> tuple[str | None, int]:
    """The `gpus:` and `concurrency:` a shipped profile is planned for (None, 1 when unset)."""
    from medclaw.models.registry import catalog

    entry = catalog().profiles.get(profile) or {}
    return entry.get("gpus"), int(entry.get("concurrency", 1))


def plan_profile(profile: str | None, gpus: str | None = None, concurrency: int | None = None, *,
                 config_path: str | None = None, overrides: dict[str, str] | None = None,
                 decode_device: str = "cpu") -> MemoryPlan:
    """Plan a profile (else the config's `profile:`) on `gpus` (default: the profile's own
    `gpus:`), for `concurrency` episodes (default: the profile's `concurrency:`, else 1)."""
    from medclaw.config_file import profile_name, read_config_file

    profile = profile_name(profile, read_config_file(config_path))
    stated_gpus, stated_concurrency = profile_hardware(profile)
    gpus = gpus or stated_gpus
    if not gpus:
        raise ConfigError(f"profile {profile!r} names no GPUs; pass --gpus COUNTxSIZE (e.g. 4x80GB)")
    specs = profile_specs(profile, config_path, overrides)
    return plan_memory(specs, parse_gpus(gpus), concurrency or stated_concurrency,
                       name=profile, decode_device=decode_device)


def detect_gpus() -> list[int] | None:
    """Total memory of each visible NVIDIA GPU, or None without one. Asked of NVML (or, without
    pynvml, of `nvidia-smi` in a child process) so that this process never initialises CUDA
    before vLLM starts its workers."""
    import os
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    sizes: list[int] | None = None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            sizes = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:              # noqa: BLE001 — no pynvml, no driver: try nvidia-smi
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        try:
            out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            sizes = [int(float(line)) * 2 ** 20 for line in out.split() if line.strip()]
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    if not sizes:
        return None
    if visible is not None and visible.strip() != "":
        picked = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        sizes = [sizes[i] for i in picked if i < len(sizes)]
    return sizes or None


def check_before_start(specs: dict, concurrency: int = 1, *, decode_device: str = "cpu",
                       gpus: list[int] | None = None, name: str = "") -> MemoryPlan | None:
    """The engine-start hook: on a CUDA host, plan `specs` on the GPUs present and raise
    `PlanError` (one line; the table goes to stderr) when they cannot fit. None on CPU hosts
    or when no role runs a local GPU engine."""
    if not any(s.backend in GPU_BACKENDS for r, s in specs.items() if r != "encoder"):
        return None
    gpus = gpus if gpus is not None else detect_gpus()
    if not gpus:
        return None
    try:
        plan = plan_memory(specs, gpus, concurrency, name=name, decode_device=decode_device)
    except PlanError as err:       # an architecture the planner cannot read: vLLM's profiling decides
        import logging

        logging.getLogger(__name__).warning("GPU memory not checked before start: %s", err)
        return None
    if not plan.fits:
        print(plan.table(), file=sys.stderr)
    return plan.raise_if_unfit()
