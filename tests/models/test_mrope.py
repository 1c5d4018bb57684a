"""Qwen2.5-VL's reference positions in transformers (`medclaw.models.mrope`), on the committed
trained VLM: the text after a video resumes after the video's largest position, images are
untouched, and `generate` (prefill + cached decode steps, left padding) follows the layout."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from medclaw.models import train_tiny as T
from medclaw.models.mrope import use_reference_positions

FPS = 1.0


@pytest.fixture(scope="module")
def vlm():
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    folder = T.COMMITTED / "vlm"
    plain = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return T.load_vlm(folder).eval(), plain, AutoProcessor.from_pretrained(folder)


def _sample(num_frames: int, seed: int = 0):
    """A request like the tools send: a clip of `num_frames` frames (an image when 1)."""
    from medclaw.models.train_data import Sample
    from medclaw.tools.prompts import VIDEO_EXPERT_SYSTEM

    shape = (num_frames, 84, 140, 3) if num_frames > 1 else (84, 140, 3)
    image = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return Sample(system=VIDEO_EXPERT_SYSTEM, prompt="Describe what is visible.", image=image,
                  target="", fps=FPS if num_frames > 1 else 0.0)


def _positions(model, batch):
    return model.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                      image_grid_thw=batch.get("image_grid_thw"),
                                      video_grid_thw=batch.get("video_grid_thw"),
                                      second_per_grid_ts=batch.get("second_per_grid_ts"),
                                      attention_mask=batch["attention_mask"])


def test_text_after_a_video_resumes_after_its_largest_position(vlm):
    model, plain, processor = vlm
    batch = T._encode(processor, [_sample(20)], with_target=False)
    positions, deltas = _positions(model, batch)
    own, _ = _positions(plain, batch)
    after = int((batch["input_ids"][0] == model.config.video_token_id).nonzero()[-1, 0]) + 1
    assert int(positions[0, 0, after]) == int(positions[:, 0, :after].max()) + 1
    assert int(own[0, 0, after]) < int(positions[0, 0, after])     # transformers' own is earlier
    assert (positions[:, 0, :after] == own[:, 0, :after]).all()    # the video itself unchanged
    assert int(deltas[0, 0]) == int(positions.max()) + 1 - batch["input_ids"].shape[1]


def test_an_image_keeps_transformers_positions(vlm):
    model, plain, processor = vlm
    batch = T._encode(processor, [_sample(1)], with_target=False)
    positions, deltas = _positions(model, batch)
    own, own_deltas = _positions(plain, batch)
    assert (positions == own).all() and (deltas == own_deltas).all()


def _greedy_without_cache(model, batch, steps: int) -> list[int]:
    """Greedy tokens from full forwards with explicit reference positions at every step."""
    import torch

    ids, types = batch["input_ids"], batch["mm_token_type_ids"]
    out = []
    for _ in range(steps):
        inputs = dict(batch, input_ids=ids, attention_mask=torch.ones_like(ids),
                      mm_token_type_ids=types)
        positions, _ = _positions(model, inputs)
        with torch.no_grad():
            token = int(model(**inputs, position_ids=positions).logits[0, -1].argmax())
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], 1)
        types = torch.cat([types, torch.zeros(1, 1, dtype=types.dtype)], 1)
    return out


def test_generate_decodes_from_the_reference_positions(vlm):
    import torch

    model, _, processor = vlm
    batch = T._encode(processor, [_sample(20)], with_target=False)
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert generated[0, batch["input_ids"].shape[1]:].tolist() == _greedy_without_cache(model, batch, 8)


def test_left_padded_rows_generate_what_they_generate_alone(vlm):
    """A short clip padded beside a long one: each row's positions and decode offset are its own."""
    import torch

    model, _, processor = vlm
    samples = [_sample(20, seed=1), _sample(6, seed=2)]
    both = T._encode(processor, samples, with_target=False)
    assert both["attention_mask"][1, 0] == 0                     # the short row is padded
    alone = [T.describe(model, processor, s) for s in samples]
    with torch.no_grad():
        out = model.generate(**both, max_new_tokens=T.MAX_NEW_TOKENS, do_sample=False)
    replies = processor.batch_decode(out[:, both["input_ids"].shape[1]:], skip_special_tokens=True)
    assert replies == alone


def test_only_qwen2_vl_models_are_wrapped_and_only_once(vlm):
    model = vlm[0]
    wrapped = model.model.get_rope_index
    assert use_reference_positions(model) and model.model.get_rope_index is wrapped
    text_model = SimpleNamespace(config=SimpleNamespace(model_type="qwen2"))
    assert use_reference_positions(text_model) is False


def test_a_text_run_that_is_not_consecutive_fails_loudly():
    import torch

    from medclaw.models.mrope import reference_rope_index

    types = torch.tensor([[0, 0, 2, 2, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 6, 3, 5]]).expand(3, 1, 6).clone()   # 3, 5: a gap
    with pytest.raises(RuntimeError, match="consecutive"):
        reference_rope_index(positions, types)
    fine = torch.tensor([[0, 1, 2, 6, 3, 4]]).expand(3, 1, 6).clone()
    shifted, deltas = reference_rope_index(fine, types)
    assert shifted[0, 0].tolist() == [0, 1, 2, 6, 7, 8] and deltas.tolist() == [[3]]
