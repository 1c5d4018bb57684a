"""Where MedClaw keeps its local state: `$MEDCLAW_HOME`, default `~/.cache/medclaw`.

Below it: `tiny/` (the tiny checkpoints), `models/` (the model store, unless
`$MEDCLAW_MODELS_DIR` says otherwise), `cache/` (content hashes of probed videos).
"""
from __future__ import annotations

import os
from pathlib import Path


def medclaw_home() -> Path:
    return Path(os.environ.get("MEDCLAW_HOME") or "~/.cache/medclaw").expanduser()
