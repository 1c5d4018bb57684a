"""How far each zoom object stands out from its empty spot, in the pixels the region tool sends.

    python benchmarks/zoom_contrast.py [--seeds 5000 5001 ...] [--minutes 0.5]

For each small-object and look-alike question of the videos of `--seeds` (default the held-out
`train_tiny.EVAL_SEEDS`), the region of its box as `crop_video_frame` sends it (the profile's
sizes, `train_data.view`) at the question's time, and the same region at the time
`synth.zoom.empty_time` picks (as `tiny_vlm_confusion.py` does), when nothing of its kind is
on screen. Their distance over the object's pixels (the 5 % of the region's pixels that differ
most) in RGB and in luma (BT.601 weights), per gold answer, as JSON on stdout. No model: it says which object a VLM has
the least to tell from an empty spot with (`synth.zoom.SMALL_OBJECTS` colours), in seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile

import numpy as np

LUMA = np.asarray([0.299, 0.587, 0.114])
TOP_SHARE = 0.05            # of a region's pixels: the object's (a small object is ~1/16 of its box)


def distance(with_object: np.ndarray, empty: np.ndarray) -> tuple[float, float]:
    """(RGB, luma) distance of two (h, w, 3) views over the TOP_SHARE of pixels that differ most."""
    diff = with_object.astype(np.float64) - empty.astype(np.float64)
    rgb = np.sqrt((diff ** 2).sum(-1)).ravel()
    top = np.argsort(rgb)[-max(1, int(len(rgb) * TOP_SHARE)):]
    return float(rgb[top].mean()), float(np.abs(diff @ LUMA).ravel()[top].mean())


def contrast(videos) -> dict:
    """{question kind: {gold answer: {"rgb", "luma", "count"}}} over `videos` ([(video, frames)])."""
    from medclaw.models import train_tiny as T
    from medclaw.models.train_data import view, zoom_questions
    from medclaw.synth.zoom import VISIT_KIND, empty_time

    budget = T._Budget()
    rows: dict = {}
    for video, frames, q in zoom_questions(videos):
        gt, t = video.gt, q["evidence_times_s"][0]
        t_empty = empty_time(gt, VISIT_KIND[q["kind"]], t)
        if t_empty is None:
            continue
        rgb, luma = distance(view(frames, gt.frame_at(t), budget, q["box"]),
                             view(frames, gt.frame_at(t_empty), budget, q["box"]))
        rows.setdefault(q["kind"], {}).setdefault(q["answer"], []).append((rgb, luma))
    return {kind: {answer: {"rgb": round(float(np.mean([r for r, _ in xs])), 1),
                            "luma": round(float(np.mean([l for _, l in xs])), 1), "count": len(xs)}
                   for answer, xs in sorted(by_answer.items())}
            for kind, by_answer in rows.items()}


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_tiny as T

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(T.EVAL_SEEDS),
                        help=f"video seeds (default the held-out ones, {T.EVAL_SEEDS[0]}-{T.EVAL_SEEDS[-1]})")
    parser.add_argument("--minutes", type=float, default=T.EVAL_MINUTES,
                        help=f"video length (default {T.EVAL_MINUTES})")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 5:
        parser.error("--minutes must be in (0, 5]")

    from medclaw.models.train_data import render
    from medclaw.synth.truth import spoken
    from medclaw.synth.zoom import SMALL_OBJECTS

    with tempfile.TemporaryDirectory(prefix="medclaw-contrast-") as tmp:
        result = contrast(render(tmp, args.seeds, args.minutes))
    json.dump({"seeds": args.seeds, "minutes": args.minutes, "top_share": TOP_SHARE,
               "small_object_colors": {spoken(n): c for n, c in SMALL_OBJECTS.items()},
               "contrast": result}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
