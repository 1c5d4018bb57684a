"""The service on scripted models (agent logic only; docs/architecture.md "Testing").

Everything but the models is real: probing, frame planning and decoding, the tools, the episode
loop, the typed trace, SQLite, FastAPI — and, for the live tests, uvicorn on a loopback port.
The scripted orchestrator looks at the whole video, zooms on a region of one frame, then answers
with two evidence times, so a finished job has windows, frames, a zoomed region and an answer.
`hold_at=N` makes the orchestrator wait before its N+1-th reply until `release` is set, so a
test can watch a job that is running.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from medclaw.engine.backends.fake import ScriptedBackend
from medclaw.requests.conversation import message_text as _text

ZOOM = {"time_s": 20.0, "x1": 0.25, "y1": 0.3, "x2": 0.75, "y2": 0.9}
EVIDENCE = [20.0, 41.0]
QUESTION = "Which instrument is used before the vessel is cut?"


def orchestrator_reply(request) -> str:
    done = sum(1 for m in request.messages if m["role"] == "assistant")
    if done == 0:
        return json.dumps({"thought": "overview", "tool": "view_full_video",
                           "args": {"query": "when is the vessel cut"}})
    if done == 1:
        return json.dumps({"thought": "zoom", "tool": "crop_video_frame",
                           "args": {**ZOOM, "query": "which instrument is this"}})
    return json.dumps({"thought": "answer", "tool": "final_answer",
                       "args": {"text": "scissors", "evidence_times": EVIDENCE}})


def vlm_reply(request) -> str:
    prompt = _text(request.messages[-1])
    if "dense timeline" in prompt:                       # view_full_video stage 1
        return "[00:00.0-00:30.0] dissection phase\n[00:30.0-01:00.0] clipping phase\nWINDOW: [00:38.0-00:44.0]"
    if "re-watches" in prompt:                           # stage 2
        return "WINDOW: [00:40.0-00:42.0]\nScissors cut the vessel."
    return "A pair of scissors near the vessel."


class HeldScripted(ScriptedBackend):
    """A scripted backend that waits, before its reply number `hold_at + 1`, for `release`."""

    def __init__(self, script, *, hold_at: int | None = None, **kw):
        super().__init__(script, **kw)
        self.hold_at = hold_at
        self.release = threading.Event()          # set from the test's thread

    async def generate(self, requests):
        if self.hold_at is not None and len(self.requests) >= self.hold_at:
            while not self.release.is_set():
                await asyncio.sleep(0.02)
        return await super().generate(requests)


def fake_specs(tmp_path: Path) -> dict:
    from medclaw.models.spec import ModelSpec

    vlm = dict(backend="fake", fps=1.0, max_frames=32, min_pixels=4 * 28 * 28,
               max_pixels=64 * 28 * 28, total_pixels=1024 * 28 * 28, max_model_len=32768)
    return {"orchestrator": ModelSpec(name="scripted-llm", path=str(tmp_path / "llm"), backend="fake"),
            "video_expert": ModelSpec(name="scripted-vlm", path=str(tmp_path / "vlm"), **vlm),
            "frame_verifier": ModelSpec(name="scripted-vlm", path=str(tmp_path / "vlm"), **vlm)}


@dataclass
class Service:
    app: object
    manager: object
    settings: object
    token: str
    orchestrator: HeldScripted
    data_dir: Path
    roots: list[Path]

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def video_root(tmp_path, synth_video) -> Path:
    """An allowed root holding a copy of the session's synthetic video as `case.mp4`."""
    root = tmp_path / "videos"
    root.mkdir()
    shutil.copy(synth_video.path, root / "case.mp4")
    return root


@pytest.fixture
def make_service(tmp_path, video_root):
    """`make_service(hold_at=None, **settings)` → a `Service` (app not started yet)."""
    from medclaw.engine.config import EpisodeConfig
    from medclaw.engine.runtime import Runtime
    from medclaw.server.app import create_app
    from medclaw.server.jobs import JobManager
    from medclaw.server.security import load_or_create_token
    from medclaw.server.settings import ServerSettings
    from medclaw.server.store import JobStore
    from medclaw.skills.library import SkillLibrary

    def make(hold_at: int | None = None, data_dir: Path | None = None, **overrides) -> Service:
        data = data_dir or tmp_path / "data"
        settings = ServerSettings(**{"allowed_roots": [str(video_root)], "data_dir": str(data),
                                     "concurrency": 2, **overrides})
        orchestrator = HeldScripted(orchestrator_reply, hold_at=hold_at, model_name="scripted-llm")
        vlm = ScriptedBackend(vlm_reply, model_name="scripted-vlm")
        runtime = Runtime(fake_specs(tmp_path), skills=SkillLibrary(),
                          backends={"orchestrator": orchestrator, "video_expert": vlm,
                                    "frame_verifier": vlm})
        manager = JobManager(JobStore(data / "jobs.sqlite"), {"tiny-cpu": runtime},
                             {"tiny-cpu": EpisodeConfig(max_steps=6)}, data_dir=data,
                             concurrency=settings.concurrency, log=lambda message: None)
        token = load_or_create_token(data / "token")
        app = create_app(manager, settings, token)
        return Service(app, manager, settings, token, orchestrator, data, [video_root])

    return make


@pytest.fixture
def client_for():
    """`client_for(service)` → a started TestClient (lifespan run) on a loopback base URL."""
    from fastapi.testclient import TestClient

    clients = []

    def make(service: Service):
        client = TestClient(service.app, base_url="http://127.0.0.1")
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def live_server():
    """`live_server(service)` → base URL of uvicorn serving `service.app` on a free loopback port,
    in a thread; stopped (lifespan shutdown included) at teardown."""
    import uvicorn

    running = []

    def start(service: Service) -> str:
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(service.app, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        running.append((server, thread, sock, service))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, thread, sock, service in running:
        service.orchestrator.release.set()
        server.should_exit = True
        thread.join(30)
        sock.close()


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05):
    """Poll `predicate()` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def run_scripted_episode(tmp_path: Path, video: Path, orchestrator=orchestrator_reply) -> Path:
    """One episode on the scripted models, without the service; returns its trace file."""
    from medclaw.engine.config import EpisodeConfig
    from medclaw.engine.episode import run_episode
    from medclaw.engine.runtime import Runtime
    from medclaw.skills.library import SkillLibrary

    vlm = ScriptedBackend(vlm_reply, model_name="scripted-vlm")
    runtime = Runtime(fake_specs(tmp_path), skills=SkillLibrary(),
                      backends={"orchestrator": ScriptedBackend(orchestrator, model_name="scripted-llm"),
                                "video_expert": vlm, "frame_verifier": vlm})

    async def run():
        try:
            return await run_episode(QUESTION, str(video), runtime,
                                     EpisodeConfig(max_steps=6, trace_dir=str(tmp_path / "traces")))
        finally:
            await runtime.close()

    # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
    result = {}
    worker = threading.Thread(target=lambda: result.update(value=asyncio.run(run())))
    worker.start()
    worker.join()
    return Path(result["value"].trace_path)
