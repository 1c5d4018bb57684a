"""What a trained miniature VLM reads for each gold answer, on held-out or on training videos.

    python benchmarks/tiny_vlm_confusion.py [VLM_FOLDER] [--seeds 1000 1001 ...] [--minutes 0.2]
        [--min-pixels 3136]

VLM_FOLDER is the vlm/ folder of a `medclaw models train-tiny` output (default: the committed
one). The videos of `--seeds` (default the held-out `train_tiny.EVAL_SEEDS`, `--minutes` long)
are scored as train-tiny scores them (`train_tiny.evaluate`: the whole frame, the region, the
one-shot request), and JSON goes to stdout: accuracy, counts and `confusion`, what was read for
each gold answer. On the training seeds (`--seeds 1000 … 1023 --minutes 0.2`, train-tiny's own
videos) it tells a class never learnt from one learnt and not carried over to new videos.
One thread, like train-tiny.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_tiny as T

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vlm", nargs="?", type=Path, default=T.COMMITTED / "vlm",
                        help="a train-tiny VLM folder (default: the committed tiny-trained one)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(T.EVAL_SEEDS),
                        help="video seeds (default the held-out ones, "
                             f"{T.EVAL_SEEDS[0]}-{T.EVAL_SEEDS[-1]})")
    parser.add_argument("--minutes", type=float, default=T.EVAL_MINUTES,
                        help=f"video length (default {T.EVAL_MINUTES}; train-tiny's training "
                             f"videos are {T.TRAIN_MINUTES})")
    parser.add_argument("--min-pixels", type=int, default=T.MIN_PIXELS,
                        help=f"least pixels of a region (default the profile's, {T.MIN_PIXELS}); "
                             "give what the VLM was trained at")
    args = parser.parse_args(argv)
    if not (args.vlm / "config.json").is_file():
        parser.error(f"{args.vlm}: not a model folder (no config.json)")
    if not 0 < args.min_pixels <= T.MAX_PIXELS:
        parser.error(f"--min-pixels must be in 1..{T.MAX_PIXELS} (the profile's max_pixels)")
    if not 0 < args.minutes <= 5:
        parser.error("--minutes must be in (0, 5]")

    import torch
    from transformers import AutoProcessor

    from medclaw.models.train_data import render

    T.MIN_PIXELS = args.min_pixels
    torch.set_num_threads(T.THREADS)
    processor = AutoProcessor.from_pretrained(args.vlm)
    model = T.load_vlm(args.vlm).eval()
    with tempfile.TemporaryDirectory(prefix="medclaw-confusion-") as tmp:
        accuracy, counts, confusion = T.evaluate(model, processor,
                                                 render(tmp, args.seeds, args.minutes))
    json.dump({"vlm": str(args.vlm), "seeds": args.seeds, "minutes": args.minutes,
               "min_pixels": args.min_pixels, "accuracy": accuracy, "counts": counts,
               "confusion": confusion, "machine": T.machine()}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
