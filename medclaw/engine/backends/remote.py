"""Remote backend: vLLM OpenAI-compatible server(s) on the hospital network (or on this machine).

Contract:
- `RemoteBackend(spec)` talks to every base URL in `spec.endpoints` (e.g.
  `http://10.0.0.5:8000/v1`); each request goes to the endpoint with the fewest requests in
  flight (ties rotate), so several servers (one per node, or data-parallel replicas) share load.
  `generate` is awaitable from any event loop; it sends a batch's requests concurrently.
- Media go inline, never as file paths: a video part becomes a `video_url` data URL
  `data:video/jpeg;base64,<frame1>,<frame2>,…` (comma-joined JPEG frames, vLLM's jpeg-sequence
  loader); an image part an `image_url` JPEG data URL. Every media part carries `uuid` =
  `MediaItem.uuid`, so the server's prefix cache recognises the clip by identity (docs/architecture.md
  rule 2). The frames' sampling fps (which sets Qwen2.5-VL's temporal spacing) is the server's
  `--media-io-kwargs '{"video": {"fps": 2.0}}'`, or, with `extra: {per_request_video_fps: true}`
  and a server started with `--trust-request-mm-kwargs`, the request's first video's fps
  (vLLM's media IO kwargs are per request, not per item).
- `GenRequest.json_schema` goes as `response_format: json_schema` (constrained by the server's
  structured-output backend; start it with `disable_any_whitespace`, below).
- Cached tokens come from `usage.prompt_tokens_details.cached_tokens` (server flag
  `--enable-prompt-tokens-details`; 0 without it). Output is split per `spec.output_format`.
- The HTTP client ignores proxy environment variables (`trust_env=False`): requests go to the
  configured endpoints and nowhere else. `spec.extra`: `served_model_name` (default `spec.name`),
  `timeout_s` (default 600), `jpeg_quality` (default 90), `per_request_video_fps` (default false).

Serving commands (offline: `export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1`).
Common flags, called $COMMON below:

    --enable-prefix-caching --enable-prompt-tokens-details \
    --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}' \
    --limit-mm-per-prompt '{"video": 2, "image": 8}' --max-model-len 32768

- Qwen2.5-VL-7B, one GPU:
    vllm serve /models/qwen2.5-vl-7b --served-model-name qwen2.5-vl-7b \
        --host 0.0.0.0 --port 8000 --gpu-memory-utilization 0.90 $COMMON
- Qwen2.5-VL-7B, 4 data-parallel replicas on one 4-GPU node (one endpoint, vLLM balances):
    vllm serve /models/qwen2.5-vl-7b --served-model-name qwen2.5-vl-7b --port 8000 \
        --data-parallel-size 4 $COMMON
- Qwen2.5-VL-72B, tensor parallel over 4 GPUs (or 8: `--tensor-parallel-size 8`):
    vllm serve /models/qwen2.5-vl-72b --served-model-name qwen2.5-vl-72b --port 8000 \
        --tensor-parallel-size 4 $COMMON
- Qwen2.5-VL-72B, 8 GPUs as 2 replicas x TP 4:
    vllm serve /models/qwen2.5-vl-72b --tensor-parallel-size 4 --data-parallel-size 2 $COMMON
- Multi-node with Ray (2 nodes x 8 GPUs: TP inside a node, pipeline stages across nodes):
    node 1:  ray start --head --port 6379
    node 2:  ray start --address <node1-ip>:6379
    node 1:  vllm serve /models/qwen2.5-vl-72b --distributed-executor-backend ray \
                 --tensor-parallel-size 8 --pipeline-parallel-size 2 $COMMON
  Often faster for many concurrent episodes: one independent server per node and all of them in
  `endpoints:` (this backend spreads the requests); no Ray needed.
The model folders must be on every node (`medclaw models import` + `verify`); nothing is fetched.
"""
from __future__ import annotations

import asyncio
import base64
import io
import itertools
import threading
import time
from pathlib import Path

from medclaw.engine.backends.base import Backend, RequestRejectedError, media_in_order
from medclaw.requests.output_format import split_output
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec
from medclaw.types import GenRequest, GenResult, MediaItem

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_JPEG_QUALITY = 90


def _jpeg_b64(frame, quality: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)   # frame: (H, W, 3) uint8
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def media_part(item: MediaItem, quality: int = DEFAULT_JPEG_QUALITY) -> dict:
    """The OpenAI-style content part vLLM accepts for `item`, with its uuid."""
    if item.kind == "video":
        frames = ",".join(_jpeg_b64(frame, quality) for frame in item.frames)  # frames: (T, H, W, 3)
        return {"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{frames}"},
                "uuid": item.uuid}
    return {"type": "image_url",
            "image_url": {"url": f"data:image/jpeg;base64,{_jpeg_b64(item.frames, quality)}"},
            "uuid": item.uuid}


class RemoteBackend(Backend):
    supports_json_schema = True
    supports_media = True

    def __init__(self, spec: ModelSpec):
        if not spec.endpoints:
            raise ConfigError(f"model {spec.name!r}: backend 'remote' needs endpoints "
                              "(base URLs like http://10.0.0.5:8000/v1)")
        bad = [url for url in spec.endpoints if not url.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"model {spec.name!r}: endpoints must be http(s) URLs, got {bad[0]!r}")
        self.spec = spec
        self.endpoints = [url.rstrip("/") for url in spec.endpoints]
        self.model_name = spec.name
        self.served_model_name = str(spec.extra.get("served_model_name", spec.name))
        self.timeout_s = float(spec.extra.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.jpeg_quality = int(spec.extra.get("jpeg_quality", DEFAULT_JPEG_QUALITY))
        self.per_request_video_fps = bool(spec.extra.get("per_request_video_fps", False))
        self.chat_template_kwargs = dict(spec.chat_template_kwargs)
        self.model_revision = _revision(spec.path)
        self._in_flight = [0] * len(self.endpoints)
        self._turn = itertools.count()
        self._lock = threading.Lock()          # callers may come from several event loops
        self._closed = False

    # --------------------------------------------------------------------------- load spreading

    def _acquire(self) -> int:
        with self._lock:
            fewest = min(self._in_flight)
            candidates = [i for i, n in enumerate(self._in_flight) if n == fewest]
            index = candidates[next(self._turn) % len(candidates)]
            self._in_flight[index] += 1
            return index

    def _release(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    # --------------------------------------------------------------------------- request body

    def payload(self, request: GenRequest) -> dict:
        """The /chat/completions JSON body for `request`."""
        media = iter(media_in_order(request))
        messages, video_fps = [], None
        for message in request.messages:
            content = message.get("content", "")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.get("type") in ("video", "image"):
                        item = next(media)
                        if item.kind == "video" and video_fps is None and item.fps > 0:
                            video_fps = float(item.fps)
                        parts.append(media_part(item, self.jpeg_quality))
                    else:
                        parts.append({"type": "text", "text": part.get("text", "")})
                if all(p["type"] == "text" for p in parts):
                    parts = "".join(p["text"] for p in parts)
                content = parts
            messages.append({"role": message["role"], "content": content})
        body: dict = {"model": self.served_model_name, "messages": messages,
                      "max_tokens": request.max_tokens, "temperature": request.temperature}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": request.json_schema, "strict": True}}
        if self.chat_template_kwargs:     # vLLM's server passes these to the chat template
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if video_fps is not None and self.per_request_video_fps:
            body["media_io_kwargs"] = {"video": {"fps": video_fps}}
        return body

    # --------------------------------------------------------------------------- generation

    async def _post(self, client, request: GenRequest) -> GenResult:
        import httpx

        body = self.payload(request)
        index = self._acquire()
        url = f"{self.endpoints[index]}/chat/completions"
        started = time.perf_counter()
        try:
            response = await client.post(url, json=body)
        except httpx.TimeoutException as err:
            raise ConfigError(f"model {self.model_name!r}: {url} did not answer within "
                              f"{self.timeout_s:g} s ({type(err).__name__}); raise "
                              "extra.timeout_s or check the server's load") from err
        except httpx.TransportError as err:
            raise ConfigError(f"model {self.model_name!r}: cannot reach {url}: "
                              f"{type(err).__name__}") from err
        finally:
            self._release(index)
        latency = time.perf_counter() - started
        if response.status_code == 400:     # vLLM's answer to a request it validates away
            raise RequestRejectedError(f"model {self.model_name!r} rejected the request: "
                                       f"{_error_message(response)}")
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")
        data = response.json()
        choice = data["choices"][0]
        message = choice.get("message") or {}
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        split = split_output(message.get("content") or "", self.spec.output_format)
        # a server-side reasoning parser moves <think> content out of `content`
        reasoning = message.get("reasoning_content") or message.get("reasoning") or split.reasoning
        return GenResult(
            text=split.answer, reasoning=reasoning or "",
            model_name=self.model_name, model_revision=self.model_revision,
            num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
            num_completion_tokens=int(usage.get("completion_tokens") or 0),
            num_cached_tokens=int(details.get("cached_tokens") or 0),
            latency_s=latency, finish_reason=str(choice.get("finish_reason") or ""))

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        import httpx

        if self._closed:
            raise RuntimeError(f"remote backend {self.model_name!r} is closed")
        # One client per call: an httpx client belongs to the loop it was created on, and callers
        # come from many loops. trust_env=False: no proxy may reroute traffic off the network.
        limits = httpx.Limits(max_connections=max(16, len(requests)))
        async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False, limits=limits) as client:
            return list(await asyncio.gather(*(self._post(client, r) for r in requests)))

    async def close(self) -> None:
        self._closed = True


def _revision(path: str) -> str:
    """revision_hash of the local copy of the weights when there is one (the server's own copy
    must be the same files: `medclaw models verify` on the server)."""
    if path and (Path(path) / "config.json").is_file():
        from medclaw.models.store import revision_hash

        return revision_hash(path)
    return "remote-unverified"


def _error_message(response) -> str:
    """The first line of an OpenAI-style error body (`{"error": {"message": ...}}`), else its text."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    text = str(message or response.text or f"HTTP {response.status_code}").strip()
    return (text.splitlines() or [""])[0][:300]
