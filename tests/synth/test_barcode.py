"""Frame-index barcode: round trip, robustness to H.264 and VLM-size downscales, clean failures."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from medclaw.synth.barcode import (
    MAX_INDEX, NUM_CELLS, BarcodeError, draw_frame_index, encode_cells, read_frame_index,
    read_frame_index_reference, read_frame_indices, strip_height,
)

RNG = np.random.default_rng(1234)
INDICES = [0, 1, 2, 7, 255, 1499, 15_000, 65_535, MAX_INDEX - 1,
           *map(int, RNG.integers(0, MAX_INDEX, size=40))]
# VLM sizes: 224x126 / 112x63 keep the aspect; the others are multiple-of-28 resizes that change it.
SIZES = [(224, 126), (112, 63), (448, 252), (252, 140), (280, 168), (196, 112), (84, 56)]
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS,
           "box": Image.BOX}


def _scene(height=360, width=640, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(40, 220, size=(height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("index", INDICES)
def test_round_trip_and_reference_agree(index):
    frame = _scene(seed=index % 97)
    draw_frame_index(frame, index)
    assert read_frame_index(frame) == index
    assert read_frame_index_reference(frame) == index


def test_draw_touches_only_the_strip():
    frame = _scene()
    before = frame.copy()
    draw_frame_index(frame, 123_456)
    rows = strip_height(frame.shape[0])
    assert np.array_equal(frame[rows:], before[rows:])
    assert not np.array_equal(frame[:rows], before[:rows])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("filt", FILTERS, ids=str)
def test_survives_downscale(size, filt):
    for index in INDICES[::3]:
        frame = _scene(seed=index % 31)
        draw_frame_index(frame, index)
        small = np.asarray(Image.fromarray(frame).resize(size, FILTERS[filt]))
        assert small.shape == (size[1], size[0], 3)
        assert read_frame_index(small) == index
        assert read_frame_index_reference(small) == index


def test_survives_torch_antialiased_bicubic_resize():
    """The resize qwen-vl-utils applies (torchvision bicubic + antialias), to 112x56 (aspect change)."""
    torch = pytest.importorskip("torch")
    from torchvision.transforms.functional import InterpolationMode, resize

    frames = np.stack([_scene(seed=i) for i in range(8)])                 # (T, H, W, 3)
    indices = [int(i) for i in RNG.integers(0, MAX_INDEX, size=8)]
    for frame, index in zip(frames, indices):
        draw_frame_index(frame, index)
    tensor = torch.from_numpy(frames).permute(0, 3, 1, 2).float()         # (T, 3, H, W)
    small = resize(tensor, [56, 112], interpolation=InterpolationMode.BICUBIC, antialias=True)
    small = small.clamp(0, 255).round().to(torch.uint8)                   # (T, 3, 56, 112)
    assert read_frame_indices(small.numpy()) == indices                  # channels-first accepted
    assert read_frame_index(small[3]) == indices[3]


def test_survives_h264_through_real_ffmpeg(synth_video):
    """Every frame of the encoded synthetic video decodes to its own index, full size and small."""
    import av

    seen = []
    with av.open(str(synth_video.path)) as container:
        for frame in container.decode(video=0):
            rgb = frame.to_ndarray(format="rgb24")                        # (H, W, 3)
            index = read_frame_index(rgb)
            seen.append(index)
            if index % 50 == 0:
                small = np.asarray(Image.fromarray(rgb).resize((112, 63), Image.BICUBIC))
                assert read_frame_index(small) == index
    assert seen == list(range(synth_video.num_frames))


def test_batch_matches_single_and_flags_unreadable():
    frames = np.stack([_scene(seed=i) for i in range(5)])                 # (5, H, W, 3)
    for i in (0, 1, 3):
        draw_frame_index(frames[i], 1000 + i)
    assert read_frame_indices(frames) == [1000, 1001, -1, 1003, -1]
    assert read_frame_indices(frames[:0]) == []


@pytest.mark.parametrize("make", [
    lambda: np.full((360, 640, 3), 128, np.uint8),                        # flat grey
    lambda: _scene(),                                                     # noise, no strip
    lambda: np.zeros((360, 640, 3), np.uint8),                            # black
], ids=["grey", "noise", "black"])
def test_frames_without_a_strip_raise(make):
    with pytest.raises(BarcodeError):
        read_frame_index(make())


def test_a_flipped_bit_fails_the_checksum():
    frame = _scene()
    draw_frame_index(frame, 424_242)
    width = frame.shape[1]
    cell = 9                                                              # a data cell
    x0, x1 = round(cell * width / NUM_CELLS), round((cell + 1) * width / NUM_CELLS)
    frame[: strip_height(360), x0:x1] = 255 - frame[0, x0]
    with pytest.raises(BarcodeError, match="checksum"):
        read_frame_index(frame)


def test_barcode_error_is_a_value_error_and_bad_input_is_rejected():
    assert issubclass(BarcodeError, ValueError)
    with pytest.raises(ValueError):
        encode_cells(MAX_INDEX)
    with pytest.raises(ValueError):
        encode_cells(-1)
    with pytest.raises(BarcodeError, match="shape"):
        read_frame_index(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="narrow"):
        draw_frame_index(np.zeros((20, NUM_CELLS - 1, 3), np.uint8), 3)
