"""The local model store: where imported weights live, and how we know which weights they are.

Nothing is ever downloaded. A user brings a Hugging Face-style folder (config.json, weights,
tokenizer) and imports it under a name:

    medclaw models import qwen2.5-vl-7b /data/weights/Qwen2.5-VL-7B-Instruct

Layout: `models_dir()/NAME/` holds either symlinks to the source files (default, no extra disk)
or copies (`copy=True`), plus `MANIFEST_NAME`, which lists every file with its full SHA-256, size,
mtime and ctime (hashed once, at import, with a progress bar). `models_dir()` is
`$MEDCLAW_MODELS_DIR`, else `$MEDCLAW_HOME/models`, else `~/.cache/medclaw/models`.

Revisions. `revision_hash(path)` names the exact weights behind every answer in a trace:
- a folder with a manifest (an imported model): the manifest's digest, the SHA-256 of its
  (file, size, file SHA-256) list — 64 hex characters, the same for a link or a copy import of the
  same bytes. Before returning it, the folder is checked against the manifest (`check_integrity`):
  a missing, extra or changed file refuses the load with one line (`ModelIntegrityError`);
- any other folder (the tiny checkpoints, a path given directly): `unimported:` + a fingerprint
  (full SHA-256 of files up to 8 MiB, size + first and last MiB of bigger ones), cached in
  process by the files' stat signature. It tells folders apart; it proves nothing about the
  middle of a big file. Import the folder to get a real revision.

Integrity at load vs `verify`. A load compares each file's size, mtime and ctime with the
manifest; it does not re-hash. Re-hashing at every process start would cost minutes for a 70B
model (~140 GB at a few hundred MB/s to a few GB/s), on every `ask`. ctime is the part that makes
the cheap check hold: any write to a file (or `touch`/`utime`, which is how one would hide a
write) sets it to now, and no system call sets it back. What the stat check cannot see (a raw
block-device edit, a clock moved backwards, a copied store whose files got new ctimes) is what
`verify_model` / `medclaw models verify NAME` is for: it re-hashes every byte of every file,
in parallel over files, and finds one flipped byte anywhere. When every hash matches but stat
signatures moved (the store was copied, the source folder was touched), verify refreshes them in
the manifest so that loads work again; the digest, and so the revision, does not change.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from medclaw.errors import ConfigError, MedClawError, ModelNotFoundError
from medclaw.home import medclaw_home

MANIFEST_NAME = "medclaw-manifest.json"
MANIFEST_FORMAT = 2
UNIMPORTED_PREFIX = "unimported:"
FINGERPRINT_CHARS = 16
HASH_THREADS = min(8, os.cpu_count() or 1)   # hashlib releases the GIL: files hash in parallel
STAT_FIELDS = ("size", "mtime_ns", "ctime_ns")   # what a load compares with the manifest
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


class ModelIntegrityError(MedClawError):
    """A stored model's files no longer match its import manifest."""


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
    """Return `path` as a Path, or raise ModelNotFoundError with a one-line how-to-import
    (ModelIntegrityError when it is an imported model whose files no longer match its manifest)."""
    problem = folder_problem(path)
    if problem:
        raise ModelNotFoundError(f"model {name!r} not usable at {path} ({problem}); {import_hint(name)}")
    check_integrity(path, name)
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
    num_bytes: int = 0
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    refreshed: list[str] = field(default_factory=list)   # same bytes, new stat signature recorded

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed or self.unexpected)

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
            "format": MANIFEST_FORMAT, "name": name, "source": str(src), "mode": "copy" if copy else "link",
            "imported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "revision": manifest_digest(entries), "files": entries,
        }
        _write_manifest(tmp, manifest)
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
    """Re-hash every byte of every file of stored model `name` and compare with its manifest;
    record fresh stat signatures when all bytes match (see module docstring)."""
    folder = store_path(name)
    problem = folder_problem(folder)
    if problem:
        raise ModelNotFoundError(f"model {name!r} not usable at {folder} ({problem}); {import_hint(name)}")
    manifest = read_manifest(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        raise ModelNotFoundError(f"model {name!r} at {folder} has no manifest; {import_hint(name)}")
    expected: dict = manifest["files"]
    present = [rel for rel in expected if (folder / rel).is_file()]
    actual = _hash_files(folder, present, progress=progress, label=f"verifying {name}")
    result = Verification(
        name=name, path=str(folder), revision=manifest_digest(expected), num_files=len(expected),
        num_bytes=sum(entry["size"] for entry in actual.values()),
        missing=sorted(set(expected) - set(present)),
        changed=sorted(rel for rel in present if actual[rel]["sha256"] != expected[rel]["sha256"]),
        unexpected=sorted(set(_model_files(folder)) - set(expected)),
    )
    if result.ok:
        result.refreshed = sorted(rel for rel in present if _stat_moved(expected[rel], actual[rel]))
        if result.refreshed or manifest.get("format") != MANIFEST_FORMAT:
            _write_manifest(folder, {**manifest, "format": MANIFEST_FORMAT, "revision": result.revision,
                                     "files": actual, "verified_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return result


# ---------------------------------------------------------------------------------------------
# integrity and revisions

def manifest_digest(entries: dict) -> str:
    """SHA-256 of the (file, size, file SHA-256) list: the revision of an imported model."""
    lines = "".join(f"{rel}\0{entries[rel]['size']}\0{entries[rel]['sha256']}\n" for rel in sorted(entries))
    return hashlib.sha256(lines.encode()).hexdigest()


def integrity_problem(path: str | os.PathLike) -> str | None:
    """Why the files in `path` no longer match its manifest (stat check, no hashing); None when
    they match or there is no manifest."""
    folder = Path(path).expanduser().resolve()
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    expected = manifest.get("files")
    if not isinstance(expected, dict):
        return "its manifest has no file list"
    files = _model_files(folder)
    missing = sorted(set(expected) - set(files))
    if missing:
        return f"{missing[0]} is missing"
    unexpected = sorted(set(files) - set(expected))
    if unexpected:
        return f"{unexpected[0]} was added after import"
    for rel in files:
        stat = os.stat(folder / rel)                 # follows the store's symlinks to the source
        for key in STAT_FIELDS:
            if key in expected[rel] and expected[rel][key] != _stat_value(stat, key):
                what = "size" if key == "size" else "modified"
                return f"{rel} changed since import ({what})"
    return None


def check_integrity(path: str | os.PathLike, name: str | None = None) -> None:
    """Raise ModelIntegrityError (one line) when `path` has a manifest its files no longer match."""
    problem = integrity_problem(path)
    if problem:
        label = name or Path(path).name
        raise ModelIntegrityError(
            f"model {label!r} at {path} does not match its import manifest: {problem}; run "
            f"`medclaw models verify {Path(path).name}` (re-hashes every file), or re-import it")


_FINGERPRINTS: dict[tuple, str] = {}


def revision_hash(path: str | os.PathLike) -> str:
    """The revision of model folder `path` (see module docstring); ModelIntegrityError when it
    has a manifest that its files no longer match."""
    folder = Path(path).expanduser().resolve()
    manifest = read_manifest(folder)
    if manifest is not None:
        check_integrity(folder)
        return manifest_digest(manifest["files"])
    files = _model_files(folder)
    stats = {rel: os.stat(folder / rel) for rel in files}      # follows symlinks
    key = (str(folder), tuple((rel, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for rel, s in sorted(stats.items())))
    if key not in _FINGERPRINTS:
        lines = "".join(f"{rel}\0{stats[rel].st_size}\0{_fingerprint(folder / rel, stats[rel].st_size)}\n"
                        for rel in sorted(files))
        _FINGERPRINTS[key] = UNIMPORTED_PREFIX + hashlib.sha256(lines.encode()).hexdigest()[:FINGERPRINT_CHARS]
    return _FINGERPRINTS[key]


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


def _stat_value(stat: os.stat_result, key: str) -> int:
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}[key]


def _stat_moved(recorded: dict, now: dict) -> bool:
    return any(recorded.get(key) != now[key] for key in STAT_FIELDS)


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
    """Full SHA-256 + stat signature of each file, several files at once (hashlib releases the
    GIL), with one byte-counting progress bar on stderr."""
    from tqdm import tqdm

    total = sum(os.stat(folder / rel).st_size for rel in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr,
              disable=not progress, leave=False) as bar:
        def one(rel: str) -> tuple[str, dict]:
            before = os.stat(folder / rel)
            digest = hashlib.sha256()
            with open(folder / rel, "rb") as fh:
                while chunk := fh.read(_HASH_CHUNK):
                    digest.update(chunk)
                    bar.update(len(chunk))
            after = os.stat(folder / rel)
            if _stat_value(before, "ctime_ns") != _stat_value(after, "ctime_ns"):
                raise ModelIntegrityError(f"{folder / rel} changed while it was being hashed; retry")
            return rel, {"size": after.st_size, "mtime_ns": after.st_mtime_ns,
                         "ctime_ns": after.st_ctime_ns, "sha256": digest.hexdigest()}

        with ThreadPoolExecutor(max_workers=max(1, min(HASH_THREADS, len(files)))) as pool:
            return dict(pool.map(one, files))


def _write_manifest(folder: Path, manifest: dict) -> None:
    """Atomically: a reader sees the old manifest or the new one, never half of one."""
    tmp = folder / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, folder / MANIFEST_NAME)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)
