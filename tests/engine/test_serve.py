"""`medclaw models serve` for real: one loopback vLLM server per test module (the tiny VLM imported
into a model store under a preset's name, started exactly as the README says), and the remote
backend against it — every frame of 64- and 128-frame clips reaches the model, the fidelity check
catches a server that keeps 32, stage 2 reuses the KV without re-uploading stage 1's frames, and
the cached tokens of a whole episode's trace equal the server's own /metrics counters."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import yaml

from medclaw.cli import main
from medclaw.models.serve import vllm_is_cpu_build
from medclaw.engine.backends.base import FidelityError, PromptPlan, media_tokens, render_prompt
from medclaw.engine.backends.shared_memory import release_shared_memory, shared_memory_of
from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.types import MediaItem

PRESET = "qwen2.5-vl-7b"         # fps 2.0, like every real preset; weights: the tiny VLM
START_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clip(seed: int, num_frames: int, side: int = 56, fps: float = 2.0) -> MediaItem:
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (num_frames, side, side, 3), dtype=np.uint8)   # (T, H, W, 3)
    sha = f"{seed:064x}"
    return MediaItem(kind="video", uuid=media_uuid(sha, 0, num_frames - 1, fps, side * side),
                     frames=frames, fps=fps, frame_indices=list(range(num_frames)))


# ------------------------------------------------------------------------------ without a server

def test_dry_run_prints_config_and_every_flag(medclaw_home, capsys):
    assert main(["models", "import", PRESET, str(medclaw_home / "tiny" / "vlm")]) == 0
    capsys.readouterr()
    assert main(["models", "serve", PRESET, "--port", "8123", "--data-parallel-size", "2",
                 "--dry-run", "--max-num-seqs", "8"]) == 0
    out = capsys.readouterr().out
    config = yaml.safe_load("\n".join(line for line in out.splitlines() if not line.startswith("#")))
    entry = config["models"]["video_expert"]
    assert entry.pop("extra", {}) == ({"per_request_seed": False} if vllm_is_cpu_build() else {})
    assert entry == {"preset": PRESET, "backend": "remote", "endpoints": ["http://127.0.0.1:8123/v1"]}
    command = out.split("# command: ", 1)[1]
    for flag in ("--host 127.0.0.1", "--port 8123", "--enable-prefix-caching",
                 "--enable-prompt-tokens-details", "--generation-config vllm",
                 '"disable_any_whitespace": true', "--trust-request-mm-kwargs",
                 "--data-parallel-size 2", "--served-model-name qwen2.5-vl-7b"):
        assert flag in command, flag
    assert '{"video": {"num_frames": -1, "fps": 2.0}}' in command       # all frames, dated at 2 fps
    assert command.rstrip().endswith("--max-num-seqs 8")                   # extra flags last (win)


def test_serve_env_is_offline_and_loopback():
    from medclaw.models.serve import server_env

    env = server_env({"PATH": "/bin"})
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert server_env({"VLLM_HOST_IP": "10.0.0.5"})["VLLM_HOST_IP"] == "127.0.0.1"


@pytest.mark.parametrize("env_binding, running, binding, note", [
    ("2", {7: [0]}, "2", None),                                 # the user's choice is kept
    (None, {}, None, None),                                     # alone: vLLM's "auto"
    (None, {7: [0], 8: [1]}, "2,3", "on cores 0,1; this server's on cores 2,3"),
    (None, {7: [0, 1], 8: [2, 3]}, None, "0 core(s) left free, fewer than a running worker's 2"),
    # vLLM's own binding took all cores but one: one core alone would be slower than sharing
    (None, {7: [0, 1, 2]}, None, "1 core(s) left free, fewer than a running worker's 3"),
    (None, {7: [0, 1]}, "2,3", "on cores 0,1; this server's on cores 2,3"),
])
def test_a_cpu_server_binds_to_the_cores_running_workers_leave(monkeypatch, capsys, tiny_vlm_spec,
                                                              env_binding, running, binding, note):
    """What `medclaw models serve` execs vLLM with, on 4 cores with other vLLM workers running."""
    from medclaw.engine.backends import cpu_binding
    from medclaw.models import serve as serve_module

    monkeypatch.setattr(cpu_binding, "allowed_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(cpu_binding, "cores_of_running_workers", lambda: running)
    if env_binding is None:
        monkeypatch.delenv(cpu_binding.BIND_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(cpu_binding.BIND_VARIABLE, env_binding)
    execs = []
    monkeypatch.setattr(serve_module.os, "execve", lambda *call: execs.append(call))
    options = serve_module.ServeOptions(on_cpu=True)
    assert serve_module.serve(tiny_vlm_spec, options, role="video_expert", is_preset=False) == 0
    (_, _, env), = execs
    assert env.get(cpu_binding.BIND_VARIABLE) == binding
    err = capsys.readouterr().err
    assert (note in err) if note else ("running vLLM workers" not in err)
    # a GPU build is never bound
    monkeypatch.delenv(cpu_binding.BIND_VARIABLE, raising=False)
    execs.clear()
    serve_module.serve(tiny_vlm_spec, serve_module.ServeOptions(on_cpu=False), role="video_expert",
                       is_preset=False)
    assert cpu_binding.BIND_VARIABLE not in execs[0][2]


def test_bad_input_is_one_line_before_anything_starts(medclaw_home, capsys):
    for argv, needle in ((["models", "serve", "no-such-model"], "medclaw models import"),
                         (["models", "serve", PRESET], "medclaw models import"),
                         (["models", "serve", "tiny-vlm", "--port", "0"], "--port"),
                         (["models", "serve", "tiny-vlm", "--tensor-parallel-size", "0"], ">= 1")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("medclaw: error:") and "\n" not in err and needle in err, err


def test_serve_refuses_what_vllm_cannot_load_on_this_device(tiny_vlm_spec):
    """The server gets the in-process engine's quantisation rule: bitsandbytes in vLLM needs a GPU,
    so on CPU it is one line, never a server that silently loads full precision."""
    import dataclasses

    from medclaw.errors import ConfigError
    from medclaw.models.serve import ServeOptions, server_command

    spec = dataclasses.replace(tiny_vlm_spec, quantization="bnb-4bit")
    with pytest.raises(ConfigError, match="needs a CUDA GPU") as info:
        server_command(spec, ServeOptions(on_cpu=True))
    assert "\n" not in str(info.value)
    command = server_command(spec, ServeOptions(on_cpu=False))
    assert command[command.index("--quantization") + 1] == "bitsandbytes"


def test_a_cpu_server_gets_the_in_process_engines_kv_cache(tiny_vlm_spec):
    """The server's KV cache on CPU is the in-process engine's fixed size (a RAM fraction failed
    on hosts with small NUMA nodes); on a GPU vLLM sizes it from gpu_memory_utilization."""
    import dataclasses

    from medclaw.engine.backends.vllm_local import cpu_kv_cache_bytes, engine_kwargs
    from medclaw.models.serve import ServeOptions, server_command

    spec = dataclasses.replace(tiny_vlm_spec, extra={})        # no size of the profile's
    command = server_command(spec, ServeOptions(on_cpu=True))
    size = int(command[command.index("--kv-cache-memory-bytes") + 1])
    assert size == engine_kwargs(spec, on_cpu=True)["kv_cache_memory_bytes"] == cpu_kv_cache_bytes(spec)
    assert 0 < size < 2**30                                    # tiny model: a few MB
    assert "--kv-cache-memory-bytes" not in server_command(spec, ServeOptions(on_cpu=False))


def test_a_false_engine_argument_is_passed_as_no_flag(tiny_vlm_spec):
    """extra `enable_prefix_caching: false` must reach the server (its default is on)."""
    import dataclasses

    from medclaw.models.serve import ServeOptions, server_command

    spec = dataclasses.replace(tiny_vlm_spec, extra={"enable_prefix_caching": False})
    command = server_command(spec, ServeOptions(on_cpu=True))
    assert "--no-enable-prefix-caching" in command and "--enable-prefix-caching" not in command


# ------------------------------------------------------------------------------ the real server

@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory, wait_until_healthy):
    """`medclaw models serve qwen2.5-vl-7b` on 127.0.0.1 (the tiny VLM imported under that name);
    yields (base URL, the config file it printed, the server's model store)."""
    root = tmp_path_factory.mktemp("serve")
    models_dir = root / "models"
    env = dict(os.environ)
    env["MEDCLAW_MODELS_DIR"] = str(models_dir)
    # vLLM's own log level, as in a user's shell: an in-process engine of an earlier test set
    # WARNING in this process, which would hide the INFO lines a test reads
    env.pop("VLLM_LOGGING_LEVEL", None)
    medclaw = [sys.executable, "-c", "import sys; from medclaw.cli import main; sys.exit(main())"]
    subprocess.run(medclaw + ["models", "import", PRESET, str(tiny_models.vlm)], env=env,
                   check=True, capture_output=True, timeout=300)
    port = _free_port()
    out_path, log_path = root / "stdout.txt", root / "server.log"
    with open(out_path, "wb") as out, open(log_path, "wb") as log:
        server = subprocess.Popen(medclaw + ["models", "serve", PRESET, "--port", str(port)],
                                  stdout=out, stderr=log, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    segments: set[str] = set()
    try:
        wait_until_healthy(url, server, log_path, START_TIMEOUT_S)
        segments = shared_memory_of(server.pid)
        config = root / "medclaw.yaml"
        config.write_text(out_path.read_text())          # the lines `serve` printed, verbatim
        with pytest.MonkeyPatch.context() as patch:      # this module's store, for load_models
            patch.setenv("MEDCLAW_MODELS_DIR", str(models_dir))
            yield f"{url}/v1", config, log_path, server
    finally:
        if server.poll() is None:                        # the last test kills it on purpose
            os.killpg(server.pid, signal.SIGTERM)        # the server's own process group
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        # a server killed with its process group (the last test's SIGKILL) takes its resource
        # tracker with it: vLLM's message queues (~400 MB each run) would stay in /dev/shm
        release_shared_memory(segments)


@pytest.fixture(scope="module")
def remote(served):
    """The remote backend exactly as the printed config resolves it."""
    from medclaw.engine.backends.remote import RemoteBackend
    from medclaw.models.registry import load_models

    spec = load_models(served[1])["video_expert"]
    assert spec.backend == "remote" and spec.endpoints == [served[0]]
    return RemoteBackend(spec)


def metric(base_url: str, name: str) -> float:
    """Sum of a Prometheus counter over its label sets, from the server's /metrics."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def planned(backend, request) -> int:
    plan = PromptPlan(backend._tokenizer, backend.model_name)
    return plan.planned_tokens(render_prompt(backend._tokenizer, request), request.media)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("num_frames", [64, 128])
async def test_long_clips_reach_the_model_whole(remote, num_frames):
    clip = _clip(num_frames, num_frames)
    request = Conversation("You watch videos.").add_user("What happens?", media=[clip]) \
        .to_request(max_tokens=2)
    result = await remote.generate_one(request)
    assert media_tokens(clip) == num_frames // 2 * 2 * 2               # 56×56: 4 tokens per pair
    assert result.num_prompt_tokens == planned(remote, request)        # every frame was seen


@pytest.mark.engine
@pytest.mark.slow
async def test_a_server_that_keeps_32_frames_is_a_fidelity_error(remote, monkeypatch, capsys):
    """What a server with vLLM's default media settings does to a 128-frame clip, reproduced by
    asking this server for its default per request: the check names both numbers."""
    original = type(remote).payload

    def default_frames(self, request, known=frozenset()):
        body = original(self, request, known)
        body["media_io_kwargs"]["video"]["num_frames"] = 32
        return body

    monkeypatch.setattr(type(remote), "payload", default_frames)
    clip = _clip(1280, 128)
    request = Conversation("You watch videos.").add_user("What happens?", media=[clip]) \
        .to_request(max_tokens=2)
    want = planned(remote, request)
    with pytest.raises(FidelityError) as info:
        await remote.generate_one(request)
    assert f"saw {want - 256 + 64} prompt tokens where MedClaw planned {want}" in str(info.value)
    assert "fidelity error" in capsys.readouterr().err


@pytest.mark.engine
@pytest.mark.slow
async def test_stage2_reuses_the_kv_without_reuploading(remote, served):
    low, high = _clip(7, 64), _clip(8, 16, side=112)
    conversation = Conversation("You watch videos.").add_user("Where is the clip applied?",
                                                              media=[low])
    hits_before = metric(served[0], "vllm:prefix_cache_hits_total")
    first = await remote.generate_one(conversation.to_request(max_tokens=4))
    uploaded_stage1 = remote.media_bytes_sent
    conversation.add_assistant(first.text).add_user("That window, closer.", media=[high])
    second = await remote.generate_one(conversation.to_request(max_tokens=4))
    # stage 2 starts with stage 1's prompt: all of it but the last partial KV block is cached
    assert second.num_cached_tokens >= first.num_prompt_tokens - 32, (first, second)
    # … and the stage-1 frames went as their uuid only: stage 2 uploaded only the window
    window_bytes = len(remote.payload(Conversation("S").add_user("q", media=[high]).to_request())
                       ["messages"][1]["content"][0]["video_url"]["url"])
    assert remote.media_bytes_sent - uploaded_stage1 == window_bytes
    # the per-request figures are the server's own counters
    hits = metric(served[0], "vllm:prefix_cache_hits_total") - hits_before
    assert hits == first.num_cached_tokens + second.num_cached_tokens


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(not vllm_is_cpu_build(), reason="CPU workers are bound to cores")
def test_the_running_server_s_worker_is_found_with_its_cores(served):
    """What a second `medclaw models serve` reads to keep off this server's cores: its model
    worker (found by vLLM's process title) and the cores it is bound to."""
    import psutil

    from medclaw.engine.backends.cpu_binding import cores_of_running_workers

    server = psutil.Process(served[3].pid)
    workers = {p.pid: sorted(p.cpu_affinity()) for p in server.children(recursive=True)
               if "Worker" in " ".join(p.cmdline())}
    assert workers, [" ".join(p.cmdline()) for p in server.children(recursive=True)]
    found = cores_of_running_workers()
    assert {pid: found.get(pid) for pid in workers} == workers


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(not vllm_is_cpu_build(), reason="the CPU build's fixed KV cache")
def test_the_cpu_server_runs_with_the_fixed_kv_cache(served):
    """What the CPU worker logged it reserved is the model's fixed size, not a RAM fraction."""
    from medclaw.engine.backends.vllm_local import cpu_kv_cache_bytes
    from medclaw.models.serve import resolve_served_model

    size = cpu_kv_cache_bytes(resolve_served_model(PRESET))
    log = served[2].read_text(errors="replace")
    assert f"Explicitly set ({round(size / 2**30, 2)}/" in log, log[-2000:]
    assert "Auto set" not in log


@pytest.mark.engine
@pytest.mark.slow
def test_episode_trace_cached_tokens_equal_server_metrics(served, synth_video, tmp_path, capsys):
    """A whole `medclaw ask` with every generation role on the server: the trace's cached tokens
    are exactly what the server counted."""
    base_url, printed, log, _ = served
    entry = yaml.safe_load(printed.read_text())["models"]["video_expert"]
    config = tmp_path / "all-remote.yaml"
    config.write_text(yaml.safe_dump({"models": {role: entry for role in (
        "orchestrator", "video_expert", "frame_verifier", "judge")}}))
    hits_before = metric(base_url, "vllm:prefix_cache_hits_total")
    queries_before = metric(base_url, "vllm:prefix_cache_queries_total")
    try:
        code = main(["ask", str(synth_video.path), "When is the clip applied?", "--config",
                     str(config), "--max-steps", "3", "--trace-dir", str(tmp_path / "traces"),
                     "--json"])
    except RuntimeError:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and not result["status"].startswith("failed"), \
        [line for line in log.read_text().splitlines() if "Error:" in line][-5:]
    from medclaw.engine.trace import Trace

    trace = Trace.load(result["trace"])
    calls = [call for step in trace.steps
             for call in ([step.orchestrator_call] if step.orchestrator_call else []) + step.model_calls]
    cached = sum(call.num_cached_tokens for call in calls)
    assert len(calls) >= 3 and cached > 0
    assert metric(base_url, "vllm:prefix_cache_hits_total") - hits_before == cached
    assert metric(base_url, "vllm:prefix_cache_queries_total") - queries_before == \
        sum(call.num_prompt_tokens for call in calls)


# ------------------------------------------------------------------ last: it kills the server

@pytest.mark.engine
@pytest.mark.slow
def test_a_server_killed_mid_episode_is_exit_3_with_the_trace(served, monkeypatch, tmp_path,
                                                             synth_video, capsys):
    """The review's case: the orchestrator's vLLM server is SIGKILLed after the first step. It used
    to come out as ConfigError (exit 2, "bad input") with no trace path and nothing on stdout.
    (This module's server, so it must stay the module's last test.)"""
    import medclaw.engine.runtime as runtime_module
    from medclaw.engine.backends.fake import ScriptedBackend
    from medclaw.engine.backends.remote import RemoteBackend
    from medclaw.engine.runtime import Runtime
    from medclaw.engine.trace import Trace
    from medclaw.models.registry import load_models
    from medclaw.models.spec import ModelSpec
    from medclaw.skills.library import SkillLibrary

    _, printed, _, server = served
    spec = load_models(printed)["video_expert"]          # the served model, as the orchestrator
    remote = RemoteBackend(spec)

    class KillsItsServer:
        """The real remote backend; after its first answer the server process group is killed."""

        supports_json_schema, supports_media = remote.supports_json_schema, remote.supports_media

        async def generate(self, requests):
            results = await remote.generate(requests)
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=60)
            return results

        async def generate_one(self, request):
            return (await self.generate([request]))[0]

        async def close(self):
            await remote.close()

    vlm = ScriptedBackend(lambda request: "[00:00-00:01] a grasper enters the view")
    specs = {"orchestrator": spec,
             **{role: ModelSpec(name="scripted", path=str(tmp_path), backend="fake")
                for role in ("video_expert", "frame_verifier")}}
    runtime = Runtime(specs, skills=SkillLibrary(),
                      backends={"orchestrator": KillsItsServer(), "video_expert": vlm,
                                "frame_verifier": vlm})
    monkeypatch.setattr(runtime_module, "open_runtime", lambda **kwargs: runtime)
    # greedy: vLLM 0.32's CPU server dies on a seeded request whose prefill is chunked
    config = tmp_path / "medclaw.yaml"
    config.write_text("episode:\n  orchestrator_temperature: 0.0\n")
    rc = main(["ask", str(synth_video.path), "Which instrument was brought in just before the "
               "vessel was cut?", "--json", "--max-steps", "4", "--config", str(config),
               "--trace-dir", str(tmp_path / "traces")])
    captured = capsys.readouterr()
    assert rc == 3, captured.err
    [line] = captured.out.splitlines()
    out = json.loads(line)
    assert out["status"].startswith("failed:") and "cannot reach" in out["error"]
    assert out["steps"] == 1 and out["answer"] is None
    assert f"medclaw: error: model '{spec.name}': cannot reach" in captured.err
    assert f"medclaw: trace: {out['trace']}" in captured.err
    trace = Trace.load(out["trace"])
    assert len(trace.steps) == 1 and trace.steps[0]["orchestrator_call"]["model_name"] == spec.name
    assert trace.footer["status"].startswith("failed: EngineLostError")
