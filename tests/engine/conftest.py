"""Engine-test helpers. The engines themselves (`vlm_engine`, `llm_engine`: one real vLLM CPU
engine per tiny model for the whole session) live in tests/conftest.py, shared with tests/tools."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def random_clip():
    """`random_clip(seed, T=16, H=224, W=224)` → uint8 (T, H, W, 3) frames; sizes are multiples
    of 28, so the Qwen processor does not resize them (16 frames at 224² = 512 video tokens)."""
    import numpy as np

    def make(seed: int, num_frames: int = 16, height: int = 224, width: int = 224):
        rng = np.random.default_rng(seed)
        return rng.integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)  # (T, H, W, 3)

    return make


@pytest.fixture(scope="session")
def tool_specs():
    """The real tools' specs (name, description, bounded JSON schema), as the orchestrator sees them."""
    from medclaw.tools.registry import default_registry

    return default_registry().specs()
