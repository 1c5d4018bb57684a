"""Seed spread of the trained miniature's VLM recipe: the VLM part of `medclaw models train-tiny`
trained alone (`train_tiny(..., orchestrator=False)`) for several seeds, each scored on the
held-out seeds as train-tiny scores it (whole frame, region, one-shot request). JSON on stdout.

    python benchmarks/tiny_vlm_seeds.py --seeds 0 1 2 3 4 [--steps 2400] [--lr 1.5e-3] [--jobs 2]
        > benchmarks/results/cpu-2core-tiny-vlm-seeds.json

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


def _one(seed: int, steps: int, lr: float | None) -> dict:
    from medclaw.models.train_tiny import train_tiny

    with tempfile.TemporaryDirectory(prefix="medclaw-vlm-seed-") as tmp:
        report = train_tiny(tmp, seed=seed, steps=steps, progress=False, lr=lr, orchestrator=False)
    return {"seed": seed, "steps": steps, "lr": lr, "accuracy": report.accuracy,
            "loss_last": report.loss_last, "wall_s": report.wall_s}


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_tiny as T

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
    parser.add_argument("--steps", type=int, default=T.STEPS, help=f"VLM steps (default {T.STEPS})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"one rate for the whole VLM (default: the recipe's, {T.LR})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        runs = list(pool.map(_one, args.seeds, [args.steps] * len(args.seeds),
                             [args.lr] * len(args.seeds)))
    json.dump({"recipe": {"steps": args.steps, "lr": args.lr or T.LR, "batch": T.BATCH,
                          "oneshot_every": T.ONESHOT_EVERY, "oneshot_batch": T.ONESHOT_BATCH},
               "eval_seeds": list(T.EVAL_SEEDS), "runs": runs}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
