"""Frame-index barcode: every synthetic frame carries its own index, so frame accuracy is exact.

Layout — a strip across the full width at the top of the frame, `STRIP_FRACTION` of its height,
cut into `NUM_CELLS` equal cells (geometry is in *fractions* of the frame, so any resize, with or
without an aspect change, keeps it decodable):

    [white black] [20 data bits, MSB first] [4 CRC bits] [black white]
     start guard                                          stop guard

A bit is white (255) for 1 and black (0) for 0. The checksum is a CRC-4 (polynomial x^4+x+1) of
the 20 data bits, so a scene that happens to look like a strip is rejected. Cells are wide (1/28 of
the frame: ~4 px even at 112 px wide) and tall (1/10 of the height), so the code survives H.264 at
CRF 23+, yuv420p chroma subsampling and antialiased downscales to VLM sizes (224×126, 112×63, a
multiple-of-28 resize with aspect change).

Decoding averages the luma of the central part of each cell (the middle half in both directions,
away from blurred edges) and thresholds it halfway between the guards' black and white levels.

API:
    draw_frame_index(frame, index)   in place; frame uint8 (H, W, 3), 0 <= index < MAX_INDEX
    frame_index_row(index, width)    one strip row, uint8 (W,) of 0/255 (for other pixel formats)
    read_frame_index(frame) -> int   raises BarcodeError (a ValueError) when unreadable
    read_frame_indices(frames) -> list[int]   batch (T, H, W, 3); -1 for an unreadable frame
    read_frame_index_reference(frame) -> int  plain per-cell loop, the reference for the fast path

`read_frame_index` accepts (H, W, 3) or (3, H, W) arrays (numpy or anything `np.asarray` takes,
e.g. a CPU torch tensor), uint8 or float in [0, 255].
"""
from __future__ import annotations

import numpy as np

DATA_BITS = 20
CRC_BITS = 4
START_GUARD = (1, 0)
STOP_GUARD = (0, 1)
NUM_CELLS = len(START_GUARD) + DATA_BITS + CRC_BITS + len(STOP_GUARD)   # 28
MAX_INDEX = 1 << DATA_BITS          # 1,048,576 frames: 11.6 h at 25 fps
STRIP_FRACTION = 0.10               # strip height / frame height
MIN_CONTRAST = 40.0                 # guard white - guard black, in luma levels
MIN_MARGIN = 0.18                   # a cell must sit this far (fraction of contrast) from threshold

_GUARD_WHITE = (0, NUM_CELLS - 1)
_GUARD_BLACK = (1, NUM_CELLS - 2)
_DATA = slice(len(START_GUARD), len(START_GUARD) + DATA_BITS)
_CRC = slice(_DATA.stop, _DATA.stop + CRC_BITS)


class BarcodeError(ValueError):
    """The frame carries no readable frame-index strip (or the strip fails its checks)."""


def strip_height(height: int) -> int:
    """Rows the strip occupies in a frame `height` rows tall (content starts below this)."""
    return max(4, int(round(height * STRIP_FRACTION)))


def _crc4(bits: list[int]) -> list[int]:
    """CRC-4/ITU over `bits` (MSB first), polynomial x^4 + x + 1, initial value 0."""
    reg = 0
    for bit in bits:
        top = ((reg >> 3) & 1) ^ bit
        reg = ((reg << 1) & 0xF) ^ (0b0011 if top else 0)
    return [(reg >> (CRC_BITS - 1 - i)) & 1 for i in range(CRC_BITS)]


def encode_cells(index: int) -> list[int]:
    """The NUM_CELLS cell values (1 white, 0 black) that encode `index`."""
    if not 0 <= int(index) < MAX_INDEX:
        raise ValueError(f"frame index {index} outside [0, {MAX_INDEX})")
    data = [(int(index) >> (DATA_BITS - 1 - i)) & 1 for i in range(DATA_BITS)]
    return [*START_GUARD, *data, *_crc4(data), *STOP_GUARD]


def _cell_edges(width: int) -> np.ndarray:
    return np.round(np.arange(NUM_CELLS + 1) * (width / NUM_CELLS)).astype(np.int64)


def frame_index_row(index: int, width: int) -> np.ndarray:
    """One row of the strip for `index`: uint8 (width,), 255 for white cells, 0 for black."""
    if width < NUM_CELLS:
        raise ValueError(f"frame {width} px wide is too narrow for a {NUM_CELLS}-cell barcode")
    cells = np.asarray(encode_cells(index), dtype=np.uint8) * 255         # (NUM_CELLS,)
    return np.repeat(cells, np.diff(_cell_edges(width)))                  # (W,)


def draw_frame_index(frame: np.ndarray, index: int) -> None:
    """Draw the strip for `index` into `frame` (uint8 (H, W, 3)) in place."""
    height, width = frame.shape[:2]
    row = frame_index_row(index, width)                                   # (W,)
    # A contiguous (W, 3) row broadcasts ~100x faster than a stride-0 channel axis.
    frame[: strip_height(height)] = np.repeat(row[:, None], 3, axis=1)[None]   # (h, W, 3)


def _as_hwc(frame) -> np.ndarray:
    arr = np.asarray(frame)
    if arr.ndim == 3 and arr.shape[0] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(1, 2, 0)                                      # (3, H, W) -> (H, W, 3)
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise BarcodeError(f"expected an (H, W, 3) frame, got shape {tuple(arr.shape)}")
    return arr


def _band_rows(height: int) -> tuple[int, int]:
    # The middle half of the strip's rows, at least one row: edges blur into the scene on resize.
    strip = height * STRIP_FRACTION
    top, bottom = int(np.floor(strip * 0.25)), int(np.ceil(strip * 0.75))
    return top, max(bottom, top + 1)


def _cell_windows(width: int) -> tuple[np.ndarray, np.ndarray]:
    # The middle half of each cell's columns, at least one column.
    cell = width / NUM_CELLS
    centres = (np.arange(NUM_CELLS) + 0.5) * cell
    lo = np.floor(centres - cell * 0.25).astype(np.int64)
    hi = np.maximum(np.ceil(centres + cell * 0.25).astype(np.int64), lo + 1)
    return np.clip(lo, 0, width - 1), np.clip(hi, 1, width)


def _decode_levels(levels: np.ndarray) -> int:
    """Cell luma levels (NUM_CELLS,) -> index; raises BarcodeError."""
    white = levels[list(_GUARD_WHITE)].min()
    black = levels[list(_GUARD_BLACK)].max()
    contrast = white - black
    if contrast < MIN_CONTRAST:
        raise BarcodeError(f"no frame-index strip: guard contrast {contrast:.0f} < {MIN_CONTRAST:.0f}")
    threshold = (white + black) / 2
    margin = np.abs(levels - threshold) / contrast
    if margin.min() < MIN_MARGIN:
        cell = int(margin.argmin())
        raise BarcodeError(f"ambiguous frame-index strip: cell {cell} is near the threshold")
    bits = (levels > threshold).astype(int).tolist()
    data, crc = bits[_DATA], bits[_CRC]
    if _crc4(data) != crc:
        raise BarcodeError("frame-index strip fails its checksum")
    return int("".join(map(str, data)), 2)


def _levels(frames: np.ndarray) -> np.ndarray:
    """Per-cell mean luma of a batch of HWC frames (T, H, W, 3) -> (T, NUM_CELLS)."""
    _, height, width, _ = frames.shape
    top, bottom = _band_rows(height)
    band = frames[:, top:bottom].astype(np.float32)                       # (T, h, W, 3)
    luma = band @ np.asarray([0.299, 0.587, 0.114], dtype=np.float32)     # (T, h, W)
    profile = luma.mean(axis=1)                                           # (T, W)
    lo, hi = _cell_windows(width)
    csum = np.concatenate([np.zeros((profile.shape[0], 1), np.float32), profile.cumsum(axis=1)], 1)
    return (csum[:, hi] - csum[:, lo]) / (hi - lo)                        # (T, NUM_CELLS)


def read_frame_index(frame) -> int:
    """The index drawn in `frame`; raises BarcodeError (a ValueError) if it cannot be read."""
    arr = _as_hwc(frame)
    if arr.shape[1] < NUM_CELLS or arr.shape[0] < 4:
        raise BarcodeError(f"frame {arr.shape[1]}x{arr.shape[0]} is too small to carry a barcode")
    return _decode_levels(_levels(arr[None])[0])


def read_frame_indices(frames) -> list[int]:
    """Indices for a batch of frames (T, H, W, 3) or (T, 3, H, W); -1 where unreadable."""
    arr = np.asarray(frames)
    if arr.ndim == 4 and arr.shape[1] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(0, 2, 3, 1)                                   # (T, 3, H, W) -> (T, H, W, 3)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise BarcodeError(f"expected (T, H, W, 3) frames, got shape {tuple(arr.shape)}")
    if len(arr) == 0:
        return []
    out = []
    for levels in _levels(arr):
        try:
            out.append(_decode_levels(levels))
        except BarcodeError:
            out.append(-1)
    return out


def read_frame_index_reference(frame) -> int:
    """Plain reference decoder: one cell at a time, no cumulative sums. Same contract."""
    arr = _as_hwc(frame).astype(np.float64)
    height, width = arr.shape[:2]
    top, bottom = _band_rows(height)
    lo, hi = _cell_windows(width)
    levels = np.empty(NUM_CELLS)
    for cell in range(NUM_CELLS):
        block = arr[top:bottom, lo[cell]:hi[cell]]
        levels[cell] = (0.299 * block[..., 0] + 0.587 * block[..., 1] + 0.114 * block[..., 2]).mean()
    return _decode_levels(levels)
