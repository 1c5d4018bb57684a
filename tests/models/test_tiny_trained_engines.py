"""The committed trained VLM says the same in vLLM (what MedClaw serves it with) as in
transformers (what it was trained and scored with), request by request.

A region request (`crop_video_frame`) and a whole-video request (the one-shot baseline) alike.
The video one guards `models.mrope`: transformers 5's Qwen2.5-VL `get_rope_index` resumes the
text after a video at the video's start + max(h, w) / 2, vLLM (like the original Qwen2.5-VL
code) at the video's largest position + 1. Without the reference layout the two engines replied
differently to the same prompt tokens and frames (a VLM trained on one-shot requests wrote
"dissector\nEVIDENCE: [00:03.7-00:07.7]" in transformers and "dissector\nEVIDENC]" in vLLM 0.32
on CPU).
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
def hf_backend(trained_specs):
    """The profile's VLM on MedClaw's transformers backend (without vLLM's engine arguments)."""
    from dataclasses import replace

    from medclaw.engine.backends.hf import TransformersBackend

    backend = TransformersBackend(replace(trained_specs["video_expert"], backend="transformers",
                                          extra={}))
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def hf_vlm():
    from transformers import AutoProcessor

    folder = T.COMMITTED / "vlm"
    return T.load_vlm(folder).eval(), AutoProcessor.from_pretrained(folder)


def _served_reply(backend, sample) -> str:
    """`sample` sent through MedClaw's vLLM backend, laid out as the tools lay it out."""
    from medclaw.types import GenRequest, MediaItem

    kind = "video" if sample.is_video else "image"
    item = MediaItem(kind=kind, uuid=f"fidelity-{kind}-{hash(sample.prompt)}", frames=sample.image,
                     fps=sample.fps)
    request = GenRequest(messages=sample.messages(uuid=item.uuid), media=[item],
                         max_tokens=T.MAX_NEW_TOKENS, temperature=0.0)
    return asyncio.run(backend.generate_one(request)).text


def test_a_region_request_gets_the_same_reply(held_out, served_vlm, hf_vlm):
    from medclaw.models.train_data import QUERY, region_sample

    video, frames = held_out
    visit = next(v for v in video.gt.zoom["visits"] if v["kind"] == "look_alike")
    index = (visit["start_frame"] + visit["end_frame"]) // 2
    sample = region_sample(video.gt, frames, index, T._Budget(), visit["box"], QUERY["look_alike"])
    hf_reply = T.describe(*hf_vlm, sample)
    assert hf_reply == sample.target                      # the committed VLM reads the region
    assert _served_reply(served_vlm, sample) == hf_reply


def test_a_whole_video_request_gets_the_same_reply(held_out, served_vlm, hf_vlm, hf_backend):
    """The same in vLLM, in training's transformers (`train_tiny.describe`) and in MedClaw's
    transformers backend: all three place the text after the video alike (module doc)."""
    from medclaw.models.train_data import oneshot_sample

    video, frames = held_out
    question = next(q for q in video.gt.zoom["qa"] if q["kind"] == "look_alike")
    sample = oneshot_sample(video, frames, T._Budget(), "look_alike", question["evidence_times_s"][0])
    served = _served_reply(served_vlm, sample)
    assert served                                               # a reply, not an empty string
    assert T.describe(*hf_vlm, sample).strip() == served       # the backends strip replies
    assert _served_reply(hf_backend, sample) == served
