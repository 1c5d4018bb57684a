"""Where the trained miniature's orchestrator recipe lands: the orchestrator part of `medclaw
models train-tiny` trained alone (`train_orchestrator`) for several seeds, each scored on both
held-out sets (seeds 5000-5011, what its report scores, and 5100-5111). JSON on stdout.

    python benchmarks/orchestrator_seeds.py --seeds 0 1 [--digit-weight 3] [--focal-gamma 2]
        [--whole-second-share 0.2] [--name-tokens] [--quote-in-thoughts] [--jobs 2]
    python benchmarks/orchestrator_seeds.py --checkpoint medclaw/checkpoints/tiny-trained/llm
    ATEN_CPU_CAPABILITY=avx2 python benchmarks/orchestrator_seeds.py --seeds 0 --digit-weight 3 --jobs 1

Each run is a spawned process on one thread (`train_orchestrator.THREADS`), `--jobs` at a time
(one per core), ~19 min each on 2 cores two at a time; `--checkpoint` scores only (~4 min alone,
20-25 min beside a training run). Same seed, same machine: the same weights as the
orchestrator of `train-tiny --seed S`. A run's floats depend on the CPU's kernels, so the same
seed on another float path (another CPU, or torch's kernels held to AVX2 by
ATEN_CPU_CAPABILITY, which applies as set when this starts; each run records `machine`) is
another draw of the recipe: the spread over seeds and paths is how far a retrain elsewhere may
land from the committed score. The flags set the module constants in `SETTINGS`:
`--digit-weight` sets `train_orchestrator.DIGIT_WEIGHT` (the
recipe's: 1, the plain mean), `--focal-gamma` sets `train_orchestrator.FOCAL_GAMMA` (the recipe's: 2;
0 is the plain cross-entropy), `--whole-second-share` sets `train_orchestrator.WHOLE_SECOND_SHARE`
(the recipe's: 0), `--name-tokens` sets `train_orchestrator.NAME_TOKENS` (each word of an
object's name one token, so an answer copies the observation's token), `--quote-in-thoughts` sets
`orchestrator_data.QUOTE_IN_THOUGHTS` (the expert's thoughts quote the asked time and the line
read before the action copies them). Each run is also scored on both sets asked at whole seconds
(`train_orchestrator.at_whole_second`: "At 17 s"), the copy the recipe gets wrong most; each
score lists its misses (the question, the student's first wrong action and the expert's).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SECOND_SET = tuple(range(5100, 5112))
# Each training setting a flag may change: its name (the flag's, the train report's, the JSON's)
# -> the module constant it sets in the run's spawned process.
SETTINGS = {
    "digit_weight": ("medclaw.models.train_orchestrator", "DIGIT_WEIGHT"),
    "focal_gamma": ("medclaw.models.train_orchestrator", "FOCAL_GAMMA"),
    "whole_second_share": ("medclaw.models.train_orchestrator", "WHOLE_SECOND_SHARE"),
    "name_tokens": ("medclaw.models.train_orchestrator", "NAME_TOKENS"),
    "quote_in_thoughts": ("medclaw.models.orchestrator_data", "QUOTE_IN_THOUGHTS"),
}


def recipe_settings() -> dict:
    """The recipe's value of every setting (the flags' defaults)."""
    import importlib

    return {name: getattr(importlib.import_module(module), attr)
            for name, (module, attr) in SETTINGS.items()}


def apply_settings(settings: dict) -> None:
    """Set the module constants named by `settings` (in this process only)."""
    import importlib

    for name, value in settings.items():
        module, attr = SETTINGS[name]
        setattr(importlib.import_module(module), attr, value)


def _one(seed: int, settings: dict) -> dict:
    from medclaw.models import train_orchestrator as O
    from medclaw.models.train_tiny import machine

    apply_settings(settings)                # in this spawned process only
    with tempfile.TemporaryDirectory(prefix="medclaw-orch-seed-") as tmp:
        llm = Path(tmp) / "llm"
        report = O.train_orchestrator(llm, seed=seed, progress=False)
        scores = _score_sets(llm, Path(tmp), known={
            "held_out": report["held_out"], "whole_second_5000": report["held_out_whole_second"]})
    return {"seed": seed, **{name: report[name] for name in SETTINGS},      # as the run saw them
            **scores, "loss_last": report["loss_last"], "train_s": report["train_s"],
            "machine": machine()}


def _score_sets(llm, tmp, known: dict | None = None) -> dict:
    """Scores of the orchestrator in folder `llm` on both held-out sets, as asked and at whole
    seconds; `known`: scores training already made (set 5000's), by key."""
    import asyncio

    from medclaw.models import train_orchestrator as O

    scores = dict(known or {})
    for name, seeds in (("5000", O.EVAL_SEEDS), ("5100", SECOND_SET)):
        asked = "held_out" if name == "5000" else f"held_out_{name}"
        if asked in scores and f"whole_second_{name}" in scores:
            continue
        root = tmp / f"set-{name}"
        cases = O.held_out_cases(root, seeds)
        whole = [O.at_whole_second(case) for case in cases]
        for key, played in ((asked, cases), (f"whole_second_{name}", whole)):
            if key not in scores:
                scores[key], _ = asyncio.run(O.evaluate(llm, played, root))
    return scores


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_orchestrator as O

    recipe = recipe_settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", help="training seeds")
    parser.add_argument("--checkpoint", type=Path,
                        help="score this trained orchestrator folder (e.g. the committed "
                             "medclaw/checkpoints/tiny-trained/llm) on the same sets instead of training")
    parser.add_argument("--digit-weight", type=float, default=recipe["digit_weight"],
                        help=f"loss weight of a reply's digit tokens (default the recipe's, "
                             f"{recipe['digit_weight']})")
    parser.add_argument("--focal-gamma", type=float, default=recipe["focal_gamma"],
                        help=f"focal loss exponent (default the recipe's, {recipe['focal_gamma']}; "
                             "0 is the plain cross-entropy)")
    parser.add_argument("--whole-second-share", type=float, default=recipe["whole_second_share"],
                        help="share of training episodes asked at a whole second (default the "
                             f"recipe's, {recipe['whole_second_share']})")
    parser.add_argument("--name-tokens", action=argparse.BooleanOptionalAction,
                        default=recipe["name_tokens"],
                        help="each word of an object's name its own token (default the recipe's, "
                             f"{recipe['name_tokens']})")
    parser.add_argument("--quote-in-thoughts", action=argparse.BooleanOptionalAction,
                        default=recipe["quote_in_thoughts"],
                        help="the expert's thoughts quote the asked time and the line read (default "
                             f"the recipe's, {recipe['quote_in_thoughts']})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    args = parser.parse_args(argv)
    if not 0 <= args.focal_gamma <= 5:
        parser.error("--focal-gamma must be in 0..5")
    if not 0 <= args.whole_second_share <= 1:
        parser.error("--whole-second-share must be in 0..1")
    if (args.seeds is None) == (args.checkpoint is None):
        parser.error("give --seeds (train and score) or --checkpoint (score only)")
    if args.checkpoint is not None:
        if not (args.checkpoint / "config.json").is_file():
            parser.error(f"{args.checkpoint}: not a model folder (no config.json)")
        with tempfile.TemporaryDirectory(prefix="medclaw-orch-score-") as tmp:
            scores = _score_sets(args.checkpoint, Path(tmp))
        json.dump({"checkpoint": str(args.checkpoint), "eval_seeds": list(O.EVAL_SEEDS),
                   "second_set": list(SECOND_SET), **scores}, sys.stdout, indent=1)
        print()
        return 0
    settings = {name: getattr(args, name) for name in SETTINGS}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        runs = list(pool.map(_one, args.seeds, [settings] * len(args.seeds)))
    json.dump({"recipe": {"steps": O.STEPS, "lr": O.LR, "batch": O.BATCH, "episodes": O.EPISODES,
                          **settings},
               "eval_seeds": list(O.EVAL_SEEDS), "second_set": list(SECOND_SET), "runs": runs},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
