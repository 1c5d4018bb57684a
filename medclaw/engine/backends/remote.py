"""Remote backend: vLLM OpenAI-compatible server(s) on the hospital network (or on this machine).

Start each server with `medclaw models serve NAME` (it sets every flag below and prints the
config lines for this backend). Contract:
- `RemoteBackend(spec)` talks to every base URL in `spec.endpoints` (e.g.
  `http://10.0.0.5:8000/v1`). `generate` is awaitable from any event loop; a batch's requests go
  concurrently.
- Cache-aware routing (`extra.routing: affinity`, the default): each request has an affinity key
  — the video sha256 of its first media item (every sub-agent call about one video), else a hash of
  its first two messages (the system prompt and the question: every orchestrator turn of one
  episode, since conversations only append). Endpoints are ranked by rendezvous hashing of
  (endpoint, key); the request goes to the first healthy one, so a video's KV and an episode's
  prefix stay on one server while it is up, and keys spread evenly over servers. An endpoint that
  refuses connections is marked down for `DOWN_S` seconds and the request fails over to the next in
  its ranking (the same next server for every request of that key). `routing: least_in_flight`
  sends each request to the endpoint with the fewest requests in flight (no affinity; the
  benchmark's baseline).
- Media go inline, never as file paths: a video part becomes a `video_url` data URL
  `data:video/jpeg;base64,<frame1>,<frame2>,…` (vLLM's JPEG-sequence loader), an image part an
  `image_url` JPEG data URL, each with `uuid` = `MediaItem.uuid` (the prefix-cache identity). A
  media item the chosen endpoint has already taken is sent as its uuid alone (vLLM finds the
  processed item in its multimodal cache), so stage 2 of view_full_video does not upload stage 1's
  frames again; if the server has evicted it ("Cache miss … data is not provided") the request is
  sent once more with the frames.
- Video requests carry `media_io_kwargs: {"video": {"num_frames": -1, "fps": F}}` (server flag
  `--trust-request-mm-kwargs`): vLLM keeps only 32 frames of a frame list by default, dates it at
  1 fps unless told, and drops the server's `num_frames` when a request names only `fps`. vLLM
  takes one fps per request, not per video: a request whose videos were sampled at different rates
  (stage 2 of a long video) is sent at the first video's fps (stage 1's, so its KV is reused) and
  the mismatch is reported once on stderr.
- Fidelity: the prompt is rendered locally with the model's tokenizer and chat template (`path`
  must hold the tokenizer files) and the server's `usage.prompt_tokens` must equal the planned
  count (`base.PromptPlan`), else `FidelityError`.
- `GenRequest.json_schema` goes as `response_format: json_schema`. Cached tokens come from
  `usage.prompt_tokens_details.cached_tokens` (`--enable-prompt-tokens-details`). Output is split
  per `spec.output_format`. The answer comes in one piece (no streaming), so time to first token
  is not seen here (`ttft_s` None); the server's own figure is its `/metrics` TTFT histogram.
- The HTTP client ignores proxy environment variables (`trust_env=False`): requests go to the
  configured endpoints and nowhere else. `spec.extra`: `served_model_name` (default `spec.name`),
  `timeout_s` (600), `jpeg_quality` (90), `routing` (affinity | least_in_flight),
  `per_request_seed` (true; false for a CPU-build server, whose engine dies on a seeded request
  with a chunked prefill — `medclaw models serve` prints it so there).

The model folders must be on every node (`medclaw models import` + `verify`); nothing is fetched.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import itertools
import json
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from medclaw.engine.backends.base import (
    Backend, PromptPlan, RequestRejectedError, check_prompt_tokens, load_chat_tokenizer,
    media_in_order, render_prompt,
)
from medclaw.errors import ConfigError, EngineLostError
from medclaw.models.spec import ModelSpec
from medclaw.requests.output_format import split_output
from medclaw.types import GenRequest, GenResult, MediaItem

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_JPEG_QUALITY = 90
DOWN_S = 30.0                  # an endpoint that refused a connection is skipped this long
KNOWN_MEDIA_PER_ENDPOINT = 4096
ROUTING = ("affinity", "least_in_flight")
CACHE_MISS = "data is not provided"          # vLLM: "Cache miss for video at index 0 but data …"


def _jpeg_b64(frame, quality: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)   # frame: (H, W, 3) uint8
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def media_part(item: MediaItem, quality: int = DEFAULT_JPEG_QUALITY, data: bool = True) -> dict:
    """The OpenAI-style content part vLLM accepts for `item`, with its uuid (`data=False`: the uuid
    alone, for a server that already holds the item)."""
    key = "video_url" if item.kind == "video" else "image_url"
    if not data:
        return {"type": key, key: None, "uuid": item.uuid}
    if item.kind == "video":
        frames = ",".join(_jpeg_b64(frame, quality) for frame in item.frames)  # frames: (T, H, W, 3)
        url = f"data:video/jpeg;base64,{frames}"
    else:
        url = f"data:image/jpeg;base64,{_jpeg_b64(item.frames, quality)}"
    return {"type": key, key: {"url": url}, "uuid": item.uuid}


def affinity_key(request: GenRequest) -> str:
    """What should stay on one server: the video of the first media item, else the conversation."""
    media = media_in_order(request)
    if media:
        return "video:" + media[0].uuid.split(":", 1)[0]      # media uuids start with the sha256
    head = json.dumps(request.messages[:2], sort_keys=True, ensure_ascii=False)
    return "conversation:" + hashlib.sha256(head.encode()).hexdigest()


def rendezvous_order(endpoints: list[str], key: str) -> list[int]:
    """Endpoint indices by rendezvous (highest-random-weight) score for `key`: stable per key,
    uniform over keys, and removing one endpoint moves only the keys it held."""
    def score(index: int) -> bytes:
        return hashlib.sha256(f"{endpoints[index]}\n{key}".encode()).digest()

    return sorted(range(len(endpoints)), key=score, reverse=True)


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
        self.routing = str(spec.extra.get("routing", "affinity"))
        if self.routing not in ROUTING:
            raise ConfigError(f"model {spec.name!r}: extra.routing must be one of {ROUTING}")
        if not spec.path or not (Path(spec.path) / "config.json").is_file():
            raise ConfigError(
                f"model {spec.name!r}: backend 'remote' needs the model's folder here too (path:, "
                "at least config.json and the tokenizer files) to check that the server saw every "
                f"planned token; got {spec.path or 'no path'!r}")
        from medclaw.models.store import revision_hash

        self.spec = spec
        self.endpoints = [url.rstrip("/") for url in spec.endpoints]
        self.model_name = spec.name
        self.served_model_name = str(spec.extra.get("served_model_name", spec.name))
        self.timeout_s = float(spec.extra.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.jpeg_quality = int(spec.extra.get("jpeg_quality", DEFAULT_JPEG_QUALITY))
        self.chat_template_kwargs = dict(spec.chat_template_kwargs)
        self.per_request_seed = bool(spec.extra.get("per_request_seed", True))
        self.model_revision = revision_hash(spec.path)
        self._tokenizer = load_chat_tokenizer(spec.path)
        self._plan = PromptPlan(self._tokenizer, spec.name)
        self._in_flight = [0] * len(self.endpoints)
        self._down_until = [0.0] * len(self.endpoints)
        self._known_media: list[OrderedDict] = [OrderedDict() for _ in self.endpoints]
        self._turn = itertools.count()
        self._lock = threading.Lock()          # callers may come from several event loops
        self._warned_fps = False
        self._closed = False
        #: per endpoint: requests answered; and media bytes uploaded (benchmarks read these)
        self.requests_served = [0] * len(self.endpoints)
        self.media_bytes_sent = 0

    # --------------------------------------------------------------------------- routing

    def endpoint_order(self, request: GenRequest) -> list[int]:
        """Endpoints to try for `request`, best first (healthy ones before those marked down)."""
        now = time.monotonic()
        with self._lock:
            if self.routing == "affinity":
                order = rendezvous_order(self.endpoints, affinity_key(request))
            else:
                turn = next(self._turn)
                order = sorted(range(len(self.endpoints)),
                               key=lambda i: (self._in_flight[i], (i - turn) % len(self.endpoints)))
            down = [i for i in order if self._down_until[i] > now]
        return [i for i in order if i not in down] + down

    def _acquire(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] += 1

    def _release(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def _mark_down(self, index: int) -> None:
        with self._lock:
            self._down_until[index] = time.monotonic() + DOWN_S

    def _known(self, index: int) -> frozenset:
        with self._lock:
            return frozenset(self._known_media[index])

    def _remember(self, index: int, media: list[MediaItem]) -> None:
        with self._lock:
            known = self._known_media[index]
            for item in media:
                known[item.uuid] = None
                known.move_to_end(item.uuid)
            while len(known) > KNOWN_MEDIA_PER_ENDPOINT:
                known.popitem(last=False)
            self._down_until[index] = 0.0

    def _forget(self, index: int, media: list[MediaItem]) -> None:
        with self._lock:
            for item in media:
                self._known_media[index].pop(item.uuid, None)

    # --------------------------------------------------------------------------- request body

    def payload(self, request: GenRequest, known: frozenset = frozenset()) -> dict:
        """The /chat/completions JSON body for `request`; media whose uuid is in `known` go as
        the uuid alone."""
        media = iter(media_in_order(request))
        messages, video_fps = [], []
        for message in request.messages:
            content = message.get("content", "")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.get("type") in ("video", "image"):
                        item = next(media)
                        if item.kind == "video":
                            video_fps.append(float(item.fps) if item.fps > 0 else 0.0)
                        parts.append(media_part(item, self.jpeg_quality, item.uuid not in known))
                    else:
                        parts.append({"type": "text", "text": part.get("text", "")})
                if all(p["type"] == "text" for p in parts):
                    parts = "".join(p["text"] for p in parts)
                content = parts
            messages.append({"role": message["role"], "content": content})
        body: dict = {"model": self.served_model_name, "messages": messages,
                      "max_tokens": request.max_tokens, "temperature": request.temperature}
        if request.seed is not None and self.per_request_seed:
            body["seed"] = request.seed
        if request.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": request.json_schema, "strict": True}}
        if self.chat_template_kwargs:     # vLLM's server passes these to the chat template
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if video_fps:
            body["media_io_kwargs"] = {"video": {"num_frames": -1,
                                                 "fps": self._request_fps(video_fps)}}
        return body

    def _request_fps(self, video_fps: list[float]) -> float:
        fps = video_fps[0] if video_fps[0] > 0 else 2.0
        if any(abs(f - fps) > 1e-6 for f in video_fps[1:] if f > 0) and not self._warned_fps:
            self._warned_fps = True
            print(f"medclaw: model {self.model_name!r}: vLLM's server takes one video fps per "
                  f"request; videos sampled at {sorted(set(video_fps))} fps are all dated at "
                  f"{fps:g} fps (the in-process backend dates each at its own)",
                  file=sys.stderr, flush=True)
        return fps

    # --------------------------------------------------------------------------- generation

    async def _post(self, client, request: GenRequest) -> GenResult:
        import httpx

        media = media_in_order(request)
        planned = self._plan.planned_tokens(
            render_prompt(self._tokenizer, request, self.chat_template_kwargs), media)
        order = self.endpoint_order(request)
        unreachable = []
        for index in order:
            url = f"{self.endpoints[index]}/chat/completions"
            started = time.perf_counter()
            self._acquire(index)
            try:
                response = await self._send(client, url, request, index, media)
            except httpx.TimeoutException as err:
                raise EngineLostError(f"model {self.model_name!r}: {url} did not answer within "
                                      f"{self.timeout_s:g} s ({type(err).__name__}); raise "
                                      "extra.timeout_s or check the server's load") from err
            except httpx.TransportError as err:
                self._mark_down(index)
                unreachable.append(f"{url} ({type(err).__name__})")
                continue
            finally:
                self._release(index)
            result = self._result(response, url, time.perf_counter() - started)
            with self._lock:
                self.requests_served[index] += 1
            check_prompt_tokens(self.model_name, request, planned, result.num_prompt_tokens)
            self._remember(index, media)
            return result
        raise EngineLostError(f"model {self.model_name!r}: cannot reach {', '.join(unreachable)}")

    async def _send(self, client, url: str, request: GenRequest, index: int, media: list):
        """POST the request; media the endpoint holds go as uuids, and once more with the frames
        if the server has evicted them."""
        known = self._known(index)
        # JPEG-encoding the frames takes a while: off the event loop, other episodes go on
        content = await asyncio.to_thread(lambda: self._encode(self.payload(request, known)))
        response = await client.post(url, content=content,
                                     headers={"Content-Type": "application/json"})
        if response.status_code == 400 and known and CACHE_MISS in response.text:
            self._forget(index, media)
            content = await asyncio.to_thread(lambda: self._encode(self.payload(request)))
            response = await client.post(url, content=content,
                                         headers={"Content-Type": "application/json"})
        return response

    def _encode(self, body: dict) -> bytes:
        data = json.dumps(body).encode()
        with self._lock:
            self.media_bytes_sent += sum(len(p[k]["url"]) for m in body["messages"]
                                         if isinstance(m["content"], list) for p in m["content"]
                                         for k in ("video_url", "image_url") if p.get(k))
        return data

    def _result(self, response, url: str, latency: float) -> GenResult:
        if response.status_code == 400:     # vLLM's answer to a request it validates away
            message = _error_message(response)
            if "media_io_kwargs" in message:
                raise ConfigError(f"model {self.model_name!r}: {url} refuses per-request video "
                                  "settings; start it with `medclaw models serve` (it passes "
                                  "--trust-request-mm-kwargs)")
            raise RequestRejectedError(f"model {self.model_name!r} rejected the request: {message}")
        if response.status_code >= 500:     # the server failed (e.g. its engine died)
            raise EngineLostError(f"model {self.model_name!r}: {url} answered "
                                  f"{response.status_code}: {_error_message(response)}")
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
            raise EngineLostError(f"remote backend {self.model_name!r} is closed")
        # One client per call: an httpx client belongs to the loop it was created on, and callers
        # come from many loops. trust_env=False: no proxy may reroute traffic off the network.
        limits = httpx.Limits(max_connections=max(16, len(requests)))
        async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False, limits=limits) as client:
            return list(await asyncio.gather(*(self._post(client, r) for r in requests)))

    async def close(self) -> None:
        self._closed = True


def _error_message(response) -> str:
    """The first line of an OpenAI-style error body (`{"error": {"message": ...}}`), else its text."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    text = str(message or response.text or f"HTTP {response.status_code}").strip()
    return (text.splitlines() or [""])[0][:300]
