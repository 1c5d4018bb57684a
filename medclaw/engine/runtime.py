"""The shared machinery many episodes run on: engines per role, frame source, KB, skills, tools.

    runtime = Runtime(specs, knowledge_base=kb, skills=library)   # nothing starts yet
    await runtime.start(on_engine=print)                           # every engine, one line each
    ... await run_episode(q, video, runtime, config) ...
    await runtime.close()

- One backend *instance* per distinct model: roles whose specs name the same backend kind and the
  same local folder (and endpoints) share it. On the tiny-cpu profile that is one VLM engine for
  video_expert + frame_verifier and one LLM engine for orchestrator + judge. The first role's
  spec configures the shared engine.
- `start()` builds every configured role's engine, then loads the knowledge base's encoder and
  the frame source and tool table, and fingerprints the models for trace headers — all off the
  event loop. vLLM engines on its CPU build start together, each on a share of the cores
  (`cpu_binding.core_shares`; a binding set in `VLLM_CPU_OMP_THREADS_BIND` is left to every
  engine): their starts are mostly single-threaded imports, so one at a time would leave cores
  idle (`benchmarks/runtime_start.py`). Other engines start one at a time: a GPU engine sizes its
  KV cache from the memory free as it starts. `run_episode` calls `start()` before the
  episode's clock starts, so budgets time the episode only; the CLI calls it first to show one
  progress line per engine (`on_engine(EngineReady)`).
- An engine build is never abandoned half-way and never started twice: each build runs to the
  end in its own thread, once per shared key, whoever asked for it. A caller that stops waiting
  (a cancelled episode, an expired budget) leaves it running; the next caller gets that engine.
  A backend with an async `start()` has it run once, as a task no waiter can cancel.
- `get_backend` / the mapping handed to tools still build lazily on first use, for callers that
  skip `start()`.
- `backends` may be given pre-built per role (tests inject scripted fakes, or session engines);
  those belong to the caller: `close()` only closes what the runtime built itself. `close()`
  waits for builds still running, then closes every engine built.
- The `encoder` role is not a generation engine: the knowledge base loads that role's model to
  embed queries, after checking it is the model the index was built with.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from medclaw.errors import EngineLostError

GENERATION_ROLES = ("orchestrator", "video_expert", "frame_verifier", "judge")
# What an episode calls: the judge only scores answers (medclaw eval starts it itself).
EPISODE_ROLES = ("orchestrator", "video_expert", "frame_verifier")


@dataclass(slots=True)
class EngineReady:
    """One engine (or the KB encoder) ready: what `Runtime.start` reports per engine."""

    name: str                      # model name
    kind: str                      # backend kind ("vllm", "remote", …) or "encoder"
    roles: list[str]
    seconds: float                 # time this start call spent on it
    cores: list[int] | None = None  # vLLM CPU engines: the cores its model worker is bound to

    def line(self) -> str:
        on_cores = f", on CPU cores {','.join(map(str, self.cores))}" if self.cores else ""
        return (f"engine {self.name} ({self.kind}) for {', '.join(self.roles)}: "
                f"ready in {self.seconds:.1f} s{on_cores}")


class Runtime:
    def __init__(self, specs: dict[str, Any], *, backends: dict[str, Any] | None = None,
                 frames: Any = None, knowledge_base: Any = None, skills: Any = None,
                 registry: Any = None, frame_source_kwargs: dict | None = None,
                 start_together: bool = True):
        self.specs = dict(specs)
        self.start_together = start_together      # False: vLLM CPU engines start one at a time too
        self.knowledge_base = knowledge_base
        self.skills = skills
        self._registry = registry
        self._registry_built = False       # True: ours to rebuild when skills change
        self._frames = frames
        self._frame_source_kwargs = dict(frame_source_kwargs or {})
        self._by_role: dict[str, Any] = dict(backends or {})
        self._by_key: dict[tuple, Any] = {}
        self._builds: dict[tuple, concurrent.futures.Future] = {}
        self._starts: dict[int, asyncio.Future] = {}        # id(backend) -> its start() task
        self._guard = threading.Lock()
        self._revisions: dict[tuple, str | None] = {}
        self._encoder_ready = False
        self.closed = False

    # --- engines ------------------------------------------------------------------------------
    @staticmethod
    def share_key(spec) -> tuple:
        """Roles with equal keys share one engine: same backend kind, same folder, same endpoints."""
        path = os.path.realpath(spec.path) if spec.path else ""
        return (spec.backend, path, tuple(spec.endpoints))

    def _spec_for(self, role: str):
        if role not in self.specs:
            from medclaw.errors import ConfigError

            raise ConfigError(f"no model configured for role {role!r}; configured: {sorted(self.specs)}")
        return self.specs[role]

    @staticmethod
    def _construct(spec, **options):
        from medclaw.engine.backends import backend_class

        return backend_class(spec.backend)(spec, **options)

    def _check_open(self) -> None:
        if self.closed:
            raise EngineLostError("the runtime is closed: its engines have been shut down")

    def _build(self, role: str, **options) -> concurrent.futures.Future:
        """The build of `role`'s engine: begun once per share key, in a thread of its own, and run
        to the end whoever waits for it. A failed build is forgotten, so a later call retries.
        `options` go to the backend's constructor when this call begins the build."""
        spec = self._spec_for(role)
        key = self.share_key(spec)
        with self._guard:
            future = self._builds.get(key)
            if future is None:
                future = concurrent.futures.Future()
                future.set_running_or_notify_cancel()     # from here on no waiter can cancel it
                self._builds[key] = future
                threading.Thread(target=self._run_build, args=(future, key, spec, options),
                                 daemon=True, name=f"medclaw-build-{spec.name}").start()
        return future

    def _run_build(self, future: concurrent.futures.Future, key: tuple, spec,
                   options: dict) -> None:
        try:
            backend = self._construct(spec, **options)
        except BaseException as err:         # handed to every waiter
            with self._guard:
                del self._builds[key]
            future.set_exception(err)
            return
        with self._guard:
            self._by_key[key] = backend
        future.set_result(backend)

    def _assigned(self, role: str) -> str:
        """`role`, or the role an optional one falls back on (`spec.ROLE_FALLBACK`) when it has
        no engine of its own and no model of its own: unassigned, or assigned the fallback's
        model. Pre-built backends (tests, an embedding app) are held by role only, so without
        this an unassigned `distiller` would start a second engine of the orchestrator's model."""
        from medclaw.models.spec import ROLE_FALLBACK

        fallback = ROLE_FALLBACK.get(role)
        if fallback is None or role in self._by_role:
            return role
        if role not in self.specs or (fallback in self.specs and self.share_key(self.specs[role])
                                      == self.share_key(self.specs[fallback])):
            return fallback
        return role

    def backend(self, role: str):
        """The backend serving `role`, built on first request (blocking: the sync path)."""
        self._check_open()
        role = self._assigned(role)
        if role not in self._by_role:
            self._by_role[role] = self._build(role).result()
        return self._by_role[role]

    async def get_backend(self, role: str):
        """`backend(role)` without blocking the event loop (see the module docstring)."""
        self._check_open()
        role = self._assigned(role)
        if role not in self._by_role:
            # wrap_future's cancel cannot stop the build (the future is already running)
            self._by_role[role] = await asyncio.wrap_future(self._build(role))
        backend = self._by_role[role]
        await self._run_start(backend)
        return backend

    async def _run_start(self, backend) -> None:
        start = getattr(backend, "start", None)
        if start is None or not asyncio.iscoroutinefunction(start):
            return
        with self._guard:
            task = self._starts.get(id(backend))
            if task is None:
                task = self._starts[id(backend)] = asyncio.ensure_future(start())
        await asyncio.shield(task)           # a cancelled waiter leaves the start running

    def _is_ready(self, role: str) -> bool:
        backend = self._by_role.get(role)
        if backend is None:
            return False
        task = self._starts.get(id(backend))
        start = getattr(backend, "start", None)
        needs_start = start is not None and asyncio.iscoroutinefunction(start)
        return not needs_start or (task is not None and task.done())

    async def start(self, roles=EPISODE_ROLES, *,
                    on_engine: Callable[[EngineReady], None] | None = None) -> list[EngineReady]:
        """Make everything an episode needs ready now (see the module docstring); returns (and
        passes to `on_engine`) one `EngineReady` per engine this call had to start. Idempotent."""
        self._check_open()
        groups: dict[object, list[str]] = {}
        for role in roles:
            if role in self._by_role:
                groups.setdefault(("given", id(self._by_role[role])), []).append(role)
            elif role in self.specs:
                groups.setdefault(self.share_key(self.specs[role]), []).append(role)
        ready = []
        pending = [group for group in groups.values() if not all(self._is_ready(r) for r in group)]
        began = time.perf_counter()
        bindings = await self._together(pending)
        if bindings is not None:
            for group, binding in zip(pending, bindings):
                self._build(group[0], **({"cpu_binding": binding} if binding else {}))
        for group in pending:
            started = began if bindings is not None else time.perf_counter()
            for role in group:
                backend = await self.get_backend(role)
            spec = self.specs.get(group[0])
            ready.append(EngineReady(
                name=getattr(spec, "name", None) or getattr(backend, "model_name", group[0]),
                kind=getattr(spec, "backend", None) or type(backend).__name__,
                roles=group, seconds=time.perf_counter() - started,
                cores=getattr(backend, "worker_cores", None)))
            if on_engine is not None:
                on_engine(ready[-1])
        warm = getattr(self.knowledge_base, "warm", None)
        if warm is not None and not self._encoder_ready:
            started = time.perf_counter()
            await asyncio.to_thread(warm)
            self._encoder_ready = True
            name = str((getattr(self.knowledge_base, "manifest", None) or {})
                       .get("encoder", {}).get("name", "sentence encoder"))
            ready.append(EngineReady(name=name, kind="encoder", roles=["knowledge base"],
                                     seconds=time.perf_counter() - started))
            if on_engine is not None:
                on_engine(ready[-1])
        # first touches that would otherwise stall an episode's event loop: the frame source
        # (imports the decoders), the tool table (jsonschema) and the model fingerprints
        await asyncio.to_thread(self._prepare)
        return ready

    async def _together(self, groups: list[list[str]]) -> list[str | None] | None:
        """Per engine group, the CPU binding to build it with (None: the environment's) when
        these groups' engines may start together; None when they start one at a time."""
        if not self.start_together or len(groups) < 2:
            return None
        if any(group[0] in self._by_role                  # given, or built: nothing to build
               or getattr(self.specs.get(group[0]), "backend", None) != "vllm" for group in groups):
            return None
        from medclaw.engine.backends import cpu_binding
        from medclaw.engine.backends.vllm_local import import_engine

        if not await asyncio.to_thread(import_engine):     # seconds: off the event loop
            return None
        if os.environ.get(cpu_binding.BIND_VARIABLE):
            return [None] * len(groups)
        return cpu_binding.core_shares(len(groups))

    def _prepare(self) -> None:
        _ = self.frames              # FrameSource: imports the decoders
        _ = self.registry            # the tool table: jsonschema checks every schema
        self.model_info()            # fills the revision cache the trace header reads

    def backends_view(self) -> Mapping:
        """A role → backend mapping for `ToolContext.backends` that builds backends on access."""
        return _LazyBackends(self)

    def live_backends(self) -> dict[str, Any]:
        """Roles whose backend has been built so far (for tests and reports)."""
        return dict(self._by_role)

    # --- shared non-model parts ---------------------------------------------------------------
    @property
    def frames(self):
        if self._frames is None:
            from medclaw.kernels.frames import FrameSource

            self._frames = FrameSource(**self._frame_source_kwargs)
        return self._frames

    @property
    def registry(self):
        if self._registry is None:
            from medclaw.tools.registry import default_registry

            self._registry = default_registry(kb_types=_kb_types(self.knowledge_base),
                                              skill_names=_skill_names(self.skills))
            self._registry_built = True
        return self._registry

    def use_skills(self, skills) -> None:
        """Swap the skill library between episodes; engines keep running (distillation's A/B
        passes). A registry the runtime built is rebuilt on next use, so load_skill's name enum
        follows the new library; a registry passed in by the caller is kept as it is."""
        self.skills = skills
        if self._registry_built:
            self._registry, self._registry_built = None, False

    def model_info(self) -> dict[str, dict]:
        """Role → model identity for trace headers (no engine is started for this)."""
        info = {}
        for role, spec in self.specs.items():
            info[role] = {
                "name": spec.name, "path": spec.path, "backend": spec.backend,
                "architecture": spec.architecture,
                "revision": self._revision(role, spec),
                # what the live engine loaded (bitsandbytes layers counted, vLLM's report), else
                # what the spec asks for
                "quantization": getattr(self._by_role.get(role), "quantization", spec.quantization),
                "shared_with": sorted(r for r, s in self.specs.items()
                                      if r != role and self.share_key(s) == self.share_key(spec)),
            }
        return info

    def _revision(self, role: str, spec) -> str | None:
        """The model's revision: the live backend's, else the store's hash (computed once)."""
        backend = self._by_role.get(role)
        if getattr(backend, "model_revision", None):
            return backend.model_revision
        key = self.share_key(spec)
        if key not in self._revisions:
            from medclaw.errors import MedClawError

            try:
                from medclaw.models.store import revision_hash

                self._revisions[key] = revision_hash(spec.path) if spec.path else None
            except (ImportError, OSError, ValueError, MedClawError):
                self._revisions[key] = None
        return self._revisions[key]

    async def close(self) -> None:
        """Close every backend this runtime built (each shared instance once). Safe to call twice.

        Builds still running are waited for first, so that no engine is left behind. Backends
        passed in via `backends=` belong to the caller and are left running. One backend failing
        to close does not leave the others running: the first error is re-raised after every
        backend (and the frame source) had its turn.
        """
        if self.closed:
            return
        self.closed = True
        with self._guard:
            pending = list(self._builds.values())
        for future in pending:
            try:
                await asyncio.wrap_future(future)
            except Exception:                # noqa: BLE001 — a failed build left nothing to close
                pass
        errors = []
        for backend in self._by_key.values():
            try:
                await backend.close()
            except Exception as err:     # noqa: BLE001 — close the rest first, then report
                errors.append(err)
        close_frames = getattr(self._frames, "close", None)
        if callable(close_frames):
            close_frames()
        if errors:
            raise errors[0]

    async def __aenter__(self) -> "Runtime":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _LazyBackends(Mapping):
    """Read-only role → backend view; indexing a configured role builds its backend."""

    def __init__(self, runtime: Runtime):
        self._runtime = runtime

    def _roles(self) -> set[str]:
        configured = {r for r in self._runtime.specs if r in GENERATION_ROLES}
        return configured | set(self._runtime._by_role)

    def __contains__(self, role: object) -> bool:    # without building anything
        return role in self._roles()

    def __getitem__(self, role: str):
        if role not in self._roles():
            raise KeyError(role)
        return self._runtime.backend(role)

    async def aget(self, role: str):
        """The backend for `role`, built off the event loop (what tools call: tools.media)."""
        if role not in self._roles():
            raise KeyError(role)
        return await self._runtime.get_backend(role)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._roles()))

    def __len__(self) -> int:
        return len(self._roles())


def _kb_types(kb) -> list[str] | None:
    if kb is None:
        return None
    types = (getattr(kb, "manifest", None) or {}).get("types")
    if isinstance(types, dict):
        types = list(types)
    return sorted(types) if types else None


def _skill_names(skills) -> list[str] | None:
    if skills is None:
        return None
    names = getattr(skills, "names", None)
    if callable(names):
        return sorted(names()) or None
    return None


def open_runtime(*, profile: str | None = None, config_path: str | None = None,
                 overrides: dict[str, str] | None = None, kb_dir: str | None = None,
                 skills_dir: str | None = None, frame_source_kwargs: dict | None = None,
                 decode_device: str | None = None) -> Runtime:
    """Resolve models, load the KB and skills, check everything — and start no engine.

    Frames are decoded as the config's `decode:` section says (`decode_device`, the
    --decode-device flag, overrides its device; `frame_source_kwargs` override both); a CUDA
    device on a host without one is refused here.
    Raises `MedClawError` subclasses (one line) for a bad profile / config / model folder / index.
    """
    from medclaw.engine.config import load_decode_config
    from medclaw.models.registry import load_models

    decode = load_decode_config(config_path,
                                device=decode_device or (frame_source_kwargs or {}).get("device"))
    decode.check_available()
    frame_source_kwargs = {**decode.frame_source_kwargs(), **(frame_source_kwargs or {})}

    specs = load_models(config_path=config_path, profile=profile, overrides=dict(overrides or {}))
    # On a CUDA host: engines that cannot even start (weights + KV for one full-context sequence +
    # activations over what their GPUs give them) are refused now, in one line, not after minutes
    # of loading. Throughput planning (concurrency) is `medclaw models plan`'s job.
    from medclaw.models.memory_plan import check_before_start

    check_before_start(specs, concurrency=1, decode_device=decode.device, name=profile or "")
    knowledge_base = None
    if kb_dir is not None:
        from medclaw.kb.search import KnowledgeBase

        # the encoder role's model embeds the queries; load() refuses one that is not the model
        # the index was built with (its vectors would not be comparable)
        encoder = specs["encoder"].path if "encoder" in specs else None
        knowledge_base = KnowledgeBase.load(kb_dir, encoder=encoder)
    skills = load_skill_library(skills_dir)
    return Runtime(specs, knowledge_base=knowledge_base, skills=skills,
                   frame_source_kwargs=frame_source_kwargs)


def load_skill_library(skills_dir: str | None = None):
    """The shipped skill library, overridden per name by the skills in `skills_dir` (if given)."""
    from medclaw.skills.library import SkillLibrary

    return SkillLibrary([skills_dir] if skills_dir is not None else None)
