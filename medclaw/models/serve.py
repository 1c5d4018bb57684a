"""`medclaw models serve NAME`: vLLM's OpenAI-compatible server for one model, with every flag
MedClaw relies on, and the config lines that point a role at it.

Contract:
- `resolve_served_model(name)` → ModelSpec for a preset, an imported store name or a model folder
  (the folder is checked before anything starts; a missing one is a one-line error).
- `server_command(spec, options)` → the argv of `python -m vllm.entrypoints.openai.api_server`:
  prefix caching and prompt-token details (the cached tokens every trace records), structured
  outputs by xgrammar without free whitespace (what the in-process backend does), vLLM's neutral
  sampling defaults (`--generation-config vllm`: greedy means greedy, as in-process), and for VLMs
  the media limits plus `--media-io-kwargs '{"video": {"num_frames": -1, "fps": F}}'`. vLLM keeps
  only the first 32 frames of a frame-list video unless told `num_frames: -1`, and dates a frame
  list at 1 fps unless told otherwise (vllm/multimodal/media/video.py). `--trust-request-mm-kwargs`
  lets the remote backend state each request's real sampling fps (and `num_frames: -1` again: a
  request that names only `fps` makes vLLM drop the server's `num_frames`). Extra vLLM arguments
  are appended verbatim and win over these (argparse keeps the last value).
- `server_env()` → the environment: MedClaw's offline variables, `VLLM_HOST_IP=127.0.0.1` among
  them (vLLM otherwise discovers its IP by connecting a UDP socket to 8.8.8.8 in every engine
  process; a multi-node Ray deployment runs `vllm serve` with the node's address itself).
- `bind_to_free_cores(env)`: on vLLM's CPU build, unless `VLLM_CPU_OMP_THREADS_BIND` is set, a
  server started while other vLLM workers run on this host computes on the cores they leave free
  (vLLM's "auto" puts every engine on the same cores), when those are at least as many as any
  running worker's; returns the line that says what it did.
- `role_config(spec, url, role)` → YAML lines for `medclaw.yaml` that put `role` on the server.
- `serve(spec, options)` prints those lines on stdout, then replaces this process with the server
  (signals go straight to vLLM; its logs go to stderr).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
VLM_ROLE, LLM_ROLE = "video_expert", "orchestrator"


@dataclass(slots=True)
class ServeOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tensor_parallel_size: int | None = None     # None: the spec's
    data_parallel_size: int | None = None
    extra_args: list[str] = field(default_factory=list)
    on_cpu: bool | None = None                  # None: detect the installed vLLM build

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port must be in 1..65535, got {self.port}")
        for flag, value in (("--tensor-parallel-size", self.tensor_parallel_size),
                            ("--data-parallel-size", self.data_parallel_size)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")


def resolve_served_model(name: str, profile: str | None = None) -> ModelSpec:
    """A preset (with `profile`'s vLLM defaults), an imported store name, or a model folder."""
    from medclaw.models import registry, store

    if name in registry.catalog().presets:
        return registry.preset_spec(name, profile=profile)
    if profile is not None:
        raise ConfigError(f"--profile applies to presets only; {name!r} is not a preset")
    looks_like_path = os.sep in name or name.startswith((".", "~"))
    folder = Path(name).expanduser().resolve() if looks_like_path else store.store_path(name)
    if not looks_like_path and not folder.exists():
        raise ConfigError(f"{name!r} is neither a preset, an imported model nor a path "
                          f"({store.import_hint(name)})")
    store.check_model_folder(folder, name if not looks_like_path else folder.name)
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or [""]
    except (OSError, ValueError, AttributeError):
        archs = [""]
    return ModelSpec(name=name if not looks_like_path else folder.name, path=str(folder),
                     architecture=str(archs[0]))


def vllm_is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (`vllm-cpu`); read from package metadata, so
    nothing is imported."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _flag(key: str, value) -> list[str]:
    """One engine argument as CLI flags: True → `--key`, False → `--no-key` (vLLM's boolean
    arguments take both; leaving the flag out would keep a default that is on, such as prefix
    caching), None → nothing, dicts/lists → JSON, others → str."""
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if value is None:
        return []
    if isinstance(value, (dict, list)):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def server_command(spec: ModelSpec, options: ServeOptions) -> list[str]:
    """argv of the vLLM OpenAI-compatible server for `spec` (see the module docstring)."""
    from medclaw.engine.backends.base import is_multimodal
    from medclaw.engine.backends.vllm_local import DEFAULT_MM_LIMITS, cpu_engine_args
    from medclaw.models.quantization import vllm_quantization

    on_cpu = vllm_is_cpu_build() if options.on_cpu is None else options.on_cpu
    args = {
        "model": spec.path,
        "served_model_name": spec.name,
        "host": options.host,
        "port": options.port,
        "max_model_len": spec.max_model_len,
        "tensor_parallel_size": options.tensor_parallel_size or spec.tensor_parallel_size,
        "data_parallel_size": options.data_parallel_size or spec.data_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        # the same rule as the in-process engine: refused where vLLM or the device cannot load it
        "quantization": vllm_quantization(spec, on_cpu),
        "seed": 0,
        "enable_prefix_caching": True,
        "enable_prompt_tokens_details": True,
        "generation_config": "vllm",
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    if is_multimodal(spec.path):
        args["limit_mm_per_prompt"] = dict(DEFAULT_MM_LIMITS)
        args["media_io_kwargs"] = {"video": {"num_frames": -1, "fps": float(spec.fps)}}
        args["trust_request_mm_kwargs"] = True
    if on_cpu:       # the CPU build (`vllm-cpu`): the in-process engine's arguments; no CUDA graphs
        args.update(cpu_engine_args(spec))
        args["enforce_eager"] = True
    # engine arguments from the spec (`extra:`), as the in-process backend passes them
    args.update({k: v for k, v in spec.extra.items() if k not in REMOTE_ONLY_EXTRA})
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    for key, value in args.items():
        command += _flag(key, value)
    return command + list(options.extra_args)


# `extra:` keys read by the remote backend (client side), never engine arguments
REMOTE_ONLY_EXTRA = frozenset({"served_model_name", "timeout_s", "jpeg_quality", "routing",
                               "per_request_seed"})


def server_env(base: dict | None = None) -> dict:
    """The server's environment: offline, loopback IP discovery, logs on stderr."""
    from medclaw import OFFLINE_ENV

    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    env["VLLM_HOST_IP"] = "127.0.0.1"       # one server, this host (also in OFFLINE_ENV)
    env.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")    # stdout: the config lines only
    return env


def bind_to_free_cores(env: dict) -> str | None:
    """Set `env`'s core binding for a CPU server to the cores no running vLLM worker is bound to
    (see the module docstring); the line to print about it, None when nothing was decided.

    Only when the free cores are at least as many as any running worker's: vLLM's own binding
    gives a server every core of the first NUMA node but one, so on a many-core host the core it
    leaves would make the second server far slower than sharing the first one's cores."""
    from medclaw.engine.backends.cpu_binding import (
        BIND_VARIABLE, cores_of_running_workers, free_cores,
    )

    if env.get(BIND_VARIABLE):
        return None                                          # the user's choice
    running = cores_of_running_workers()
    if not running:
        return None                                          # vLLM's "auto" is fine alone
    taken = {core for cores in running.values() for core in cores}
    free = free_cores(taken)
    busy = ",".join(map(str, sorted(taken)))
    largest = max(len(cores) for cores in running.values())
    if len(free) < largest:
        return (f"medclaw: running vLLM workers compute on cores {busy}, {len(free)} core(s) left "
                f"free, fewer than a running worker's {largest}; this server shares their cores "
                f"(set {BIND_VARIABLE} for each server to split them)")
    env[BIND_VARIABLE] = ",".join(map(str, free))
    return (f"medclaw: running vLLM workers compute on cores {busy}; this server's on cores "
            f"{env[BIND_VARIABLE]} (set {BIND_VARIABLE} to choose)")


def endpoint_url(options: ServeOptions) -> str:
    """The base URL clients use (a wildcard bind is advertised under this host's name)."""
    host = options.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{options.port}/v1"


def default_role(spec: ModelSpec) -> str:
    from medclaw.engine.backends.base import is_multimodal

    return VLM_ROLE if is_multimodal(spec.path) else LLM_ROLE


def role_config(spec: ModelSpec, url: str, role: str, is_preset: bool, on_cpu: bool = False) -> str:
    """`medclaw.yaml` lines that put `role` on this server (the remote backend). A CPU-build
    server gets no per-request seeds: vLLM 0.32's CPU sampler dies on a seeded request whose
    prefill is chunked (the in-process backend seeds once per engine there too)."""
    extra = {} if is_preset else {"served_model_name": spec.name}
    if on_cpu:
        extra["per_request_seed"] = False
    fields = [f"preset: {spec.name}" if is_preset else f"path: {json.dumps(spec.path)}",
              "backend: remote", f"endpoints: [{json.dumps(url)}]"]
    if extra:
        fields.append("extra: {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in extra.items()) + "}")
    entry = "{" + ", ".join(fields) + "}"
    return "\n".join([
        f"# medclaw.yaml: put {role} on this server (more servers: add their URLs to endpoints)",
        "models:",
        f"  {role}: {entry}",
    ])


def check_vllm_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("vLLM is not installed in this environment (pip install '.[gpu]' on a "
                          "GPU host, `make install` for the CPU build)")


def serve(spec: ModelSpec, options: ServeOptions, role: str, is_preset: bool,
          dry_run: bool = False) -> int:
    """Print the config lines, then become the vLLM server (or, `dry_run`, print its command)."""
    import shlex

    command = server_command(spec, options)
    on_cpu = vllm_is_cpu_build() if options.on_cpu is None else options.on_cpu
    print(role_config(spec, endpoint_url(options), role, is_preset, on_cpu), flush=True)
    if dry_run:
        print("# command: " + shlex.join(command), flush=True)
        return 0
    check_vllm_installed()
    env = server_env()
    binding_note = bind_to_free_cores(env) if on_cpu else None
    if binding_note:
        print(binding_note, file=sys.stderr)
    print(f"medclaw: starting vLLM for {spec.name} on {options.host}:{options.port} "
          f"(ready when GET /health answers 200)", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 0     # not reached
