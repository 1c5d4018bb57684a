"""Prompt layout for KV-cache reuse (docs/architecture.md "KV-cache reuse rules").

vLLM's prefix cache reuses the KV of the longest *block-aligned* common prefix of two prompts, and
identifies media by their UUID instead of their pixels. So:

1. Stable content first: the system prompt (tool schemas, skill index) opens every conversation,
   then the video, then the question. Two questions about one video share everything up to the
   question; only the question's own tokens (plus the partial last block) are computed again.
2. `media_uuid` names a clip by what determines its pixels — file sha256, frame range, sampling
   fps, pixel budget — never by hashing decoded frames (which would cost a decode to look up).
3. `Conversation` is append-only: stage 2 of view_full_video and every orchestrator turn *extend*
   the previous prompt, so the previous prompt (and the reply the engine already cached) is a
   prefix of the next one. Earlier messages are never rewritten — no "summary so far" edits, no
   reordering, no timestamps in the system prompt.
4. Callers keep fps / pixel settings identical between calls that should share cache (the UUID
   changes otherwise, and so does the cache key).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable

from medclaw.types import GenRequest, MediaItem


def media_uuid(video_sha256: str, first_frame: int, last_frame: int, fps: float,
               max_pixels: int) -> str:
    """Stable identity of a decoded clip: same arguments ⇔ same pixels ⇔ same cache key."""
    if not video_sha256:
        raise ValueError("media_uuid needs the video's sha256")
    if first_frame < 0 or last_frame < first_frame:
        raise ValueError(f"bad frame range {first_frame}..{last_frame}")
    if fps <= 0 or max_pixels <= 0:
        raise ValueError("media_uuid needs fps > 0 and max_pixels > 0")
    # repr-stable float formatting: 2.0 and 2 give the same id, 1/3 keeps enough digits.
    return f"{video_sha256}:f{first_frame}-{last_frame}:fps{fps:.6g}:px{max_pixels}"


class Conversation:
    """An append-only chat: system prompt first, then user / assistant turns in order.

    Media parts go *before* the text of their user turn (stable, expensive content first; the
    question last). `to_request` snapshots the conversation into a `GenRequest`; later appends
    never change a request already made, and nothing ever edits an earlier message.
    """

    __slots__ = ("_messages", "_media")

    def __init__(self, system: str | None = None):
        self._messages: list[dict] = []
        self._media: dict[str, MediaItem] = {}
        if system is not None:
            self._messages.append({"role": "system", "content": [{"type": "text", "text": system}]})

    @property
    def messages(self) -> list[dict]:
        """A deep copy: callers cannot edit history through it."""
        return copy.deepcopy(self._messages)

    @property
    def media(self) -> list[MediaItem]:
        return list(self._media.values())

    def __len__(self) -> int:
        return len(self._messages)

    def add_user(self, text: str = "", media: Iterable[MediaItem] = ()) -> Conversation:
        """Append a user turn: its media (in order), then its text."""
        parts: list[dict] = []
        for item in media:
            if item.kind not in ("video", "image"):
                raise ValueError(f"media kind must be 'video' or 'image', got {item.kind!r}")
            known = self._media.get(item.uuid)
            if known is not None and known is not item and known.kind != item.kind:
                raise ValueError(f"media uuid {item.uuid!r} reused for a different kind")
            self._media.setdefault(item.uuid, item)
            parts.append({"type": item.kind, "uuid": item.uuid})
        if text:
            parts.append({"type": "text", "text": text})
        if not parts:
            raise ValueError("a user turn needs text or media")
        self._messages.append({"role": "user", "content": parts})
        return self

    def add_assistant(self, text: str) -> Conversation:
        """Append the model's reply, verbatim (re-rendering it differently would break the cache)."""
        self._messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        return self

    def to_request(self, **sampling) -> GenRequest:
        """Snapshot into a GenRequest; `sampling` are GenRequest fields (max_tokens, json_schema…)."""
        if not any(m["role"] == "user" for m in self._messages):
            raise ValueError("a conversation needs at least one user turn before a request")
        return GenRequest(messages=self.messages, media=self.media, **sampling)


def message_text(message: dict, sep: str = "\n") -> str:
    """The text of one chat message: its string content, or its text parts joined by `sep`
    (media parts carry no text)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return sep.join(part.get("text", "") for part in content if part.get("type") == "text")
