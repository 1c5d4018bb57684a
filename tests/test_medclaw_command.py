"""The `medclaw` command itself: help is instant (no heavy imports) and the process is offline."""
import subprocess
import sys

import pytest

from medclaw.cli import COMMANDS, main

HEAVY_MODULES = ("torch", "vllm", "transformers", "cv2", "faiss", "sentence_transformers", "av")


def _run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120).stdout


def test_help_does_not_import_heavy_libraries():
    code = (
        "import sys, contextlib, io\n"
        "from medclaw.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
    )
    assert _run_python(code).strip() == "[]"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: medclaw " + command in capsys.readouterr().out


def test_importing_medclaw_sets_offline_environment():
    code = ("import os, medclaw\n"
            "print(os.environ['HF_HUB_OFFLINE'], os.environ['TRANSFORMERS_OFFLINE'],"
            " os.environ['VLLM_NO_USAGE_STATS'], os.environ['DO_NOT_TRACK'])")
    assert _run_python(code).split() == ["1", "1", "1", "1"]


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out
