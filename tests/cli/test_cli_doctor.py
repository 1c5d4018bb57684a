"""`medclaw doctor` (the report): offline settings, devices, decoders, models; exit 1 when a
required check fails. (`doctor --airgap` is tested in tests/test_airgap.py.)"""
from __future__ import annotations

import json
import os

import pytest

from medclaw.cli import doctor, main
from medclaw.models import store


def _report(capsys, *argv) -> tuple[int, dict]:
    rc = main(["doctor", "--json", *argv])
    report = json.loads(capsys.readouterr().out)
    return rc, {(c["section"], c["name"]): c for c in report["checks"]}


@pytest.fixture
def no_gpu_probe(monkeypatch):
    """The CUDA probe (a child interpreter importing torch) is covered once; skip it elsewhere."""
    monkeypatch.setattr(doctor, "_probe_cuda", lambda: {"torch": "x", "available": False, "devices": []})


def test_report_on_the_tiny_profile(medclaw_home, capsys):
    rc, checks = _report(capsys)
    assert rc == 0
    assert checks[("offline", "VLLM_HOST_IP")]["status"] == "ok"
    assert checks[("offline", "HF_HUB_OFFLINE")]["detail"] == "=1"
    assert checks[("offline", "air-gap guard")]["status"] == "ok"
    assert checks[("devices", "cpu")]["detail"].startswith(f"{os.cpu_count()} cores")
    cuda = [c for (section, name), c in checks.items() if section == "devices" and name.startswith("cuda")]
    assert cuda and all(c["status"] in ("ok", "warn") for c in cuda)
    assert checks[("decoders", "cpu")]["status"] == "ok" and "auto = " in checks[("decoders", "cpu")]["detail"]
    for role in ("orchestrator", "video_expert", "frame_verifier", "judge", "encoder"):
        assert checks[("models", role)]["status"] == "warn"          # tiny folders are not imported
        assert "not imported" in checks[("models", role)]["detail"]


def test_offline_setting_undone_is_a_failure(medclaw_home, monkeypatch, capsys, no_gpu_probe):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    rc, checks = _report(capsys)
    assert rc == 1 and checks[("offline", "HF_HUB_OFFLINE")]["status"] == "FAIL"


def test_no_cpu_decoder_is_a_failure(medclaw_home, monkeypatch, capsys, no_gpu_probe):
    import medclaw.kernels.decoders as decoders

    monkeypatch.setattr(decoders, "available_decoders", lambda device="cpu": [])
    rc, checks = _report(capsys)
    assert rc == 1 and checks[("decoders", "cpu")]["status"] == "FAIL"
    assert "none usable" in checks[("decoders", "cpu")]["detail"]


def test_models_imported_intact_and_tampered(medclaw_home, capsys, no_gpu_probe):
    store.import_model("orch", medclaw_home / "tiny" / "llm", copy=True, progress=False)
    store.import_model("spare", medclaw_home / "tiny" / "llm", copy=True, progress=False)
    rc, checks = _report(capsys, "--model", "orchestrator=orch")
    assert rc == 0 and checks[("models", "orchestrator")]["status"] == "ok"
    assert checks[("models", "orchestrator")]["detail"].startswith("orch rev ")
    assert checks[("models", "store: spare")]["status"] == "ok"

    os.utime(store.models_dir() / "spare" / "config.json")           # unused model: a warning
    os.utime(store.models_dir() / "orch" / "config.json")            # the profile's: a failure
    rc, checks = _report(capsys, "--model", "orchestrator=orch")
    assert rc == 1 and checks[("models", "profile")]["status"] == "FAIL"
    assert "does not match its import manifest" in checks[("models", "profile")]["detail"]
    rc, checks = _report(capsys)
    assert rc == 0 and checks[("models", "store: orch")]["status"] == "warn"


def test_text_report_and_stray_arguments(medclaw_home, capsys, no_gpu_probe):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("offline:\n") and "decoders:\n" in out and "all required checks passed" in out
    assert main(["doctor", "--", "echo", "hi"]) == 2
    assert "only with --airgap" in capsys.readouterr().err
