"""Why vLLM and transformers reply differently to the trained miniature's whole-video requests:
the position of the text after the video. JSON on stdout.

    python benchmarks/video_positions.py [--reply TEXT]

Builds the one-shot request about the first look-alike question of held-out video 5000 (as
`train_tiny.evaluate` does), appends `--reply` (default: what vLLM 0.32 on CPU replied to it,
see tests/models/test_tiny_trained_engines.py) and runs the committed VLM in transformers once
with transformers' own positions (`get_rope_index`: text after the video resumes at its start +
max(h, w) / merge) and once with the reference layout vLLM and the original Qwen2.5-VL use
(`medclaw.models.mrope`: resumes at the video's largest position + 1, what MedClaw now trains
and serves with). Reports how many of the reply's tokens each layout's greedy prediction
matches, teacher-forced, and the shift between the two layouts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile

VLLM_REPLY = "phase\nphase\ninstruments\nphase\nphase\nsmall\nphase\ninstruments\ninstruments"


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from medclaw.models import train_tiny as T
    from medclaw.models.mrope import reference_rope_index
    from medclaw.models.train_data import oneshot_sample, render

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reply", default=VLLM_REPLY, help="the served reply to teacher-force")
    args = parser.parse_args(argv)
    torch.set_num_threads(T.THREADS)
    folder = T.COMMITTED / "vlm"
    processor = AutoProcessor.from_pretrained(folder)
    # not `train_tiny.load_vlm`: both layouts are passed explicitly as position_ids
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory(prefix="medclaw-positions-") as tmp:   # the plan probes the file
        video, frames = render(tmp, T.EVAL_SEEDS[:1], T.EVAL_MINUTES)[0]
        question = next(q for q in video.gt.zoom["qa"] if q["kind"] == "look_alike")
        sample = oneshot_sample(video, frames, T._Budget(), "look_alike",
                                question["evidence_times_s"][0])
    batch = T._encode(processor, [sample], with_target=False)
    prompt_len = batch["input_ids"].shape[1]
    reply = processor.tokenizer(args.reply, add_special_tokens=False)["input_ids"]
    ids = torch.cat([batch["input_ids"], torch.tensor([reply])], 1)
    types = torch.cat([batch["mm_token_type_ids"],
                       torch.zeros(1, len(reply), dtype=batch["mm_token_type_ids"].dtype)], 1)
    inputs = dict(batch, input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types)
    own, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=None,
                                        video_grid_thw=batch["video_grid_thw"],
                                        second_per_grid_ts=batch["second_per_grid_ts"],
                                        attention_mask=inputs["attention_mask"])
    reference, _ = reference_rope_index(own, types, inputs["attention_mask"])
    after = int((ids[0] == model.config.video_token_id).nonzero()[-1, 0]) + 1
    shift = int(reference[0, 0, after]) - int(own[0, 0, after])
    matched = {}
    for name, positions in (("transformers", own), ("reference", reference)):
        with torch.no_grad():
            logits = model(**inputs, position_ids=positions).logits
        predicted = logits[0, prompt_len - 1:-1].argmax(-1).tolist()
        matched[name] = sum(int(p == t) for p, t in zip(predicted, reply))
    json.dump({"prompt_tokens": prompt_len, "reply_tokens": len(reply),
               "text_after_video_shift": shift, "matched_tokens": matched}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
