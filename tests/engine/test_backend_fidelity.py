"""The fidelity check every backend runs: planned prompt tokens (text + visual) against the count
the engine reports. The check itself here; each backend's use of it in its own test file."""
from __future__ import annotations

import numpy as np
import pytest

from medclaw.engine.backends.base import (
    FidelityError, PromptPlan, check_prompt_tokens, load_chat_tokenizer, media_tokens, render_prompt,
)
from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.types import MediaItem


def _video(num_frames: int, height: int, width: int, seed: int = 0) -> MediaItem:
    frames = np.zeros((num_frames, height, width, 3), np.uint8)          # (T, H, W, 3)
    return MediaItem(kind="video", uuid=media_uuid(f"{seed:064x}", 0, num_frames - 1, 2.0,
                                                   height * width), frames=frames, fps=2.0)


@pytest.fixture(scope="module")
def vlm_plan(tiny_models):
    tokenizer = load_chat_tokenizer(str(tiny_models.vlm))
    return tokenizer, PromptPlan(tokenizer, "tiny-vlm")


def test_visual_tokens_follow_the_planner():
    assert media_tokens(_video(16, 224, 224)) == 8 * 8 * 8            # T/2 × H/28 × W/28
    assert media_tokens(_video(128, 56, 84)) == 64 * 2 * 3
    still = MediaItem(kind="image", uuid="i", frames=np.zeros((56, 112, 3), np.uint8))
    assert media_tokens(still) == 2 * 4                                # one temporal patch


def test_planned_tokens_replace_each_placeholder(vlm_plan):
    tokenizer, plan = vlm_plan
    clip = _video(16, 224, 224)
    still = MediaItem(kind="image", uuid="i", frames=np.zeros((56, 56, 3), np.uint8))
    request = Conversation("SYS").add_user("What happens?", media=[clip, still]).to_request()
    text = render_prompt(tokenizer, request)
    text_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert plan.planned_tokens(text, [clip, still]) == text_tokens - 2 + 512 + 4
    plain = Conversation("SYS").add_user("hello").to_request()
    plain_text = render_prompt(tokenizer, plain)
    assert plan.planned_tokens(plain_text, []) == len(tokenizer(plain_text)["input_ids"])
    # a template that rendered no placeholder for a media item cannot be planned: an error
    with pytest.raises(FidelityError, match="0 video placeholder"):
        plan.planned_tokens(plain_text, [clip])


def test_mismatch_names_both_numbers_on_stderr(capsys):
    request = Conversation("S").add_user("q", media=[_video(128, 56, 56)]).to_request(
        request_id="ep-s2")
    check_prompt_tokens("m", request, planned=300, reported=300)         # equal: nothing
    with pytest.raises(FidelityError) as info:
        check_prompt_tokens("m", request, planned=300, reported=108)
    message = str(info.value)
    assert "saw 108 prompt tokens where MedClaw planned 300" in message and "ep-s2" in message
    assert "\n" not in message
    assert message in capsys.readouterr().err
