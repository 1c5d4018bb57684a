"""Cost of one training step of the trained miniature's orchestrator, three ways on the same rows:

- plain: transformers' own loss on one padded batch of whole sequences (LM head everywhere);
- shared: the system turn computed once and shared by the batch, one padded batch, LM head
  everywhere (what `train_orchestrator` did before the fast losses);
- fast: the losses it trains with (`rows_loss`, `prefix_loss`): the system turn shared, rows
  in batches of similar length, the LM head on reply tokens only.

They run interleaved in one process, so whatever else the machine does hits them alike; the
losses must agree, or the script stops. JSON on stdout.

    python benchmarks/orchestrator_step.py [--steps 12] [--videos 4]
        > benchmarks/results/cpu-2core-orchestrator-step.json

The rows are real training sequences: expert episodes played on `--videos` training videos,
tokenized as `train_orchestrator` tokenizes them. One thread (`train_orchestrator.THREADS`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="timed steps (default 12; the first 2 are warm-up)")
    parser.add_argument("--videos", type=int, default=4, help="training videos to play episodes on (default 4)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from medclaw.models import train_orchestrator as T
    from medclaw.models.orchestrator_data import play_all, render_videos, shipped_kb_types

    torch.set_num_threads(T.THREADS)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="medclaw-step-") as tmp:
        root = Path(tmp)
        videos = render_videos(root, T.TRAIN_SEEDS[:args.videos], T.TRAIN_MINUTES)
        cases = T.training_cases(videos, 16 * args.videos, rng)
        played = asyncio.run(play_all(cases, root, kb_types=shipped_kb_types(), kb_share=T.KB_SHARE, rng=rng))
        model, tokenizer, data, short = T.build_rows(root / "model", played, 0)
    pad = tokenizer.pad_token_id
    groups = T._by_prefix(data, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    keys = sorted(groups)
    model.train()

    def plain(rows):                       # whole sequences, one padded batch, every logit
        ids, mask, labels = T._batch(rows, pad)
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    def shared(prefix, rows):              # the system turn once, one padded batch, every logit
        cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(rows))
        ids, mask, labels = T._batch(rows, pad)
        mask = torch.cat([torch.ones((len(rows), len(prefix)), dtype=mask.dtype), mask], 1)
        logits = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)

    def timed(fn):
        started = time.perf_counter()
        loss = fn()
        loss.backward()
        model.zero_grad()
        return time.perf_counter() - started, float(loss.detach())

    seconds: dict = {name: [] for name in ("plain_short", "fast_short", "plain_full", "shared_full",
                                           "fast_full")}
    for step in range(args.steps):
        short_rows = [short[int(i)] for i in rng.integers(len(short), size=T.BATCH)]
        prefix = keys[step % len(keys)]
        suffixes = [groups[prefix][int(i)] for i in rng.integers(len(groups[prefix]), size=T.BATCH // 2)]
        full_rows = [(list(prefix) + s, [-100] * len(prefix) + l) for s, l in suffixes]
        ways = {"plain_short": lambda: plain(short_rows),
                "fast_short": lambda: T.rows_loss(model, short_rows, pad),
                "plain_full": lambda: plain(full_rows),
                "shared_full": lambda: shared(prefix, suffixes),
                "fast_full": lambda: T.prefix_loss(model, prefix, suffixes, pad)}
        losses = {}
        for name, fn in ways.items():
            took, losses[name] = timed(fn)
            if step >= 2:
                seconds[name].append(took)
        for name, value in losses.items():
            want = losses["plain_" + name.split("_")[1]]
            if abs(value - want) > 1e-4 * max(1.0, abs(want)):
                raise SystemExit(f"{name} loss {value} is not the plain loss {want}")
    median = {k: round(float(np.median(v)), 4) for k, v in seconds.items()}
    json.dump({"rows": {"short": T.BATCH, "full": T.BATCH // 2},
               "short_tokens_mean": round(float(np.mean([len(s) for s, _ in short])), 1),
               "system_tokens": sorted(len(k) for k in keys),
               "median_s": median,
               "fast_over_plain": {kind: round(median[f"fast_{kind}"] / median[f"plain_{kind}"], 3)
                                   for kind in ("short", "full")},
               "fast_over_shared_full": round(median["fast_full"] / median["shared_full"], 3),
               "timed_steps": args.steps - 2, "threads": T.THREADS}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
