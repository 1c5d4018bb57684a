"""Model sizes from architecture values: parameters, weight bytes (quantised or not), KV cache per
token, activation peaks — the arithmetic behind the GPU memory plan (`memory_plan.py`).

    architecture_of_spec(spec) -> Architecture   from the spec's folder (config.json + safetensors
                                                 headers, exact) or the published values of its
                                                 preset (`dummy.PUBLISHED`); PlanError if neither
    count_params(config)       (decoder linear, other, vision) parameters of a Qwen2 / Qwen2.5-VL /
                               Qwen3 config.json (equal to a meta-device build, tests/models/test_dummy.py)
    weight_bytes(arch, quantization), kv_bytes_per_token(arch, tp), vision_activation_bytes(arch,
    clip_tokens), lm_activation_bytes(arch, chunk_tokens, max_seqs, tp)

Quantised weights: the decoder's linear layers at their packed size (4-bit + group scales, 8-bit +
row scales); embeddings, norms and the vision tower stay bf16. Pure Python: no torch import.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from medclaw.errors import MedClawError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "BF16": 2, "F16": 2, "F32": 4,
               "I8": 1, "U8": 1, "I32": 4, "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
# bytes per parameter of a quantised linear layer (weights + their scales/zeros)
QUANT_LINEAR_BYTES = {
    "bnb-4bit": 0.5 + 4 / 64,          # NF4, one fp32 absmax per 64 weights (no double quant)
    "bitsandbytes": 0.5 + 4 / 64,      # vLLM's in-flight bitsandbytes is 4-bit
    "bnb-8bit": 1.0 + 4 / 1024,        # int8 + a row scale (rows ≥ 1024 wide in these models)
    "awq": 0.5 + 2.5 / 128,            # 4-bit, fp16 scale + 4-bit zero per group of 128
    "gptq": 0.5 + 2.5 / 128 + 0.01,    # as AWQ plus the act-order index
    "fp8": 1.0 + 4 / 1024,
}


class PlanError(MedClawError):
    """The roles do not fit on the GPUs; str() is one line, `.table` the numbers."""

    def __init__(self, message: str, table: str = "") -> None:
        super().__init__(message)
        self.table = table


@dataclass(slots=True)
class Architecture:
    """What the plan needs to know about one model (text tower + optional vision tower)."""

    name: str
    source: str                        # "folder", "folder config" or "published"
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linear_params: int                 # the decoder's linear weights (what quantisation packs)
    other_params: int                  # embeddings, lm head, norms, biases
    vision_params: int = 0
    vision: dict | None = None         # vision_config values (Qwen2/2.5-VL)
    dtype_bytes: int = 2
    stored_bytes: int | None = None    # on-disk size of a pre-quantised folder
    stored_quantization: str | None = None

    @property
    def params(self) -> int:
        return self.linear_params + self.other_params + self.vision_params


def count_params(config: dict) -> tuple[int, int, int]:
    """(decoder linear, other, vision) parameter counts of a Qwen2 / Qwen2.5-VL / Qwen3 config."""
    text = _text_config(config)
    h, inter, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    hd = text.get("head_dim") or h // heads
    vocab = text["vocab_size"]
    model_type = config.get("model_type", "")
    linear = layers * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter)
    qkv_bias = text.get("attention_bias", model_type != "qwen3")
    per_layer_other = 2 * h + ((heads + 2 * kv) * hd if qkv_bias else 0)
    if model_type == "qwen3":
        per_layer_other += 2 * hd                                   # q_norm, k_norm
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    other = layers * per_layer_other + h + vocab * h * (1 if tied else 2)
    return linear, other, _vision_params(config.get("vision_config"))


def _vision_params(vision: dict | None) -> int:
    if not vision:
        return 0
    if not all(k in vision for k in ("hidden_size", "intermediate_size", "depth", "patch_size",
                                     "temporal_patch_size", "spatial_merge_size", "out_hidden_size")):
        return 0                   # not a Qwen2/2.5-VL tower: its weights still count (safetensors)
    hv, iv, depth = vision["hidden_size"], vision["intermediate_size"], vision["depth"]
    channels = vision.get("in_chans", vision.get("in_channels", 3))
    patch = channels * vision["temporal_patch_size"] * vision["patch_size"] ** 2 * hv
    block = (2 * hv + hv * 3 * hv + 3 * hv + hv * hv + hv           # norms, qkv, proj
             + 2 * (hv * iv + iv) + iv * hv + hv)                   # gate, up, down (+ biases)
    merged = hv * vision["spatial_merge_size"] ** 2
    merger = hv + merged * merged + merged + merged * vision["out_hidden_size"] + vision["out_hidden_size"]
    return patch + depth * block + merger


def _text_config(config: dict) -> dict:
    text = dict(config)
    text.update(config.get("text_config") or {})
    return text


def architecture_from_config(name: str, config: dict, source: str) -> Architecture:
    text = _text_config(config)
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "vocab_size") if k not in text]
    if missing:
        raise PlanError(f"model {name!r}: its config has no {', '.join(missing)}; cannot plan "
                        "its memory")
    linear, other, vision = count_params(config)
    heads = text["num_attention_heads"]
    quant = (config.get("quantization_config") or {}).get("quant_method")
    return Architecture(
        name=name, source=source, layers=text["num_hidden_layers"], hidden=text["hidden_size"],
        intermediate=text["intermediate_size"], heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads, vocab=text["vocab_size"],
        linear_params=linear, other_params=other, vision_params=vision,
        vision=config.get("vision_config") or None,
        dtype_bytes=DTYPE_BYTES.get(str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"), 2),
        stored_quantization=quant)


def architecture_of_spec(spec) -> Architecture:
    """From the spec's folder when present (exact sizes from safetensors headers), else the
    published values of its preset; PlanError when neither is known."""
    folder = Path(spec.path) if spec.path else None
    if folder is not None and (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
        arch = architecture_from_config(spec.name, config, "folder config")
        tensors = _safetensor_sizes(folder)
        if tensors:
            arch.source = "folder"
            if arch.stored_quantization:                            # packed: what is on disk is
                arch.stored_bytes = sum(size for _, _, size in tensors)   # what gets loaded
            else:
                _apply_tensor_counts(arch, tensors)
        return arch
    from medclaw.models.dummy import architecture_of

    config = architecture_of(spec.name)
    if config is None:
        raise PlanError(f"model {spec.name!r}: no local folder and no published architecture; "
                        f"import it (medclaw models import {spec.name} FOLDER) to plan its memory")
    return architecture_from_config(spec.name, config, "published")


def _safetensor_sizes(folder: Path) -> list[tuple[str, int, int]]:
    """(tensor name, element count, bytes) from every *.safetensors header (no tensor is read)."""
    out = []
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            out.append((name, math.prod(info["shape"]) if info["shape"] else 1, end - start))
    return out


def _apply_tensor_counts(arch: Architecture, tensors) -> None:
    linear = other = vision = 0
    for name, count, size in tensors:
        if name.startswith(("visual.", "model.visual.")) or ".visual." in name:
            vision += count
        elif ".layers." in name and name.endswith(".weight") and ("proj" in name):
            linear += count
        else:
            other += count
    arch.linear_params, arch.other_params, arch.vision_params = linear, other, vision
    if tensors:
        arch.dtype_bytes = max(1, round(sum(s for *_, s in tensors) / max(1, sum(c for _, c, _ in tensors))))


def weight_bytes(arch: Architecture, quantization: str | None) -> int:
    """Bytes of the loaded weights (all GPUs together)."""
    if arch.stored_bytes is not None:
        return arch.stored_bytes
    full = arch.dtype_bytes
    per_linear = QUANT_LINEAR_BYTES.get(quantization or "", full)
    return int(arch.linear_params * per_linear + (arch.other_params + arch.vision_params) * full)


def kv_bytes_per_token(arch: Architecture, tp: int = 1, dtype_bytes: int = 2) -> int:
    """K and V of one token on one GPU of a t-way tensor-parallel engine (KV heads replicate
    when there are fewer than t)."""
    kv_heads = max(1, math.ceil(arch.kv_heads / tp))
    return 2 * arch.layers * kv_heads * arch.head_dim * dtype_bytes


def vision_activation_bytes(arch: Architecture, clip_tokens: int) -> int:
    """Peak activations of the vision tower over one clip: every layer holds its input, q/k/v,
    attention output and MLP (gate, up, act) for all patches; the patch embedding input too."""
    vision = arch.vision
    if not vision or clip_tokens <= 0 or not _vision_params(vision):
        return 0
    patches = clip_tokens * vision["spatial_merge_size"] ** 2
    hv, iv = vision["hidden_size"], vision["intermediate_size"]
    patch_in = vision.get("in_chans", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    return patches * (6 * hv + 3 * iv + patch_in) * arch.dtype_bytes


def lm_activation_bytes(arch: Architecture, chunk_tokens: int, max_seqs: int, tp: int) -> int:
    """One prefill chunk through one decoder layer, plus the sampler's fp32 logits."""
    per_token = 4 * arch.hidden + (3 * arch.intermediate + (arch.heads + 2 * arch.kv_heads) * arch.head_dim) / tp
    return int(chunk_tokens * per_token * arch.dtype_bytes + 2 * max_seqs * arch.vocab * 4 / tp)
