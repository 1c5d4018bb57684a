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
    linked = store.import_model("tiny-link", src, progress=False)
    revision = store.revision_hash(dest)
    assert revision == store.revision_hash(linked)                 # same bytes, same revision
    # the revision is the manifest's digest: SHA-256 over (file, size, file SHA-256)
    lines = "".join(f"{rel}\0{(src / rel).stat().st_size}\0{_sha(src / rel)}\n"
                    for rel in sorted(p.name for p in src.iterdir()))
    assert revision == hashlib.sha256(lines.encode()).hexdigest()
    # a folder that was never imported has no manifest to cite: its revision says so
    assert store.revision_hash(src).startswith(store.UNIMPORTED_PREFIX)


def test_changed_file_refuses_the_load_until_reimported(src):
    dest = store.import_model("tiny-orch", src, progress=False)
    plain_before = store.revision_hash(src)
    config = json.loads((src / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (src / "config.json").write_text(json.dumps(config))           # the link's target changes
    assert store.revision_hash(src) != plain_before
    with pytest.raises(store.ModelIntegrityError) as err:
        store.revision_hash(dest)
    message = str(err.value)
    assert "\n" not in message and "config.json changed since import" in message
    assert "medclaw models verify tiny-orch" in message
    report = store.verify_model("tiny-orch", progress=False)
    assert not report.ok and report.changed == ["config.json"]
    store.import_model("tiny-orch", src, force=True, progress=False)
    assert not store.revision_hash(dest).startswith(store.UNIMPORTED_PREFIX)


def _flip_middle_byte(path: Path, keep_mtime: bool = True) -> None:
    """Flip one byte in the middle of `path`, in place, then put its mtime back."""
    stat = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(stat.st_size // 2)
        byte = fh.read(1)
        fh.seek(stat.st_size // 2)
        fh.write(bytes([byte[0] ^ 0x01]))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


def test_one_flipped_byte_in_a_weight_file_is_refused_at_load_and_found_by_verify(src, monkeypatch):
    # a second weight shard well past the fingerprint's edges (first and last MiB)
    rng = __import__("random").Random(0)
    (src / "model-00002-of-00002.safetensors").write_bytes(rng.randbytes(24 << 20))
    dest = store.import_model("tiny-big", src, copy=True, progress=False)
    revision = store.revision_hash(dest)
    shard = dest / "model-00002-of-00002.safetensors"
    edges_before = store._fingerprint(shard, shard.stat().st_size)
    _flip_middle_byte(shard)                   # size and mtime unchanged: only ctime moves
    # a sampling check would not see it; the full hash does
    assert store._fingerprint(shard, shard.stat().st_size) == edges_before
    with pytest.raises(store.ModelIntegrityError, match="model-00002-of-00002.safetensors changed"):
        store.revision_hash(dest)
    with pytest.raises(store.ModelIntegrityError):                  # and before any engine starts
        store.check_model_folder(dest, "tiny-big")
    report = store.verify_model("tiny-big", progress=False)
    assert not report.ok and report.changed == ["model-00002-of-00002.safetensors"]
    assert report.revision == revision and report.num_bytes > 24 << 20

    # verify hashes every byte, not the stat signature: with the stat check fooled (ctime
    # forged, as a raw disk edit would), the load passes but verify still finds the flip
    weights = dest / "model.safetensors"
    _flip_middle_byte(weights)
    manifest = json.loads((dest / store.MANIFEST_NAME).read_text())
    for rel in manifest["files"]:
        manifest["files"][rel]["ctime_ns"] = (dest / rel).stat().st_ctime_ns
    (dest / store.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert store.revision_hash(dest) == revision
    assert store.verify_model("tiny-big", progress=False).changed == [
        "model-00002-of-00002.safetensors", "model.safetensors"]


def test_verify_refreshes_stat_signatures_when_bytes_match(src):
    dest = store.import_model("tiny-copy", src, copy=True, progress=False)
    revision = store.revision_hash(dest)
    os.utime(dest / "config.json")                                 # touched, not changed
    with pytest.raises(store.ModelIntegrityError):
        store.revision_hash(dest)
    report = store.verify_model("tiny-copy", progress=False)
    assert report.ok and report.refreshed == ["config.json"]
    assert store.revision_hash(dest) == revision                   # loads again, same revision


def test_added_file_is_refused(src):
    dest = store.import_model("tiny-copy", src, copy=True, progress=False)
    (dest / "model-extra.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(store.ModelIntegrityError, match="model-extra.safetensors was added"):
        store.revision_hash(dest)
    report = store.verify_model("tiny-copy", progress=False)
    assert not report.ok and report.unexpected == ["model-extra.safetensors"]


def test_fingerprint_of_big_files_sees_the_tail(src, monkeypatch):
    monkeypatch.setattr(store, "FINGERPRINT_FULL_LIMIT", 1024)
    monkeypatch.setattr(store, "FINGERPRINT_EDGE", 256)
    before = store.revision_hash(src)
    weights = src / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))     # same size and mtime (ctime moves)
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


def test_models_verify_command_names_the_flipped_file(src, capsys):
    from medclaw.cli import main

    store.import_model("tiny-cli", src, copy=True, progress=False)
    assert main(["models", "verify", "tiny-cli"]) == 0
    capsys.readouterr()
    _flip_middle_byte(store.models_dir() / "tiny-cli" / "model.safetensors")
    assert main(["models", "resolve", "--model", "judge=tiny-cli"]) == 2   # refused at resolution
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "does not match its import manifest" in err
    assert main(["models", "verify", "tiny-cli"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["changed"] == ["model.safetensors"]
    assert "model.safetensors" in captured.err.strip().splitlines()[-1]
