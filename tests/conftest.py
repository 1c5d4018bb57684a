"""Shared fixtures: tiny checkpoints, a synthetic procedure video and the real vLLM CPU engines.

Nothing is downloaded: the checkpoints are random-weight models built by the `medclaw models
make-tiny` code, the video by the `medclaw video synth` code. Each test run gets its own
MEDCLAW_HOME, so the `tiny-cpu` profile resolves to the very checkpoints built here and nothing
touches the user's cache. Engines are session-scoped — one per tiny model, shared by every
engine-marked test in every folder — because each takes ~30 s to start on 2 cores. `make test`
runs two pytest-xdist workers, each a session of its own (its own home, its own engines).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Before anything reads them: an isolated home, and engines that size their KV caches as a
# user's do (the tiny profiles' 1 GiB, else `vllm_local.cpu_kv_cache_bytes`): vLLM's CPU override
# in a developer's shell would hide a default that fails (one did: `make demo`, every test passing).
os.environ["MEDCLAW_HOME"] = tempfile.mkdtemp(prefix="medclaw-test-home-")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

# vLLM's CPU build binds each engine's model worker to the first core ("auto"), keeping the next
# for its scheduler: every engine of both xdist workers (and of the servers and CLI runs they
# start) then computes on that one core. Each xdist worker's engines get a core of their own
# instead (`benchmarks/engine_binding.py` measures the difference). One process: vLLM's default.
if (_worker := os.environ.get("PYTEST_XDIST_WORKER", "")).startswith("gw"):
    from medclaw.engine.backends.cpu_binding import own_core_binding

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", own_core_binding(int(_worker[2:])))

# Every test runs behind the air-gap guard (medclaw/airgap.py): this process and every Python
# process it starts (vLLM engine processes, CLI subprocesses) refuse non-loopback connections and
# log them here; `_air_gap_holds` fails the test during which one was logged.
from medclaw import airgap  # noqa: E402

AIRGAP_LOG = Path(os.environ["MEDCLAW_HOME"]) / "airgap.jsonl"
airgap.enable(AIRGAP_LOG)


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


# The modules on the session's engines (`llm_engine`, `vlm_engine`). `make test` runs them all on
# one of its two workers (--dist loadfile with the scheduler below), so that one worker starts
# those engines, not both: two engine starts less. pytest-xdist's own grouping (`xdist_group`,
# --dist loadgroup) does not work under pytest 9, and a scheduler sees test ids only, so the list
# is written here; collection fails while a module on those engines is missing from it.
SESSION_ENGINES = {"llm_engine", "vlm_engine"}
SESSION_ENGINE_MODULES = {
    "tests/bench/test_bench_e2e.py", "tests/cli/test_cli_ask.py",
    "tests/engine/test_backend_vllm.py", "tests/engine/test_quantized.py",
    "tests/engine/test_runtime.py", "tests/eval/test_eval_e2e.py", "tests/models/test_tiny.py",
    "tests/test_airgap.py", "tests/tools/test_tool_engine.py",
}


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    used = {_module_of(item.nodeid) for item in items if SESSION_ENGINES & set(item.fixturenames)}
    stale = {m for m in SESSION_ENGINE_MODULES if not (config.rootpath / m).is_file()}
    if used - SESSION_ENGINE_MODULES or stale:
        raise pytest.UsageError(
            f"tests/conftest.py: SESSION_ENGINE_MODULES is out of date: add "
            f"{sorted(used - SESSION_ENGINE_MODULES) or 'nothing'}, remove {sorted(stale) or 'nothing'}")
    # The session-engine modules first, then the other modules that start engines, each
    # module's tests kept in order: the long units are the ones with engines; handed out last,
    # one worker would run them alone while the other waits.
    starts_engines = {item.module for item in items if "engine" in item.keywords}
    items.sort(key=lambda item: (_module_of(item.nodeid) not in SESSION_ENGINE_MODULES,
                                 item.module not in starts_engines))     # a stable sort
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.hookimpl(tryfirst=True)          # before pytest-xdist's own choice
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (each module one unit of work, so that a module's fixtures start once), with
    the session-engine modules one unit together."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") != "loadfile":
        return None                                  # pytest-xdist's own

    class ModulesOnSessionEnginesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module_of(nodeid)
            return "session-engines" if module in SESSION_ENGINE_MODULES else module

    return ModulesOnSessionEnginesTogether(config, log)


class AirGapLog:
    """The guard's records written since a test began (see `airgap_log`)."""

    def __init__(self, path: Path):
        self.path, self.start = path, (path.stat().st_size if path.exists() else 0)

    def records(self) -> list[dict]:
        return airgap.read_log(self.path)[self._index():]

    def violations(self) -> list[dict]:
        return [r for r in self.records() if r.get("event") != "install"]

    def _index(self) -> int:
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as fh:
            return fh.read(self.start).count(b"\n")


@pytest.fixture
def airgap_log() -> AirGapLog:
    """The air-gap records (install / violation) logged during this test, by any process."""
    return AirGapLog(AIRGAP_LOG)


def pytest_sessionfinish(session, exitstatus):
    """Also fail the run for what was refused outside any test (session fixtures: engine starts)."""
    refused = airgap.violations(AIRGAP_LOG)
    if refused:
        print("\nair gap: non-loopback connection(s) during the test run:\n  "
              + "\n  ".join(airgap.describe(r) for r in refused))
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _air_gap_holds():
    log = AirGapLog(AIRGAP_LOG)
    yield
    refused = log.violations()
    if refused:
        pytest.fail("air gap: non-loopback connection(s) during this test: "
                    + "; ".join(airgap.describe(r) for r in refused), pytrace=False)


@pytest.fixture(scope="session")
def tiny_models():
    """Paths of the tiny VLM and tiny text LLM (`.vlm`, `.llm`), where `tiny-cpu` looks for them."""
    from medclaw.models.registry import TINY_SEED
    from medclaw.models.tiny import build_tiny_models

    return build_tiny_models(Path(os.environ["MEDCLAW_HOME"]) / "tiny", seed=TINY_SEED)


@pytest.fixture(scope="session")
def synth_video(tmp_path_factory):
    """A 1-minute synthetic procedure video (320×180, 25 fps) and its ground truth."""
    from medclaw.synth.video import synthesize

    out = tmp_path_factory.mktemp("videos") / "procedure.mp4"
    return synthesize(out, minutes=1.0, seed=0, width=320, height=180, fps=25)


@pytest.fixture(scope="session")
def tiny_cpu_specs(tiny_models):
    """role → ModelSpec of the `tiny-cpu` profile, exactly as `medclaw ask` resolves it."""
    from medclaw.models.registry import load_models

    return load_models(profile="tiny-cpu")


@pytest.fixture(scope="session")
def tiny_vlm_spec(tiny_cpu_specs):
    return tiny_cpu_specs["video_expert"]


@pytest.fixture(scope="session")
def tiny_llm_spec(tiny_cpu_specs):
    return tiny_cpu_specs["orchestrator"]


@pytest.fixture(scope="session")
def vlm_engine(tiny_vlm_spec):
    """The shared in-process vLLM engine serving the tiny VLM (video expert, frame verifier)."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(tiny_vlm_spec)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def llm_engine(tiny_llm_spec):
    """The shared in-process vLLM engine serving the tiny text LLM (orchestrator, judge)."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    backend = VLLMBackend(tiny_llm_spec)
    yield backend
    backend.shutdown()

@pytest.fixture(scope="session")
def trained_specs(tiny_models):
    """role → ModelSpec of the `tiny-trained` profile (the committed trained miniature)."""
    from medclaw.models.registry import load_models

    return load_models(profile="tiny-trained")


@pytest.fixture
def serve_roles_with(monkeypatch):
    """`serve_roles_with(backends)`: from now on, commands resolve their models, KB and skills for
    real (`open_runtime`), but `backends` (role → backend) serve the roles, so no command starts
    (or closes) an engine of its own. Returns the list of the runtimes opened, in order."""
    import medclaw.engine.runtime as runtime_module

    real_open = runtime_module.open_runtime

    def patch(backends: dict) -> list:
        opened = []

        def open_runtime(**kwargs):
            resolved = real_open(**kwargs)
            opened.append(runtime_module.Runtime(
                resolved.specs, backends=dict(backends), knowledge_base=resolved.knowledge_base,
                skills=resolved.skills))
            return opened[-1]

        monkeypatch.setattr(runtime_module, "open_runtime", open_runtime)
        return opened

    return patch


@pytest.fixture
def on_session_engines(serve_roles_with, llm_engine, vlm_engine) -> list:
    """Commands run on the session's tiny engines (see `serve_roles_with`)."""
    return serve_roles_with({"orchestrator": llm_engine, "judge": llm_engine,
                             "video_expert": vlm_engine, "frame_verifier": vlm_engine})


@pytest.fixture(scope="session")
def random_clip():
    """`random_clip(seed, T=16, H=224, W=224)` → uint8 (T, H, W, 3) frames; sizes are multiples
    of 28, so the Qwen processor does not resize them (16 frames at 224² = 512 video tokens)."""
    import numpy as np

    def make(seed: int, num_frames: int = 16, height: int = 224, width: int = 224):
        rng = np.random.default_rng(seed)
        return rng.integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)  # (T, H, W, 3)

    return make


@pytest.fixture(scope="session")
def tool_specs():
    """The real tools' specs (name, description, bounded JSON schema), as the orchestrator sees them."""
    from medclaw.tools.registry import default_registry

    return default_registry().specs()

@pytest.fixture
def medclaw_home(tmp_path, monkeypatch, tiny_models):
    """A fresh $MEDCLAW_HOME whose `tiny/` is a copy of the session's tiny checkpoints (so the
    tiny-cpu profile finds them built), and an empty model store."""
    home = tmp_path / "home"
    shutil.copytree(tiny_models.vlm.parent, home / "tiny")
    monkeypatch.setenv("MEDCLAW_HOME", str(home))
    monkeypatch.delenv("MEDCLAW_MODELS_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def hd_video(tmp_path_factory):
    """4 s of ffmpeg's test pattern at 1920x1080 (a real 1080p H.264 file, made in a second)."""
    import subprocess

    path = tmp_path_factory.mktemp("hd") / "hd.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc=size=1920x1080:rate=5", "-t", "4", "-c:v", "libx264", "-preset",
                    "ultrafast", "-pix_fmt", "yuv420p", str(path)], check=True)
    return path


@pytest.fixture(scope="session")
def wait_until_healthy():
    """`wait_until_healthy(base_url, process, log_path, timeout_s=900)`: poll `/health` of a server
    the test started until it answers 200; fail with the log's tail if the process exits first
    or the deadline passes."""
    import time
    import urllib.request

    def wait(base_url: str, process, log_path, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                pytest.fail(f"server exited ({process.returncode}):\n"
                            f"{Path(log_path).read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server did not start:\n{Path(log_path).read_text()[-3000:]}")
            time.sleep(2)

    return wait
