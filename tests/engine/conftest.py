"""Engine fixtures: ONE real vLLM CPU engine per tiny model for the whole test session.

An engine takes ~40 s to start (much more on a busy 2-core CI box), so every engine-marked test
shares these; requests from different tests (and different event loops) go to the same engine,
which is exactly how concurrent episodes use it in production.
"""
from __future__ import annotations

import os

import pytest

# Small CPU KV cache: the tiny models need a few MiB, not the default fraction of RAM.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# as the tiny-cpu profile runs them (medclaw/models/presets.yaml): eager mode starts faster on CPU
TINY_ENGINE_EXTRA = {"enforce_eager": True, "max_num_seqs": 128}


def tiny_spec(name: str, path, **overrides):
    from medclaw.models.spec import ModelSpec

    fields = dict(name=name, path=str(path), max_model_len=8192, gpu_memory_utilization=0.15,
                  fps=2.0, max_frames=64, min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28,
                  extra=dict(TINY_ENGINE_EXTRA))
    fields.update(overrides)
    return ModelSpec(**fields)


@pytest.fixture(scope="session")
def tiny_vlm_spec(tiny_models):
    return tiny_spec("tiny-vlm", tiny_models.vlm)


@pytest.fixture(scope="session")
def tiny_llm_spec(tiny_models):
    return tiny_spec("tiny-llm", tiny_models.llm)


@pytest.fixture(scope="session")
def vlm_engine(tiny_vlm_spec):
    """The shared in-process vLLM engine serving the tiny VLM."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(tiny_vlm_spec)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def llm_engine(tiny_llm_spec):
    """The shared in-process vLLM engine serving the tiny text LLM (orchestrator / judge)."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(tiny_llm_spec)
    yield backend
    backend.shutdown()


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
