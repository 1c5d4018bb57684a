"""Small barcoded videos in the containers and codecs hospital archives hold, built with ffmpeg.

    FORMATS                         name -> Format(suffix, how it is made, encoder it needs)
    make_format(name, folder) -> Path     builds (once) and returns the file
    missing_encoder(name) -> str | None   why this ffmpeg cannot build it (e.g. no AV1 encoder)

Frame i (in presentation order) carries the barcode i (`barcode.py`), so a decoder's output is
checked exactly. Sources are tiny (160×90, a few seconds) so that a test suite builds them all in
seconds. Variants:
    mp4         H.264 in MP4 with B-frames (the baseline)
    ts          stream copy of mp4 into MPEG-TS (stream starts at 1.4 s; what OR recorders write)
    vfr         10, 30 and 5 fps segments concatenated (abrupt rate changes), H.264 MP4
    h264        raw H.264 elementary stream: no container, no timestamps
    hevc10      HEVC Main 10 (yuv420p10le) in MKV
    av1         AV1 in MP4 (libsvtav1 or libaom-av1)
    vp9         VP9 in WebM
    mpeg4       MPEG-4 Part 2 in AVI
    mjpeg       Motion JPEG in MOV
    rotated     mp4 with a 90° display matrix
    odd         161×91 (odd sides), H.264 4:4:4
    one         a single frame
    trunc_ts    ts cut at 60 % of its bytes (a recorder that lost power)
    trunc_mp4   mp4 remuxed faststart ('moov' index first), cut at 60 % of its bytes
    trunc_mkv   mp4 remuxed into Matroska, cut at half its bytes
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from medclaw.kernels.errors import EncoderError

WIDTH, HEIGHT, FPS, FRAMES = 160, 90, 25, 100
VFR_SEGMENTS = ((10, 20), (30, 60), (5, 20))    # (fps, frames): 2 s + 2 s + 4 s
_X264 = ["-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-g", "24", "-bf", "3"]


@dataclass(slots=True, frozen=True)
class Format:
    suffix: str
    args: tuple[str, ...]            # ffmpeg output arguments for an encode from raw frames
    encoder: str = "libx264"        # ffmpeg encoder it needs (checked by missing_encoder)
    frames: int = FRAMES
    size: tuple[int, int] = (WIDTH, HEIGHT)
    derive: str = ""                 # made from another format's file instead of from raw frames
    cut: float = 0.0                 # keep only this fraction of the bytes (a damaged file)


FORMATS: dict[str, Format] = {
    "mp4": Format(".mp4", (*_X264, "-pix_fmt", "yuv420p")),
    "ts": Format(".ts", ("-c", "copy"), derive="mp4"),
    "vfr": Format(".mp4", (*_X264, "-pix_fmt", "yuv420p", "-fps_mode", "passthrough",
                           "-video_track_timescale", "3000"),
                  frames=sum(n for _, n in VFR_SEGMENTS)),
    "h264": Format(".h264", ("-c", "copy", "-bsf:v", "h264_mp4toannexb", "-f", "h264"),
                   derive="mp4"),
    "hevc10": Format(".mkv", ("-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt",
                              "yuv420p10le", "-x265-params", "log-level=error:keyint=24:bframes=3"),
                     encoder="libx265"),
    "av1": Format(".mp4", ("-pix_fmt", "yuv420p", "-g", "24"), encoder="av1"),
    "vp9": Format(".webm", ("-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
                            "-crf", "20", "-b:v", "0", "-g", "24", "-pix_fmt", "yuv420p"),
                  encoder="libvpx-vp9"),
    "mpeg4": Format(".avi", ("-c:v", "mpeg4", "-q:v", "2", "-g", "24", "-bf", "2"),
                    encoder="mpeg4"),
    "mjpeg": Format(".mov", ("-c:v", "mjpeg", "-q:v", "2", "-pix_fmt", "yuvj420p"),
                    encoder="mjpeg"),
    "rotated": Format(".mp4", ("-c", "copy", "-metadata:s:v:0", "rotate=90"), derive="mp4"),
    "odd": Format(".mp4", (*_X264, "-pix_fmt", "yuv444p"), size=(161, 91)),
    "one": Format(".mp4", (*_X264, "-pix_fmt", "yuv420p"), frames=1),
    "trunc_ts": Format(".ts", (), derive="ts", cut=0.6),
    "trunc_mp4": Format(".mp4", ("-c", "copy", "-movflags", "+faststart"), derive="mp4", cut=0.6),
    "trunc_mkv": Format(".mkv", ("-c", "copy"), derive="mp4", cut=0.5),
}
_AV1_ENCODERS = ("libsvtav1", "libaom-av1")


def _encoders() -> str:
    if shutil.which("ffmpeg") is None:
        return ""
    out = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True)
    return out.stdout


def _av1_encoder(listing: str) -> str | None:
    return next((e for e in _AV1_ENCODERS if f" {e} " in listing), None)


def missing_encoder(name: str) -> str | None:
    """None if ffmpeg can build `name` here, else the reason (for a clean test skip)."""
    if shutil.which("ffmpeg") is None:
        return "the ffmpeg binary is not installed"
    fmt = FORMATS[name]
    while fmt.derive:
        fmt = FORMATS[fmt.derive]
    listing = _encoders()
    if fmt.encoder == "av1":
        return None if _av1_encoder(listing) else "this ffmpeg has no AV1 encoder (libsvtav1/libaom)"
    return None if f" {fmt.encoder} " in listing else f"this ffmpeg has no {fmt.encoder} encoder"


def _frames(n: int, width: int, height: int):
    import numpy as np

    from medclaw.synth.barcode import draw_frame_index

    yy, xx = np.mgrid[0:height, 0:width]
    for i in range(n):
        frame = np.empty((height, width, 3), np.uint8)                     # (H, W, 3)
        frame[..., 0] = (xx * 3 + i * 5) % 256
        frame[..., 1] = (yy * 4 + i * 3) % 256
        frame[..., 2] = 128
        draw_frame_index(frame, i)
        yield frame


def _run(cmd: list[str], what: str, stdin_frames=None) -> None:
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin_frames else None,
                            stderr=subprocess.PIPE)
    if stdin_frames:
        try:
            for frame in stdin_frames:
                proc.stdin.write(frame.tobytes())
        except BrokenPipeError:
            pass
        proc.stdin.close()
    err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    if proc.wait() != 0:
        raise EncoderError(f"ffmpeg failed to build {what}: {(err or ['?'])[-1]}")


def make_format(name: str, folder) -> Path:
    """Build the `name` video in `folder` (reused if already there) and return its path."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}: choose from {', '.join(FORMATS)}")
    why = missing_encoder(name)
    if why:
        raise EncoderError(why)
    fmt = FORMATS[name]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}{fmt.suffix}"
    if out.exists():
        return out
    tmp = out.with_name(f".tmp-{out.name}")
    base = ["ffmpeg", "-nostdin", "-v", "error", "-y"]
    if fmt.derive:
        source = make_format(fmt.derive, folder)
        if fmt.args:
            _run([*base, "-i", str(source), *fmt.args, "-f", _muxer(fmt.suffix), str(tmp)], name)
            source = tmp
        if fmt.cut:
            data = source.read_bytes()
            tmp.write_bytes(data[: int(len(data) * fmt.cut)])
    else:
        width, height = fmt.size
        args = list(fmt.args)
        if fmt.encoder == "av1":
            args = ["-c:v", _av1_encoder(_encoders()), *args]
            if args[1] == "libsvtav1":
                args += ["-preset", "12"]
            else:
                args += ["-cpu-used", "8", "-row-mt", "1"]
        raw = ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(FPS),
               "-i", "-"]
        if name == "vfr":
            # Piecewise pts: each segment at its own rate, in seconds, then / TB.
            (r1, n1), (r2, n2), (r3, _) = VFR_SEGMENTS
            t2, t3 = n1 / r1, n1 / r1 + n2 / r2
            expr = (f"if(lt(N,{n1}),N/{r1},if(lt(N,{n1 + n2}),{t2}+(N-{n1})/{r2},"
                    f"{t3}+(N-{n1 + n2})/{r3}))/TB")
            args = ["-vf", f"settb=1/3000,setpts='{expr}'", "-enc_time_base:v", "1/3000",
                    *args]
        if fmt.suffix == ".h264":
            args += ["-f", "h264"]
        _run([*base, *raw, *args, "-f", _muxer(fmt.suffix), str(tmp)], name,
             _frames(fmt.frames, width, height))
    tmp.replace(out)
    return out


def _muxer(suffix: str) -> str:
    return {".mp4": "mp4", ".ts": "mpegts", ".mkv": "matroska", ".webm": "webm", ".avi": "avi",
            ".mov": "mov", ".h264": "h264"}[suffix]

