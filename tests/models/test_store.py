"""Local model store: import (link / copy), manifest, revisions, verification, errors."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from medclaw.errors import ConfigError, ModelNotFoundError
from medclaw.models import store


@pytest.fixture
def src(medclaw_home, tmp_path):
    """A private copy of the tiny LLM folder, safe to modify."""
    folder = tmp_path / "src-llm"
    shutil.copytree(medclaw_home / "tiny" / "llm", folder)
    return folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_models_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MEDCLAW_MODELS_DIR", raising=False)
    monkeypatch.setenv("MEDCLAW_HOME", str(tmp_path / "h"))
    assert store.models_dir() == tmp_path / "h" / "models"
    monkeypatch.setenv("MEDCLAW_MODELS_DIR", str(tmp_path / "m"))
    assert store.models_dir() == tmp_path / "m"


def test_import_links_files_and_writes_manifest(src):
    dest = store.import_model("tiny-orch", src, progress=False)
    assert dest == store.models_dir() / "tiny-orch"
    assert (dest / "model.safetensors").is_symlink()
    manifest = json.loads((dest / store.MANIFEST_NAME).read_text())
    assert manifest["mode"] == "link" and manifest["source"] == str(src.resolve())
    expected = sorted(p.name for p in src.iterdir())
    assert sorted(manifest["files"]) == expected
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == _sha(src / rel)
    assert store.revision_hash(dest) == manifest["revision"]
    assert store.list_stored() == ["tiny-orch"]
    assert store.verify_model("tiny-orch", progress=False).ok


def test_copy_mode_copies(src):
    dest = store.import_model("tiny-copy", src, copy=True, progress=False)
    assert not (dest / "model.safetensors").is_symlink()
    assert _sha(dest / "model.safetensors") == _sha(src / "model.safetensors")
    assert store.revision_hash(dest) == store.revision_hash(src)   # same bytes, same revision


def test_revision_changes_when_a_file_changes(src):
    dest = store.import_model("tiny-orch", src, progress=False)
    plain_before, stored_before = store.revision_hash(src), store.revision_hash(dest)
    config = json.loads((src / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (src / "config.json").write_text(json.dumps(config))
    assert store.revision_hash(src) != plain_before
    assert store.revision_hash(dest) != stored_before               # stale manifest is not trusted
    report = store.verify_model("tiny-orch", progress=False)
    assert not report.ok and report.changed == ["config.json"]


def test_fingerprint_of_big_files_sees_the_tail(src, monkeypatch):
    monkeypatch.setattr(store, "FINGERPRINT_FULL_LIMIT", 1024)
    monkeypatch.setattr(store, "FINGERPRINT_EDGE", 256)
    before = store.revision_hash(src)
    weights = src / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))     # same size and mtime: no stat cache hit
    store._FINGERPRINTS.clear()
    assert store.revision_hash(src) != before


def test_verify_reports_missing_files(src):
    store.import_model("tiny-copy", src, copy=True, progress=False)
    (store.models_dir() / "tiny-copy" / "generation_config.json").unlink()
    report = store.verify_model("tiny-copy", progress=False)
    assert report.missing == ["generation_config.json"] and not report.ok


def test_import_refuses_duplicates_unless_forced(src):
    store.import_model("tiny-orch", src, progress=False)
    with pytest.raises(ConfigError, match="--force"):
        store.import_model("tiny-orch", src, progress=False)
    store.import_model("tiny-orch", src, copy=True, force=True, progress=False)
    assert json.loads((store.models_dir() / "tiny-orch" / store.MANIFEST_NAME).read_text())["mode"] == "copy"


@pytest.mark.parametrize("remove, problem", [
    ("config.json", "no config.json"),
    ("model.safetensors", "no weights"),
    ("tokenizer.json", "no tokenizer"),
])
def test_invalid_folder_is_model_not_found_with_import_hint(src, remove, problem):
    (src / remove).unlink()
    if remove == "tokenizer.json":
        (src / "tokenizer_config.json").unlink()
    with pytest.raises(ModelNotFoundError) as err:
        store.import_model("broken", src, progress=False)
    assert problem in str(err.value)
    assert "medclaw models import broken /path/to/folder" in str(err.value)
    assert not (store.models_dir() / "broken").exists()


def test_bad_names_and_unknown_models(medclaw_home):
    with pytest.raises(ConfigError, match="invalid model name"):
        store.store_path("../escape")
    with pytest.raises(ModelNotFoundError, match="medclaw models import ghost"):
        store.verify_model("ghost")
