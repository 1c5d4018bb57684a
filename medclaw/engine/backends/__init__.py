"""Generation backends behind one async interface (see `base.Backend`).

The table maps a backend kind (the `backend:` field of a model config) to a lazily imported class,
so that importing `medclaw` never imports vLLM, torch or CUDA.
"""
from __future__ import annotations

import importlib

BACKENDS: dict[str, str] = {
    "vllm": "medclaw.engine.backends.vllm_local:VLLMBackend",
    "remote": "medclaw.engine.backends.remote:RemoteBackend",
    "transformers": "medclaw.engine.backends.hf:TransformersBackend",
    "fake": "medclaw.engine.backends.fake:ScriptedBackend",
}


def backend_class(kind: str):
    """Return the Backend class registered for `kind` (imports its module on first use)."""
    if kind not in BACKENDS:
        from medclaw.errors import ConfigError

        raise ConfigError(f"unknown backend {kind!r}; choose one of {sorted(BACKENDS)}")
    module_name, class_name = BACKENDS[kind].split(":")
    return getattr(importlib.import_module(module_name), class_name)
