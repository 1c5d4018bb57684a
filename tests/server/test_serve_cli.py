"""`medclaw serve` itself: its checks before any engine starts, and the README recipe run for real
(the tiny-cpu profile's vLLM CPU engines, a job by path, the bearer token file, Ctrl-C)."""
from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from medclaw import airgap
from medclaw.cli import main
from tests.server.conftest import QUESTION, wait_for


def test_serve_refuses_bad_settings_before_any_engine(medclaw_home, tmp_path, capsys):
    busy = socket.create_server(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    config = tmp_path / "medclaw.yaml"
    config.write_text("server:\n  max_upload_mb: -1\n")
    cases = [
        (["--port", str(port), "--data-dir", str(tmp_path / "d1")], f"cannot listen on 127.0.0.1:{port}"),
        (["--allow-root", str(tmp_path / "missing")], "is not a folder"),
        (["--config", str(config)], "max_upload_mb must be > 0"),
        (["--profile", "no-such-profile"], "unknown profile"),
        (["--port", "70000"], "port must be an integer in 0-65535"),
    ]
    try:
        for argv, message in cases:
            started = time.monotonic()
            assert main(["serve", *argv]) == 2, argv
            err = capsys.readouterr().err
            assert message in err and err.count("\n") == 1, (argv, err)
            assert time.monotonic() - started < 20           # nothing was started
    finally:
        busy.close()


@pytest.mark.engine
@pytest.mark.slow
def test_medclaw_serve_runs_a_job_on_the_tiny_engines(medclaw_home, tmp_path, video_root):
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    config = tmp_path / "medclaw.yaml"                 # a short episode: the recipe is under test
    config.write_text("profile: tiny-cpu\nepisode: {max_steps: 2}\n")
    command = [str(Path(sys.executable).with_name("medclaw")), "serve", "--port", "0",
               "--allow-root", str(video_root), "--data-dir", str(data), "--config", str(config)]
    with open(log, "w") as stderr:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                  env={**os.environ, "MEDCLAW_HOME": str(medclaw_home)})
    try:
        url = wait_for(lambda: (m := re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text()))
                       and m.group(0), timeout=120)
        token_file = data / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(data.stat().st_mode) == 0o700

        def healthy():
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(url + "health", timeout=5).json()["status"] == "ok"
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=600, interval=1.0)
        startup = log.read_text()
        # the engines started with the server, before it served anything
        assert len(re.findall(r"engine \S+ \(vllm\) for .*: ready in", startup)) == 2, startup
        # the air gap holds in a fresh CLI process's engine cores too (tests/conftest.py guards
        # every process this test starts; an engine core that skipped the guard logs no install)
        cores = [r for r in airgap.read_log(os.environ[airgap.ENV_LOG])
                 if r["event"] == "install" and r["ppid"] == server.pid
                 and "--multiprocessing-fork" in r["argv"]]
        assert len(cores) >= 2, cores

        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=auth, timeout=60) as client:
            assert httpx.get(url + "api/jobs").status_code == 401
            created = client.post("api/jobs", json={"question": QUESTION,
                                                    "video": str(video_root / "case.mp4")})
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            job = wait_for(lambda: (j := client.get(f"api/jobs/{job_id}").json())["status"]
                           in ("done", "failed") and j, timeout=300, interval=1.0)
            assert job["status"] == "done", job
            view = client.get(f"api/jobs/{job_id}/view").json()["view"]
            assert view["answer"]["status"] in ("answered", "forced_answer")
            assert view["models"]["orchestrator"]["revision"]               # real model identity
            frames = [f for s in view["steps"] for f in s["frames"] if f["shown"]]
            if frames:                       # random weights may pick tools that show no frame
                thumb = client.get(f"api/jobs/{job_id}/frames/{frames[0]['key']}")
                assert thumb.status_code == 200 and thumb.content[:3] == b"\xff\xd8\xff"
        server.send_signal(signal.SIGTERM)                   # how a service manager stops it
        assert server.wait(60) == 0, log.read_text()
        assert "medclaw serve: stopped" in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
