"""`medclaw bench decode VIDEO [--json] [--device cpu|cuda]`: our decode path vs qwen-vl-utils.

Three cases, each run by us and by the baseline with the same frames and sizes:
    coarse  the whole video as qwen-vl-utils samples it by default: 2 fps, <= 768 frames, its
            default video pixel budget (e.g. 768 frames at 644x364 for 10 min of 640x360)
    window  a 30 s window in the middle at 4 fps and up to 768 tokens per frame (stage 2)
    sparse  64 frames spread over the whole video
    seek    one full-size frame at 60 % of the video, fetched by a fresh process and a fresh
            FrameSource (probe served by the stored sha256 and decode index, as on any call after
            the first); speed limit = `ffmpeg -ss T -i VIDEO -frames:v 1 -f null -`; no baseline
Ours = probe_video + plan_frames + FrameSource.get (default decoder for --device, default cache,
`--threads` decode threads: by default one per core, up to 8).
`--check-all`: after timing, every frame each case decodes is compared with a sequential reference
decode (PyAV from the start, no seeking), once through FrameSource and once per raw decoder
(`wrong_frames` per case: {decoder: frames differing from the reference}; raw decoders may be
wrong — FrameSource must not be).
Baseline = qwen-vl-utils `fetch_video` with its torchcodec reader forced
(FORCE_QWENVL_VIDEO_READER=torchcodec; we check its metadata says torchcodec, since it silently
falls back to torchvision on errors). Speed limit = `ffmpeg -threads N -i VIDEO -f null -` with
our thread count, decoding every frame of the case's time range (the whole video, or the window).

Method: every measurement (case × ours/baseline) runs in a fresh Python subprocess. Imports
(torch, torchcodec, qwen-vl-utils) happen before the clock starts, for both. Time = wall time of
the work. Peak memory = ru_maxrss at the end minus the RSS right after imports, i.e. the extra
resident memory the work needed at its peak (ru_maxrss is the kernel's exact high-water mark, so
no short spike is missed). frame_accuracy = fraction of returned frames whose barcode
(`barcode.read_frame_indices`) equals the planned index, when a ground-truth JSON of
`medclaw video synth` lies beside the video; null otherwise.

JSON (stdout): {"video", "device", "cases": {case: {"ours_s", "baseline_s", "speedup",
"ffmpeg_all_s", "ratio_to_ffmpeg", "ours_peak_mb", "baseline_peak_mb", "frame_accuracy", ...}},
"method": {...}}. Extra per-case keys: num_frames, width, height, same_frames_as_baseline,
baseline_frame_accuracy, baseline_reader.
"""
from __future__ import annotations

import argparse
import json
import os
from statistics import median
import subprocess
import sys
import time
from pathlib import Path

CASES = ("coarse", "window", "sparse", "seek")
SEEK_AT = 0.6                      # the seek case fetches the frame at this fraction of the video
WINDOW_S = 30.0
WINDOW_FPS = 4.0
SPARSE_FRAMES = 64
WINDOW_MAX_PIXELS = 768 * 28 * 28


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("video", metavar="VIDEO",
                        help="video file (e.g. from `medclaw video synth`)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where we decode (baseline always runs on CPU)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per measurement; the median time is reported (default 1)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="decode threads for ours and for the ffmpeg speed limit (default: "
                             "one per core, up to 8, as FrameSource uses); the baseline keeps "
                             "qwen-vl-utils' own setting")
    parser.add_argument("--check-all", action="store_true",
                        help="compare every decoded frame with a sequential reference decode and "
                             "report wrong frames per decoder")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip qwen-vl-utils (fast check of our path only)")
    parser.set_defaults(handler=_handler)


# --- case definitions (shared by both sides) ----------------------------------------------------

def case_request(case: str, info) -> dict:
    """Our plan_frames kwargs and the equivalent qwen-vl-utils element for `case`."""
    duration = info.num_frames / info.fps
    if case == "coarse":
        return {"plan": {}, "ele": {"fps": 2.0}, "range": (0.0, duration)}
    if case == "window":
        start = max(0.0, duration / 2 - WINDOW_S / 2)
        end = min(duration, start + WINDOW_S)
        return {"plan": {"start_s": start, "end_s": end, "fps": WINDOW_FPS,
                         "max_pixels": WINDOW_MAX_PIXELS},
                "ele": {"video_start": start, "video_end": end, "fps": WINDOW_FPS,
                        "max_pixels": WINDOW_MAX_PIXELS},
                "range": (start, end)}
    if case == "sparse":
        return {"plan": {"fps": None, "num_frames": SPARSE_FRAMES},
                "ele": {"nframes": SPARSE_FRAMES}, "range": (0.0, duration)}
    if case == "seek":
        at = SEEK_AT * duration
        return {"plan": None, "ele": None, "range": (at, at)}
    raise ValueError(f"unknown case {case!r}")


def has_ground_truth(video: str) -> bool:
    gt = Path(video).with_suffix(".json")
    if not gt.is_file():
        return False
    try:
        data = json.loads(gt.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "phases" in data and "seed" in data


# --- worker (runs in a fresh subprocess per measurement) -----------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_mb_since(rss_before: int) -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024    # KiB on Linux
    return round(max(peak - rss_before, 0) / 2 ** 20, 1)


def _accuracy(frames, expected) -> float:
    from medclaw.synth.barcode import read_frame_indices

    got = read_frame_indices(frames)
    return round(sum(g == e for g, e in zip(got, expected)) / max(len(expected), 1), 4)


def _run_ours(video: str, case: str, device: str, check: bool, threads: int) -> dict:
    import medclaw.kernels.decoders as decoders
    from medclaw.kernels.frames import FrameSource
    from medclaw.kernels.planner import plan_frames
    from medclaw.kernels.probe import probe_video

    decoders.make_decoder("auto", device)      # loads torchcodec/FFmpeg libs before the clock
    import torch  # noqa: F401
    rss = _rss_bytes()
    t0 = time.perf_counter()
    if case == "seek":
        from medclaw.kernels.planner import frame_at_time

        info = probe_video(video)                  # the stored sha256 + index: no file scan
        at = case_request(case, info)["range"][0]
        plan = _SeekPlan((frame_at_time(info, at),), info.width, info.height)
    else:
        info = probe_video(video, use_cache=False)
        plan = plan_frames(info, **case_request(case, info)["plan"])
    frames = FrameSource(device=device, num_threads=threads).get(info, plan,
                                                                  as_tensor=device != "cpu")
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = _peak_mb_since(rss)
    out = {"seconds": seconds, "peak_mb": peak, "indices": list(plan.frame_indices),
           "width": plan.width, "height": plan.height}
    if device != "cpu":
        out["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
        frames = frames.cpu().numpy()
    if check:
        out["accuracy"] = _accuracy(frames, plan.frame_indices)
    return out


class _SeekPlan:
    """The seek case's plan: one frame at full size (quacks like a FramePlan for FrameSource)."""

    def __init__(self, frame_indices, width, height):
        self.frame_indices, self.width, self.height = frame_indices, width, height


def _run_baseline(video: str, case: str, check: bool) -> dict:
    # FORCE_QWENVL_VIDEO_READER is read at import time: the parent sets it in our environment.
    import torchcodec.decoders  # noqa: F401
    from qwen_vl_utils import vision_process as vp

    from medclaw.kernels.probe import probe_video

    info = probe_video(video)                  # only to define the case's time range
    ele = {"video": video, **case_request(case, info)["ele"]}
    rss = _rss_bytes()
    t0 = time.perf_counter()
    frames, meta = vp.fetch_video(ele, return_video_metadata=True)    # (T, 3, H, W) float32
    seconds = time.perf_counter() - t0
    peak = _peak_mb_since(rss)
    indices = [int(i) for i in meta["frames_indices"]]
    out = {"seconds": seconds, "peak_mb": peak, "indices": indices,
           "width": int(frames.shape[-1]), "height": int(frames.shape[-2]),
           "reader": meta.get("video_backend", "?")}
    if check:
        out["accuracy"] = _accuracy(frames.numpy(), indices)
    return out


def _worker(argv: list[str]) -> None:
    side, video, case, device, check, threads = argv
    check = check == "1"
    result = (_run_ours(video, case, device, check, int(threads)) if side == "ours"
              else _run_baseline(video, case, check))
    print("MEDCLAW_BENCH " + json.dumps(result))


# --- parent -------------------------------------------------------------------------------------

def _measure(side: str, video: str, case: str, device: str, check: bool, threads: int) -> dict:
    env = {**os.environ, "FORCE_QWENVL_VIDEO_READER": "torchcodec"}
    cmd = [sys.executable, "-m", "medclaw.bench.decode", "--worker", side, video, case,
           device, "1" if check else "0", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("MEDCLAW_BENCH "):
            return json.loads(line[len("MEDCLAW_BENCH "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"bench worker {side}/{case} failed (exit {proc.returncode}): {tail[0]}")


def _ffmpeg_seconds(video: str, start: float, end: float, full: bool, threads: int) -> float:
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-threads", str(threads)]
    if end == start:                               # the seek case: one frame at `start`
        cmd += ["-ss", f"{start:.3f}", "-i", video, "-frames:v", "1", "-f", "null", "-"]
    elif not full:
        cmd += ["-ss", f"{start:.3f}", "-t", f"{end - start:.3f}", "-i", video, "-f", "null",
                "-"]
    else:
        cmd += ["-i", video, "-f", "null", "-"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def check_all(video: str, info, cases, device: str = "cpu") -> dict:
    """{case: {decoder: wrong frames}}: every frame of each case, through FrameSource and through
    each raw decoder, against a sequential reference decode (module docstring)."""
    import numpy as np

    from medclaw.kernels.decoders import available_decoders, make_decoder
    from medclaw.kernels.decoders.base import DecodeJob
    from medclaw.kernels.frames import FrameSource
    from medclaw.kernels.index import index_for
    from medclaw.kernels.planner import frame_at_time, plan_frames
    from medclaw.kernels.verify import reference_decode

    index = index_for(info)
    out = {}
    for case in cases:
        if case == "seek":
            indices = [frame_at_time(info, case_request(case, info)["range"][0])]
        else:
            indices = sorted(set(plan_frames(info, **case_request(case, info)["plan"])
                                 .frame_indices))
        # Native size: the reference and every decoder compared pixel for pixel, no resizing.
        reference, _ = reference_decode(video, index, keep=indices)               # (n, H, W, 3)

        def wrong(frames) -> int:
            frames = np.asarray(frames)
            diff = np.abs(frames.astype(np.int16) - reference.astype(np.int16))
            return int((diff.reshape(len(indices), -1).mean(axis=1) > 4.0).sum())

        row = {"frame_source": wrong(FrameSource(device=device, cache_mb=0).get_frames(
            info, indices, info.width, info.height))}
        for name in available_decoders(device):
            job = DecodeJob(path=str(video), indices=tuple(indices), width=info.width,
                            height=info.height, fps=info.fps, rotation=info.rotation,
                            index=index)
            try:
                row[name] = wrong(make_decoder(name, device).decode(job).frames.cpu().numpy())
            except Exception as err:                  # a raw decoder's failure, reported
                row[name] = f"error: {str(err)[:120]}"
        out[case] = {"checked_frames": len(indices), "wrong_frames": row}
    return out


def run_benchmark(video: str, device: str = "cpu", cases=CASES, repeat: int = 1,
                  baseline: bool = True, progress: bool = True, threads: int | None = None,
                  check_all_frames: bool = False) -> dict:
    import shutil

    from medclaw.errors import ConfigError
    from medclaw.kernels.frames import DEFAULT_DECODE_THREADS
    from medclaw.kernels.probe import probe_video

    threads = DEFAULT_DECODE_THREADS if threads is None else threads
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")

    info = probe_video(video)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ConfigError(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    if shutil.which("ffmpeg") is None:
        raise ConfigError("the ffmpeg binary is needed for the speed limit "
                          "(apt-get install ffmpeg)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda needs a CUDA GPU, and torch sees none here")
    check = has_ground_truth(video)
    sides = ("ours", "baseline") if baseline else ("ours",)
    steps = len(cases) * repeat * (len(sides) + 1)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc="bench decode", unit="run", file=sys.stderr)
    result = {"video": str(video), "device": device, "cases": {}}
    for case in cases:
        start, end = case_request(case, info)["range"]
        full = case not in ("window", "seek")
        case_sides = tuple(side for side in sides if side == "ours" or case != "seek")
        runs: dict[str, list[dict]] = {side: [] for side in case_sides}
        ffmpeg = []
        for _ in range(repeat):
            for side in case_sides:
                if bar:
                    bar.set_postfix_str(f"{case}/{side}")
                runs[side].append(_measure(side, str(video), case, device, check, threads))
                bar and bar.update()
            if case == "seek" and baseline:
                bar and bar.update()                   # no baseline run for this case
            ffmpeg.append(_ffmpeg_seconds(str(video), start, end, full, threads))
            bar and bar.update()
        ours = runs["ours"][0]
        ours_s = median(r["seconds"] for r in runs["ours"])
        ffmpeg_s = median(ffmpeg)
        row = {
            "ours_s": round(ours_s, 3), "baseline_s": None, "speedup": None,
            "ffmpeg_all_s": round(ffmpeg_s, 3), "ratio_to_ffmpeg": round(ours_s / ffmpeg_s, 3),
            "ours_peak_mb": max(r["peak_mb"] for r in runs["ours"]), "baseline_peak_mb": None,
            "frame_accuracy": min(r["accuracy"] for r in runs["ours"]) if check else None,
            "num_frames": len(ours["indices"]), "width": ours["width"], "height": ours["height"],
        }
        if "gpu_peak_mb" in ours:
            row["ours_gpu_peak_mb"] = max(r["gpu_peak_mb"] for r in runs["ours"])
        if "baseline" in runs:
            base = runs["baseline"][0]
            base_s = median(r["seconds"] for r in runs["baseline"])
            row.update({
                "baseline_s": round(base_s, 3), "speedup": round(base_s / ours_s, 2),
                "baseline_peak_mb": max(r["peak_mb"] for r in runs["baseline"]),
                "same_frames_as_baseline": (base["indices"] == ours["indices"]
                                            and (base["width"], base["height"])
                                            == (ours["width"], ours["height"])),
                "baseline_frame_accuracy": (min(r["accuracy"] for r in runs["baseline"])
                                            if check else None),
                "baseline_reader": base["reader"],
            })
        result["cases"][case] = row
    if bar:
        bar.close()
    if check_all_frames:
        for case, checked in check_all(str(video), info, cases, device).items():
            result["cases"][case].update(checked)
    result["method"] = {
        "repeat": repeat, "time": "median wall time of the work, imports excluded",
        "peak_mb": "ru_maxrss minus RSS after imports, fresh subprocess per measurement",
        "threads": threads,
        "ffmpeg": f"ffmpeg -threads {threads} [-ss S -t 30 for window] -i VIDEO -f null - "
                  f"(seek: ffmpeg -ss T -i VIDEO -frames:v 1 -f null -)",
        "baseline": "qwen_vl_utils.fetch_video, FORCE_QWENVL_VIDEO_READER=torchcodec",
        "ours": f"probe_video + plan_frames + FrameSource(device, num_threads={threads}).get, "
                "default cache",
    }
    return result


def _handler(args) -> int:
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    if args.repeat < 1:
        from medclaw.errors import ConfigError

        raise ConfigError(f"--repeat must be >= 1, got {args.repeat}")
    result = run_benchmark(args.video, args.device, cases, args.repeat, not args.no_baseline,
                           threads=args.threads, check_all_frames=args.check_all)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"video: {result['video']}  device: {result['device']}")
    header = ("case", "frames", "size", "ours_s", "base_s", "speedup", "ffmpeg_s", "x_ffmpeg",
              "ours_MB", "base_MB", "accuracy")
    print("  ".join(f"{h:>9}" for h in header))
    for case, row in result["cases"].items():
        cells = (case, row["num_frames"], f"{row['width']}x{row['height']}", row["ours_s"],
                 row["baseline_s"], row["speedup"], row["ffmpeg_all_s"], row["ratio_to_ffmpeg"],
                 row["ours_peak_mb"], row["baseline_peak_mb"], row["frame_accuracy"])
        print("  ".join(f"{'-' if c is None else c!s:>9}" for c in cells))
    for case, row in result["cases"].items():
        if "wrong_frames" in row:
            counts = ", ".join(f"{k} {v}" for k, v in row["wrong_frames"].items())
            print(f"wrong frames ({case}, {row['checked_frames']} checked): {counts}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
    else:
        parser = argparse.ArgumentParser(prog="python -m medclaw.bench.decode")
        register(parser)
        ns = parser.parse_args()
        sys.exit(ns.handler(ns))
