"""`medclaw video synth|probe` through the real `medclaw.cli.main` (only the video group loaded)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import medclaw.cli as cli


@pytest.fixture(autouse=True)
def _video_group_only(monkeypatch, tmp_path):
    # Other groups are built in parallel by other modules; this test exercises ours alone.
    monkeypatch.setitem(cli.__dict__, "COMMANDS", {"video": cli.COMMANDS["video"]})
    monkeypatch.setenv("MEDCLAW_HOME", str(tmp_path / "home"))


def test_synth_then_probe(tmp_path, capsys):
    out = tmp_path / "clip.mp4"
    rc = cli.main(["video", "synth", str(out), "--minutes", "0.25", "--seed", "3",
                   "--width", "160", "--height", "90", "--fps", "20"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert str(out) in printed and str(out.with_suffix(".json")) in printed
    gt = json.loads(out.with_suffix(".json").read_text())
    assert gt["num_frames"] == 300 and gt["seed"] == 3

    assert cli.main(["video", "probe", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_frames"] == 300 and info["fps"] == pytest.approx(20.0)
    assert (info["width"], info["height"]) == (160, 90)

    assert cli.main(["video", "probe", str(out)]) == 0
    table = capsys.readouterr().out
    assert "300" in table and "h264" in table and info["sha256"] in table


def test_synth_json_summary(tmp_path, capsys):
    out = tmp_path / "s.mp4"
    assert cli.main(["video", "synth", str(out), "--minutes", "0.2", "--width", "128",
                     "--height", "72", "--fps", "10", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_frames"] == 120 and summary["video"] == str(out)


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 1000)
    assert cli.main(["video", "probe", str(junk)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medclaw: error:") and "junk.mp4" in err and "\n" not in err

    assert cli.main(["video", "synth", str(tmp_path / "x.mp4"), "--minutes", "1",
                     "--width", "161"]) == 2
    err = capsys.readouterr().err.strip()
    assert "even" in err and "\n" not in err and "Traceback" not in err


def test_group_without_subcommand_prints_help(capsys):
    assert cli.main(["video"]) == 2
    assert "synth" in capsys.readouterr().out


def test_cli_module_import_is_light():
    code = ("import sys, medclaw.cli.video; "
            "print(sorted(m for m in ('numpy', 'av', 'torch', 'PIL') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
