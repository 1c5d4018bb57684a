"""The backend contract every generation engine implements.

A backend serves one model. `generate` takes a batch of requests and returns one result per request
in the same order; it is async so that many episodes can await the same engine concurrently and the
engine (vLLM) batches them. Results always carry token accounting, including cached prompt tokens.

Below the contract: small helpers every real backend shares — forcing offline mode, telling a
VLM checkpoint from a text one, turning GenRequest messages into chat-template input, pairing
media parts with their MediaItems, the video metadata for already-sampled frames, and the
fidelity check.

Fidelity check (every real backend runs it on every request): what the engine saw is what
MedClaw planned. `PromptPlan` counts the planned prompt tokens with the model's own tokenizer and
chat template — the rendered text, where each media part is one placeholder token, minus the
placeholders, plus each media item's visual tokens as the frame planner computes them
(`kernels.planner.visual_tokens` of its frame count and size). `check_prompt_tokens` compares that
with the number the engine reports and raises `FidelityError` (naming both numbers; also printed
on stderr) on any difference: a server that kept 32 of 128 frames, a processor that resized the
frames, a template that differs from the server's — never silently accepted.
"""
from __future__ import annotations

import abc
import threading

from medclaw.errors import MedClawError
from medclaw.types import GenRequest, GenResult, MediaItem


class FidelityError(MedClawError):
    """The engine reported a different number of prompt tokens than MedClaw planned: it did not
    see the frames (or text) MedClaw sent. One line, naming both numbers."""


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


# ------------------------------------------------------------------ fidelity check

# Media placeholder token per media kind: each media part renders as exactly one of these in the
# chat template (Qwen2-VL / Qwen2.5-VL family), and the engine replaces it by the visual tokens.
MEDIA_PLACEHOLDERS = {"video": "<|video_pad|>", "image": "<|image_pad|>"}


def media_tokens(item: MediaItem) -> int:
    """Visual tokens the planner budgets for `item`: a video (T, H, W, 3) as planned; a still is
    one temporal patch, i.e. a 2-frame clip."""
    from medclaw.kernels.planner import FRAME_FACTOR, visual_tokens

    shape = tuple(item.frames.shape)
    if item.kind == "video":
        return visual_tokens(int(shape[0]), int(shape[1]), int(shape[2]))
    return visual_tokens(FRAME_FACTOR, int(shape[0]), int(shape[1]))


# transformers' lazy imports are not thread-safe (two threads at once failed with "cannot import
# name 'AutoTokenizer'"): engines built in parallel threads (Runtime.start) load one at a time.
_tokenizer_load_lock = threading.Lock()


def load_chat_tokenizer(model_path: str):
    """The tokenizer whose chat template renders prompts (the processor's template as fallback)."""
    with _tokenizer_load_lock:
        from transformers import AutoTokenizer

        from medclaw.errors import ConfigError

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if getattr(tokenizer, "chat_template", None) is None:
            from transformers import AutoProcessor

            template = getattr(AutoProcessor.from_pretrained(model_path), "chat_template", None)
            if template is None:
                raise ConfigError(f"model at {model_path} has no chat template")
            tokenizer.chat_template = template
        return tokenizer


def render_prompt(tokenizer, request: GenRequest, chat_template_kwargs: dict | None = None) -> str:
    """The request as prompt text, rendered by the model's chat template (media → placeholders)."""
    return tokenizer.apply_chat_template(
        template_messages(request.messages), tokenize=False, add_generation_prompt=True,
        **(chat_template_kwargs or {}))


class PromptPlan:
    """Counts the prompt tokens MedClaw plans for a request, with the model's tokenizer."""

    __slots__ = ("model_name", "tokenizer", "_placeholder_ids")

    def __init__(self, tokenizer, model_name: str):
        self.model_name = model_name
        self.tokenizer = tokenizer
        self._placeholder_ids: dict[str, int] = {}
        unknown = getattr(tokenizer, "unk_token_id", None)
        for kind, token in MEDIA_PLACEHOLDERS.items():
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != unknown:
                self._placeholder_ids[kind] = token_id

    def planned_tokens(self, text: str, media: list[MediaItem]) -> int:
        """Tokens of `text` (placeholders included), each placeholder replaced by its media's
        planned visual tokens. Raises FidelityError when the placeholders do not match the media."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        for kind in ("video", "image"):
            wanted = sum(1 for item in media if item.kind == kind)
            token_id = self._placeholder_ids.get(kind)
            found = 0 if token_id is None else sum(1 for i in ids if i == token_id)
            if found != wanted:
                raise FidelityError(
                    f"model {self.model_name!r}: the chat template rendered {found} {kind} "
                    f"placeholder(s) for {wanted} {kind} item(s); cannot plan the prompt")
        return len(ids) - len(media) + sum(media_tokens(item) for item in media)


def check_prompt_tokens(model_name: str, request: GenRequest, planned: int, reported: int) -> None:
    """Raise FidelityError (and log it on stderr) unless the engine saw the planned prompt."""
    if planned == reported:
        return
    media = ", ".join(f"{item.kind} {tuple(item.frames.shape)}" for item in request.media) or "none"
    message = (f"model {model_name!r} saw {reported} prompt tokens where MedClaw planned "
               f"{planned} (text + visual tokens; media: {media}; request "
               f"{request.request_id or '-'}): the engine dropped, resized or re-sampled input "
               "(a server started without `medclaw models serve` keeps only 32 frames per video)")
    import sys

    print(f"medclaw: fidelity error: {message}", file=sys.stderr, flush=True)
    raise FidelityError(message)
