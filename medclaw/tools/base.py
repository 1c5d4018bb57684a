"""The tool contract: a name, a description, a JSON schema for the arguments, and `run`.

`run` gets the episode's `ToolContext` (the video, the engines by role, the shared frame source,
the knowledge base, the skill library, the visual-token budget) and validated arguments, and
returns an `Observation`. Mistakes the *model* made (a time past the end, an unparseable sub-agent
reply) come back as `Observation(error=...)` for the orchestrator to read; bugs in our code and
lost engines raise (the registry decides which is which with `medclaw.errors.error_kind`).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from medclaw.errors import MedClawError
from medclaw.types import Observation, VideoInfo


@dataclass(slots=True)
class ToolContext:
    """Everything a tool may use during one episode. Shared engines, per-episode state."""

    video: VideoInfo
    question: str
    backends: dict[str, Any]           # role ("video_expert", "frame_verifier", ...) -> Backend
    specs: dict[str, Any]              # role -> ModelSpec (pixel / fps budgets)
    frames: Any                        # kernels.frames.FrameSource, shared by all episodes
    knowledge_base: Any = None         # kb.search.KnowledgeBase or None
    skills: Any = None                 # skills.library.SkillLibrary or None
    visual_tokens_used: int = 0        # charged by the tools, checked by the episode budget
    visual_token_budget: int = 10 ** 9
    sub_agent_max_tokens: int | None = None   # EpisodeConfig's cap on sub-agent replies

    @property
    def visual_tokens_left(self) -> int:
        return max(0, self.visual_token_budget - self.visual_tokens_used)

    def reply_tokens(self, budget: int) -> int:
        """The tokens a sub-agent reply may take: the tool's `budget`, capped by the episode's."""
        return budget if self.sub_agent_max_tokens is None else min(budget, self.sub_agent_max_tokens)


class ToolError(MedClawError):
    """A problem the *model* caused inside a tool (a time past the end, a region with x1 >= x2,
    an unparseable sub-agent reply, the visual budget spent). The registry turns it into
    `Observation(error=str(err))`; the message is one line, written for the orchestrator to read
    and fix. (Tools need not catch other errors for that: the registry observes every exception
    `medclaw.errors.ERROR_KINDS` calls MODEL.)"""


def error_observation(tool: str, message: str, *, frames=(), model_calls=()) -> Observation:
    """An observation that tells the orchestrator what went wrong (`text == error`).

    Tools return this directly (instead of raising `ToolError`) when a sub-agent already ran, so
    the frames it saw and its GenResult still reach the trace.
    """
    text = f"{tool}: {message}" if tool else message
    return Observation(text=text, error=text, frames=list(frames), model_calls=list(model_calls))


class Tool(abc.ABC):
    name: str = ""
    description: str = ""
    #: JSON schema of the arguments object. Keep fields bounded (enums, min/max) so that
    #: constrained decoding stays tight even for weak models.
    parameters: dict = {"type": "object", "properties": {}, "required": []}

    @abc.abstractmethod
    async def run(self, ctx: ToolContext, args: dict) -> Observation:
        """Execute the tool with already schema-validated `args`."""

    def spec(self) -> dict:
        """What the orchestrator's system prompt and the action schema are built from."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}
