"""The backend contract every generation engine implements.

A backend serves one model. `generate` takes a batch of requests and returns one result per request
in the same order; it is async so that many episodes can await the same engine concurrently and the
engine (vLLM) batches them. Results always carry token accounting, including cached prompt tokens.

Below the contract: small helpers every real backend shares — forcing offline mode, telling a
VLM checkpoint from a text one, turning GenRequest messages into chat-template input, pairing
media parts with their MediaItems, and the video metadata for already-sampled frames.
"""
from __future__ import annotations

import abc

from medclaw.errors import MedClawError
from medclaw.types import GenRequest, GenResult, MediaItem


class RequestRejectedError(MedClawError):
    """The engine refused a request before generating (e.g. the prompt exceeds the model's
    context). One line, naming the model; the episode records it and stops."""


class Backend(abc.ABC):
    """An async text (or vision-language) generation engine for one model."""

    #: True when `GenRequest.json_schema` is enforced by the engine (constrained decoding).
    #: Callers still validate the output; without enforcement they use a tolerant parser.
    supports_json_schema: bool = False
    #: True when the backend accepts video / image media parts.
    supports_media: bool = False

    @abc.abstractmethod
    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Run every request; results come back in request order."""

    async def generate_one(self, request: GenRequest) -> GenResult:
        return (await self.generate([request]))[0]

    async def close(self) -> None:
        """Release engine resources. Safe to call twice."""


# ------------------------------------------------------------------ helpers shared by backends

def set_offline_env() -> None:
    """Force offline mode before vLLM / transformers are imported (user settings cannot undo it),
    and silence one harmless warning.

    Frames come from the shared frame cache as read-only arrays (no copy per request); the
    multimodal processors only read them, but torch warns once that it "does not support
    non-writable tensors".
    """
    import os
    import warnings

    from medclaw import OFFLINE_ENV

    os.environ.update(OFFLINE_ENV)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def is_multimodal(model_path: str) -> bool:
    """True when the checkpoint's config.json has a `vision_config` (a VLM); False when it has none
    or cannot be read (loading the model then reports the real problem)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def template_messages(messages: list[dict]) -> list[dict]:
    """GenRequest messages → what a HF chat template expects.

    Media parts lose their uuid (the template only needs a placeholder per part); a message made of
    text parts only becomes a plain string, which text-only templates (Qwen2, ChatML) require.
    """
    out = []
    for message in messages:
        content = message.get("content", "")
        if isinstance(content, list):
            if all(part.get("type") == "text" for part in content):
                content = "".join(part.get("text", "") for part in content)
            else:
                content = [{"type": part["type"]} if part.get("type") in ("video", "image")
                           else {"type": "text", "text": part.get("text", "")} for part in content]
        out.append({"role": message["role"], "content": content})
    return out


def media_in_order(request: GenRequest) -> list[MediaItem]:
    """The request's MediaItems in placeholder order (one per media part, repeats included)."""
    by_uuid = {item.uuid: item for item in request.media}
    items = []
    for message in request.messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") in ("video", "image"):
                item = by_uuid.get(part.get("uuid"))
                if item is None:
                    raise ValueError(f"media part {part.get('uuid')!r} has no MediaItem in the request")
                if item.kind != part["type"]:
                    raise ValueError(f"media {item.uuid!r} is a {item.kind}, used as {part['type']}")
                items.append(item)
    return items


def video_metadata(item: MediaItem) -> dict:
    """HF/vLLM video metadata for already-sampled frames (`do_sample_frames=False`).

    The clip is described as itself (indices 0..T-1 at the sampling fps) rather than by its
    source indices: transformers derives the temporal spacing Qwen2.5-VL encodes from
    `len(frames_indices) / total_num_frames * fps`, which for a window of a longer video is only
    right when the clip is its own whole.
    """
    num_frames = int(item.frames.shape[0])
    fps = float(item.fps) if item.fps > 0 else 2.0
    return {
        "fps": fps,
        "frames_indices": list(range(num_frames)),
        "total_num_frames": num_frames,
        "duration": num_frames / fps,
        "do_sample_frames": False,
    }
