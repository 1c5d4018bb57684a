"""Drawing primitives for the synthetic video: phase scenes, instrument sprites, two canvases.

The renderer draws every frame with six operations (`load` a pre-converted scene, `fill` a
rectangle, `paint` a masked sprite, colour a rectangle column by column (`stripes`), draw the barcode
`strip`, read `data`). Two canvases implement them:

- `YUVCanvas` (fast path, what `synthesize` uses): draws straight into a planar yuv420p buffer,
  which is what x264 encodes. Feeding ffmpeg yuv420p instead of rgb24 halves the bytes through the
  pipe and skips ffmpeg's colour conversion (~40 % of its CPU time on these frames).
- `RGBCanvas` (plain reference): draws into an RGB array; `rgb_to_yuv420` of its frame is what
  ffmpeg would have encoded. A test checks the two agree (luma exactly; chroma on every 2×2 block
  that is one colour in the reference — mixed blocks are averaged there, thresholded here).

All coordinates given to `fill`/`paint` must be even (the renderer snaps them), so a drawn
object's edges line up with the 2×2 chroma blocks. Colour conversion is BT.601 limited range,
ffmpeg's default for untagged video, so decoders map the colours back to the RGB we chose.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Scene look per phase: base RGB and texture kind. Muted tissue tones: far from every instrument,
# clip, blood and suture colour, so a colour found in a frame identifies what drew it.
SCENES: dict[str, tuple[tuple[int, int, int], str]] = {
    "preparation": ((196, 150, 140), "speckle"),
    "dissection": ((148, 84, 80), "blobs"),
    "clipping": ((190, 162, 112), "fat"),
    "cutting": ((150, 128, 134), "fat"),
    "suturing": ((170, 108, 112), "fibres"),
    "closure": ((178, 172, 150), "stripes"),
}

_YUV = np.asarray([[65.481, 128.553, 24.966],                 # BT.601, limited range (16..235)
                   [-37.797, -74.203, 112.0],
                   [112.0, -93.786, -18.214]], dtype=np.float32) / 255.0
_YUV_OFFSET = np.asarray([16.0, 128.0, 128.0], dtype=np.float32)


def even(value: float) -> int:
    """Nearest even integer (drawn geometry lines up with 2×2 chroma blocks)."""
    return int(round(value / 2.0)) * 2


def yuv_color(color) -> tuple[int, int, int]:
    """One RGB colour -> (Y, U, V) bytes, as `rgb_to_yuv420` maps a flat patch of it."""
    yuv = _YUV @ np.asarray(color, np.float32) + _YUV_OFFSET
    return tuple(int(v) for v in np.clip(np.round(yuv), 0, 255))


def rgb_to_yuv420(rgb: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) RGB -> flat uint8 yuv420p (H*W*3/2,): Y plane, then U, then V (2×2 means)."""
    h, w, _ = rgb.shape
    f = rgb.astype(np.float32)
    y = f @ _YUV[0] + _YUV_OFFSET[0]                                          # (H, W)
    block = f.reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3))              # (H/2, W/2, 3)
    u = block @ _YUV[1] + _YUV_OFFSET[1]
    v = block @ _YUV[2] + _YUV_OFFSET[2]
    planes = [np.clip(np.round(p), 0, 255).astype(np.uint8).ravel() for p in (y, u, v)]
    return np.concatenate(planes)


@dataclass(slots=True, frozen=True)
class Mask:
    """A boolean shape (h, w), even sizes, with its half-resolution chroma mask precomputed."""

    full: np.ndarray              # (h, w) bool
    half: np.ndarray              # (h/2, w/2) bool: 2×2 blocks at least half covered

    @classmethod
    def of(cls, full: np.ndarray) -> "Mask":
        h, w = full.shape
        if h % 2 or w % 2:
            raise ValueError(f"mask sizes must be even, got {h}x{w}")
        half = full.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)) >= 0.5
        return cls(np.ascontiguousarray(full), np.ascontiguousarray(half))


class YUVCanvas:
    """Planar yuv420p frame buffer: `data` is the flat (H*W*3/2,) uint8 array ffmpeg reads."""

    def __init__(self, height: int, width: int):
        self.height, self.width = height, width
        n = height * width
        self.data = np.empty(n * 3 // 2, dtype=np.uint8)
        self.y = self.data[:n].reshape(height, width)                         # (H, W)
        self.u = self.data[n:n * 5 // 4].reshape(height // 2, width // 2)     # (H/2, W/2)
        self.v = self.data[n * 5 // 4:].reshape(height // 2, width // 2)
        self._row_luma = np.asarray([16, 235], np.uint8)                       # black, white

    def native(self, rgb: np.ndarray) -> np.ndarray:
        return rgb_to_yuv420(rgb)

    def load(self, scene: np.ndarray) -> None:
        np.copyto(self.data, scene)

    def fill(self, y0: int, y1: int, x0: int, x1: int, color) -> None:
        cy, cu, cv = yuv_color(color)
        self.y[y0:y1, x0:x1] = cy
        self.u[y0 // 2:y1 // 2, x0 // 2:x1 // 2] = cu
        self.v[y0 // 2:y1 // 2, x0 // 2:x1 // 2] = cv

    def paint(self, y0: int, x0: int, mask: Mask, color) -> None:
        cy, cu, cv = yuv_color(color)
        h, w = mask.full.shape
        self.y[y0:y0 + h, x0:x0 + w][mask.full] = cy
        self.u[y0 // 2:(y0 + h) // 2, x0 // 2:(x0 + w) // 2][mask.half] = cu
        self.v[y0 // 2:(y0 + h) // 2, x0 // 2:(x0 + w) // 2][mask.half] = cv

    def stripes(self, y0: int, y1: int, x0: int, x1: int, columns: np.ndarray) -> None:
        """Rows y0..y1 of x0..x1 coloured by column: `columns` (x1 - x0, 3) RGB. Chroma per 2×2
        block from the mean of its two columns, as `rgb_to_yuv420` takes it from the reference."""
        cols = columns.astype(np.float32)
        self.y[y0:y1, x0:x1] = [yuv_color(c)[0] for c in cols]
        pairs = cols.reshape(-1, 2, 3).mean(axis=1)
        chroma = np.asarray([yuv_color(c)[1:] for c in pairs], np.uint8)          # (n/2, 2)
        self.u[y0 // 2:y1 // 2, x0 // 2:x1 // 2] = chroma[:, 0]
        self.v[y0 // 2:y1 // 2, x0 // 2:x1 // 2] = chroma[:, 1]

    def strip(self, row: np.ndarray, rows: int) -> None:
        """Barcode: `row` (W,) of 0/255 repeated over the top `rows` rows (even), neutral chroma."""
        self.y[:rows] = self._row_luma[row // 255][None, :]
        self.u[:rows // 2] = 128
        self.v[:rows // 2] = 128


class RGBCanvas:
    """Reference canvas: plain RGB drawing; compare `rgb_to_yuv420(canvas.rgb)` with YUVCanvas."""

    def __init__(self, height: int, width: int):
        self.rgb = np.empty((height, width, 3), dtype=np.uint8)

    @property
    def data(self) -> np.ndarray:
        return rgb_to_yuv420(self.rgb)

    def native(self, rgb: np.ndarray) -> np.ndarray:
        return rgb

    def load(self, scene: np.ndarray) -> None:
        self.rgb[...] = scene

    def fill(self, y0: int, y1: int, x0: int, x1: int, color) -> None:
        self.rgb[y0:y1, x0:x1] = color

    def paint(self, y0: int, x0: int, mask: Mask, color) -> None:
        h, w = mask.full.shape
        self.rgb[y0:y0 + h, x0:x0 + w][mask.full] = color

    def stripes(self, y0: int, y1: int, x0: int, x1: int, columns: np.ndarray) -> None:
        self.rgb[y0:y1, x0:x1] = columns[None]

    def strip(self, row: np.ndarray, rows: int) -> None:
        self.rgb[:rows] = row[None, :, None]


def _upsample(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear upsampling of a small (gh, gw) grid to (height, width)."""
    gh, gw = grid.shape
    ys, xs = np.linspace(0, gh - 1, height), np.linspace(0, gw - 1, width)
    y0, x0 = np.minimum(ys.astype(int), gh - 2), np.minimum(xs.astype(int), gw - 2)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx                 # (H, W)
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def scene(name: str, rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """The static background of one phase: base colour + its own texture, uint8 (H, W, 3)."""
    base, kind = SCENES[name]
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    yy, xx = yy / height, xx / width
    shade = _upsample(rng.standard_normal((5, 8)), height, width) * 6.0         # (H, W)
    if kind == "speckle":
        shade += rng.standard_normal((height, width)) * 5.0
    elif kind == "blobs":
        shade += np.tanh(_upsample(rng.standard_normal((10, 18)), height, width) * 2.5) * 14.0
    elif kind == "fat":
        cells = np.sin(xx * 60 + 3 * np.sin(yy * 11)) * np.sin(yy * 34 + 2 * np.sin(xx * 9))
        shade += np.abs(cells) * 18.0 - 9.0
    elif kind == "fibres":
        warp = 4 * _upsample(rng.standard_normal((4, 6)), height, width)
        shade += np.sin((xx * 0.4 + yy) * 90 + warp) * 11.0
    elif kind == "stripes":
        shade += np.sign(np.sin(xx * 40)) * 8.0
    img = np.asarray(base, np.float32)[None, None, :] + shade[..., None]      # (H, W, 3)
    return np.ascontiguousarray(np.clip(img, 0, 255).astype(np.uint8))


def sprite(shape: str, size: int) -> np.ndarray:
    """Boolean (size, size) mask of an instrument, tip pointing right."""
    v = (np.arange(size, dtype=np.float32) + 0.5) / size
    y, x = v[:, None], v[None, :]

    def line(x0, y0, x1, y1, half):
        # Distance to the segment (x0, y0)-(x1, y1) below `half`.
        dx, dy = x1 - x0, y1 - y0
        t = np.clip(((x - x0) * dx + (y - y0) * dy) / (dx * dx + dy * dy), 0, 1)
        return np.hypot(x - x0 - t * dx, y - y0 - t * dy) < half

    shaft = (x < 0.6) & (np.abs(y - 0.5) < 0.09)
    masks = {
        "fork": shaft | line(0.55, 0.5, 0.95, 0.2, 0.08) | line(0.55, 0.5, 0.95, 0.8, 0.08),
        "X": line(0.08, 0.08, 0.92, 0.92, 0.1) | line(0.08, 0.92, 0.92, 0.08, 0.1),
        "head": (((x < 0.7) & (np.abs(y - 0.5) < 0.1)) | ((x >= 0.6) & (np.abs(y - 0.5) < 0.3)))
                & ~((x > 0.85) & (np.abs(y - 0.5) < 0.08)),
        "ring": ((x < 0.45) & (np.abs(y - 0.5) < 0.09))
                | (np.abs(np.hypot(x - 0.68, y - 0.5) - 0.22) < 0.08),
        "L": ((np.abs(x - 0.35) < 0.1) & (y > 0.08) & (y < 0.9))
             | ((y > 0.72) & (y < 0.9) & (x > 0.25) & (x < 0.9)),
        "disc": (np.hypot(x - 0.6, y - 0.5) < 0.34) | ((x < 0.4) & (np.abs(y - 0.5) < 0.1)),
    }
    return masks[shape]
