"""`medclaw models …` through the real entry point (`medclaw.cli.main`)."""
from __future__ import annotations

import json

from medclaw.cli import main


def test_make_tiny_builds_loadable_folders(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEDCLAW_HOME", str(tmp_path / "home"))
    assert main(["models", "make-tiny", str(tmp_path / "tiny"), "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seed"] == 3
    for key in ("vlm", "llm"):
        assert (tmp_path / "tiny" / key / "model.safetensors").is_file()
        assert out[key] == str(tmp_path / "tiny" / key)


def test_import_verify_list_resolve(medclaw_home, capsys):
    assert main(["models", "import", "qwen2.5-vl-7b", str(medclaw_home / "tiny" / "vlm")]) == 0
    imported = json.loads(capsys.readouterr().out)
    assert imported["path"].endswith("models/qwen2.5-vl-7b") and len(imported["revision"]) == 64

    assert main(["models", "verify", "qwen2.5-vl-7b"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    assert main(["models", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["presets"]["qwen2.5-vl-7b"]["present"] is True
    assert listing["presets"]["qwen2.5-vl-72b"]["present"] is False
    assert listing["imported"] == ["qwen2.5-vl-7b"]
    assert "tiny-cpu" in listing["profiles"]

    assert main(["models", "resolve", "--model", "judge=tiny-vlm"]) == 0
    specs = json.loads(capsys.readouterr().out)
    assert specs["judge"]["name"] == "tiny-vlm" and specs["orchestrator"]["name"] == "tiny-llm"


def test_user_errors_are_one_line_exit_2(medclaw_home, tmp_path, capsys):
    assert main(["models", "import", "x", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medclaw: error:") and "\n" not in err
    assert "medclaw models import x /path/to/folder" in err
    assert main(["models", "resolve", "--profile", "qwen-7b"]) == 2
    assert "medclaw models import qwen2.5-7b" in capsys.readouterr().err
