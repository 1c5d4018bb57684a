"""Synthetic procedure videos with frame-exact ground truth.

    synthesize(out_path, minutes, seed=0, width=640, height=360, fps=25) -> SynthVideo

writes an H.264 (yuv420p, CRF 23, keyframe every 250 frames) video to `out_path` and its ground
truth to `out_path.with_suffix(".json")` (schema: `synth_truth`). The video shows six phases, each
with its own scene colour and texture; saturated instruments (each a distinct colour and shape,
`synth_truth.INSTRUMENTS`) enter and leave at known frames; a vessel gets silver clips and is cut;
a bleed appears and is sucked away; black sutures close an incision. Every frame carries its index
as a barcode strip at the top (`barcode`), so decoders can be checked frame-exactly.

Deterministic from the seed (the ground truth exactly; the bytes too, for one ffmpeg build).
Rendering is numpy only: each phase's static scene is pre-rendered once; per frame we copy it and
draw just what changes (instrument sprites, clips, stitches, blood, barcode), then pipe raw RGB
into `ffmpeg`. A 10-minute 640×360 25 fps video takes well under a minute on 2 cores.
"""
from __future__ import annotations

from dataclasses import dataclass
import math
import os
from pathlib import Path
import shutil
import subprocess
import sys

from medclaw.kernels.errors import EncoderError
from medclaw.kernels.synth_truth import (
    BLOOD_COLOR, CLIP_COLOR, INSTRUMENTS, MAX_SUTURES, PHASES, SUTURE_COLOR, GroundTruth,
    make_ground_truth,
)

# Scene look per phase: base RGB and texture kind. Muted tissue tones: far from every instrument,
# clip, blood and suture colour, so a colour found in a frame identifies what drew it.
SCENES: dict[str, tuple[tuple[int, int, int], str]] = {
    "preparation": ((196, 150, 140), "speckle"),
    "dissection": ((160, 96, 92), "blobs"),
    "clipping": ((190, 162, 112), "fat"),
    "cutting": ((150, 128, 134), "fat"),
    "suturing": ((170, 108, 112), "fibres"),
    "closure": ((178, 172, 150), "stripes"),
}
_VESSEL_COLOR = (118, 30, 40)
_INCISION_COLOR = (110, 52, 56)
# Instrument anchors as fractions of the scene (below the barcode). Instruments that share an
# anchor are never present together (hook: dissection; needle driver: suturing and closure).
_ANCHORS = {
    "grasper": (0.14, 0.32), "suction": (0.14, 0.78), "hook": (0.86, 0.32),
    "needle_driver": (0.86, 0.32), "clip_applier": (0.86, 0.78), "scissors": (0.50, 0.20),
}
_VESSEL_Y, _INCISION_Y, _BLEED_XY = 0.62, 0.66, (0.50, 0.58)
_CLIP_SPACING = 0.07               # of the width
_PROGRESS_MIN_FRAMES = 2500


@dataclass(slots=True)
class SynthVideo:
    """A synthetic video on disk and its ground truth."""

    path: Path
    gt_path: Path
    gt: GroundTruth

    @property
    def num_frames(self) -> int:
        return self.gt.num_frames

    @property
    def fps(self) -> float:
        return self.gt.fps

    @property
    def duration_s(self) -> float:
        return self.gt.duration_s


def synthesize(out_path, minutes: float, seed: int = 0, width: int = 640, height: int = 360,
               fps: float = 25, *, crf: int = 23, gop: int = 250,
               progress: bool | None = None) -> SynthVideo:
    """Render the procedure video and write its ground truth JSON beside it (`OUT.json`).

    `progress=None` shows a bar on stderr for long videos when stderr is a terminal.
    Raises ValueError for bad sizes/lengths, EncoderError if ffmpeg is missing or fails.
    """
    if width % 2 or height % 2 or width < 96 or height < 54:
        raise ValueError(f"size must be even and at least 96x54, got {width}x{height}")
    if not 1 <= fps <= 240:
        raise ValueError(f"fps must be in [1, 240], got {fps}")
    out = Path(out_path)
    gt = make_ground_truth(minutes, seed=seed, width=width, height=height, fps=fps)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.stem}.partial{out.suffix or '.mp4'}")
    if progress is None:
        progress = gt.num_frames >= _PROGRESS_MIN_FRAMES and sys.stderr.isatty()
    _encode(_Renderer(gt, seed).frames(), partial, width, height, fps, crf, gop,
            gt.num_frames if progress else 0)
    os.replace(partial, out)
    gt_path = out.with_suffix(".json")
    gt.save(gt_path)
    return SynthVideo(path=out, gt_path=gt_path, gt=gt)


def _encode(frames, path: Path, width: int, height: int, fps: float, crf: int, gop: int,
            progress_total: int) -> None:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise EncoderError("ffmpeg not found on PATH; install it (e.g. apt-get install ffmpeg)")
    cmd = [ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
           "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", f"{fps:g}",
           "-i", "pipe:0", "-an", "-c:v", "libx264", "-preset", "veryfast", "-crf", str(crf),
           "-g", str(gop), "-pix_fmt", "yuv420p", str(path)]
    bar = None
    if progress_total:
        from tqdm import tqdm

        bar = tqdm(total=progress_total, unit="frame", desc=f"synth {path.name}", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for frame in frames:
            proc.stdin.write(frame.data)
            if bar is not None:
                bar.update(1)
        proc.stdin.close()
    except BrokenPipeError:
        pass                           # ffmpeg died: its stderr says why, below
    finally:
        if bar is not None:
            bar.close()
    err = proc.stderr.read().decode(errors="replace").strip()
    if proc.wait() != 0:
        path.unlink(missing_ok=True)
        last = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
        raise EncoderError(f"ffmpeg failed writing {path}: {last}")


# ---------------------------------------------------------------------------------------------
# Rendering


def _upsample(grid, height: int, width: int):
    """Bilinear upsampling of a small (gh, gw) grid to (height, width)."""
    import numpy as np

    gh, gw = grid.shape
    ys, xs = np.linspace(0, gh - 1, height), np.linspace(0, gw - 1, width)
    y0, x0 = np.minimum(ys.astype(int), gh - 2), np.minimum(xs.astype(int), gw - 2)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx                 # (H, W)
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _scene(name: str, rng, width: int, height: int):
    """The static background of one phase: base colour + its own texture, uint8 (H, W, 3)."""
    import numpy as np

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
        shade += np.sin((xx * 0.4 + yy) * 90 + 4 * _upsample(rng.standard_normal((4, 6)), height, width)) * 11.0
    elif kind == "stripes":
        shade += np.sign(np.sin(xx * 40)) * 8.0
    img = np.asarray(base, np.float32)[None, None, :] + shade[..., None]      # (H, W, 3)
    return np.ascontiguousarray(np.clip(img, 0, 255).astype(np.uint8))   # fast per-frame copies


def _sprite(shape: str, size: int):
    """Boolean (size, size) mask of an instrument, tip pointing right."""
    import numpy as np

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
        "L": ((np.abs(x - 0.35) < 0.1) & (y > 0.08) & (y < 0.9)) | ((y > 0.72) & (y < 0.9) & (x > 0.25) & (x < 0.9)),
        "disc": (np.hypot(x - 0.6, y - 0.5) < 0.34) | ((x < 0.4) & (np.abs(y - 0.5) < 0.1)),
    }
    return masks[shape]


class _Renderer:
    """Draws the frames of one ground truth. `frames()` yields one reused uint8 (H, W, 3) buffer."""

    def __init__(self, gt: GroundTruth, seed: int):
        import numpy as np

        from medclaw.kernels.barcode import strip_height

        self.gt, self.np = gt, np
        w, h = gt.width, gt.height
        self.top = top = strip_height(h)
        self.scene_h = scene_h = h - top
        rng = np.random.default_rng([seed, 1])
        self.sprite_size = s = max(12, int(round(0.22 * min(scene_h, w * 9 / 16))))
        self.amp = (0.025 * w, 0.025 * h)
        self.names = list(INSTRUMENTS)
        self.sprites, self.anchors = {}, {}
        for name, (_, shape) in INSTRUMENTS.items():
            mask = _sprite(shape, s)
            fx, fy = _ANCHORS[name]
            self.sprites[name] = mask[:, ::-1] if fx > 0.5 else mask       # tips face the centre
            self.anchors[name] = (fx * w, top + fy * scene_h)

        # Static scenes, and the vessel/incision geometry drawn into them.
        self.vessel_half = max(2, int(round(0.035 * scene_h)))
        self.vessel_y = int(round(top + _VESSEL_Y * scene_h))
        self.incision_y = int(round(top + _INCISION_Y * scene_h))
        clips = gt.events_of("clip_placed")
        n = len(clips)
        self.clip_x = [int(round((0.5 + (k - (n - 1) / 2) * _CLIP_SPACING) * w)) for k in range(n)]
        left = n // 2 - 1 if n > 1 else 0
        self.cut_x = (self.clip_x[left] + self.clip_x[min(left + 1, n - 1)]) // 2
        self.clip_half_w = max(2, int(round(0.01 * w)))
        self.stitch_x = [int(round((0.32 + (k + 0.5) * 0.36 / MAX_SUTURES) * w))
                         for k in range(MAX_SUTURES)]
        self.scenes = {}
        for name in PHASES:
            img = _scene(name, rng, w, h)
            if name in ("clipping", "cutting"):
                y0, y1 = self.vessel_y - self.vessel_half, self.vessel_y + self.vessel_half
                img[y0:y1, int(0.25 * w):int(0.75 * w)] = _VESSEL_COLOR
            if name in ("suturing", "closure"):
                half = max(1, int(round(0.012 * scene_h)))
                img[self.incision_y - half:self.incision_y + half, int(0.3 * w):int(0.7 * w)] = _INCISION_COLOR
            self.scenes[name] = img
        cut_img = self.scenes["cutting"].copy()
        gap = max(2, int(round(0.0125 * w)))
        y0, y1 = self.vessel_y - self.vessel_half, self.vessel_y + self.vessel_half
        clean = _scene("cutting", np.random.default_rng([seed, 2]), w, h)
        cut_img[y0:y1, self.cut_x - gap:self.cut_x + gap] = clean[y0:y1, self.cut_x - gap:self.cut_x + gap]
        self.scenes["cut"] = cut_img

    def _timeline(self):
        """Per-frame state as arrays, so the draw loop does no searching."""
        np, gt = self.np, self.gt
        n = gt.num_frames
        present = np.zeros((len(self.names), n), dtype=bool)               # (I, N)
        for i, name in enumerate(self.names):
            for span in gt.presence[name]:
                present[i, span["start_frame"]:span["end_frame"]] = True
        phase = np.zeros(n, dtype=np.int64)
        for i, p in enumerate(gt.phases):
            phase[p["start_frame"]:p["end_frame"]] = i
        frames = np.arange(n)
        clips = np.searchsorted([e["frame"] for e in gt.events_of("clip_placed")], frames, "right")
        sutures = np.searchsorted([e["frame"] for e in gt.events_of("suture")], frames, "right")
        return present, phase, clips, sutures

    def frames(self):
        from medclaw.kernels.barcode import draw_frame_index

        np, gt = self.np, self.gt
        present, phase, clips, sutures = self._timeline()
        cut_frame = gt.events_of("cut")[0]["frame"]
        bleed_on = gt.events_of("bleeding_start")[0]["frame"]
        bleed_off = gt.events_of("bleeding_stop")[0]["frame"]
        colors = {name: np.asarray(c, np.uint8) for name, (c, _) in INSTRUMENTS.items()}
        s = self.sprite_size
        buf = np.empty((gt.height, gt.width, 3), dtype=np.uint8)
        for f in range(gt.num_frames):
            name = PHASES[phase[f]]
            scene = "cut" if name == "cutting" and f >= cut_frame else name
            np.copyto(buf, self.scenes[scene])
            if name in ("clipping", "cutting"):
                half_h = int(self.vessel_half * 1.8)
                for x in self.clip_x[:clips[f]]:
                    buf[self.vessel_y - half_h:self.vessel_y + half_h,
                        x - self.clip_half_w:x + self.clip_half_w] = CLIP_COLOR
            if name in ("suturing", "closure"):
                half_h, half_w = int(0.06 * self.scene_h), max(2, int(round(0.006 * gt.width)))
                for x in self.stitch_x[:sutures[f]]:
                    buf[self.incision_y - half_h:self.incision_y + half_h, x - half_w:x + half_w] = SUTURE_COLOR
            if bleed_on <= f < bleed_off:
                self._draw_blood(buf, (f - bleed_on) / gt.fps)
            t = f / gt.fps
            for i, inst in enumerate(self.names):
                if present[i, f]:
                    x0, y0 = self._position(inst, i, t)
                    np.copyto(buf[y0:y0 + s, x0:x0 + s], colors[inst], where=self.sprites[inst][..., None])
            draw_frame_index(buf, f)
            yield buf

    def _position(self, name: str, i: int, t: float) -> tuple[int, int]:
        """Top-left corner of an instrument's sprite at time t: a slow wobble around its anchor."""
        ax, ay = self.anchors[name]
        s, (amp_x, amp_y) = self.sprite_size, self.amp
        x = ax + amp_x * math.sin(2 * math.pi * t / (6.0 + i) + i) - s / 2
        y = ay + amp_y * math.sin(2 * math.pi * t / (9.0 + i) + 2 * i) - s / 2
        x = min(max(int(round(x)), 0), self.gt.width - s)
        y = min(max(int(round(y)), self.top), self.gt.height - s)
        return x, y

    def _draw_blood(self, buf, age_s: float) -> None:
        np = self.np
        w = self.gt.width
        cx, cy = _BLEED_XY[0] * w, self.top + _BLEED_XY[1] * self.scene_h
        radius = self.scene_h * (0.05 + 0.05 * min(1.0, age_s / 3.0))
        x0, x1 = int(cx - radius), int(math.ceil(cx + radius)) + 1
        y0, y1 = int(cy - radius), int(math.ceil(cy + radius)) + 1
        yy, xx = np.ogrid[y0:y1, x0:x1]
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= radius * radius          # (h, w)
        np.copyto(buf[y0:y1, x0:x1], np.asarray(BLOOD_COLOR, np.uint8), where=mask[..., None])
