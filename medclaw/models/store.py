"""The local model store: where imported weights live, and how we know which weights they are.

Nothing is ever downloaded. A user brings a Hugging Face-style folder (config.json, weights,
tokenizer) and imports it under a name:

    medclaw models import qwen2.5-vl-7b /data/weights/Qwen2.5-VL-7B-Instruct

Layout: `models_dir()/NAME/` holds either symlinks to the source files (default, no extra disk)
or copies (`copy=True`), plus `MANIFEST_NAME`, which lists every file with its size, mtime and
sha256 (hashed once, at import, with a progress bar). `models_dir()` is `$MEDCLAW_MODELS_DIR`,
else `$MEDCLAW_HOME/models`, else `~/.cache/medclaw/models`.

`revision_hash(path)` names the exact weights behind every answer in a trace (short hex). It reads
the manifest when the files still match it (size + mtime), else computes a fast fingerprint:
the full sha256 of small files, size + first and last MiB of big ones. Results are cached in
process, keyed on the files' stat signature, so a changed file gives a new revision.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from medclaw.errors import ConfigError, ModelNotFoundError
from medclaw.home import medclaw_home

MANIFEST_NAME = "medclaw-manifest.json"
REVISION_CHARS = 12
FINGERPRINT_FULL_LIMIT = 8 << 20      # files up to 8 MiB are hashed whole by the fingerprint
FINGERPRINT_EDGE = 1 << 20            # bigger ones: size + first and last MiB
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HASH_CHUNK = 4 << 20


def models_dir() -> Path:
    """`$MEDCLAW_MODELS_DIR`, else `medclaw_home()/models`."""
    explicit = os.environ.get("MEDCLAW_MODELS_DIR")
    return Path(explicit).expanduser() if explicit else medclaw_home() / "models"


def import_hint(name: str) -> str:
    return f"import weights with `medclaw models import {name} /path/to/folder`"


# ---------------------------------------------------------------------------------------------
# checking a folder

def folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a usable model folder (None if it is)."""
    folder = Path(path)
    if not folder.is_dir():
        return "no such folder"
    if not (folder / "config.json").is_file():
        return "no config.json"
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        return "no weights (*.safetensors / *.bin)"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return "no tokenizer files"
    return None


def check_model_folder(path: str | os.PathLike, name: str) -> Path:
    """Return `path` as a Path, or raise ModelNotFoundError with a one-line how-to-import."""
    problem = folder_problem(path)
    if problem:
        raise ModelNotFoundError(f"model {name!r} not usable at {path} ({problem}); {import_hint(name)}")
    return Path(path)


def store_path(name: str) -> Path:
    """Where model `name` lives in the store (whether or not it is there)."""
    if not _NAME_RE.match(name):
        raise ConfigError(f"invalid model name {name!r}: use letters, digits, '.', '_' or '-'")
    return models_dir() / name


def resolve_stored(name: str) -> Path:
    """The store folder of `name`, checked; ModelNotFoundError (one line) when absent or broken."""
    return check_model_folder(store_path(name), name)


def list_stored() -> list[str]:
    """Names of the models imported into the store."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST_NAME).is_file())


# ---------------------------------------------------------------------------------------------
# import / verify

@dataclass(slots=True)
class Verification:
    """Result of re-hashing a stored model against its manifest."""

    name: str
    path: str
    revision: str
    num_files: int
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def import_model(name: str, src_folder: str | os.PathLike, copy: bool = False,
                 force: bool = False, progress: bool = True) -> Path:
    """Link (or copy) a model folder into the store as `name`, and write its manifest."""
    dest = store_path(name)
    src = Path(src_folder).expanduser().resolve()
    check_model_folder(src, name)
    if dest.exists() or dest.is_symlink():
        if not force:
            raise ConfigError(f"model {name!r} is already in the store at {dest}; pass --force to replace it")
    files = _model_files(src)
    tmp = dest.with_name(f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for rel in files:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if copy:
                shutil.copy2(src / rel, target)
            else:
                os.symlink(src / rel, target)
        entries = _hash_files(tmp, files, progress=progress, label=f"hashing {name}")
        manifest = {
            "name": name, "source": str(src), "mode": "copy" if copy else "link",
            "imported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "revision": _revision_of(entries), "files": entries,
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        if dest.exists() or dest.is_symlink():
            _remove(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _FINGERPRINTS.clear()
    return dest


def read_manifest(path: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(path) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def verify_model(name: str, progress: bool = True) -> Verification:
    """Re-hash every file of stored model `name` and compare with its manifest."""
    folder = resolve_stored(name)
    manifest = read_manifest(folder)
    if manifest is None:
        raise ModelNotFoundError(f"model {name!r} at {folder} has no manifest; {import_hint(name)}")
    expected: dict = manifest["files"]
    present = [rel for rel in expected if (folder / rel).is_file()]
    actual = _hash_files(folder, present, progress=progress, label=f"verifying {name}")
    return Verification(
        name=name, path=str(folder), revision=manifest["revision"], num_files=len(expected),
        missing=sorted(set(expected) - set(present)),
        changed=sorted(rel for rel in present if actual[rel]["sha256"] != expected[rel]["sha256"]),
        unexpected=sorted(set(_model_files(folder)) - set(expected)),
    )


# ---------------------------------------------------------------------------------------------
# revisions

_FINGERPRINTS: dict[tuple, str] = {}


def revision_hash(path: str | os.PathLike) -> str:
    """Short hex id of the exact files in model folder `path` (see module docstring)."""
    folder = Path(path).expanduser().resolve()
    files = _model_files(folder)
    stats = {rel: os.stat(folder / rel) for rel in files}      # follows symlinks
    manifest = read_manifest(folder)
    if manifest is not None and _matches_manifest(manifest["files"], stats):
        return manifest["revision"]
    key = (str(folder), tuple((rel, s.st_size, s.st_mtime_ns) for rel, s in sorted(stats.items())))
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = _revision_of({
            rel: {"size": stats[rel].st_size, "fingerprint": _fingerprint(folder / rel, stats[rel].st_size)}
            for rel in files
        })
    return _FINGERPRINTS[key]


def _matches_manifest(entries: dict, stats: dict) -> bool:
    return set(entries) == set(stats) and all(
        entries[rel]["size"] == s.st_size and entries[rel]["mtime_ns"] == s.st_mtime_ns
        for rel, s in stats.items()
    )


def _fingerprint(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= FINGERPRINT_FULL_LIMIT:
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
        else:
            digest.update(fh.read(FINGERPRINT_EDGE))
            fh.seek(size - FINGERPRINT_EDGE)
            digest.update(fh.read(FINGERPRINT_EDGE))
    return digest.hexdigest()


def _revision_of(entries: dict) -> str:
    """One definition for both paths (manifest and fingerprint), so equal bytes → equal revision."""
    lines = "".join(f"{rel}\0{entries[rel]['size']}\0{entries[rel]['fingerprint']}\n" for rel in sorted(entries))
    return hashlib.sha256(lines.encode()).hexdigest()[:REVISION_CHARS]


# ---------------------------------------------------------------------------------------------
# helpers

def _model_files(folder: Path) -> list[str]:
    """Relative paths of the files that make up a model (hidden files and the manifest excluded)."""
    out = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or name == MANIFEST_NAME:
                continue
            out.append(os.path.relpath(os.path.join(root, name), folder))
    return out


def _hash_files(folder: Path, files: list[str], progress: bool, label: str) -> dict[str, dict]:
    """sha256 + size + mtime of each file, with one byte-counting progress bar on stderr."""
    from tqdm import tqdm

    stats = {rel: os.stat(folder / rel) for rel in files}
    total = sum(s.st_size for s in stats.values())
    entries = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr,
              disable=not progress, leave=False) as bar:
        for rel in files:
            digest = hashlib.sha256()
            with open(folder / rel, "rb") as fh:
                while chunk := fh.read(_HASH_CHUNK):
                    digest.update(chunk)
                    bar.update(len(chunk))
            size = stats[rel].st_size
            sha = digest.hexdigest()
            # small files: the fingerprint is the full sha256, no second read
            fingerprint = sha if size <= FINGERPRINT_FULL_LIMIT else _fingerprint(folder / rel, size)
            entries[rel] = {"size": size, "mtime_ns": stats[rel].st_mtime_ns, "sha256": sha,
                            "fingerprint": fingerprint}
    return entries


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)
