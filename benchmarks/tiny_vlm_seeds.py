"""Seed spread of the trained miniature's VLM recipe: the VLM part of `medclaw models train-tiny`
trained alone (`train_tiny(..., orchestrator=False)`) for several seeds, each scored on the
held-out seeds as train-tiny scores it (whole frame, region, one-shot request). JSON on stdout.

    python benchmarks/tiny_vlm_seeds.py --seeds 0 1 2 3 4 [--steps 2400] [--lr 1.5e-3] [--jobs 2]
        [--min-pixels 7056] [--warmup-part 5] [--focal-gamma 2] [--mark-pattern stripes]
        [--empty-spot-share 0.1]
        > benchmarks/results/cpu-2core-tiny-vlm-seeds.json

`--min-pixels` trains and scores the VLM with regions of at least that many pixels instead of
the profile's (`train_tiny.MIN_PIXELS`); `--warmup-part N` warms the rate up over the first 1/N
of the steps instead of the recipe's (`train_tiny.WARMUP_PART`); `--focal-gamma G` trains with
a focal loss (`train_tiny.FOCAL_GAMMA`; the recipe's 2; 0 is the plain cross-entropy);
`--mark-pattern stripes` draws the look-alike mark as one-pixel stripes whose mean is the
instrument's colour (`synth.zoom.MARK_PATTERN`; the recipe's: solid); `--empty-spot-share F` draws
that share of samples at an object's spot when it is empty (`train_data.EMPTY_SPOT_SHARE`; the
recipe's: 0). Each run reports, per question kind and view, what the VLM read for each gold
answer (`confusion`), so a name never said shows, and what it reads at each question's spot when
it is empty (`empty_spot`, `benchmarks/tiny_vlm_confusion.py`).

Each run is a spawned process on one thread (`train_tiny.THREADS`), `--jobs` at a time (one per
core). Same seed, same machine: the same weights as the VLM of `train-tiny --seed S`, whose
report gives the same scores.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor


def _one(seed: int, steps: int, lr: float | None, min_pixels: int, warmup_part: int,
         focal_gamma: float, mark_pattern: str, empty_spot_share: float) -> dict:
    import importlib.util
    from pathlib import Path

    from transformers import AutoProcessor

    from medclaw.models import train_data as D
    from medclaw.models import train_tiny as T
    from medclaw.synth import zoom

    # in this spawned process only (it renders its own videos)
    T.MIN_PIXELS, T.WARMUP_PART, T.FOCAL_GAMMA = min_pixels, warmup_part, focal_gamma
    zoom.MARK_PATTERN, D.EMPTY_SPOT_SHARE = mark_pattern, empty_spot_share
    spec = importlib.util.spec_from_file_location(
        "confusion", Path(__file__).with_name("tiny_vlm_confusion.py"))
    confusion = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(confusion)
    with tempfile.TemporaryDirectory(prefix="medclaw-vlm-seed-") as tmp:
        report = T.train_tiny(tmp, seed=seed, steps=steps, progress=False, lr=lr, orchestrator=False)
        vlm = Path(tmp) / "vlm"
        empty = confusion.empty_spots(T.load_vlm(vlm).eval(), AutoProcessor.from_pretrained(vlm),
                                      D.render(Path(tmp) / "eval", T.EVAL_SEEDS, T.EVAL_MINUTES))
    return {"seed": seed, "steps": steps, "lr": lr, "accuracy": report.accuracy,
            "confusion": report.confusion, "empty_spot": empty, "loss_last": report.loss_last,
            "wall_s": report.wall_s, "machine": report.machine}


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_data as D
    from medclaw.models import train_tiny as T
    from medclaw.synth import zoom

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
    parser.add_argument("--steps", type=int, default=T.STEPS, help=f"VLM steps (default {T.STEPS})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"one rate for the whole VLM (default: the recipe's, {T.LR})")
    parser.add_argument("--min-pixels", type=int, default=T.MIN_PIXELS,
                        help=f"least pixels of a region the VLM sees (default the profile's, "
                             f"{T.MIN_PIXELS}; 7056 sends a 32x32 region at 84x84)")
    parser.add_argument("--warmup-part", type=int, default=T.WARMUP_PART,
                        help=f"warm the rate up over the first 1/N of the steps (default the "
                             f"recipe's, {T.WARMUP_PART}: 5 %%)")
    parser.add_argument("--focal-gamma", type=float, default=T.FOCAL_GAMMA,
                        help=f"focal loss exponent (default the recipe's, {T.FOCAL_GAMMA}; 0 is "
                             "the plain cross-entropy)")
    parser.add_argument("--mark-pattern", choices=sorted(zoom.MARK_WORDS), default=zoom.MARK_PATTERN,
                        help=f"how the look-alike mark is drawn (default the recipe's, "
                             f"{zoom.MARK_PATTERN}; stripes: one-pixel columns a downscale averages away)")
    parser.add_argument("--empty-spot-share", type=float, default=D.EMPTY_SPOT_SHARE,
                        help=f"share of samples at an object's spot when it is empty (default the "
                             f"recipe's, {D.EMPTY_SPOT_SHARE})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    args = parser.parse_args(argv)
    if not 0 < args.min_pixels <= T.MAX_PIXELS:
        parser.error(f"--min-pixels must be in 1..{T.MAX_PIXELS} (the profile's max_pixels)")
    if not 1 <= args.warmup_part <= args.steps:
        parser.error(f"--warmup-part must be in 1..{args.steps} (--steps)")
    if not 0 <= args.focal_gamma <= 5:
        parser.error("--focal-gamma must be in 0..5")
    if not 0 <= args.empty_spot_share <= 0.5:
        parser.error("--empty-spot-share must be in 0..0.5")
    context = multiprocessing.get_context("spawn")
    n = len(args.seeds)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        runs = list(pool.map(_one, args.seeds, [args.steps] * n, [args.lr] * n,
                             [args.min_pixels] * n, [args.warmup_part] * n,
                             [args.focal_gamma] * n, [args.mark_pattern] * n,
                             [args.empty_spot_share] * n))
    json.dump({"recipe": {"steps": args.steps, "lr": args.lr or T.LR, "batch": T.BATCH,
                          "oneshot_every": T.ONESHOT_EVERY, "oneshot_batch": T.ONESHOT_BATCH,
                          "min_pixels": args.min_pixels, "warmup_part": args.warmup_part,
                          "focal_gamma": args.focal_gamma, "mark_fraction": zoom.MARK_FRACTION,
                          "mark_pattern": args.mark_pattern,
                          "empty_spot_share": args.empty_spot_share,
                          **({"mark_stripes": zoom.MARK_STRIPES} if args.mark_pattern == "stripes" else {})},
               "eval_seeds": list(T.EVAL_SEEDS), "runs": runs}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
