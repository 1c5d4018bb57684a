"""The committed trained VLM says the same in vLLM (what MedClaw serves it with) as in
transformers (what it was trained and scored with), request by request.

A region request (`crop_video_frame`) agrees. A whole-video request (the one-shot baseline)
does not: with the same prompt tokens and the same frames, vLLM 0.32 (CPU) and transformers
reply differently (a VLM trained on one-shot requests wrote "dissector\nEVIDENCE: [00:03.7-
00:07.7]" in transformers and "dissector\nEVIDENC]" in vLLM). The cause: transformers 5.19's
Qwen2.5-VL `get_rope_index` resumes the text after a video at the video's start + max(h, w) / 2,
vLLM (like the original Qwen2.5-VL code) at the video's largest position + 1; with the latter
layout transformers reproduces vLLM's reply token for token. Until training uses the serving
layout, video answers of the miniature served by vLLM are not what it learnt; the video test is
an expected failure while they differ and fails as soon as the two agree.
"""
from __future__ import annotations

import asyncio

import pytest

from medclaw.models import train_tiny as T

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """The first held-out video of train-tiny (30 s), decoded as training decodes it."""
    from medclaw.models.train_data import render

    return render(tmp_path_factory.mktemp("held-out"), T.EVAL_SEEDS[:1], T.EVAL_MINUTES)[0]


@pytest.fixture(scope="module")
def served_vlm(trained_specs):
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(trained_specs["video_expert"])
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def hf_vlm():
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    folder = T.COMMITTED / "vlm"
    return (Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval(),
            AutoProcessor.from_pretrained(folder))


def _served_reply(backend, sample) -> str:
    """`sample` sent through MedClaw's vLLM backend, laid out as the tools lay it out."""
    from medclaw.types import GenRequest, MediaItem

    kind = "video" if sample.is_video else "image"
    item = MediaItem(kind=kind, uuid=f"fidelity-{kind}-{hash(sample.prompt)}", frames=sample.image,
                     fps=sample.fps)
    request = GenRequest(messages=[
        {"role": "system", "content": [{"type": "text", "text": sample.system}]},
        {"role": "user", "content": [{"type": kind, "uuid": item.uuid},
                                     {"type": "text", "text": sample.prompt}]}],
        media=[item], max_tokens=T.MAX_NEW_TOKENS, temperature=0.0)
    return asyncio.run(backend.generate_one(request)).text


def test_a_region_request_gets_the_same_reply(held_out, served_vlm, hf_vlm):
    from medclaw.models.train_data import QUERIES, region_sample

    video, frames = held_out
    visit = next(v for v in video.gt.zoom["visits"] if v["kind"] == "look_alike")
    index = (visit["start_frame"] + visit["end_frame"]) // 2
    sample = region_sample(video.gt, frames, index, T._Budget(), visit["box"], QUERIES[1])
    hf_reply = T.describe(*hf_vlm, sample)
    assert hf_reply == sample.target                      # the committed VLM reads the region
    assert _served_reply(served_vlm, sample) == hf_reply


def test_a_whole_video_request_gets_the_same_reply(held_out, served_vlm, hf_vlm):
    """Known to differ (module doc): an expected failure while it does, a failure once it
    agrees, so that the README's note and this expectation go when the cause is fixed."""
    from medclaw.models.train_data import oneshot_sample

    video, frames = held_out
    question = next(q for q in video.gt.zoom["qa"] if q["kind"] == "look_alike")
    sample = oneshot_sample(video, frames, T._Budget(), "look_alike", question["evidence_times_s"][0])
    hf_reply = T.describe(*hf_vlm, sample)
    served = _served_reply(served_vlm, sample)
    if served != hf_reply:
        pytest.xfail(f"vLLM replies {served!r}, transformers {hf_reply!r}")
    pytest.fail("vLLM and transformers now agree on a whole-video request: drop the README's "
                "note that they disagree on video requests and make this a plain equality test")
