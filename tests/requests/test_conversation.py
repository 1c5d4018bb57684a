"""KV-reuse prompt layout: media UUIDs and the append-only Conversation (no engine)."""
from __future__ import annotations

import numpy as np
import pytest

from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.types import MediaItem

SHA = "ab" * 32


def _video(uuid: str) -> MediaItem:
    return MediaItem(kind="video", uuid=uuid, frames=np.zeros((2, 28, 28, 3), np.uint8), fps=2.0)


def test_media_uuid_depends_on_every_field_and_only_them():
    base = media_uuid(SHA, 0, 100, 2.0, 200_704)
    assert base == media_uuid(SHA, 0, 100, 2, 200_704)
    variants = {media_uuid("cd" * 32, 0, 100, 2.0, 200_704), media_uuid(SHA, 1, 100, 2.0, 200_704),
                media_uuid(SHA, 0, 101, 2.0, 200_704), media_uuid(SHA, 0, 100, 1.0, 200_704),
                media_uuid(SHA, 0, 100, 2.0, 100_352)}
    assert base not in variants and len(variants) == 5


@pytest.mark.parametrize("args", [("", 0, 1, 2.0, 10), (SHA, -1, 1, 2.0, 10), (SHA, 5, 4, 2.0, 10),
                                  (SHA, 0, 1, 0.0, 10), (SHA, 0, 1, 2.0, 0)])
def test_media_uuid_rejects_bad_input(args):
    with pytest.raises(ValueError):
        media_uuid(*args)


def test_layout_system_then_media_then_question():
    video = _video(media_uuid(SHA, 0, 10, 2.0, 1000))
    request = Conversation("SYS").add_user("Q?", media=[video]).to_request(max_tokens=7)
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.messages[1]["content"] == [{"type": "video", "uuid": video.uuid},
                                              {"type": "text", "text": "Q?"}]
    assert request.media == [video] and request.max_tokens == 7


def test_two_questions_share_the_prefix():
    video = _video(media_uuid(SHA, 0, 10, 2.0, 1000))
    a = Conversation("SYS").add_user("first?", media=[video]).to_request()
    b = Conversation("SYS").add_user("second?", media=[video]).to_request()
    assert a.messages[0] == b.messages[0]
    assert a.messages[1]["content"][0] == b.messages[1]["content"][0]


def test_append_only_stage2_extends_stage1():
    low, high = _video("low"), _video("high")
    conversation = Conversation("SYS").add_user("where?", media=[low])
    stage1 = conversation.to_request()
    conversation.add_assistant("10-20 s").add_user("closer:", media=[high])
    stage2 = conversation.to_request()
    assert stage2.messages[:len(stage1.messages)] == stage1.messages       # a strict extension
    assert [m["role"] for m in stage2.messages] == ["system", "user", "assistant", "user"]
    assert [m.uuid for m in stage2.media] == ["low", "high"]
    assert len(stage1.messages) == 2                                        # snapshot unchanged


def test_history_cannot_be_edited_from_outside():
    conversation = Conversation("SYS").add_user("q")
    conversation.messages[0]["content"][0]["text"] = "EDITED"
    request = conversation.to_request()
    request.messages[1]["content"][0]["text"] = "EDITED"
    assert conversation.messages[0]["content"][0]["text"] == "SYS"
    assert conversation.messages[1]["content"][0]["text"] == "q"


def test_invalid_turns():
    with pytest.raises(ValueError):
        Conversation("SYS").to_request()
    with pytest.raises(ValueError):
        Conversation("SYS").add_user("")
    with pytest.raises(ValueError):
        Conversation().add_user("q", media=[MediaItem(kind="audio", uuid="x", frames=None)])
