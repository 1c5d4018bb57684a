"""What a config may pass to an engine (`extra:` allowlist) and where a remote backend may connect
(endpoints from the config file only, loopback by default, no redirect followed)."""
from __future__ import annotations

import asyncio
import http.server
import threading

import pytest

from medclaw.cli import main
from medclaw.errors import ConfigError
from medclaw.models.engine_args import DEFAULT_ENDPOINT, EXTRA_KEYS
from medclaw.models.registry import load_models
from medclaw.models.spec import ModelSpec


@pytest.mark.parametrize("backend, extra, message", [
    ("vllm", {"otlp_traces_endpoint": "http://collector:4317"}, "extra key 'otlp_traces_endpoint'"),
    ("vllm", {"trust_remote_code": True}, "extra key 'trust_remote_code'"),
    ("vllm", {"download_dir": "/tmp/x"}, "extra key 'download_dir'"),
    ("vllm", {"load_format": "runai_streamer"}, "extra.load_format = 'runai_streamer' is not allowed"),
    ("vllm", {"distributed_executor_backend": "ray"}, "use one of mp, uni"),
    ("transformers", {"trust_remote_code": True}, "extra key 'trust_remote_code'"),
    ("transformers", {"revision": "main"}, "extra key 'revision'"),
])
def test_extra_outside_the_allowlist_is_refused(backend, extra, message):
    with pytest.raises(ConfigError) as err:
        ModelSpec(name="m", path="/m", backend=backend, extra=extra)
    text = str(err.value)
    assert message in text and "\n" not in text
    if "extra key" in text:                     # names the allowed keys
        assert "allowed: " + ", ".join(sorted(EXTRA_KEYS[backend])) in text


def test_allowed_extra_passes():
    spec = ModelSpec(name="m", path="/m", extra={"enforce_eager": True, "block_size": 64,
                                                 "load_format": "dummy"})
    assert spec.extra["load_format"] == "dummy"
    # prefix caching may be switched off (a benchmark's baseline), and only with a boolean
    assert ModelSpec(name="m", path="/m", extra={"enable_prefix_caching": False}).extra
    with pytest.raises(ConfigError, match="enable_prefix_caching = 'no' is not allowed"):
        ModelSpec(name="m", path="/m", extra={"enable_prefix_caching": "no"})
    ModelSpec(name="m", path="/m", backend="transformers", extra={"attn_implementation": "sdpa"})


def test_config_file_cannot_switch_on_tracing(medclaw_home, tmp_path, capsys):
    config = tmp_path / "medclaw.yaml"
    config.write_text("models:\n  video_expert: {preset: tiny-vlm, extra: "
                      "{otlp_traces_endpoint: 'http://collector.example.org:4317'}}\n")
    assert main(["models", "resolve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medclaw: error:") and "\n" not in err
    assert "'otlp_traces_endpoint' is not allowed" in err and "enforce_eager" in err


def test_remote_endpoints_come_from_the_config_and_default_to_loopback(medclaw_home, tmp_path):
    config = tmp_path / "medclaw.yaml"
    config.write_text("models:\n"
                      "  video_expert: {preset: tiny-vlm, backend: remote, "
                      "endpoints: ['http://10.0.0.5:8000/v1', 'https://gpu-2.hospital.lan/v1']}\n"
                      "  frame_verifier: {preset: tiny-vlm, backend: remote}\n")
    specs = load_models(config)
    assert specs["video_expert"].endpoints == ["http://10.0.0.5:8000/v1", "https://gpu-2.hospital.lan/v1"]
    assert specs["frame_verifier"].endpoints == [DEFAULT_ENDPOINT] == ["http://127.0.0.1:8000/v1"]
    assert specs["orchestrator"].endpoints == []                     # not remote: no endpoints


@pytest.mark.parametrize("url, problem", [
    ("10.0.0.5:8000", "use http:// or https://"),
    ("ftp://10.0.0.5/v1", "use http:// or https://"),
    ("http:///v1", "no host"),
    ("http://user:secret@10.0.0.5/v1", "no credentials"),
    ("http://10.0.0.5/v1?next=http://elsewhere", "no query or fragment"),
    ("http://10.0.0.5:99999/v1", "bad port"),
])
def test_bad_endpoint_urls_are_refused(url, problem):
    with pytest.raises(ConfigError, match=problem):
        ModelSpec(name="m", path="", backend="remote", endpoints=[url])


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list

    def do_POST(self):                   # noqa: N802 (http.server's naming)
        self.hits.append(self.path)
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _server(status: int, location: str = ""):
    handler = type("Handler", (_Recorder,), {"hits": [], "status": status, "location": location})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler.hits


def test_remote_backend_follows_no_redirect(tiny_models, airgap_log):
    """A configured server that answers "go elsewhere" does not make the client go there."""
    from medclaw.engine.backends.remote import RemoteBackend
    from medclaw.requests.conversation import Conversation

    elsewhere, elsewhere_hits = _server(200)
    redirecting, hits = _server(307, f"http://127.0.0.1:{elsewhere.server_address[1]}/v1/chat/completions")
    try:
        spec = ModelSpec(name="tiny-llm", path=str(tiny_models.llm), backend="remote",
                         endpoints=[f"http://127.0.0.1:{redirecting.server_address[1]}/v1"])
        backend = RemoteBackend(spec)
        request = Conversation("SYS").add_user("Q?").to_request(max_tokens=4)
        with pytest.raises(Exception, match="307"):
            asyncio.run(backend.generate([request]))
        assert hits == ["/v1/chat/completions"] and elsewhere_hits == []
    finally:
        redirecting.shutdown()
        elsewhere.shutdown()
    assert airgap_log.violations() == []
