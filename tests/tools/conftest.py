"""Fixtures for tool tests: a ToolContext over a real synthetic video (real probe, real decoder)
with scripted sub-agents, and a bare context for the tools that never look at pixels."""
from __future__ import annotations

import pytest

from medclaw.tools.base import ToolContext
from medclaw.types import VideoInfo


def bare_context(**overrides) -> ToolContext:
    """A context for tools that read no pixels (final_answer, search, skills)."""
    video = VideoInfo(path="/nonexistent.mp4", sha256="ab" * 32, duration_s=60.0, fps=25.0,
                      num_frames=1500, width=320, height=180, codec="h264")
    fields = dict(video=video, question="q", backends={}, specs={}, frames=None)
    fields.update(overrides)
    return ToolContext(**fields)


@pytest.fixture
def bare_ctx():
    return bare_context()


@pytest.fixture
def make_bare_ctx():
    return bare_context
