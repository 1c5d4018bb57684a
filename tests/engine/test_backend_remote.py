"""The remote backend without a server: request bodies, cache-aware routing, failover,
configuration errors. Against a real `medclaw models serve` server: tests/engine/test_serve.py."""
from __future__ import annotations

import base64
import io
import socket
from collections import Counter

import numpy as np
import pytest

from medclaw.engine.backends.remote import RemoteBackend, affinity_key, rendezvous_order
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec
from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.types import MediaItem


def _spec(endpoints, path="", **extra) -> ModelSpec:
    return ModelSpec(name="tiny-remote", path=str(path), backend="remote", endpoints=list(endpoints),
                     extra=extra)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_configuration_errors(tiny_models):
    assert _spec([]).endpoints == ["http://127.0.0.1:8000/v1"]        # loopback by default
    with pytest.raises(ConfigError, match="http"):
        RemoteBackend(_spec(["10.0.0.1:8000"]))
    # the fidelity check needs the model's tokenizer on this side too
    with pytest.raises(ConfigError, match="tokenizer"):
        RemoteBackend(_spec(["http://127.0.0.1:1/v1"]))
    with pytest.raises(ConfigError, match="routing"):
        RemoteBackend(_spec(["http://127.0.0.1:1/v1"], tiny_models.vlm, routing="random"))


def test_payload_media_as_jpeg_data_urls_with_uuids(tiny_models):
    from PIL import Image

    frames = np.zeros((4, 28, 56, 3), np.uint8)  # (T, H, W, 3)
    video = MediaItem(kind="video", uuid=media_uuid("a" * 64, 0, 3, 4.0, 1568), frames=frames, fps=4.0)
    image = MediaItem(kind="image", uuid="img", frames=np.zeros((28, 28, 3), np.uint8))
    request = (Conversation("SYS").add_user("Q?", media=[video, image])
               .to_request(max_tokens=9, json_schema={"type": "object"}))
    backend = RemoteBackend(_spec(["http://127.0.0.1:1/v1"], tiny_models.vlm,
                                  served_model_name="srv"))
    body = backend.payload(request)
    assert body["model"] == "srv" and body["max_tokens"] == 9
    assert body["messages"][0] == {"role": "system", "content": "SYS"}
    video_part, image_part, text_part = body["messages"][1]["content"]
    assert video_part["uuid"] == video.uuid and image_part["uuid"] == "img"
    assert text_part == {"type": "text", "text": "Q?"}
    head, payload = video_part["video_url"]["url"].split(",", 1)
    assert head == "data:video/jpeg;base64"
    decoded = [Image.open(io.BytesIO(base64.b64decode(p))) for p in payload.split(",")]
    assert [im.size for im in decoded] == [(56, 28)] * 4
    assert image_part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    # every frame kept and dated at its own rate, whatever the server's defaults
    assert body["media_io_kwargs"] == {"video": {"num_frames": -1, "fps": 4.0}}
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    # media the endpoint already holds go as their uuid alone
    again = backend.payload(request, known=frozenset({video.uuid}))
    video_part, image_part, _ = again["messages"][1]["content"]
    assert video_part == {"type": "video_url", "video_url": None, "uuid": video.uuid}
    assert image_part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    text_only = backend.payload(Conversation("SYS").add_user("Q?").to_request())
    assert "media_io_kwargs" not in text_only


def test_affinity_key_is_the_video_or_the_conversation():
    clip = MediaItem(kind="video", uuid=media_uuid("b" * 64, 0, 9, 2.0, 784), frames=None)
    other = MediaItem(kind="video", uuid=media_uuid("b" * 64, 100, 109, 4.0, 3136), frames=None)
    assert affinity_key(Conversation("S").add_user("q1", media=[clip]).to_request()) == \
        affinity_key(Conversation("T").add_user("q2", media=[other]).to_request()) == "video:" + "b" * 64
    episode = Conversation("SYSTEM").add_user("question")
    first = affinity_key(episode.to_request())
    episode.add_assistant("call a tool").add_user("observation")
    assert affinity_key(episode.to_request()) == first          # later turns: same endpoint
    assert affinity_key(Conversation("SYSTEM").add_user("another").to_request()) != first


def test_rendezvous_is_stable_balanced_and_fails_over_minimally():
    endpoints = [f"http://gpu-{i}:8000/v1" for i in range(4)]
    keys = [f"video:{i:064x}" for i in range(2000)]
    firsts = Counter(rendezvous_order(endpoints, key)[0] for key in keys)
    assert set(firsts) == {0, 1, 2, 3} and min(firsts.values()) > 400          # even spread
    # without endpoint 2, only its keys move, each to its own second choice
    survivors = endpoints[:2] + endpoints[3:]
    for key in keys[:300]:
        order = rendezvous_order(endpoints, key)
        now = survivors[rendezvous_order(survivors, key)[0]]
        assert now == endpoints[order[0] if order[0] != 2 else order[1]]


def test_routing_modes(tiny_models):
    endpoints = ["http://a/v1", "http://b/v1", "http://c/v1"]
    affinity = RemoteBackend(_spec(endpoints, tiny_models.llm))
    request = Conversation("S").add_user("q").to_request()
    order = affinity.endpoint_order(request)
    assert order == rendezvous_order(affinity.endpoints, affinity_key(request))
    affinity._mark_down(order[0])                              # failover: next in the ranking
    assert affinity.endpoint_order(request) == order[1:] + order[:1]

    spread = RemoteBackend(_spec(endpoints, tiny_models.llm, routing="least_in_flight"))
    held = []
    for _ in range(3):
        index = spread.endpoint_order(request)[0]
        spread._acquire(index)
        held.append(index)
    assert sorted(held) == [0, 1, 2]                           # one each before any doubles up
    spread._release(1)
    assert spread.endpoint_order(request)[0] == 1              # the idle one wins


async def test_unreachable_endpoints_are_one_lost_engine_error(tiny_models):
    from medclaw.errors import EngineLostError

    dead = [f"http://127.0.0.1:{_free_port()}/v1" for _ in range(2)]
    backend = RemoteBackend(_spec(dead, tiny_models.llm))
    with pytest.raises(EngineLostError, match="cannot reach") as info:      # exit 3, not bad input
        await backend.generate_one(Conversation("SYS").add_user("q").to_request(max_tokens=2))
    assert all(url in str(info.value) for url in dead)           # both were tried
    assert all(until > 0 for until in backend._down_until)
