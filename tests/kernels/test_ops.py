"""Resize/crop ops: the torch path agrees with the PIL reference; crop boxes map to pixels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from medclaw.kernels.errors import InvalidCropError
from medclaw.kernels.ops import crop_box_to_pixels, resize_crop, resize_crop_reference


def _frames(t=3, h=90, w=160, seed=0) -> np.ndarray:
    """Smooth gradients + sharp blocks: both kinds of content a resize must get right."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy + 40 * i) % 256], -1)
        block = rng.integers(0, 256, (h // 10 + 1, w // 10 + 1, 3)).repeat(10, 0).repeat(10, 1)
        out[i] = np.where((xx // 20 + yy // 20)[..., None] % 2 == 0, base, block[:h, :w])
    return out


@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size,crop", [((168, 84), None), ((56, 28), None), ((336, 196), None),
                                       ((84, 56), (10, 5, 110, 80)), ((160, 90), None)])
def test_torch_path_agrees_with_pil_reference(size, crop, interp):
    frames = _frames()
    w, h = size
    fast = resize_crop(torch.from_numpy(frames), w, h, crop, interp).numpy()
    ref = resize_crop_reference(frames, w, h, crop, interp)
    assert fast.shape == ref.shape == (3, h, w, 3) and fast.dtype == np.uint8
    diff = np.abs(fast.astype(int) - ref.astype(int))
    # Bicubic overshoot next to hard edges is clamped slightly differently by PIL and torch:
    # the odd edge pixel may differ by more, the bulk must not.
    assert diff.mean() < 0.5 and np.mean(diff > 2) < 0.005 and diff.max() <= 32


def test_crop_picks_the_right_region():
    frames = np.zeros((1, 100, 200, 3), np.uint8)
    frames[0, 50:, 100:] = 255                                # bottom-right quadrant white
    px = crop_box_to_pixels((0.5, 0.5, 1.0, 1.0), 200, 100)
    assert px == (100, 50, 200, 100)
    out = resize_crop(torch.from_numpy(frames), 40, 20, px).numpy()
    assert out.min() == 255
    other = resize_crop(torch.from_numpy(frames), 40, 20, crop_box_to_pixels((0, 0, .5, .5),
                                                                             200, 100)).numpy()
    assert other.max() == 0


def test_identity_size_returns_same_pixels():
    frames = _frames()
    out = resize_crop(torch.from_numpy(frames), 160, 90).numpy()
    assert np.array_equal(out, frames)


@pytest.mark.parametrize("box", [(0.5, 0.1, 0.4, 0.9), (-0.1, 0, 1, 1), (0, 0, 1, 1.2),
                                 (0, 0, 1), "abcd", (0, float("nan"), 1, 1)])
def test_bad_crop_boxes_raise(box):
    with pytest.raises(InvalidCropError) as err:
        crop_box_to_pixels(box, 640, 360)
    assert "\n" not in str(err.value)


def test_tiny_crop_is_at_least_one_pixel():
    x1, y1, x2, y2 = crop_box_to_pixels((0.5, 0.5, 0.5001, 0.5001), 640, 360)
    assert x2 - x1 >= 1 and y2 - y1 >= 1


@pytest.mark.gpu
def test_cuda_path_agrees_with_reference():
    frames = _frames()
    fast = resize_crop(torch.from_numpy(frames).cuda(), 84, 56, (10, 5, 110, 80)).cpu().numpy()
    ref = resize_crop_reference(frames, 84, 56, (10, 5, 110, 80))
    assert np.abs(fast.astype(int) - ref.astype(int)).mean() < 1.0


@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size,crop", [((168, 84), None), ((84, 56), (10, 5, 110, 80)),
                                       ((160, 90), None)])
def test_writing_into_a_batch_slice_matches(size, crop, interp):
    frames = torch.from_numpy(_frames())
    w, h = size
    batch = torch.zeros((7, h, w, 3), dtype=torch.uint8)
    returned = resize_crop(frames, w, h, crop, interp, out=batch[2:5])
    expected = resize_crop(frames, w, h, crop, interp)
    assert returned.data_ptr() == batch[2:5].data_ptr()
    assert torch.equal(batch[2:5], expected)
    assert batch[:2].sum() == 0 and batch[5:].sum() == 0
