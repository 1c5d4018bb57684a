"""Plain dataclasses that cross layer boundaries (kernels → tools → engine → trace).

Nothing here imports numpy, torch or vLLM at module import time; frame arrays are typed loosely
(`Any`) so that importing `medclaw.types` stays cheap for the CLI.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The sampling seed of every request unless a caller sets another (traces record it).
DEFAULT_SEED = 0


@dataclass(slots=True, frozen=True)
class VideoInfo:
    """What the probe learned about a video file. `sha256` is of the file's bytes."""

    path: str
    sha256: str
    duration_s: float
    fps: float                 # average frame rate
    num_frames: int            # frames actually present (not blindly the container's claim)
    width: int                 # display width (after rotation)
    height: int                # display height (after rotation)
    codec: str
    rotation: int = 0          # degrees, from the stream's display matrix
    is_variable_fps: bool = False
    start_s: float = 0.0       # pts of the first frame (stream clock); video time 0 is this frame
    fps_is_assumed: bool = False   # no timestamps in the stream (raw .h264): frames timed at `fps`
    damage: str = ""           # what is wrong with a damaged file served anyway ("truncated: …")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class FrameRef:
    """One frame that some model looked at: enough to find it again and prove which it was.
    (Its on-disk form is `medclaw.engine.trace_schema.FrameRef`, validated from this.)"""

    video_sha256: str
    frame_index: int           # in presentation order
    timestamp_s: float         # video time from the frame's pts: pts × time base − start_s
    width: int                 # size the model saw
    height: int
    crop_box: tuple[float, float, float, float] | None = None  # normalised (x1, y1, x2, y2)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class MediaItem:
    """Decoded pixels attached to a generation request.

    `uuid` is the prefix-cache identity (docs/architecture.md rule 2): video sha256 + frame range + fps +
    pixel budget — never a hash of decoded pixels. Two requests with the same uuid must carry the
    same pixels, so vLLM may reuse the KV it computed for them.
    """

    kind: str                  # "video" | "image"
    uuid: str
    frames: Any                # video: uint8 (T, H, W, 3); image: uint8 (H, W, 3)
    fps: float = 0.0           # sampling rate of `frames` (video only)
    frame_indices: list[int] = field(default_factory=list)   # source frame index of each frame
    timestamps_s: list[float] = field(default_factory=list)
    source_fps: float = 0.0    # the video's own frame rate
    source_num_frames: int = 0


@dataclass(slots=True)
class GenRequest:
    """One generation call.

    `messages` are chat messages in the OpenAI shape. A content part may be
    `{"type": "text", "text": ...}` or `{"type": "video" | "image", "uuid": <MediaItem.uuid>}`;
    the pixels for a media part are found in `media` by uuid.
    """

    messages: list[dict]
    media: list[MediaItem] = field(default_factory=list)
    max_tokens: int = 256
    temperature: float = 0.0
    json_schema: dict | None = None    # constrain the output to this JSON schema when supported
    request_id: str = ""
    seed: int | None = DEFAULT_SEED


@dataclass(slots=True)
class GenResult:
    """What a backend returned for one request, with the accounting the trace needs."""

    text: str
    model_name: str
    model_revision: str
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = ""
    reasoning: str = ""        # <think>…</think> content for reasoning models, kept for the trace
    # time to first token: submission → first generated token, as the backend measured it (same
    # clock as latency_s, so ttft_s <= latency_s); None where the backend cannot see it
    ttft_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class Observation:
    """What a tool hands back to the orchestrator. `error` is for the *model* to read and fix."""

    text: str
    frames: list[FrameRef] = field(default_factory=list)
    error: str | None = None
    model_calls: list[GenResult] = field(default_factory=list)   # sub-agent calls behind it
    data: dict = field(default_factory=dict)                     # structured extras (windows, hits)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "frames": [f.to_dict() for f in self.frames],
            "error": self.error,
            "model_calls": [c.to_dict() for c in self.model_calls],
            "data": self.data,
        }
