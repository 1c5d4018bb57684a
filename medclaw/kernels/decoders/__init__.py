"""Batched video decoders behind one interface, chosen from a table per device.

    DECODERS                      name -> DecoderSpec ("module:Class", devices, required module)
    AUTO_ORDER                    device kind -> decoder names tried in order by "auto"
    available_decoders(device)    names usable on this machine for that device
    make_decoder(name, device)    an instance; name "auto" picks the first available in AUTO_ORDER

Every decoder takes a `DecodeJob` (sorted unique indices, output size, optional crop) and returns
one uint8 torch tensor (T, H, W, 3) on its device; see `base.py` for the shared contract
(chunked decode, cancellation, `CorruptVideoError`). Imports of torch/torchcodec/av/decord happen
only when a decoder is made, so importing this package is cheap.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from medclaw.errors import ConfigError


@dataclass(slots=True, frozen=True)
class DecoderSpec:
    target: str                      # "module:Class"
    devices: tuple[str, ...]         # device kinds it decodes on ("cpu", "cuda")
    requires: str                    # top-level module that must be importable
    note: str = ""


_PKG = "medclaw.kernels.decoders"
DECODERS: dict[str, DecoderSpec] = {
    "torchcodec": DecoderSpec(f"{_PKG}.torchcodec_decoder:TorchcodecDecoder", ("cpu", "cuda"),
                              "torchcodec", "FFmpeg on CPU; NVDEC with device='cuda'"),
    "pynvc": DecoderSpec(f"{_PKG}.pynvc_decoder:PyNvDecoder", ("cuda",), "PyNvVideoCodec",
                         "NVDEC via NVIDIA PyNvVideoCodec"),
    "decord": DecoderSpec(f"{_PKG}.decord_decoder:DecordDecoder", ("cpu",), "decord",
                          "optional; decord 0.6 can fail on the last frame"),
    "pyav": DecoderSpec(f"{_PKG}.pyav_decoder:PyAVDecoder", ("cpu",), "av",
                        "FFmpeg through PyAV; swscale resize"),
}
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "cpu": ("torchcodec", "pyav", "decord"),
    "cuda": ("torchcodec", "pynvc"),
}


def device_kind(device: str) -> str:
    kind = str(device).split(":")[0]
    if kind not in AUTO_ORDER:
        raise ConfigError(f"unknown device {device!r}: use 'cpu' or 'cuda[:N]'")
    return kind


def is_available(name: str, device: str = "cpu") -> bool:
    spec = DECODERS.get(name)
    if spec is None or device_kind(device) not in spec.devices:
        return False
    if importlib.util.find_spec(spec.requires) is None:
        return False
    if spec.requires == "torchcodec":
        # torchcodec needs FFmpeg's shared libraries; it only fails when first loaded.
        try:
            importlib.import_module("torchcodec.decoders")
        except Exception:
            return False
    return True


def available_decoders(device: str = "cpu") -> list[str]:
    return [name for name in DECODERS if is_available(name, device)]


def resolve(name: str, device: str = "cpu") -> str:
    """The concrete decoder name for `name` ("auto" or a DECODERS key) on `device`."""
    kind = device_kind(device)
    if name == "auto":
        for candidate in AUTO_ORDER[kind]:
            if is_available(candidate, device):
                return candidate
        raise ConfigError(f"no video decoder is available for device {device!r} "
                          f"(tried {', '.join(AUTO_ORDER[kind])})")
    if name not in DECODERS:
        raise ConfigError(f"unknown decoder {name!r}: choose from auto, {', '.join(DECODERS)}")
    if kind not in DECODERS[name].devices:
        raise ConfigError(f"decoder {name!r} does not run on {kind} "
                          f"(it runs on {', '.join(DECODERS[name].devices)})")
    if not is_available(name, device):
        raise ConfigError(f"decoder {name!r} is not installed (needs the "
                          f"'{DECODERS[name].requires}' package)")
    return name


def make_decoder(name: str = "auto", device: str = "cpu"):
    """An instance of the decoder `name` (or the first available one for "auto") on `device`."""
    concrete = resolve(name, device)
    module_name, class_name = DECODERS[concrete].target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(device=device)
