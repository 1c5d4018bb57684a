"""Where the trained miniature's orchestrator recipe lands: the orchestrator part of `medclaw
models train-tiny` trained alone (`train_orchestrator`) for several seeds, each scored on both
held-out sets (seeds 5000-5011, what its report scores, and 5100-5111). JSON on stdout.

    python benchmarks/orchestrator_seeds.py --seeds 0 1 [--digit-weight 3] [--focal-gamma 2] [--jobs 2]
    ATEN_CPU_CAPABILITY=avx2 python benchmarks/orchestrator_seeds.py --seeds 0 --digit-weight 3 --jobs 1

Each run is a spawned process on one thread (`train_orchestrator.THREADS`), `--jobs` at a time
(one per core), ~19 min each here. Same seed, same machine: the same weights as the
orchestrator of `train-tiny --seed S`. A run's floats depend on the CPU's kernels, so the same
seed on another float path (another CPU, or torch's kernels held to AVX2 by
ATEN_CPU_CAPABILITY, which applies as set when this starts; each run records `machine`) is
another draw of the recipe: the spread over seeds and paths is how far a retrain elsewhere may
land from the committed score. `--digit-weight` sets `train_orchestrator.DIGIT_WEIGHT` (the
recipe's: 1, the plain mean), `--focal-gamma` sets `train_orchestrator.FOCAL_GAMMA` (the recipe's: 2;
0 is the plain cross-entropy).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

SECOND_SET = tuple(range(5100, 5112))


def _one(seed: int, digit_weight: float, focal_gamma: float) -> dict:
    import asyncio
    from pathlib import Path

    from medclaw.models import train_orchestrator as O
    from medclaw.models.train_tiny import machine

    O.DIGIT_WEIGHT, O.FOCAL_GAMMA = digit_weight, focal_gamma         # in this spawned process only
    with tempfile.TemporaryDirectory(prefix="medclaw-orch-seed-") as tmp:
        report = O.train_orchestrator(Path(tmp) / "llm", seed=seed, progress=False)
        root = Path(tmp) / "second-set"
        second, _ = asyncio.run(O.evaluate(Path(tmp) / "llm", O.held_out_cases(root, SECOND_SET), root))
    return {"seed": seed, "digit_weight": report["digit_weight"],
            "focal_gamma": report["focal_gamma"], "held_out": report["held_out"],
            "held_out_5100": second, "loss_last": report["loss_last"], "train_s": report["train_s"],
            "machine": machine()}


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_orchestrator as O

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
    parser.add_argument("--digit-weight", type=float, default=O.DIGIT_WEIGHT,
                        help=f"loss weight of a reply's digit tokens (default the recipe's, {O.DIGIT_WEIGHT})")
    parser.add_argument("--focal-gamma", type=float, default=O.FOCAL_GAMMA,
                        help=f"focal loss exponent (default the recipe's, {O.FOCAL_GAMMA}; 0 is "
                             "the plain cross-entropy)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    args = parser.parse_args(argv)
    if not 0 <= args.focal_gamma <= 5:
        parser.error("--focal-gamma must be in 0..5")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        n = len(args.seeds)
        runs = list(pool.map(_one, args.seeds, [args.digit_weight] * n, [args.focal_gamma] * n))
    json.dump({"recipe": {"steps": O.STEPS, "lr": O.LR, "batch": O.BATCH, "episodes": O.EPISODES,
                          "digit_weight": args.digit_weight, "focal_gamma": args.focal_gamma},
               "eval_seeds": list(O.EVAL_SEEDS), "second_set": list(SECOND_SET), "runs": runs},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
