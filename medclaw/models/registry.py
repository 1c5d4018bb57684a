"""Model registry: presets + deployment profiles (presets.yaml) → one ModelSpec per role.

    load_models(config_path=None, profile=None, overrides=None) -> {role: ModelSpec}

Precedence, lowest first: the preset's fields → the profile's per-backend `defaults` → the
profile's role entry → the user config's `models:` entry → `overrides` (CLI `--model ROLE=X`).
`profile` argument > config `profile:` > "tiny-cpu".

A user config is YAML; it may contain other top-level sections (`episode:`, …), which we ignore:

    profile: qwen-7b
    presets:                      # optional: extra presets, same keys as presets.yaml
      my-vlm: {architecture: Qwen2_5_VLForConditionalGeneration, path: /data/my-vlm}
    models:
      video_expert: video-r1-7b   # a preset name, a store name, or a folder path
      judge: {preset: qwen2.5-14b, max_model_len: 16384}
      orchestrator: {path: ./weights/orch, architecture: Qwen2ForCausalLM}

A role of `spec.ROLE_FALLBACK` (`distiller`) that nothing assigns is the role it falls back on
(the orchestrator's spec, so one engine for both); assigned, it starts from that role's profile
entry.

A model entry (or override) that names a folder keeps the role's budgets and reads the
architecture from the folder's config.json, so swapping a backbone is one line or one flag.
Paths are local, always: a missing folder raises ModelNotFoundError with the import command.
Tiny checkpoints are built on first use (building is not downloading).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import os
from pathlib import Path

from medclaw.config_file import read_config_file, read_yaml_mapping
from medclaw.config_file import profile_name as choose_profile
from medclaw.errors import ConfigError, ModelNotFoundError
from medclaw.models import store
from medclaw.models.spec import ROLE_FALLBACK, ROLES, ModelSpec

PRESETS_FILE = Path(__file__).with_name("presets.yaml")
SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSpec))
# `hub_id` is documentation for humans: it is accepted in an entry but never used to load anything.
CATALOG_ONLY_KEYS = frozenset({"source", "hub_id", "description"})
ENTRY_KEYS = SPEC_FIELDS | CATALOG_ONLY_KEYS | {"preset"}
MERGED_DICT_FIELDS = frozenset({"extra"})   # merged key by key; every other field is replaced
# Backends that serve weights from elsewhere: their `path` may be empty or absent.
PATHLESS_BACKENDS = frozenset({"remote", "fake"})
TINY_SEED = 0
TINY_KINDS = ("vlm", "llm")          # the fields of tiny.TinyModels


# ---------------------------------------------------------------------------------------------
# where a preset's weights live: `source: SCHEME:ARG` → resolver(arg, preset_name, build) -> Path

def _from_store(arg: str, preset: str, build: bool) -> Path:
    return store.store_path(arg or preset)


def _from_tiny(arg: str, preset: str, build: bool) -> Path:
    if arg not in TINY_KINDS:
        raise ConfigError(f"model {preset!r}: source tiny:{arg} must be one of "
                          f"{['tiny:' + k for k in TINY_KINDS]}")
    folder = store.medclaw_home() / "tiny"
    if build:
        from medclaw.models.tiny import build_tiny_models

        return getattr(build_tiny_models(folder, seed=TINY_SEED), arg)
    return folder / arg


def _from_package(arg: str, preset: str, build: bool) -> Path:
    package, _, subdir = arg.partition("/")
    found = importlib.util.find_spec(package)        # locates the package without importing it
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(f"model {preset!r}: Python package {package!r} is not installed "
                                 f"(pip install {package.replace('_', '-')})")
    return Path(list(found.submodule_search_locations)[0]) / subdir


SOURCES = {"store": _from_store, "tiny": _from_tiny, "package": _from_package}


# ---------------------------------------------------------------------------------------------
# catalog

@dataclasses.dataclass(slots=True)
class Catalog:
    presets: dict[str, dict]
    profiles: dict[str, dict]


@functools.lru_cache(maxsize=1)
def _builtin_catalog() -> Catalog:
    data = read_yaml_mapping(PRESETS_FILE)
    catalog = Catalog(presets=dict(data.get("presets") or {}), profiles=dict(data.get("profiles") or {}))
    _validate_catalog(catalog, str(PRESETS_FILE))
    return catalog


def catalog(user_config: dict | None = None, where: str = "config") -> Catalog:
    """The built-in catalog, plus the `presets:` of a user config (which may shadow built-ins)."""
    base = _builtin_catalog()
    extra = (user_config or {}).get("presets") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"{where}: `presets` must be a mapping of name -> fields")
    merged = Catalog(presets={**base.presets, **extra}, profiles=dict(base.profiles))
    _validate_catalog(Catalog(presets=extra, profiles={}), where)
    return merged


def _validate_catalog(cat: Catalog, where: str) -> None:
    for name, fields in cat.presets.items():
        _check_entry(fields, f"{where}: preset {name!r}", allow_preset=False)
        scheme = str(fields.get("source", "store")).partition(":")[0]
        if scheme not in SOURCES:
            raise ConfigError(f"{where}: preset {name!r}: unknown source {scheme!r}; use one of {sorted(SOURCES)}")
    for name, profile in cat.profiles.items():
        roles = set(profile.get("roles") or {})
        required = set(ROLES) - set(ROLE_FALLBACK)
        if not required <= roles <= set(ROLES):
            raise ConfigError(f"{where}: profile {name!r} must assign every role "
                              f"{[r for r in ROLES if r in required]} (and may assign "
                              f"{', '.join(ROLE_FALLBACK)}), not {sorted(roles)}")
        for backend, fields in (profile.get("defaults") or {}).items():
            _check_entry(fields, f"{where}: profile {name!r} defaults.{backend}", allow_preset=False)


def _check_entry(fields, where: str, allow_preset: bool = True) -> None:
    if not isinstance(fields, dict):
        raise ConfigError(f"{where}: expected a mapping of fields, got {type(fields).__name__}")
    allowed = ENTRY_KEYS if allow_preset else ENTRY_KEYS - {"preset"}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


# ---------------------------------------------------------------------------------------------
# resolving roles

def load_models(config_path: str | os.PathLike | None = None, profile: str | None = None,
                overrides: dict[str, str] | None = None, *, build: bool = True) -> dict[str, ModelSpec]:
    """Resolve every role to a ModelSpec with a checked local path (see module docstring).

    `build=False` resolves paths without building tiny checkpoints or checking folders (the
    memory planner sizes profiles whose weights are not on this machine)."""
    user = read_config_file(config_path)
    where = str(config_path) if config_path else "config"
    base_dir = Path(config_path).expanduser().resolve().parent if config_path else Path.cwd()
    cat = catalog(user, where)
    profile_name = choose_profile(profile, user)
    if not isinstance(profile_name, str) or profile_name not in cat.profiles:
        raise ConfigError(f"unknown profile {profile_name!r}; choose one of {sorted(cat.profiles)}")
    prof = cat.profiles[profile_name]
    defaults = prof.get("defaults") or {}
    user_models = user.get("models") or {}
    if not isinstance(user_models, dict):
        raise ConfigError(f"{where}: `models` must be a mapping of role -> preset, path or fields")
    for label, table in (("models", user_models), ("--model", overrides or {})):
        unknown = sorted(set(table) - set(ROLES))
        if unknown:
            raise ConfigError(f"{label}: unknown role(s) {unknown}; roles are {list(ROLES)}")

    specs = {}
    for role in ROLES:
        if not any(role in table for table in (prof["roles"], user_models, overrides or {})):
            specs[role] = specs[ROLE_FALLBACK[role]]          # an optional role left unassigned
            continue
        entry = prof["roles"].get(role, prof["roles"].get(ROLE_FALLBACK.get(role)))
        fields = _apply(cat, defaults, {}, entry, base_dir, f"profile {profile_name!r} {role}")
        if role in user_models:
            fields = _apply(cat, defaults, fields, user_models[role], base_dir, f"{where}: models.{role}")
        if overrides and role in overrides:
            fields = _apply(cat, defaults, fields, overrides[role], Path.cwd(), f"--model {role}")
        specs[role] = _finish(fields, f"{role} ({fields.get('name')})", build=build)
    return specs


def preset_spec(name: str, build: bool = True, profile: str | None = None) -> ModelSpec:
    """One preset as a ModelSpec (with the profile's backend defaults when `profile` is given)."""
    cat = catalog()
    if name not in cat.presets:
        raise ConfigError(f"unknown preset {name!r}; known: {sorted(cat.presets)}")
    defaults = (cat.profiles.get(profile) or {}).get("defaults") or {}
    fields = _apply(cat, defaults, {}, name, Path.cwd(), f"preset {name!r}")
    return _finish(fields, name, build=build)


def preset_path(name: str, build: bool = False) -> Path | None:
    """Where preset `name`'s weights are expected (None when they come from nowhere local)."""
    fields = _builtin_catalog().presets[name]
    if "path" in fields:
        return Path(fields["path"]).expanduser()
    scheme, _, arg = str(fields.get("source", "store")).partition(":")
    try:
        return SOURCES[scheme](arg, name, build)
    except ModelNotFoundError:
        return None


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """`["ROLE=VALUE", ...]` (CLI `--model`) → {role: value}; ConfigError on a malformed item."""
    out: dict[str, str] = {}
    for item in items or []:
        role, sep, value = item.partition("=")
        if not sep or not role or not value:
            raise ConfigError(f"--model expects ROLE=PRESET_OR_PATH, got {item!r}")
        if role not in ROLES:
            raise ConfigError(f"--model {item!r}: unknown role {role!r}; roles are {list(ROLES)}")
        out[role] = value
    return out


def _apply(cat: Catalog, defaults: dict, current: dict, entry, base_dir: Path, where: str) -> dict:
    """Layer one role entry (preset name, store name, folder path, or field mapping) on `current`."""
    if isinstance(entry, str):
        if entry in cat.presets:
            return _preset_fields(cat, defaults, entry, where)
        return _folder_fields(_reference_folder(entry, base_dir, where, cat), current)
    _check_entry(entry, where)
    entry = dict(entry)
    preset = entry.pop("preset", None)
    if preset is not None:
        if preset not in cat.presets:
            raise ConfigError(f"{where}: unknown preset {preset!r}; known: {sorted(cat.presets)}")
        # the profile's defaults are those of the backend the role ends up on, not the preset's
        current = _preset_fields(cat, defaults, preset, where, backend=entry.get("backend"))
    if "path" in entry:
        folder = (base_dir / Path(str(entry.pop("path"))).expanduser()).resolve()
        # `{preset: X, path: P}` = preset X's weights at P; a bare `{path: P}` = whatever P holds
        current = (_folder_fields(folder, current) if preset is None
                   else {**{k: v for k, v in current.items() if k != "source"}, "path": str(folder)})
    return _merge(current, entry)


def _preset_fields(cat: Catalog, defaults: dict, name: str, where: str,
                   backend: str | None = None) -> dict:
    """A preset's fields with the profile's defaults for its backend (or for `backend`, when the
    entry moves the preset to another one) on top: those describe the hardware (e.g. CPU memory
    limits), so they win over the preset's own values."""
    fields = {"name": name, **cat.presets[name]}
    return _merge(fields, defaults.get(backend or fields.get("backend", "vllm")) or {})


def _reference_folder(ref: str, base_dir: Path, where: str, cat: Catalog) -> Path:
    """A non-preset string: an imported store name, else a folder path."""
    looks_like_path = os.sep in ref or ref.startswith((".", "~"))
    if not looks_like_path:
        try:
            stored = store.store_path(ref)
        except ConfigError:
            stored = None
        if stored is not None and stored.exists():
            return stored
        raise ConfigError(f"{where}: {ref!r} is neither a preset, an imported model nor a path "
                          f"({store.import_hint(ref)}); presets: {sorted(cat.presets)}")
    folder = (base_dir / Path(ref).expanduser()).resolve()
    store.check_model_folder(folder, folder.name)
    return folder


def _folder_fields(folder: Path, current: dict) -> dict:
    """Fields implied by pointing a role at a folder: name, path and the architecture it declares."""
    fields = {"name": folder.name, "path": str(folder)}
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        archs = []
    if archs:
        fields["architecture"] = archs[0]
    # drop where the old weights came from: the folder is the source now
    return {**{k: v for k, v in current.items() if k != "source"}, **fields}


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if key in MERGED_DICT_FIELDS and isinstance(value, dict):
            out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    return out


def _finish(fields: dict, where: str, build: bool = True) -> ModelSpec:
    """Resolve the path (building tiny checkpoints if needed), check it, build the ModelSpec."""
    fields = dict(fields)
    name = fields.get("name") or "model"
    backend = fields.get("backend", "vllm")
    if not fields.get("path"):
        scheme, _, arg = str(fields.get("source", "store")).partition(":")
        fields["path"] = str(SOURCES[scheme](arg, name, build))
    if backend not in PATHLESS_BACKENDS and build:
        store.check_model_folder(fields["path"], name)
    # deep copy: dict/list fields may still be the cached catalog's own objects
    spec_fields = copy.deepcopy({k: v for k, v in fields.items() if k in SPEC_FIELDS})
    try:
        return ModelSpec(**spec_fields)
    except TypeError as err:
        raise ConfigError(f"{where}: {err}") from None


# ---------------------------------------------------------------------------------------------
# files
