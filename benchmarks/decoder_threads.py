"""Decoders alone, by thread count: wall and CPU time of each CPU decoder on the three decode cases,
and ffmpeg decoding every frame, with how many cores each kept busy (CPU time / wall time).

    python benchmarks/decoder_threads.py VIDEO [--threads 1,2] [--repeat 3] [--decoders a,b]

No probe, no planner overhead, no cache, no baseline: one `DecodeJob` per measurement, straight to
the decoder, in this process (imports and decoder libraries loaded before the clock). Frame
accuracy is checked from the barcodes when VIDEO is a synthetic one. JSON on stdout. Run it
against another checkout with PYTHONPATH=that/checkout to compare two versions of the decoders.
`medclaw bench decode` is the end-to-end comparison with qwen-vl-utils; this one explains it.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from statistics import median


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _timed(work, repeat: int, who=resource.RUSAGE_SELF) -> tuple[float, float, object]:
    """Median wall seconds, median CPU seconds (all threads, or children), last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        cpu0, wall0 = _cpu_s(who), time.perf_counter()
        result = work()
        walls.append(time.perf_counter() - wall0)
        cpus.append(_cpu_s(who) - cpu0)
    return median(walls), median(cpus), result


def _row(wall: float, cpu: float, **extra) -> dict:
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "cores_busy": round(cpu / wall, 2) if wall else None, **extra}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("video")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--decoders", default=None, help="default: every available CPU decoder")
    args = parser.parse_args(argv)

    from medclaw.synth.barcode import read_frame_indices
    from medclaw.bench.decode import CASES, case_request, has_ground_truth
    from medclaw.kernels.decoders import available_decoders, make_decoder
    from medclaw.kernels.decoders.base import DecodeJob
    from medclaw.kernels.index import index_for
    from medclaw.kernels.planner import plan_frames
    from medclaw.kernels.probe import probe_video

    info = probe_video(args.video)
    index = index_for(info)
    plans = {case: plan_frames(info, **case_request(case, info)["plan"]) for case in CASES
             if case_request(case, info)["plan"] is not None}        # not the one-frame seek
    names = args.decoders.split(",") if args.decoders else available_decoders("cpu")
    threads = [int(t) for t in args.threads.split(",")]
    check = has_ground_truth(args.video)
    out = {"video": args.video, "repeat": args.repeat, "decoders": {}, "ffmpeg_all": {}}
    for name in names:
        decoder = make_decoder(name, "cpu")
        for n in threads:
            for case, plan in plans.items():
                def work():
                    return decoder.decode(DecodeJob(
                        path=str(info.path), indices=tuple(plan.frame_indices), width=plan.width,
                        height=plan.height, fps=info.fps, num_threads=n, index=index)).frames
                wall, cpu, frames = _timed(work, args.repeat)
                accuracy = None
                if check:
                    got = read_frame_indices(frames.numpy())
                    accuracy = sum(g == e for g, e in zip(got, plan.frame_indices)) / len(got)
                out["decoders"].setdefault(name, {}).setdefault(str(n), {})[case] = _row(
                    wall, cpu, frames=plan.num_frames, frame_accuracy=accuracy)
                print(f"{name} threads={n} {case}: {wall:.2f} s", file=sys.stderr)
    for n in threads:
        cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-threads", str(n), "-i", args.video,
               "-f", "null", "-"]
        wall, cpu, _ = _timed(lambda: subprocess.run(cmd, check=True), args.repeat,
                              resource.RUSAGE_CHILDREN)
        out["ffmpeg_all"][str(n)] = _row(wall, cpu)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
