"""The shared machinery many episodes run on: engines per role, frame source, KB, skills, tools.

    runtime = Runtime(specs, knowledge_base=kb, skills=library)   # nothing starts yet
    ... await run_episode(q, video, runtime, config) ...            # engines start on first use
    await runtime.close()

- One backend *instance* per distinct model: roles whose specs name the same backend kind and the
  same local folder (and endpoints) share it. On the tiny-cpu profile that is one VLM engine for
  video_expert + frame_verifier and one LLM engine for orchestrator + judge. The first role's
  spec configures the shared engine.
- Lazy: a backend is constructed the first time a role is asked for (`get_backend` / the mapping
  handed to tools), i.e. after every input check has passed. A backend with an async `start()`
  has it awaited once, under a lock, so concurrent episodes never start an engine twice.
- `backends` may be given pre-built per role (tests inject scripted fakes, or session engines);
  those belong to the caller: `close()` only closes what the runtime built itself.
- The `encoder` role is not a generation engine: the knowledge base loads its own encoder.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from typing import Any

GENERATION_ROLES = ("orchestrator", "video_expert", "frame_verifier", "judge")


class Runtime:
    def __init__(self, specs: dict[str, Any], *, backends: dict[str, Any] | None = None,
                 frames: Any = None, knowledge_base: Any = None, skills: Any = None,
                 registry: Any = None, frame_source_kwargs: dict | None = None):
        self.specs = dict(specs)
        self.knowledge_base = knowledge_base
        self.skills = skills
        self._registry = registry
        self._frames = frames
        self._frame_source_kwargs = dict(frame_source_kwargs or {})
        self._by_role: dict[str, Any] = dict(backends or {})
        self._by_key: dict[tuple, Any] = {}
        self._started: set[int] = set()
        self._locks: dict = {}
        self._locks_loop = None
        self._revisions: dict[tuple, str | None] = {}
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
    def _construct(spec):
        from medclaw.engine.backends import backend_class

        return backend_class(spec.backend)(spec)

    def backend(self, role: str):
        """The backend serving `role`, constructed on first request (blocking: tools' path)."""
        if self.closed:
            raise RuntimeError("runtime is closed")
        if role not in self._by_role:
            key = self.share_key(self._spec_for(role))
            if key not in self._by_key:
                self._by_key[key] = self._construct(self.specs[role])
            self._by_role[role] = self._by_key[key]
        return self._by_role[role]

    async def get_backend(self, role: str):
        """`backend(role)` without blocking the event loop.

        Construction (a vLLM engine start takes ~40 s on CPU) runs in a worker thread, once per
        shared key even when many episodes ask at the same moment; a backend's async `start()`,
        if it has one, is awaited once as well.
        """
        if self.closed:
            raise RuntimeError("runtime is closed")
        if role not in self._by_role:
            spec = self._spec_for(role)
            key = self.share_key(spec)
            async with self._lock(("build", key)):
                if key not in self._by_key:
                    self._by_key[key] = await asyncio.to_thread(self._construct, spec)
            self._by_role[role] = self._by_key[key]
        backend = self._by_role[role]
        start = getattr(backend, "start", None)
        if start is not None and asyncio.iscoroutinefunction(start) and id(backend) not in self._started:
            async with self._lock(("start", id(backend))):
                if id(backend) not in self._started:
                    await start()
                    self._started.add(id(backend))
        return backend

    async def start(self, roles=GENERATION_ROLES) -> None:
        """Build the backends of `roles` now (one at a time: engines compete for the same cores)."""
        for role in roles:
            if role in self.specs or role in self._by_role:
                await self.get_backend(role)

    def _lock(self, name) -> asyncio.Lock:
        # asyncio locks belong to one event loop; a runtime may outlive a loop (tests, notebooks).
        loop = asyncio.get_running_loop()
        if self._locks_loop is not loop:
            self._locks, self._locks_loop = {}, loop
        return self._locks.setdefault(name, asyncio.Lock())

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
        return self._registry

    def model_info(self) -> dict[str, dict]:
        """Role → model identity for trace headers (no engine is started for this)."""
        info = {}
        for role, spec in self.specs.items():
            info[role] = {
                "name": spec.name, "path": spec.path, "backend": spec.backend,
                "architecture": spec.architecture,
                "revision": self._revision(role, spec),
                "shared_with": sorted(r for r, s in self.specs.items()
                                      if r != role and self.share_key(s) == self.share_key(spec)),
            }
        return info

    def _revision(self, role: str, spec) -> str | None:
        """The model's revision: the live backend's, else the store's hash (computed once)."""
        backend = self._by_role.get(role)
        if getattr(backend, "model_revision", None):
            return backend.model_revision
        if spec.extra.get("revision"):
            return str(spec.extra["revision"])
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

        Backends passed in via `backends=` belong to the caller and are left running. One
        backend failing to close does not leave the others running: the first error is re-raised
        after every backend (and the frame source) had its turn.
        """
        if self.closed:
            return
        self.closed = True
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
                 skills_dir: str | None = None, frame_source_kwargs: dict | None = None) -> Runtime:
    """Resolve models, load the KB and skills, check everything — and start no engine.

    Raises `MedClawError` subclasses (one line) for a bad profile / config / model folder / index.
    """
    from medclaw.models.registry import load_models

    specs = load_models(config_path=config_path, profile=profile, overrides=dict(overrides or {}))
    knowledge_base = None
    if kb_dir is not None:
        from medclaw.kb.search import KnowledgeBase

        knowledge_base = KnowledgeBase.load(kb_dir)
    skills = load_skill_library(skills_dir)
    return Runtime(specs, knowledge_base=knowledge_base, skills=skills,
                   frame_source_kwargs=frame_source_kwargs)


def load_skill_library(skills_dir: str | None = None):
    """The shipped skill library, overridden per name by the skills in `skills_dir` (if given)."""
    from medclaw.skills.library import SkillLibrary

    return SkillLibrary([skills_dir] if skills_dir is not None else None)
