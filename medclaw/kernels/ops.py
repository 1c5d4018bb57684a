"""Resize and spatial crop of uint8 frame batches on the target device, plus the plain reference.

    crop_box_to_pixels(box, width, height) -> (x1, y1, x2, y2)   normalised box -> source pixels
    resize_crop(frames, width, height, crop_px=None, interpolation="bicubic", *, out=None)
        frames: uint8 torch tensor (T, H, W, 3) on any device -> uint8 (T, height, width, 3), same
        device (written into `out` when given). Antialiased (like PIL and qwen-vl-utils'
        torchvision resize), so downscales do not alias. On CPU the uint8 kernels of
        `torch.nn.functional.interpolate` are used directly; on CUDA the batch goes through
        float32.
    resize_crop_reference(frames, width, height, crop_px=None, interpolation="bicubic")
        numpy uint8 (T, H, W, 3) -> numpy; PIL per frame. The fast path must agree with it within
        a few grey levels (tests/kernels/test_ops.py).

A crop is applied first (in source pixels), then the crop is resized to (width, height).
"""
from __future__ import annotations

import math

from medclaw.kernels.errors import InvalidCropError

INTERPOLATIONS = ("bilinear", "bicubic")


def crop_box_to_pixels(box, width: int, height: int) -> tuple[int, int, int, int]:
    """Normalised (x1, y1, x2, y2) in [0, 1] -> integer pixel box covering it (at least 1 px)."""
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        raise InvalidCropError(
            f"crop box must be 4 numbers (x1, y1, x2, y2), got {box!r}") from None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise InvalidCropError(f"crop box must be finite, got {box!r}")
    if not (0.0 <= x1 < x2 <= 1.0 and 0.0 <= y1 < y2 <= 1.0):
        raise InvalidCropError(f"crop box must satisfy 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1, "
                               f"got {tuple(box)}")
    px1, py1 = math.floor(x1 * width), math.floor(y1 * height)
    px2, py2 = math.ceil(x2 * width), math.ceil(y2 * height)
    px2, py2 = max(px2, px1 + 1), max(py2, py1 + 1)
    return px1, py1, min(px2, width), min(py2, height)


def _check(width: int, height: int, interpolation: str) -> None:
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    if width < 1 or height < 1:
        raise ValueError(f"output size must be positive, got {width}x{height}")


def resize_crop(frames, width: int, height: int, crop_px=None, interpolation: str = "bicubic",
                *, out=None):
    """uint8 (T, H, W, 3) tensor -> uint8 (T, height, width, 3) tensor on the same device.

    With `out` (a uint8 (T, height, width, 3) tensor, e.g. a slice of a batch), the result is
    written there — on CPU straight from the resize kernel, saving a copy of every frame.
    """
    import torch
    import torch.nn.functional as F

    _check(width, height, interpolation)
    if crop_px is not None:
        x1, y1, x2, y2 = crop_px
        frames = frames[:, y1:y2, x1:x2]                                  # (T, h, w, 3) view
    if frames.shape[1] == height and frames.shape[2] == width:
        if out is None:
            return frames.contiguous()
        out.copy_(frames)
        return out
    if frames.shape[0] == 0:
        return frames.new_empty((0, height, width, 3)) if out is None else out
    # (T, H, W, 3) -> (T, 3, H, W) as a channels-last view: no copy, and the layout the uint8
    # antialias kernels are fastest on.
    nchw = frames.permute(0, 3, 1, 2)                                     # (T, 3, H, W)
    if frames.device.type == "cpu":
        if out is not None and _resize_into(nchw, out, height, width, interpolation):
            return out
        resized = F.interpolate(nchw, size=(height, width), mode=interpolation, antialias=True,
                                align_corners=False)                      # (T, 3, h, w) uint8
    else:
        resized = F.interpolate(nchw.float(), size=(height, width), mode=interpolation,
                                antialias=True, align_corners=False)      # (T, 3, h, w) float32
        resized = resized.round_().clamp_(0, 255).to(torch.uint8)
    resized = resized.permute(0, 2, 3, 1)                                 # (T, h, w, 3)
    if out is None:
        return resized.contiguous()
    out.copy_(resized)
    return out


def _resize_into(nchw, out, height: int, width: int, interpolation: str) -> bool:
    """Antialiased resize written straight into `out` (T, h, w, 3); False if unsupported.

    Uses the `out=` overload of aten's `_upsample_*_aa` (what F.interpolate calls with
    antialias=True). `out` viewed as (T, 3, h, w) is channels-last, the layout the kernel
    produces for a channels-last input, so it writes in place with no proxy copy.
    """
    import torch

    op = getattr(torch._C._nn, f"_upsample_{interpolation}2d_aa", None)
    target = out.permute(0, 3, 1, 2)                                      # (T, 3, h, w) view
    if op is None or not target.is_contiguous(memory_format=torch.channels_last):
        return False
    try:
        op(nchw, (height, width), False, None, None, out=target)
    except (RuntimeError, TypeError):
        return False
    return True


def resize_crop_reference(frames, width: int, height: int, crop_px=None,
                          interpolation: str = "bicubic"):
    """Plain path: numpy uint8 (T, H, W, 3) -> numpy uint8 (T, height, width, 3), PIL per frame."""
    import numpy as np
    from PIL import Image

    _check(width, height, interpolation)
    resample = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[interpolation]
    out = np.empty((len(frames), height, width, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        if crop_px is not None:
            x1, y1, x2, y2 = crop_px
            frame = frame[y1:y2, x1:x2]
        image = Image.fromarray(np.ascontiguousarray(frame))
        out[i] = np.asarray(image.resize((width, height), resample))
    return out
