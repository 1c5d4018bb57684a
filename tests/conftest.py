"""Shared fixtures: tiny checkpoints and a synthetic procedure video, built once per test run.

Nothing is downloaded: the checkpoints are random-weight models built by `medclaw models make-tiny`
code, the video by `medclaw video synth` code. Engine fixtures (real vLLM CPU) are session-scoped
because an engine takes ~40 s to start.
"""
from __future__ import annotations

import importlib.util

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of the tiny VLM and tiny text LLM: `.vlm`, `.llm`."""
    from medclaw.models.tiny import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"), seed=0)


@pytest.fixture(scope="session")
def synth_video(tmp_path_factory):
    """A 1-minute synthetic procedure video (320×180, 25 fps) and its ground truth."""
    from medclaw.kernels.synth import synthesize

    out = tmp_path_factory.mktemp("videos") / "procedure.mp4"
    return synthesize(out, minutes=1.0, seed=0, width=320, height=180, fps=25)
