"""Runtime: backends shared per model, built lazily and once; episode config + budget rules."""
from __future__ import annotations

import asyncio

import pytest

from medclaw.engine.budget import Budget
from medclaw.engine.config import PROFILE_EPISODE_DEFAULTS, EpisodeConfig, load_episode_config
from medclaw.engine.runtime import Runtime
from medclaw.errors import ConfigError
from medclaw.models.spec import ModelSpec


def _specs(tmp_path):
    vlm, llm = tmp_path / "vlm", tmp_path / "llm"
    vlm.mkdir()
    llm.mkdir()
    return {
        "orchestrator": ModelSpec(name="tiny-llm", path=str(llm), backend="fake"),
        "judge": ModelSpec(name="tiny-llm", path=str(llm) + "/", backend="fake"),   # same folder
        "video_expert": ModelSpec(name="tiny-vlm", path=str(vlm), backend="fake"),
        "frame_verifier": ModelSpec(name="tiny-vlm", path=str(vlm), backend="fake"),
        "encoder": ModelSpec(name="minilm", path=str(tmp_path / "enc"), backend="fake"),
    }


class _Built:
    """Records constructions; stands in for an engine (agent-logic fake)."""

    instances: list = []

    def __init__(self, spec):
        self.spec, self.closed, self.starts = spec, 0, 0
        _Built.instances.append(self)

    async def start(self):
        self.starts += 1
        await asyncio.sleep(0.01)          # let concurrent callers pile up on the lock

    async def close(self):
        self.closed += 1


@pytest.fixture
def built(monkeypatch):
    _Built.instances = []
    monkeypatch.setattr(Runtime, "_construct", staticmethod(_Built))
    return _Built.instances


async def test_roles_with_same_model_share_one_backend(tmp_path, built):
    runtime = Runtime(_specs(tmp_path))
    assert runtime.live_backends() == {}                    # lazy: nothing built yet
    orchestrator = await runtime.get_backend("orchestrator")
    assert len(built) == 1 and runtime.live_backends() == {"orchestrator": orchestrator}
    assert await runtime.get_backend("judge") is orchestrator
    video = await runtime.get_backend("video_expert")
    assert video is not orchestrator
    assert runtime.backend("frame_verifier") is video
    assert len(built) == 2
    info = runtime.model_info()
    assert info["video_expert"]["shared_with"] == ["frame_verifier"]
    assert info["orchestrator"]["shared_with"] == ["judge"]
    await runtime.close()
    await runtime.close()                                    # safe twice, each engine closed once
    assert [b.closed for b in built] == [1, 1]
    from medclaw.errors import EngineLostError

    with pytest.raises(EngineLostError, match="closed"):
        runtime.backend("orchestrator")


async def test_concurrent_first_use_builds_and_starts_once(tmp_path, built):
    runtime = Runtime(_specs(tmp_path))
    got = await asyncio.gather(*(runtime.get_backend(role) for role in
                                 ["video_expert", "frame_verifier"] * 4))
    assert len(built) == 1 and all(b is got[0] for b in got)
    assert built[0].starts == 1
    await runtime.close()


async def test_backends_view_is_lazy_and_skips_the_encoder(tmp_path, built):
    runtime = Runtime(_specs(tmp_path))
    view = runtime.backends_view()
    assert "video_expert" in view and "encoder" not in view
    assert sorted(view) == ["frame_verifier", "judge", "orchestrator", "video_expert"]
    assert built == []                                       # membership / listing builds nothing
    assert view["frame_verifier"] is view["video_expert"]
    assert len(built) == 1
    with pytest.raises(KeyError):
        view["encoder"]
    with pytest.raises(ConfigError, match="no model configured"):
        await runtime.get_backend("nonexistent")
    await runtime.close()


async def test_injected_backends_are_used_as_given(tmp_path, built):
    from medclaw.engine.backends.fake import ScriptedBackend

    class Owned(ScriptedBackend):
        closes = 0

        async def close(self):
            Owned.closes += 1

    fake = Owned(["{}"])
    runtime = Runtime(_specs(tmp_path), backends={"orchestrator": fake})
    assert await runtime.get_backend("orchestrator") is fake
    assert await runtime.get_backend("judge") is not fake      # judge was not injected: built
    assert len(built) == 1
    await runtime.close()
    assert Owned.closes == 0 and built[0].closed == 1          # the caller's engine keeps running


async def test_the_distiller_uses_the_orchestrators_engine_unless_it_has_a_model_of_its_own(tmp_path, built):
    """An unassigned distiller (the registry gives it the orchestrator's spec, or none) reviews
    on the orchestrator's engine, also an injected one; one with its own folder gets its own."""
    from medclaw.engine.backends.fake import ScriptedBackend

    given = ScriptedBackend(["{}"])
    specs = _specs(tmp_path)
    for distiller in (specs["orchestrator"], None):
        with_role = dict(specs, **({"distiller": distiller} if distiller else {}))
        runtime = Runtime(with_role, backends={"orchestrator": given})
        assert await runtime.get_backend("distiller") is given
        assert runtime.backend("distiller") is given
        await runtime.close()
    assert built == []
    own = tmp_path / "distiller"
    own.mkdir()
    runtime = Runtime(dict(specs, distiller=ModelSpec(name="d", path=str(own), backend="fake")),
                      backends={"orchestrator": given})
    assert await runtime.get_backend("distiller") is built[0] and built[0].spec.name == "d"
    await runtime.close()


async def test_close_closes_every_backend_even_when_one_fails(tmp_path, built):
    runtime = Runtime(_specs(tmp_path))
    first = await runtime.get_backend("orchestrator")
    second = await runtime.get_backend("video_expert")

    async def broken_close():
        raise OSError("engine core already gone")

    first.close = broken_close
    with pytest.raises(OSError, match="already gone"):
        await runtime.close()
    assert second.closed == 1


async def test_a_build_outlives_a_cancelled_waiter_and_is_never_repeated(tmp_path, monkeypatch):
    """The wall budget (or any cancellation) may stop a caller waiting for an engine build; the
    build itself finishes, and the next caller gets that same engine instead of a second one."""
    import threading

    built, release = [], threading.Event()

    def slow_construct(spec):
        release.wait(30)                  # an engine start in progress (blocking, like vLLM's)
        built.append(_Built(spec))
        return built[-1]

    monkeypatch.setattr(Runtime, "_construct", staticmethod(slow_construct))
    runtime = Runtime(_specs(tmp_path))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(runtime.get_backend("orchestrator"), 0.05)
    waiter = asyncio.ensure_future(runtime.get_backend("judge"))     # same engine, still building
    await asyncio.sleep(0.05)
    release.set()
    backend = await waiter
    assert await runtime.get_backend("orchestrator") is backend
    assert len(built) == 1
    await runtime.close()
    assert backend.closed == 1


async def test_close_waits_for_a_running_build_and_closes_it(tmp_path, monkeypatch):
    import threading

    built, release = [], threading.Event()

    def slow_construct(spec):
        release.wait(30)
        built.append(_Built(spec))
        return built[-1]

    monkeypatch.setattr(Runtime, "_construct", staticmethod(slow_construct))
    runtime = Runtime(_specs(tmp_path))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(runtime.get_backend("video_expert"), 0.05)
    closing = asyncio.ensure_future(runtime.close())
    await asyncio.sleep(0.05)
    assert not closing.done()                                  # the engine is not left behind
    release.set()
    await closing
    assert [b.closed for b in built] == [1]
    from medclaw.errors import EngineLostError

    with pytest.raises(EngineLostError, match="closed"):
        await runtime.get_backend("video_expert")


async def test_start_builds_every_engine_once_with_one_report_each(tmp_path, built):
    from medclaw.engine.backends.fake import ScriptedBackend

    class KB:
        warmed = 0
        manifest = {"encoder": {"name": "minilm"}}

        def warm(self):
            KB.warmed += 1

    given = ScriptedBackend([])
    runtime = Runtime(_specs(tmp_path), knowledge_base=KB(), backends={"frame_verifier": given})
    lines = []
    ready = await runtime.start(on_engine=lambda r: lines.append(r.line()))
    # an episode's roles only (the judge shares the orchestrator's engine anyway); video_expert
    # its own; the given frame_verifier is the caller's (already up); the KB encoder loads once
    assert [(r.name, r.kind, r.roles) for r in ready] == [
        ("tiny-llm", "fake", ["orchestrator"]), ("tiny-vlm", "fake", ["video_expert"]),
        ("minilm", "encoder", ["knowledge base"])]
    assert lines == [r.line() for r in ready] and lines[0].startswith("engine tiny-llm (fake) for")
    assert len(built) == 2 and all(b.starts == 1 for b in built) and KB.warmed == 1
    assert await runtime.start() == [] and len(built) == 2 and KB.warmed == 1     # idempotent
    assert runtime.live_backends()["frame_verifier"] is given
    await runtime.close()


async def test_start_leaves_a_separate_judge_engine_alone(tmp_path, built):
    """`ask` never starts a judge model it does not use; `medclaw eval` asks for it by role."""
    from medclaw.engine.runtime import GENERATION_ROLES

    specs = _specs(tmp_path)
    (tmp_path / "judge").mkdir()
    specs["judge"] = ModelSpec(name="judge-llm", path=str(tmp_path / "judge"), backend="fake")
    runtime = Runtime(specs)
    ready = await runtime.start()
    assert [r.name for r in ready] == ["tiny-llm", "tiny-vlm"] and len(built) == 2
    ready = await runtime.start(roles=GENERATION_ROLES)
    assert [(r.name, r.roles) for r in ready] == [("judge-llm", ["judge"])] and len(built) == 3
    await runtime.close()


def test_the_revision_comes_from_the_model_store_never_from_the_config(tmp_path):
    """A config cannot claim a revision: the trace cites the store's digest of the files."""
    from medclaw.models.store import revision_hash

    specs = _specs(tmp_path)
    specs["judge"] = ModelSpec(name="tiny-llm", path=specs["judge"].path, backend="fake",
                               extra={"revision": "claimed-by-config"})
    info = Runtime(specs).model_info()
    assert info["judge"]["revision"] == revision_hash(specs["judge"].path) != "claimed-by-config"


# --- episode config ------------------------------------------------------------------------------

def test_episode_config_validates_with_one_line_errors():
    assert EpisodeConfig().max_steps >= 1
    for bad in ({"max_steps": 0}, {"warn_at": 0}, {"warn_at": 1.5}, {"max_wall_s": -1},
                {"concurrency": 0}, {"orchestrator_temperature": 3.0}, {"max_steps": "8"},
                {"trace_dir": ""}, {"sub_agent_max_tokens": 8}, {"sub_agent_max_tokens": 64.0}):
        with pytest.raises(ConfigError) as info:
            EpisodeConfig.from_dict(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="unknown key"):
        EpisodeConfig.from_dict({"max_stpes": 3})


def test_episode_section_of_yaml_then_flags(tmp_path):
    path = tmp_path / "medclaw.yaml"
    path.write_text("models: {}\nepisode:\n  max_steps: 5\n  max_wall_s: 60\n  trace_dir: traces\n")
    config = load_episode_config(path, max_steps=None, concurrency=3)
    assert (config.max_steps, config.max_wall_s, config.trace_dir, config.concurrency) == \
        (5, 60.0, "traces", 3)
    assert load_episode_config(path, max_steps=2).max_steps == 2          # flag wins
    # profile defaults: none for a real-model profile, tight generation bounds for tiny-cpu
    assert load_episode_config(None, profile="qwen-7b").to_dict() == EpisodeConfig().to_dict()
    tiny = load_episode_config(None)                                       # default profile
    assert tiny.max_string_chars == PROFILE_EPISODE_DEFAULTS["tiny-cpu"]["max_string_chars"]
    # random weights fill every reply budget with noise: tiny-cpu caps the sub-agents' replies
    assert tiny.sub_agent_max_tokens == 64 and EpisodeConfig().sub_agent_max_tokens is None
    (tmp_path / "prof.yaml").write_text("profile: qwen-7b\nepisode: {max_steps: 3}\n")
    assert load_episode_config(tmp_path / "prof.yaml").max_string_chars is None
    assert load_episode_config(path, profile="tiny-cpu").max_steps == 5     # YAML beats profile
    (tmp_path / "bad.yaml").write_text("episode: [1, 2]\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_episode_config(tmp_path / "bad.yaml")
    (tmp_path / "broken.yaml").write_text("episode:\n  max_steps: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_episode_config(tmp_path / "broken.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_episode_config(tmp_path / "missing.yaml")


def test_budget_warns_then_exhausts_on_each_dimension():
    class Ctx:
        visual_tokens_used = 0

    now = [0.0]
    config = EpisodeConfig(max_steps=5, visual_token_budget=1000, max_wall_s=100.0, warn_at=0.75)
    ctx = Ctx()
    budget = Budget(config=config, ctx=ctx, clock=lambda: now[0])
    assert budget.exhausted() is None and budget.warning() is None
    budget.steps_used = 3
    assert "2 step(s) left of 5" in budget.warning() and budget.exhausted() is None
    # spent after max_steps - 1 calls: the forced answer is call max_steps, never max_steps + 1
    budget.steps_used = 4
    assert budget.exhausted() == "steps budget spent"
    budget.steps_used = 0
    ctx.visual_tokens_used = 1000
    assert budget.exhausted() == "visual tokens budget spent"
    ctx.visual_tokens_used = 0
    now[0] = 80.0
    assert budget.warning() is not None and budget.exhausted() is None
    now[0] = 100.0
    assert budget.exhausted() == "wall time budget spent"
    one = Budget(config=EpisodeConfig(max_steps=1), ctx=ctx)      # one call: the answer itself
    assert one.exhausted() == "steps budget spent"


class _Starts:
    """Records how many engine builds run at once, and the options each was built with."""

    def __init__(self, meet: int = 0):
        import threading

        self.lock, self.running, self.most, self.options = threading.Lock(), 0, 0, {}
        self.meeting = threading.Barrier(meet, timeout=10) if meet else None

    def construct(self, spec, **options):
        import time

        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.options[spec.name] = options
        if self.meeting is not None:
            self.meeting.wait()          # both builds under way at once, else BrokenBarrierError
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return _Built(spec)


def _vllm_specs(tmp_path):
    return {role: ModelSpec(name=spec.name, path=spec.path, backend="vllm")
            for role, spec in _specs(tmp_path).items()}


@pytest.fixture
def cpu_vllm(monkeypatch):
    """vLLM's CPU build, on a machine whose process may use cores 0-3; no binding set."""
    from medclaw.engine.backends import cpu_binding, vllm_local

    monkeypatch.setattr(vllm_local, "import_engine", lambda: True)
    monkeypatch.setattr(cpu_binding, "allowed_cores", lambda: [0, 1, 2, 3])
    monkeypatch.delenv(cpu_binding.BIND_VARIABLE, raising=False)
    return monkeypatch


async def test_cpu_vllm_engines_start_together_each_on_its_share_of_the_cores(tmp_path, cpu_vllm):
    starts = _Starts(meet=2)
    cpu_vllm.setattr(Runtime, "_construct", staticmethod(starts.construct))
    runtime = Runtime(_vllm_specs(tmp_path))
    ready = await runtime.start()
    assert starts.most == 2
    assert starts.options == {"tiny-llm": {"cpu_binding": "0,1"}, "tiny-vlm": {"cpu_binding": "2,3"}}
    assert [(r.name, r.roles) for r in ready] == [("tiny-llm", ["orchestrator"]),
                                                  ("tiny-vlm", ["video_expert", "frame_verifier"])]
    await runtime.close()


async def test_a_binding_the_user_set_is_left_to_every_engine(tmp_path, cpu_vllm):
    from medclaw.engine.backends.cpu_binding import BIND_VARIABLE

    cpu_vllm.setenv(BIND_VARIABLE, "2-3")
    starts = _Starts(meet=2)
    cpu_vllm.setattr(Runtime, "_construct", staticmethod(starts.construct))
    runtime = Runtime(_vllm_specs(tmp_path))
    await runtime.start()
    assert starts.most == 2 and starts.options == {"tiny-llm": {}, "tiny-vlm": {}}
    await runtime.close()


@pytest.mark.parametrize("case", ["asked one at a time", "GPU build", "one engine"])
async def test_engines_start_one_at_a_time_otherwise(tmp_path, cpu_vllm, case):
    from medclaw.engine.backends import vllm_local

    starts = _Starts()
    cpu_vllm.setattr(Runtime, "_construct", staticmethod(starts.construct))
    specs = _vllm_specs(tmp_path)
    if case == "GPU build":
        cpu_vllm.setattr(vllm_local, "import_engine", lambda: False)
    if case == "one engine":
        specs["video_expert"] = specs["frame_verifier"] = specs["orchestrator"]
    runtime = Runtime(specs, start_together=case != "asked one at a time")
    ready = await runtime.start()
    assert starts.most == 1 and all(options == {} for options in starts.options.values())
    assert len(ready) == (1 if case == "one engine" else 2)
    await runtime.close()


async def test_a_given_backend_is_never_built_again_to_start_together(tmp_path, cpu_vllm):
    starts = _Starts()
    cpu_vllm.setattr(Runtime, "_construct", staticmethod(starts.construct))
    given = _Built(ModelSpec(name="given", path=str(tmp_path), backend="vllm"))   # start() pending
    runtime = Runtime(_vllm_specs(tmp_path), backends={"orchestrator": given})
    await runtime.start()
    assert list(starts.options) == ["tiny-vlm"] and given.starts == 1
    await runtime.close()
