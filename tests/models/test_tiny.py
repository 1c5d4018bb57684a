"""Tiny checkpoints: they load and generate in transformers and vLLM, and building is deterministic."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from medclaw.models.tiny import MARKER_NAME, build_tiny_models


def _weights_sha(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def _video(num_frames=8, size=112):
    frames = np.random.default_rng(0).integers(0, 256, (num_frames, size, size, 3), dtype=np.uint8)  # (T, H, W, 3)
    metadata = {
        "fps": 2.0, "frames_indices": list(range(0, 4 * num_frames, 4)),
        "total_num_frames": 4 * num_frames, "duration": 4 * num_frames / 8.0, "do_sample_frames": False,
    }
    return frames, metadata


def test_same_seed_same_weights_other_seed_differs(tiny_models, tmp_path):
    again = build_tiny_models(tmp_path / "again", seed=0)
    other = build_tiny_models(tmp_path / "other", seed=1)
    for attr in ("vlm", "llm"):
        assert _weights_sha(getattr(again, attr)) == _weights_sha(getattr(tiny_models, attr))
        assert _weights_sha(getattr(other, attr)) != _weights_sha(getattr(tiny_models, attr))
    assert (again.vlm / "tokenizer.json").read_bytes() == (tiny_models.vlm / "tokenizer.json").read_bytes()


def test_rebuild_is_reused_unless_seed_changes(tmp_path):
    first = build_tiny_models(tmp_path, seed=0)
    stamp = (first.vlm / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_models(tmp_path, seed=0) == first
    assert (first.vlm / "model.safetensors").stat().st_mtime_ns == stamp   # reused, not rebuilt
    (tmp_path / MARKER_NAME).unlink()                                      # stale/missing marker → rebuild
    build_tiny_models(tmp_path, seed=0)
    assert (first.vlm / "model.safetensors").stat().st_mtime_ns != stamp


def test_vocab_and_special_tokens_agree(tiny_models):
    from transformers import AutoConfig, AutoTokenizer

    for folder in (tiny_models.vlm, tiny_models.llm):
        tok = AutoTokenizer.from_pretrained(folder)
        cfg = AutoConfig.from_pretrained(folder)
        text_cfg = cfg.get_text_config()
        assert text_cfg.vocab_size == len(tok)
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
        assert text_cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    cfg = AutoConfig.from_pretrained(tiny_models.vlm)
    tok = AutoTokenizer.from_pretrained(tiny_models.vlm)
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")


def test_vlm_generates_on_video_in_transformers(tiny_models):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_models.vlm)
    model = AutoModelForImageTextToText.from_pretrained(tiny_models.vlm)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|video_pad|><|vision_end|>" in text
    frames, _ = _video()
    inputs = processor(text=[text], videos=[frames], return_tensors="pt",
                       videos_kwargs=dict(do_sample_frames=False, fps=2.0))
    num_video_tokens = int((inputs["input_ids"] == model.config.video_token_id).sum())
    t, h, w = inputs["video_grid_thw"][0].tolist()
    assert num_video_tokens == t * h * w // 4 > 1      # the placeholder was expanded per visual token
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_llm_generates_with_chat_template(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models.llm)
    model = AutoModelForCausalLM.from_pretrained(tiny_models.llm)
    tools = [{"type": "function", "function": {"name": "final_answer", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools,
                                   add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "final_answer" in text
    inputs = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


@pytest.mark.engine
async def test_vlm_video_request_in_vllm(vlm_engine):
    """The tiny VLM serves a video request in vLLM (the session's engine: no engine of its own).
    The backend's fidelity check makes the count exact: it raises unless vLLM's prompt holds the
    planned text tokens plus every planned video token."""
    from medclaw.requests.conversation import Conversation, media_uuid
    from medclaw.types import MediaItem

    frames, metadata = _video()
    clip = MediaItem(kind="video", uuid=media_uuid("e" * 64, 0, len(frames) - 1, metadata["fps"], 112 * 112),
                     frames=frames, fps=metadata["fps"])
    request = Conversation("You watch videos.").add_user("What happens?", media=[clip]).to_request(max_tokens=6)
    result = await vlm_engine.generate_one(request)
    # 8 frames of 112×112: 4 temporal patches × (8×8 patches / 2×2 merge) = 64 video tokens
    num_video_tokens = (len(frames) // 2) * (112 // 14) ** 2 // 4
    assert result.num_prompt_tokens > num_video_tokens
    assert result.num_completion_tokens == 6 or result.finish_reason == "stop"
