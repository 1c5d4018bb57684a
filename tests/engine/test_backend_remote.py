"""The remote backend: request bodies and load spreading (no server), then for real against a
vLLM OpenAI-compatible server started on 127.0.0.1 with the tiny text model."""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from medclaw.engine.backends.remote import RemoteBackend
from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec
from medclaw.types import MediaItem


def _spec(endpoints, **extra) -> ModelSpec:
    return ModelSpec(name="tiny-remote", path="", endpoints=list(endpoints), extra=extra)


def test_needs_http_endpoints():
    with pytest.raises(ConfigError):
        RemoteBackend(_spec([]))
    with pytest.raises(ConfigError):
        RemoteBackend(_spec(["10.0.0.1:8000"]))


def test_payload_media_as_jpeg_data_urls_with_uuids():
    from PIL import Image

    frames = np.zeros((3, 28, 56, 3), np.uint8)  # (T, H, W, 3)
    video = MediaItem(kind="video", uuid=media_uuid("a" * 64, 0, 2, 4.0, 1568), frames=frames, fps=4.0)
    image = MediaItem(kind="image", uuid="img", frames=np.zeros((28, 28, 3), np.uint8))
    request = (Conversation("SYS").add_user("Q?", media=[video, image])
               .to_request(max_tokens=9, json_schema={"type": "object"}))
    plain = RemoteBackend(_spec(["http://127.0.0.1:1/v1"], served_model_name="srv"))
    assert "media_io_kwargs" not in plain.payload(request)      # needs --trust-request-mm-kwargs
    body = RemoteBackend(_spec(["http://127.0.0.1:1/v1"], served_model_name="srv",
                               per_request_video_fps=True)).payload(request)
    assert body["model"] == "srv" and body["max_tokens"] == 9
    assert body["messages"][0] == {"role": "system", "content": "SYS"}
    video_part, image_part, text_part = body["messages"][1]["content"]
    assert video_part["uuid"] == video.uuid and image_part["uuid"] == "img"
    assert text_part == {"type": "text", "text": "Q?"}
    head, payload = video_part["video_url"]["url"].split(",", 1)
    assert head == "data:video/jpeg;base64"
    decoded = [Image.open(io.BytesIO(base64.b64decode(p))) for p in payload.split(",")]
    assert [im.size for im in decoded] == [(56, 28)] * 3
    assert image_part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert body["media_io_kwargs"] == {"video": {"fps": 4.0}}
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_least_in_flight_spreads_and_rotates():
    backend = RemoteBackend(_spec(["http://a/v1", "http://b/v1", "http://c/v1"]))
    held = [backend._acquire() for _ in range(3)]
    assert sorted(held) == [0, 1, 2]                  # one each before any doubles up
    backend._release(1)
    assert backend._acquire() == 1                    # the idle one wins
    for index in held:
        backend._release(index)


async def test_unreachable_endpoint_is_a_config_error():
    port = _free_port()
    backend = RemoteBackend(_spec([f"http://127.0.0.1:{port}/v1"]))
    with pytest.raises(ConfigError, match="cannot reach"):
        await backend.generate_one(Conversation("SYS").add_user("q").to_request(max_tokens=2))


# ------------------------------------------------------------------------- real vLLM server

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tiny_models, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 with the tiny LLM."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_models.llm), "--served-model-name", "tiny-llm",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.15", "--block-size", "32",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(server.pid, signal.SIGTERM)             # the server's own process group
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.engine
@pytest.mark.slow
async def test_against_real_vllm_server(vllm_server, tool_specs):
    from medclaw.engine.toolcall import Action, action_schema, parse_action

    backend = RemoteBackend(_spec([vllm_server], served_model_name="tiny-llm"))
    system = "You are the orchestrator. " + json.dumps(tool_specs)      # a long, stable prefix
    first, second = await backend.generate([
        Conversation(system).add_user("first question").to_request(max_tokens=4),
        Conversation(system).add_user("second question").to_request(max_tokens=4)])
    assert first.num_prompt_tokens > 256 and first.num_completion_tokens == 4
    assert first.finish_reason == "length" and first.model_revision == "remote-unverified"
    again = await backend.generate_one(
        Conversation(system).add_user("third question").to_request(max_tokens=4))
    assert again.num_cached_tokens >= again.num_prompt_tokens - 64      # prefix served from cache

    constrained = await backend.generate_one(Conversation(system).add_user("act").to_request(
        max_tokens=1536, json_schema=action_schema(tool_specs), temperature=1.0))
    assert isinstance(parse_action(constrained.text, tool_specs), Action), constrained.text[-300:]

    # a prompt past the server's context window (4096 here) is a one-line rejection, not a crash
    from medclaw.engine.backends.base import RequestRejectedError

    with pytest.raises(RequestRejectedError) as info:
        await backend.generate_one(
            Conversation(system).add_user("gallbladder " * 5000).to_request(max_tokens=4))
    assert backend.model_name in str(info.value) and "context length" in str(info.value)
    assert "\n" not in str(info.value)
