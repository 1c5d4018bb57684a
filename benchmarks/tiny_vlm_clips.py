"""Can the trained miniature's VLM learn `crop_video` timelines? The VLM part of
`medclaw models train-tiny` trained alone with clip batches (`train_tiny.CLIP_EVERY`), for
several seeds, scored on held-out clips. JSON on stdout.

    python benchmarks/tiny_vlm_clips.py --seeds 0 1 [--every 5] [--batch 8] [--fps 2.0]
        [--max-pixels P] [--steps N] [--jobs 2] > benchmarks/results/cpu-2core-tiny-vlm-clips.json

A clip request asks `train_data.CLIP_QUERY` (the cautery flash, and the instrument brought in
after it) about a range of a video, planned as `crop_video` plans it at `--fps`; its target is
`train_data.clip_target`. The default `--steps` keeps the recipe's frame steps
(STEPS * every / (every - 1)), so the region scores say what the clip batches cost them.

Held-out clips: for each flash of the held-out videos with an instrument brought in after it, a
10 s range starting 0.5-5 s before the flash (drawn from a fixed stream), so the flash falls
anywhere in the first half of the clip. Scored on the greedy reply, parsed as the tool parses
it (`timeline.parse_timeline`):
  flash_named        a flash line (flash_in_target: the target has one, the flash falls on a
                     sampled frame)
  flash_start_error  reply's first flash start - target's, seconds (median of absolute values)
  after_right        the first "brought in" line after the first flash line names the
                     instrument the ground truth says was brought in after it
  after_in_target    the same read from the target (what a perfect reply scores)
  blind_guess        always the most frequent answer
plus the region / whole-frame scores train-tiny reports, to show what the clips cost.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

MAX_NEW_TOKENS = 96          # a clip reply is a few timeline lines
CLIP_S = 10.0


def _read(text: str) -> tuple[float | None, str | None]:
    """(start of the first flash line, the first "<instrument> brought in" after it) of a
    timeline, each None when absent; the text is parsed once, as the tool parses it."""
    from medclaw.tools.timeline import parse_timeline

    entries = parse_timeline(text).entries
    first = next((k for k, e in enumerate(entries) if e.text == "cautery flash"), None)
    if first is None:
        return None, None
    after = next((e.text.removesuffix(" brought in") for e in entries[first + 1:]
                  if e.text.endswith(" brought in")), None)
    return entries[first].start_s, after


def clip_scores(model, processor, videos, spec) -> dict:
    """Held-out clip scores of `model` (module doc)."""
    import numpy as np

    from medclaw.models import train_tiny as T
    from medclaw.models.train_data import clip_sample
    from medclaw.synth.truth import spoken

    rng = np.random.default_rng(77)
    rows = []
    for video, frames in videos:
        gt = video.gt
        for flash in gt.zoom["flashes"]:
            if flash["instrument_in_after"] is None:
                continue
            start = round(max(0.0, flash["time_s"] - float(rng.uniform(0.5, 5.0))), 1)
            end = round(min(gt.num_frames / gt.fps, start + CLIP_S), 1)
            sample = clip_sample(video, frames, spec, start, end)
            reply = T.describe(model, processor, sample).strip()
            (said, said_after), (target, target_after) = _read(reply), _read(sample.target)
            rows.append({"gold": spoken(flash["instrument_in_after"]["instrument"]),
                         "said": said_after, "in_target": target_after,
                         "flash_named": said is not None, "flash_in_target": target is not None,
                         "flash_error": None if said is None or target is None else said - target,
                         "target": sample.target, "reply": reply})
    n = len(rows)
    errors = [abs(r["flash_error"]) for r in rows if r["flash_error"] is not None]
    return {
        "clips": n,
        "flash_named": round(sum(r["flash_named"] for r in rows) / n, 4),
        "flash_in_target": round(sum(r["flash_in_target"] for r in rows) / n, 4),
        "flash_start_error_s": round(statistics.median(errors), 2) if errors else None,
        "after_right": round(sum(r["said"] == r["gold"] for r in rows) / n, 4),
        "after_in_target": round(sum(r["in_target"] == r["gold"] for r in rows) / n, 4),
        "blind_guess": round(Counter(r["gold"] for r in rows).most_common(1)[0][1] / n, 4),
        "said": dict(Counter(str(r["said"]) for r in rows)),
        "examples": rows[:4],
    }


def _one(seed: int, steps: int, every: int, batch: int, fps: float, max_pixels: int) -> dict:
    import torch
    from transformers import AutoProcessor

    from medclaw.models import train_tiny as T
    from medclaw.models.train_data import render

    T.CLIP_EVERY, T.CLIP_BATCH, T.CLIP_FPS = every, batch, fps
    T.CLIP_MAX_PIXELS, T.MAX_NEW_TOKENS = max_pixels, MAX_NEW_TOKENS
    with tempfile.TemporaryDirectory(prefix="medclaw-vlm-clips-") as tmp:
        report = T.train_tiny(tmp, seed=seed, steps=steps, progress=False, orchestrator=False)
        torch.set_num_threads(T.THREADS)
        model = T.load_vlm(f"{tmp}/vlm").eval()
        processor = AutoProcessor.from_pretrained(f"{tmp}/vlm")
        held_out = render(tmp, T.EVAL_SEEDS, T.EVAL_MINUTES)
        clips = clip_scores(model, processor, held_out, T._Budget(fps=fps, max_pixels=max_pixels))
    return {"seed": seed, "steps": steps, "accuracy": report.accuracy, "clips": clips,
            "loss_last": report.loss_last, "wall_s": report.wall_s}


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_tiny as T

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
    parser.add_argument("--every", type=int, default=5, help="a clip batch every N steps (default 5)")
    parser.add_argument("--batch", type=int, default=8, help="clips per clip batch (default 8)")
    parser.add_argument("--fps", type=float, default=T.CLIP_FPS,
                        help=f"clip sampling rate (default {T.CLIP_FPS})")
    parser.add_argument("--max-pixels", type=int, default=T.CLIP_MAX_PIXELS,
                        help=f"pixels of a clip frame at most (default {T.CLIP_MAX_PIXELS}, the "
                             "profile's: 140x84 for these videos)")
    parser.add_argument("--steps", type=int, default=None,
                        help="all steps (default: the recipe's frame steps kept)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    args = parser.parse_args(argv)
    if args.every < 2:
        parser.error("--every must be at least 2 (every step a clip batch leaves no frame steps)")
    steps = args.steps or T.STEPS * args.every // (args.every - 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        n = len(args.seeds)
        runs = list(pool.map(_one, args.seeds, [steps] * n, [args.every] * n, [args.batch] * n,
                             [args.fps] * n, [args.max_pixels] * n))
    json.dump({"recipe": {"steps": steps, "lr": T.LR, "batch": T.BATCH, "clip_every": args.every,
                          "clip_batch": args.batch, "clip_fps": args.fps,
                          "clip_max_pixels": args.max_pixels, "clip_s": CLIP_S},
               "eval_seeds": list(T.EVAL_SEEDS), "runs": runs}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
