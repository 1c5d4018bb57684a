"""Fixtures for the model-registry tests: an isolated MEDCLAW_HOME with the tiny checkpoints in it."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def medclaw_home(tmp_path, monkeypatch, tiny_models):
    """A fresh $MEDCLAW_HOME whose `tiny/` is a copy of the session's tiny checkpoints (so the
    tiny-cpu profile finds them built), and an empty model store."""
    home = tmp_path / "home"
    shutil.copytree(tiny_models.vlm.parent, home / "tiny")
    monkeypatch.setenv("MEDCLAW_HOME", str(home))
    monkeypatch.delenv("MEDCLAW_MODELS_DIR", raising=False)
    return home
