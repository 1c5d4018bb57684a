"""Synthetic procedure videos with frame-exact ground truth.

    synthesize(out_path, minutes, seed=0, width=640, height=360, fps=25) -> SynthVideo

writes an H.264 (yuv420p, CRF 23, keyframe every 250 frames) video to `out_path` and its ground
truth to `out_path.with_suffix(".json")` (schema: `synth.truth`). The video shows six phases, each
with its own scene colour and texture; saturated instruments (each a distinct colour and shape,
`synth.truth.INSTRUMENTS`) enter and leave at known frames; a vessel gets titanium clips and is cut;
a bleed appears and is sucked away; black sutures close an incision. Every frame carries its index
as a barcode strip at the top (`barcode`), so decoders can be checked frame-exactly.

Deterministic from the seed (the ground truth exactly; the bytes too, for one ffmpeg build).
Rendering is numpy only: each phase's static scene is pre-rendered once; per frame we copy it and
draw just what changes (instrument sprites, clips, stitches, blood, barcode) straight into a
yuv420p buffer that is piped into `ffmpeg` (`synth.draw`: fast YUV canvas + plain RGB reference).
"""
from __future__ import annotations

from dataclasses import dataclass
import math
import os
from pathlib import Path
import shutil
import subprocess
import sys

from medclaw.synth.barcode import MAX_INDEX
from medclaw.kernels.errors import EncoderError
from medclaw.synth.draw import Mask, YUVCanvas, even, scene, sprite
from medclaw.synth.truth import (
    BLOOD_COLOR, CLIP_COLOR, INSTRUMENTS, MAX_SUTURES, PHASES, SUTURE_COLOR, GroundTruth,
    make_ground_truth,
)

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
               progress: bool | None = None, zoom=None) -> SynthVideo:
    """Render the procedure video and write its ground truth JSON beside it (`OUT.json`).

    `progress=None` shows a bar on stderr for long videos when stderr is a terminal.
    `zoom` (a `synth.zoom.ZoomOptions`) adds small objects, look-alikes and short flashes.
    Raises ValueError for bad sizes/lengths, EncoderError if ffmpeg is missing or fails.
    """
    if width % 2 or height % 2 or width < 128 or height < 72:
        raise ValueError(f"size must be even and at least 128x72, got {width}x{height}")
    if not 1 <= fps <= 240:
        raise ValueError(f"fps must be in [1, 240], got {fps}")
    out = Path(out_path)
    gt = make_ground_truth(minutes, seed=seed, width=width, height=height, fps=fps, zoom=zoom)
    if gt.num_frames > MAX_INDEX:     # fail now, not after hours of rendering
        raise ValueError(f"{gt.num_frames} frames exceed the frame-index barcode's limit of "
                         f"{MAX_INDEX}; ask for fewer minutes or a lower fps")
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
           "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", f"{width}x{height}", "-r", f"{fps:g}",
           "-i", "pipe:0", "-an", "-c:v", "libx264", "-preset", "veryfast", "-crf", str(crf),
           "-g", str(gop), "-pix_fmt", "yuv420p", str(path)]
    bar = None
    if progress_total:
        from tqdm import tqdm

        name = path.name.replace(".partial", "")
        bar = tqdm(total=progress_total, unit="frame", desc=f"synth {name}", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for canvas in frames:
            proc.stdin.write(canvas.data)
            if bar is not None:
                bar.update(1)
        proc.stdin.close()
    except BrokenPipeError:
        pass                           # ffmpeg died: its stderr says why, below
    except BaseException:
        proc.kill()                    # interrupted or a bug: leave no encoder or partial file
        proc.wait()
        path.unlink(missing_ok=True)
        raise
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


class _Renderer:
    """Draws the frames of one ground truth on a canvas (`YUVCanvas` fast, `RGBCanvas` reference).

    `frames()` yields the same canvas object once per frame, redrawn in place. All geometry is
    snapped to even pixels (see `synth.draw`).
    """

    def __init__(self, gt: GroundTruth, seed: int, canvas_type=YUVCanvas):
        import numpy as np

        from medclaw.synth.barcode import strip_height

        self.gt, self.np = gt, np
        w, h = gt.width, gt.height
        self.canvas = canvas_type(h, w)
        self.top = top = even(strip_height(h) + 0.5)          # barcode rows, rounded up to even
        self.scene_h = scene_h = h - top
        self.sprite_size = s = max(12, even(0.22 * min(scene_h, w * 9 / 16)))
        self.amp = (0.025 * w, 0.025 * h)
        self.names = list(INSTRUMENTS)
        self.sprites, self.anchors = {}, {}
        for name, (_, shape) in INSTRUMENTS.items():
            mask = sprite(shape, s)
            fx, fy = _ANCHORS[name]
            self.sprites[name] = Mask.of(mask[:, ::-1] if fx > 0.5 else mask)   # tips face the centre
            self.anchors[name] = (fx * w, top + fy * scene_h)

        # Vessel (clipping, cutting) and incision (suturing, closure) are part of the static scenes.
        half = max(2, even(0.035 * scene_h))
        self.vessel = (even(top + _VESSEL_Y * scene_h) - half, even(top + _VESSEL_Y * scene_h) + half)
        self.incision_y = even(top + _INCISION_Y * scene_h)
        n = len(gt.events_of("clip_placed"))
        self.clip_x = [even((0.5 + (k - (n - 1) / 2) * _CLIP_SPACING) * w) for k in range(n)]
        left = n // 2 - 1 if n > 1 else 0
        self.cut_x = even((self.clip_x[left] + self.clip_x[min(left + 1, n - 1)]) / 2)
        self.clip_half_w = max(2, even(0.01 * w))
        self.stitch_x = [even((0.32 + (k + 0.5) * 0.36 / MAX_SUTURES) * w) for k in range(MAX_SUTURES)]
        rng = np.random.default_rng([seed, 1])
        scenes = {}
        for name in PHASES:
            img = scene(name, rng, w, h)
            if name in ("clipping", "cutting"):
                img[self.vessel[0]:self.vessel[1], even(0.25 * w):even(0.75 * w)] = _VESSEL_COLOR
            if name in ("suturing", "closure"):
                half_h = max(2, even(0.012 * scene_h))
                rows = slice(self.incision_y - half_h, self.incision_y + half_h)
                img[rows, even(0.3 * w):even(0.7 * w)] = _INCISION_COLOR
            scenes[name] = img
        cut_img = scenes["cutting"].copy()          # after the cut: a gap in the vessel
        gap = max(2, even(0.0125 * w))
        clean = scene("cutting", np.random.default_rng([seed, 2]), w, h)
        rows, cols = slice(*self.vessel), slice(self.cut_x - gap, self.cut_x + gap)
        cut_img[rows, cols] = clean[rows, cols]
        scenes["cut"] = cut_img
        self.scenes = {name: self.canvas.native(img) for name, img in scenes.items()}
        self.zoom = None
        if gt.zoom:
            from medclaw.synth.zoom import ZoomPainter

            self.zoom = ZoomPainter(gt.zoom, w, h, gt.num_frames)

    def _timeline(self):
        """Per-frame state as arrays, so the draw loop does no searching."""
        np, gt = self.np, self.gt
        n = gt.num_frames
        present = np.zeros((len(self.names), n), dtype=bool)               # (I, N)
        for i, name in enumerate(self.names):
            for span in gt.presence[name]:
                present[i, span["start_frame"]:span["end_frame"]] = True
        phase = np.zeros(n, dtype=np.int64)                                # (N,)
        for i, p in enumerate(gt.phases):
            phase[p["start_frame"]:p["end_frame"]] = i
        frames = np.arange(n)
        clips = np.searchsorted([e["frame"] for e in gt.events_of("clip_placed")], frames, "right")
        sutures = np.searchsorted([e["frame"] for e in gt.events_of("suture")], frames, "right")
        return present, phase, clips, sutures

    def frames(self, indices=None):
        """Yield the canvas drawn with frame i, for i in `indices` (default: every frame)."""
        from medclaw.synth.barcode import frame_index_row

        gt, canvas = self.gt, self.canvas
        present, phase, clips, sutures = self._timeline()
        cut_frame = gt.events_of("cut")[0]["frame"]
        bleed_on = gt.events_of("bleeding_start")[0]["frame"]
        bleed_off = gt.events_of("bleeding_stop")[0]["frame"]
        colors = {name: color for name, (color, _) in INSTRUMENTS.items()}
        clip_half_h = even((self.vessel[1] - self.vessel[0]) * 0.9)
        stitch_half_h, stitch_half_w = max(2, even(0.06 * self.scene_h)), max(2, even(0.006 * gt.width))
        vessel_mid = (self.vessel[0] + self.vessel[1]) // 2
        for f in range(gt.num_frames) if indices is None else indices:
            name = PHASES[phase[f]]
            canvas.load(self.scenes["cut" if name == "cutting" and f >= cut_frame else name])
            if name in ("clipping", "cutting"):
                for x in self.clip_x[:clips[f]]:
                    canvas.fill(vessel_mid - clip_half_h, vessel_mid + clip_half_h,
                                x - self.clip_half_w, x + self.clip_half_w, CLIP_COLOR)
            if name in ("suturing", "closure"):
                for x in self.stitch_x[:sutures[f]]:
                    canvas.fill(self.incision_y - stitch_half_h, self.incision_y + stitch_half_h,
                                x - stitch_half_w, x + stitch_half_w, SUTURE_COLOR)
            if bleed_on <= f < bleed_off:
                self._draw_blood((f - bleed_on) / gt.fps)
            t = f / gt.fps
            for i, inst in enumerate(self.names):
                if present[i, f]:
                    x0, y0 = self._position(inst, i, t)
                    canvas.paint(y0, x0, self.sprites[inst], colors[inst])
            if self.zoom is not None:
                self.zoom.draw(canvas, int(f))
            canvas.strip(frame_index_row(int(f), gt.width), self.top)
            yield canvas

    def _position(self, name: str, i: int, t: float) -> tuple[int, int]:
        """Top-left corner of an instrument's sprite at time t: a slow wobble around its anchor."""
        ax, ay = self.anchors[name]
        s, (amp_x, amp_y) = self.sprite_size, self.amp
        x = ax + amp_x * math.sin(2 * math.pi * t / (6.0 + i) + i) - s / 2
        y = ay + amp_y * math.sin(2 * math.pi * t / (9.0 + i) + 2 * i) - s / 2
        x = min(max(even(x), 0), self.gt.width - s)
        y = min(max(even(y), self.top), self.gt.height - s)
        return x, y

    def _draw_blood(self, age_s: float) -> None:
        np = self.np
        cx, cy = _BLEED_XY[0] * self.gt.width, self.top + _BLEED_XY[1] * self.scene_h
        radius = self.scene_h * (0.05 + 0.05 * min(1.0, age_s / 3.0))
        x0, y0 = even(cx - radius - 1), even(cy - radius - 1)
        size = even(2 * radius + 3)
        yy, xx = np.ogrid[y0:y0 + size, x0:x0 + size]
        disc = (xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= radius * radius     # (size, size)
        self.canvas.paint(y0, x0, Mask.of(disc), BLOOD_COLOR)
