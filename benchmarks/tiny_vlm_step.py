"""What a training step of the trained miniature's VLM costs, by the kind of request it trains on.

    python benchmarks/tiny_vlm_step.py [--steps 6] > benchmarks/results/cpu-2core-tiny-vlm-step.json

The VLM of `medclaw models train-tiny` (the untrained base of `train_tiny.build_base`, seed 0)
takes full training steps (forward, backward, AdamW) on batches of `train_tiny.BATCH` requests
of one kind, interleaved so that each kind sees the same machine load:

- `recipe`: the recipe's own mix (`train_data.random_sample`: regions, whole frames);
- `oneshot`: the one-shot baseline's request (`train_data.oneshot_sample`), the whole 12 s
  training video planned at the profile's budgets (1 frame a second);
- `timeline_2fps`: `crop_video` on the first 10 s of the same video at 2 frames a second at the
  profile's frame size (`train_data.clip_sample`, the request and target clip training uses),
  the least a clip tool would need to catch a 0.6 s cautery flash (the clip's visual tokens,
  not its text, are what costs).

JSON: median seconds per step for each kind, its ratio to `recipe`, visual tokens per request,
and how many steps of each kind fit in the time the recipe's 2400 steps take. One thread, like
`train-tiny`; run it with nothing else on the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

CLIP_S = 10.0
CLIP_FPS = 2.0


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch
    from transformers import AutoProcessor

    from medclaw.models import train_tiny as T
    from medclaw.models.train_data import clip_sample, oneshot_sample, random_sample, render

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per kind (default 6)")
    args = parser.parse_args(argv)
    torch.set_num_threads(T.THREADS)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="medclaw-vlm-step-") as tmp:
        base = Path(tmp) / "base"
        T.build_base(base, 0)
        processor = AutoProcessor.from_pretrained(base)
        model = T.load_vlm(base)
        videos = render(tmp, T.TRAIN_SEEDS[:2], T.TRAIN_MINUTES)
        spec = T._Budget()
        video, frames = videos[0]
        clip_spec = replace(spec, fps=CLIP_FPS)
        clip_end = min(CLIP_S, video.gt.num_frames / video.gt.fps)
        makers = {
            "recipe": lambda: random_sample(videos, spec, rng, 0.0),
            "oneshot": lambda: oneshot_sample(video, frames, spec, "small_object", 3.0),
            "timeline_2fps": lambda: clip_sample(video, frames, clip_spec, 0.0, clip_end),
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        model.train()
        seconds: dict[str, list[float]] = {kind: [] for kind in makers}
        making: dict[str, list[float]] = {kind: [] for kind in makers}
        encoding: dict[str, list[float]] = {kind: [] for kind in makers}
        tokens = {}
        for step in range(args.steps + 1):                 # the first round warms up, untimed
            for kind, make in makers.items():
                started = time.perf_counter()
                samples = [make() for _ in range(T.BATCH)]
                made = time.perf_counter()
                batch = T._encode(processor, samples)
                if step:
                    making[kind].append(made - started)
                    encoding[kind].append(time.perf_counter() - made)
                ids = batch["input_ids"]
                visual = (ids == model.config.image_token_id) | (ids == model.config.video_token_id)
                tokens[kind] = round(float(visual.sum()) / len(samples), 1)
                started = time.perf_counter()
                loss = T.sample_loss(model, batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step:
                    seconds[kind].append(time.perf_counter() - started)
    median = {kind: statistics.median(s) for kind, s in seconds.items()}
    budget_s = median["recipe"] * T.STEPS
    json.dump({
        "batch": T.BATCH, "threads": T.THREADS, "timed_steps": args.steps,
        "kinds": {kind: {"median_s": round(median[kind], 4),
                         "make_samples_s": round(statistics.median(making[kind]), 4),
                         "encode_s": round(statistics.median(encoding[kind]), 4),
                         "ratio_to_recipe": round(median[kind] / median["recipe"], 2),
                         "visual_tokens_per_request": tokens[kind],
                         "steps_in_recipe_time": int(budget_s // median[kind])}
                  for kind in makers},
        "recipe_steps": T.STEPS, "recipe_time_s": round(budget_s, 1),
    }, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
