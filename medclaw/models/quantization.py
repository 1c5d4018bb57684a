"""Quantised loading, one rule for every backend: what was asked is what is loaded, or an error.

`ModelSpec.quantization` (config key `quantization:`):
    bnb-4bit | bitsandbytes   quantise on load to 4-bit NF4 with bitsandbytes (transformers; vLLM
                              on a GPU, which quantises in flight to 4-bit only)
    bnb-8bit                  quantise on load to 8-bit LLM.int8 (transformers; vLLM only for a
                              checkpoint already saved in 8-bit bitsandbytes)
    awq | gptq | fp8          a checkpoint saved that way: its config.json must say so
    null                      as the folder is: full precision, or whatever quantization_config
                              the folder declares (an AWQ release loads as AWQ)

    declared_quantization(path)        the folder's own `quantization_config` (method, bits)
    vllm_quantization(spec, on_cpu)    vLLM's `quantization` argument, or ConfigError (one line)
    check_transformers(spec)           ConfigError when the folder contradicts the spec
    quantized_layers(model)            {"Linear4bit": n, "Linear8bitLt": m, ...} of a loaded model

Nothing here imports torch or vLLM at module level. A quantisation that cannot be honoured is
refused before any weight is loaded; a load that ends up in full precision is refused after it
(`expect_quantized`), never served silently.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from medclaw.errors import ConfigError

BNB_IN_FLIGHT = {"bnb-4bit": 4, "bitsandbytes": 4, "bnb-8bit": 8}
SAVED_METHODS = ("awq", "gptq", "fp8")
# vLLM's names for a saved method, as its model config reports it after loading
VLLM_METHOD_FAMILY = {
    "awq": ("awq", "awq_marlin"), "gptq": ("gptq", "gptq_marlin"), "fp8": ("fp8",),
    "bitsandbytes": ("bitsandbytes",),
}
# bitsandbytes layer classes that hold packed weights
QUANTIZED_LAYER_CLASSES = ("Linear4bit", "Linear8bitLt")


@dataclass(slots=True, frozen=True)
class Declared:
    """A folder's own quantization_config: the method and, for bitsandbytes, the bit width."""

    method: str
    bits: int | None = None


def declared_quantization(path: str | Path) -> Declared | None:
    """The `quantization_config` in `path/config.json` (None without one or without the file)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config") or (config.get("text_config") or {}).get(
        "quantization_config")
    if not isinstance(quant, dict) or not quant.get("quant_method"):
        return None
    method = str(quant["quant_method"]).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if method == "bitsandbytes":
        bits = 8 if quant.get("load_in_8bit") else 4
    return Declared(method=method, bits=int(bits) if bits else None)


def vllm_quantization(spec, on_cpu: bool) -> str | None:
    """vLLM's `quantization` argument for `spec`; ConfigError where vLLM or the device cannot
    honour it (it would otherwise load something else, or full precision)."""
    asked = spec.quantization
    declared = declared_quantization(spec.path) if spec.path else None
    if asked is None:
        return None                      # vLLM reads the folder's own quantization_config
    if asked in BNB_IN_FLIGHT:
        if on_cpu:
            raise ConfigError(f"model {spec.name!r}: quantization {asked} with vLLM needs a CUDA "
                              "GPU (vLLM's bitsandbytes loader has no CPU path); on CPU use "
                              "backend: transformers, which loads bnb-4bit / bnb-8bit there")
        if declared is not None and declared.method != "bitsandbytes":
            raise ConfigError(f"model {spec.name!r}: quantization {asked}, but {spec.path} is a "
                              f"{declared.method} checkpoint; set quantization: {declared.method}")
        if BNB_IN_FLIGHT[asked] == 8 and (declared is None or declared.bits != 8):
            raise ConfigError(f"model {spec.name!r}: vLLM quantises in flight to 4-bit only; "
                              "bnb-8bit needs a checkpoint saved in 8-bit bitsandbytes (or use "
                              "quantization: bnb-4bit, or backend: transformers)")
        return "bitsandbytes"
    _check_saved(spec, declared)
    return asked


def check_transformers(spec) -> None:
    """ConfigError when the spec asks for a saved method the folder does not have, or for
    on-load bitsandbytes over a folder that is already quantised another way."""
    asked = spec.quantization
    if asked is None:
        return
    declared = declared_quantization(spec.path)
    if asked in BNB_IN_FLIGHT:
        if declared is not None and declared.method != "bitsandbytes":
            raise ConfigError(f"model {spec.name!r}: quantization {asked}, but {spec.path} is "
                              f"already a {declared.method} checkpoint; set quantization: "
                              f"{declared.method} (or null)")
        return
    _check_saved(spec, declared)


def _check_saved(spec, declared: Declared | None) -> None:
    asked = spec.quantization
    if asked not in SAVED_METHODS:
        raise ConfigError(f"model {spec.name!r}: unknown quantization {asked!r}")
    if declared is None or declared.method not in VLLM_METHOD_FAMILY.get(asked, (asked,)):
        found = f"a {declared.method} checkpoint" if declared else "not quantised (no quantization_config)"
        raise ConfigError(f"model {spec.name!r}: quantization {asked}, but {spec.path} is {found}; "
                          f"{asked} needs a checkpoint saved in {asked}")


def expected_vllm_method(spec) -> str | None:
    """The method vLLM should report after loading `spec` (None: full precision)."""
    if spec.quantization in BNB_IN_FLIGHT:
        return "bitsandbytes"
    if spec.quantization is not None:
        return spec.quantization
    declared = declared_quantization(spec.path) if spec.path else None
    return declared.method if declared else None


def check_vllm_loaded(spec, reported: str | None) -> None:
    """After the engine started: ConfigError unless vLLM loaded what was asked."""
    expected = expected_vllm_method(spec)
    family = VLLM_METHOD_FAMILY.get(expected or "", (expected,))
    if (reported or None) not in family and not (expected is None and reported is None):
        raise ConfigError(f"model {spec.name!r}: vLLM loaded it as {reported or 'full precision'}, "
                          f"not {expected or 'full precision'}")


def quantized_layers(model) -> dict[str, int]:
    """How many layers of each bitsandbytes class `model` holds (an empty dict: none)."""
    counts: dict[str, int] = {}
    for module in model.modules():
        name = type(module).__name__
        if name in QUANTIZED_LAYER_CLASSES:
            counts[name] = counts.get(name, 0) + 1
    return counts


def expect_quantized(spec, model) -> str | None:
    """The quantisation the loaded `model` really carries ("bnb-4bit", "awq", …, None for full
    precision); ConfigError when the spec asked for bitsandbytes and no layer is quantised."""
    if spec.quantization in BNB_IN_FLIGHT:
        wanted = "Linear4bit" if BNB_IN_FLIGHT[spec.quantization] == 4 else "Linear8bitLt"
        if not quantized_layers(model).get(wanted):
            raise ConfigError(f"model {spec.name!r}: asked for {spec.quantization} but no "
                              f"{wanted} layer was loaded; refusing to serve it in full precision")
        return "bnb-4bit" if wanted == "Linear4bit" else "bnb-8bit"
    if spec.quantization is not None:
        return spec.quantization
    declared = declared_quantization(spec.path)
    return declared.method if declared else None
