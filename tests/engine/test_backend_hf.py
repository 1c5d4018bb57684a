"""The transformers backend on the tiny checkpoints (real models, CPU)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec
from medclaw.types import MediaItem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_vlm(tiny_models):
    from medclaw.engine.backends.hf import TransformersBackend

    backend = TransformersBackend(ModelSpec(name="tiny-vlm-hf", path=str(tiny_models.vlm)))
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def hf_llm(tiny_models):
    from medclaw.engine.backends.hf import TransformersBackend

    backend = TransformersBackend(ModelSpec(name="tiny-llm-hf", path=str(tiny_models.llm),
                                            output_format="think_answer"))
    yield backend
    backend.shutdown()


def _clip(seed: int, num_frames: int = 4, side: int = 56) -> MediaItem:
    frames = np.random.default_rng(seed).integers(0, 256, (num_frames, side, side, 3),
                                                  dtype=np.uint8)  # (T, H, W, 3)
    return MediaItem(kind="video", uuid=media_uuid("e" * 64, 0, num_frames - 1, 2.0, side * side),
                     frames=frames, fps=2.0)


async def test_video_request_on_tiny_vlm(hf_vlm, tiny_models):
    from medclaw.models.store import revision_hash

    with_video = Conversation("SYS").add_user("What happens?", media=[_clip(0)]).to_request(max_tokens=6)
    text_only = Conversation("SYS").add_user("What happens?").to_request(max_tokens=6)
    video_result, text_result = await hf_vlm.generate([with_video, text_only])
    # 4 frames at 56x56 → 2 temporal groups x (4x4 patches / 2x2 merge) = 8 video tokens
    assert video_result.num_prompt_tokens - text_result.num_prompt_tokens == 8 + 2  # + vision start/end
    assert video_result.num_completion_tokens == 6 and video_result.finish_reason == "length"
    assert video_result.num_cached_tokens == 0
    for result in (video_result, text_result):       # first of 6 tokens: before the call ends
        assert 0 < result.ttft_s < result.latency_s
    assert video_result.model_revision == revision_hash(tiny_models.vlm)


async def test_image_request_on_tiny_vlm(hf_vlm):
    image = MediaItem(kind="image", uuid="img-1",
                      frames=np.full((56, 84, 3), 128, np.uint8))  # (H, W, 3)
    request = Conversation("SYS").add_user("Describe.", media=[image]).to_request(max_tokens=3)
    result = await hf_vlm.generate_one(request)
    assert result.num_completion_tokens == 3 and result.num_prompt_tokens > 2 * 3


async def test_text_request_on_tiny_llm_is_deterministic(hf_llm):
    request = Conversation("SYS").add_user("Hello").to_request(max_tokens=5)
    first, second = await hf_llm.generate([request, request])
    assert first.num_completion_tokens == 5
    assert (first.text, first.reasoning) == (second.text, second.reasoning)
    assert first.model_name == "tiny-llm-hf"
    # schema enforcement comes from xgrammar's transformers integration when it is installed
    assert hf_llm.supports_json_schema == (importlib.util.find_spec("xgrammar") is not None)


async def test_resized_frames_are_a_fidelity_error(hf_vlm):
    """210-px frames are not a multiple of 28: the processor resizes them to 224 (8×8 merged
    patches, not the 7×7 planned) and the check stops the request before generating."""
    from medclaw.engine.backends.base import FidelityError

    request = Conversation("SYS").add_user("x", media=[_clip(2, side=210)]).to_request(max_tokens=2)
    with pytest.raises(FidelityError, match=r"saw \d+ prompt tokens where MedClaw planned \d+"):
        await hf_vlm.generate_one(request)


async def test_text_model_rejects_media(hf_llm):
    request = Conversation("SYS").add_user("x", media=[_clip(1)]).to_request(max_tokens=2)
    with pytest.raises(ValueError, match="text-only"):
        await hf_llm.generate_one(request)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes present")
def test_bnb_without_bitsandbytes_is_a_config_error(tiny_models):
    from medclaw.engine.backends.hf import TransformersBackend

    with pytest.raises(ConfigError, match="bitsandbytes"):
        TransformersBackend(ModelSpec(name="q", path=str(tiny_models.llm), quantization="bnb-4bit"))
