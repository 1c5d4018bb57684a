"""What a model entry's `extra:` may pass on, per backend, and where a remote backend may connect.

`extra` carries engine arguments that MedClaw does not model (KV block size, eager mode, …). Passed
through verbatim it would also let one config line break the air gap or the audit trail: vLLM's
`otlp_traces_endpoint` ships traces to a collector, `trust_remote_code` runs Python that came with
the weights, `download_dir` / `revision` / `tokenizer` change what is loaded, `load_format:
runai_streamer` streams weights from object storage, `distributed_executor_backend: ray` joins a
cluster. So `EXTRA_KEYS` lists, for each backend that hands `extra` to an engine (vLLM,
transformers), the keys it accepts (and, for keys that could reach out, the values); `check_extra`
refuses anything else with one line naming the key and the allowed ones. `ModelSpec` runs it when
it is built, so no path (config file, profile, code) gets around it. Other backends pass nothing
on: the remote client reads its own few keys by name (`served_model_name`, `timeout_s`, …).

Remote endpoints come from the config file only (no environment variable, no CLI flag names
one), must be plain `http(s)://host[:port][/path]` URLs (no credentials, query or fragment), and
default to the loopback server `medclaw models serve` starts (`DEFAULT_ENDPOINT`).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from medclaw.errors import ConfigError

ANY = None          # any value
EXTRA_KEYS: dict[str, dict[str, tuple | None]] = {
    "vllm": {
        "enforce_eager": ANY, "block_size": ANY, "kv_cache_memory_bytes": ANY, "kv_cache_dtype": ANY,
        "max_num_seqs": ANY, "max_num_batched_tokens": ANY, "enable_chunked_prefill": ANY,
        "limit_mm_per_prompt": ANY, "mm_processor_kwargs": ANY, "dtype": ANY, "seed": ANY,
        "swap_space": ANY, "cpu_offload_gb": ANY, "pipeline_parallel_size": ANY,
        "enable_expert_parallel": ANY, "disable_custom_all_reduce": ANY, "max_logprobs": ANY,
        "enable_prefix_caching": (True, False),     # false: the cache-off baseline (bench e2e)
        "load_format": ("auto", "safetensors", "pt", "dummy"),
        "distributed_executor_backend": ("mp", "uni"),
    },
    "transformers": {
        "torch_dtype": ANY, "dtype": ANY, "attn_implementation": ANY, "low_cpu_mem_usage": ANY,
        "device_map": ANY, "max_memory": ANY, "offload_folder": ANY,
    },
}
DEFAULT_ENDPOINT = "http://127.0.0.1:8000/v1"


def check_extra(name: str, backend: str, extra: dict) -> None:
    """ConfigError (one line) for an `extra` key or value that `backend` does not allow."""
    if not isinstance(extra, dict):
        raise ConfigError(f"model {name!r}: extra must be a mapping of engine arguments")
    if backend not in EXTRA_KEYS:
        return
    allowed = EXTRA_KEYS[backend]
    for key, value in extra.items():
        if key not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            raise ConfigError(f"model {name!r}: extra key {key!r} is not allowed for backend "
                              f"{backend!r}; allowed: {listed}")
        values = allowed[key]
        if values is not ANY and value not in values:
            raise ConfigError(f"model {name!r}: extra.{key} = {value!r} is not allowed; "
                              f"use one of {', '.join(map(str, values))}")


def check_endpoints(name: str, endpoints: list) -> list[str]:
    """The endpoints as given (DEFAULT_ENDPOINT when empty), each checked to be a plain URL."""
    if not isinstance(endpoints, list):
        raise ConfigError(f"model {name!r}: endpoints must be a list of URLs")
    for url in endpoints:
        parts = urlsplit(str(url))
        problem = (
            "use http:// or https://" if parts.scheme not in ("http", "https") else
            "no host" if not parts.hostname else
            "no credentials in the URL" if parts.username or parts.password else
            "no query or fragment" if parts.query or parts.fragment else None)
        if problem is None:
            try:
                parts.port                      # raises on a malformed port
            except ValueError:
                problem = "bad port"
        if problem:
            raise ConfigError(f"model {name!r}: endpoint {url!r} is not a server base URL ({problem})")
    return [str(url) for url in endpoints] or [DEFAULT_ENDPOINT]


def endpoint_hosts(endpoints: list[str]) -> list[str]:
    """`host:port` of each endpoint (the default port of its scheme when none is given)."""
    out = []
    for url in endpoints:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out.append(f"{parts.hostname}:{port}")
    return out
