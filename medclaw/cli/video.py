"""`medclaw video …`: synthesise a procedure video with ground truth, probe a video.

    medclaw video synth OUT.mp4 --minutes M [--seed S] [--width W] [--height H] [--fps F]
    medclaw video probe VIDEO [--json] [--max-pixels N] [--assume-fps F]

Top level is argparse only; numpy/PyAV load inside the handlers so `medclaw --help` stays instant.
"""
from __future__ import annotations

import argparse
import json
import sys

from medclaw.errors import ConfigError


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="video_command", metavar="SUBCOMMAND")

    synth = sub.add_parser("synth", help="render a synthetic procedure video + ground-truth JSON",
                           description="Render a synthetic procedure video (phases, instruments, "
                                       "clips, sutures, a frame-index barcode on every frame) and "
                                       "write its ground truth to OUT.json.")
    synth.add_argument("out", metavar="OUT.mp4", help="output video path")
    synth.add_argument("--minutes", type=float, required=True, help="length in minutes (>= 0.2)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument("--width", type=int, default=640, help="frame width, even (default 640)")
    synth.add_argument("--height", type=int, default=360, help="frame height, even (default 360)")
    synth.add_argument("--fps", type=float, default=25, help="frame rate (default 25)")
    synth.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    synth.set_defaults(handler=_synth)

    probe = sub.add_parser("probe", help="frame count, fps, duration, codec, rotation, sha256",
                           description="Probe a video: real frame count (demuxed packets), "
                                       "duration, fps, codec, rotation, display size, sha256.")
    probe.add_argument("video", metavar="VIDEO", help="video file")
    probe.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    probe.add_argument("--max-pixels", type=int, default=None,
                       help="fail if width * height exceeds this")
    probe.add_argument("--assume-fps", type=float, default=None, metavar="F",
                       help="frame rate of a stream without timestamps (raw .h264/.hevc); "
                            "default: the rate it declares, else 25")
    probe.set_defaults(handler=_probe)


def _synth(args) -> int:
    import time

    from medclaw.synth.video import synthesize

    started = time.perf_counter()
    try:
        video = synthesize(args.out, args.minutes, seed=args.seed, width=args.width,
                           height=args.height, fps=args.fps)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    summary = {"video": str(video.path), "ground_truth": str(video.gt_path),
               "num_frames": video.num_frames, "fps": video.fps, "duration_s": video.duration_s,
               "phases": [p["name"] for p in video.gt.phases], "num_qa": len(video.gt.qa),
               "elapsed_s": round(time.perf_counter() - started, 3)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"video:        {video.path}  ({video.num_frames} frames, {video.duration_s:.1f} s "
              f"at {video.fps:g} fps)")
        print(f"ground truth: {video.gt_path}  ({len(video.gt.events)} events, "
              f"{len(video.gt.qa)} QA pairs)")
    return 0


def _probe(args) -> int:
    from medclaw.kernels.probe import probe_video

    if args.assume_fps is not None and not args.assume_fps > 0:
        raise ConfigError(f"--assume-fps must be > 0, got {args.assume_fps}")
    info = probe_video(args.video, max_pixels=args.max_pixels, assumed_fps=args.assume_fps)
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    rows = [("path", info.path), ("codec", info.codec),
            ("size", f"{info.width}x{info.height} (display)"),
            ("frames", str(info.num_frames)),
            ("fps", f"{info.fps:.3f}" + (" (variable)" if info.is_variable_fps else "")
             + (" (assumed: the stream has no timestamps)" if info.fps_is_assumed else "")),
            ("duration", f"{info.duration_s:.3f} s"), ("rotation", f"{info.rotation} deg"),
            ("sha256", info.sha256)]
    if info.damage:
        rows.append(("damage", info.damage))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}", file=sys.stdout)
    return 0
