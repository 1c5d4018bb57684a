"""The air gap, proven: the socket guard itself (policy, every process, every call), `medclaw
doctor --airgap`, and the commands that load models or start engines — ask, kb build, kb search,
bench kv, demo — with nothing refused. (tests/conftest.py runs every test behind the same guard.)
"""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from medclaw import airgap
from medclaw.cli import main

MEDCLAW = str(Path(sys.executable).with_name("medclaw"))      # the installed console script


@pytest.mark.parametrize("family, address, local", [
    (socket.AF_INET, ("127.0.0.1", 8000), True),
    (socket.AF_INET, ("127.3.2.1", 1), True),
    (socket.AF_INET, ("localhost", 1), True),
    (socket.AF_INET, ("0.0.0.0", 1), True),                       # Linux: this host
    (socket.AF_INET6, ("::1", 1, 0, 0), True),
    (socket.AF_INET6, ("::ffff:127.0.0.1", 1, 0, 0), True),
    (socket.AF_UNIX, "/tmp/engine.sock", True),
    (socket.AF_UNIX, b"\0abstract", True),
    (socket.AF_INET, ("8.8.8.8", 80), False),
    (socket.AF_INET, ("10.0.0.5", 8000), False),                  # the hospital LAN is not loopback
    (socket.AF_INET6, ("2001:4860:4860::8888", 80, 0, 0), False),
    (socket.AF_INET6, ("::ffff:8.8.8.8", 80, 0, 0), False),
    (socket.AF_INET, ("gpu-node-1", 8000), False),                # a name: resolving it may query DNS
    (socket.AF_INET, ("localhost.example.com", 1), False),
])
def test_policy(family, address, local):
    assert airgap.is_local_address(family, address) is local


GUARDED_SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, socket, subprocess, sys

    def udp_out():
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(("8.8.8.8", 80))
        except PermissionError:
            sys.exit(13)

    def refused(call):
        try:
            call()
        except PermissionError:
            return True
        return False

    if __name__ == "__main__":
        out = {"shadowed_sitecustomize": os.environ.get("SHADOWED_RAN")}
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(("localhost", server.getsockname()[1]))
        conn, _ = server.accept()
        client.sendall(b"tcp")
        out["tcp_loopback"] = conn.recv(3).decode()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        udp.sendto(b"udp", udp.getsockname())
        out["udp_loopback"] = udp.recv(3).decode()
        a, b = socket.socketpair()
        a.send(b"unix")
        out["unix"] = b.recv(4).decode()
        out["udp_connect"] = refused(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(("8.8.8.8", 80)))
        out["tcp_connect"] = refused(lambda: socket.create_connection(("10.255.255.1", 80), timeout=5))
        out["connect_ex"] = socket.socket().connect_ex(("192.0.2.1", 80))
        out["sendto"] = refused(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("198.51.100.7", 53)))
        out["lookup"] = refused(lambda: socket.getaddrinfo("updates.example.org", 443))
        child = multiprocessing.get_context("spawn").Process(target=udp_out)
        child.start()
        child.join()
        out["spawn_child_exit"] = child.exitcode
        out["grandchild_exit"] = subprocess.run([sys.executable, "-c",
            "import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"
            ".sendto(b'x', ('2001:4860:4860::8888', 53))"], capture_output=True).returncode
        print(json.dumps(out))
""")


def test_guard_refuses_every_way_out_in_every_process(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(GUARDED_SCRIPT)
    other = tmp_path / "other-site"                    # a sitecustomize that ours shadows still runs
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    log = tmp_path / "airgap.jsonl"
    env = airgap.guarded_env(log, {**os.environ, "PYTHONPATH": str(other)})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == {"shadowed_sitecustomize": "1", "tcp_loopback": "tcp", "udp_loopback": "udp",
                   "unix": "unix", "udp_connect": True, "tcp_connect": True,
                   "connect_ex": errno.EACCES, "sendto": True, "lookup": True,
                   "spawn_child_exit": 13, "grandchild_exit": 1}
    records = airgap.read_log(log)
    refused = sorted((r["call"], r["address"]) for r in records if r["event"] == "violation")
    assert refused == sorted([
        ("connect", "8.8.8.8:80"), ("connect", "8.8.8.8:80"),     # the script and its spawn child
        ("connect", "10.255.255.1:80"), ("connect_ex", "192.0.2.1:80"),
        ("sendto", "198.51.100.7:53"), ("getaddrinfo", "updates.example.org"),
        ("sendto", "[2001:4860:4860::8888]:53")])                 # the grandchild
    guarded = {r["pid"] for r in records if r["event"] == "install"}
    assert {r["pid"] for r in records if r["event"] == "violation"} <= guarded
    assert len(guarded) >= 3
    assert "refused: only loopback is allowed" in done.stderr


def test_the_test_process_itself_is_guarded(monkeypatch, tmp_path):
    assert airgap.installed() and os.environ[airgap.ENV_SWITCH] == "1"
    log = tmp_path / "here.jsonl"          # not the session's log: this violation is on purpose
    monkeypatch.setenv(airgap.ENV_LOG, str(log))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert udp.connect_ex(("203.0.113.9", 9)) == errno.EACCES
    assert [r["address"] for r in airgap.violations(log)] == ["203.0.113.9:9"]


def _doctor_airgap(*command: str, log: Path | None = None, timeout: int = 120):
    argv = [MEDCLAW, "doctor", "--airgap", "--json"] + (["--log", str(log)] if log else []) + ["--", *command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])                      # doctor's line comes after COMMAND's output
    done.stdout = "\n".join(lines[:-1])
    return done, report


def test_doctor_airgap_lists_what_was_refused():
    done, report = _doctor_airgap(sys.executable, "-c", "import socket; "
                                  "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect_ex(('8.8.4.4', 53))")
    assert done.returncode == 1
    assert [(v["call"], v["address"]) for v in report["violations"]] == [("connect_ex", "8.8.4.4:53")]
    assert "1 connection(s) refused" in done.stderr and "connect_ex to 8.8.4.4:53" in done.stderr

    done, report = _doctor_airgap(sys.executable, "-c", "raise SystemExit(5)")
    assert done.returncode == 5 and report["violations"] == []      # the command's own failure
    assert report["guarded_processes"] == 1

    done = subprocess.run([MEDCLAW, "doctor", "--airgap"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "needs a command" in done.stderr


def test_kb_build_and_search_under_the_guard(tmp_path, capsys, airgap_log):
    """In this (guarded) process: loading the sentence encoder and FAISS asks no hub."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ports.md").write_text("# Ports\n\nA trocar is the pointed obturator inside a port.\n")
    (corpus / "clips.md").write_text("# Clips\n\nThe cystic duct is clipped twice before division.\n")
    index = tmp_path / "index"
    assert main(["kb", "build", str(corpus), "--out", str(index), "--json"]) == 0
    capsys.readouterr()
    assert main(["kb", "search", str(index), "what is a trocar", "-k", "1", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 1 and "trocar" in json.dumps(hits)
    assert airgap_log.violations() == []


@pytest.mark.engine
def test_ask_under_the_guard(on_session_engines, tmp_path, synth_video, capsys, airgap_log):
    """A real `medclaw ask` in this guarded process on the session's engines (whose core processes
    this process spawned under the guard). That a fresh CLI process's own engine cores are guarded
    too is checked where one starts them: tests/server/test_serve_cli.py. Before VLLM_HOST_IP was
    pinned to loopback, every engine core process connected a UDP socket to 8.8.8.8 here."""
    rc = main(["ask", str(synth_video.path), "What happens first?", "--json", "--max-steps", "2",
               "--trace-dir", str(tmp_path / "traces")])
    answer = json.loads(capsys.readouterr().out)
    assert rc == 0 and answer["status"] in ("answered", "forced_answer"), answer
    assert airgap_log.violations() == []


class _Shared:
    """A session engine lent to a command that would start (and later shut down) its own."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def shutdown(self):
        pass


@pytest.mark.engine
def test_bench_kv_on_guarded_engines(monkeypatch, capsys, airgap_log, tiny_vlm_spec, vlm_engine,
                                     llm_engine):
    import medclaw.engine.backends.vllm_local as vllm_local

    engines = {tiny_vlm_spec.name: vlm_engine, llm_engine.model_name: llm_engine}
    monkeypatch.setattr(vllm_local, "VLLMBackend", lambda spec: _Shared(engines[spec.name]))
    assert main(["bench", "kv", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["concurrent_requests_ok"] == "16/16"
    assert airgap_log.violations() == []
    # the session engines' core processes run the guard too (they were spawned by this process),
    # and nothing was refused while they started (that happened before this test's own window)
    everything = airgap.read_log(os.environ[airgap.ENV_LOG])
    assert [r for r in everything if r["event"] != "install"] == []
    cores = [r for r in everything if r["event"] == "install" and r["ppid"] == os.getpid()
             and "--multiprocessing-fork" in r["argv"]]
    assert len(cores) >= 2


@pytest.mark.engine
@pytest.mark.slow
def test_demo_on_guarded_engines(on_session_engines, tmp_path, capsys, airgap_log):
    rc = main(["demo", "--out-dir", str(tmp_path / "demo"), "--minutes", "0.5", "--max-steps", "2",
               "--json", "--profile", "tiny-cpu"])
    summary = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and summary["trace"]
    assert (tmp_path / "demo" / "kb" / "manifest.json").is_file()      # the KB was built, guarded
    assert airgap_log.violations() == []


def test_doctor_airgap_allows_exactly_the_configured_endpoints(tmp_path, tiny_models):
    config = tmp_path / "medclaw.yaml"
    config.write_text("models:\n  video_expert: {preset: tiny-vlm, backend: remote, "
                      "endpoints: ['http://10.0.0.5:8000/v1']}\n")
    # UDP connect() sends nothing: it only asks the guard (and the routing table)
    probe = ("import errno, json, socket\n"
             "def try_(host, port):\n"
             "    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:\n"
             "        return s.connect_ex((host, port)) != errno.EACCES\n"
             "print(json.dumps([try_('10.0.0.5', 8000), try_('10.0.0.5', 9000), try_('10.0.0.6', 8000)]))\n")
    argv = [MEDCLAW, "doctor", "--airgap", "--json", "--config", str(config), "--", sys.executable, "-c", probe]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert json.loads(lines[0]) == [True, False, False]
    report = json.loads(lines[-1])
    assert report["allowed"] == ["10.0.0.5:8000"] and done.returncode == 1
    assert sorted(v["address"] for v in report["violations"]) == ["10.0.0.5:9000", "10.0.0.6:8000"]


def test_an_allowed_name_allows_the_addresses_it_resolves_to(tmp_path):
    """A config endpoint given by name: its lookup is allowed, then connects to what it resolved
    to, on the allowed port only. (The resolver is faked: nothing here may query DNS.)"""
    script = textwrap.dedent(f"""
        import errno, json, os, socket, sys
        sys.path.insert(0, {str(Path(airgap.__file__).parents[1])!r})
        def fake_resolver(host, port, *args, **kwargs):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.1.1", port))]
        socket.getaddrinfo = fake_resolver
        os.environ["{airgap.ENV_ALLOW}"] = "gpu-2.hospital.lan:8000"
        from medclaw import airgap
        airgap.install()
        def udp(host, port):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                return s.connect_ex((host, port)) != errno.EACCES
        before = udp("10.1.1.1", 8000)
        socket.getaddrinfo("gpu-2.hospital.lan", 8000)
        try:
            socket.getaddrinfo("gpu-3.hospital.lan", 8000)
            other_lookup = True
        except PermissionError:
            other_lookup = False
        print(json.dumps([before, udp("10.1.1.1", 8000), udp("10.1.1.1", 8001), other_lookup]))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDCLAW_AIRGAP")}
    env["PYTHONPATH"] = ""
    env[airgap.ENV_LOG] = str(tmp_path / "log.jsonl")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert json.loads(done.stdout) == [False, True, False, False], done.stderr


def test_vllm_artifactory_probe_stays_on_loopback(airgap_log):
    """On Hopper/Blackwell GPUs vLLM asks NVIDIA's artifactory whether FlashInfer kernels can be
    downloaded; medclaw points that probe at a closed loopback port (OFFLINE_ENV)."""
    flashinfer = pytest.importorskip("vllm.utils.flashinfer")
    flashinfer.has_nvidia_artifactory.cache_clear()
    if flashinfer.has_flashinfer_cubin():
        pytest.skip("flashinfer-cubin installed: vLLM makes no probe")
    assert flashinfer.FLASHINFER_CUBINS_REPOSITORY.startswith("http://127.0.0.1:")
    assert flashinfer.has_nvidia_artifactory() is False
    assert airgap_log.violations() == []
