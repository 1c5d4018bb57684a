"""Two `medclaw models serve` on one CPU host: the second on the cores the first leaves free,
against both on vLLM's own binding.

`medclaw models serve` on vLLM's CPU build binds a server started while other vLLM workers run to
the cores they leave free (`serve.bind_to_free_cores`); vLLM's own binding ("auto") puts every
server's model worker on the same first core. This starts two servers of the profile's ROLE model
the way a user would, one command after the other (the second once the first answers
`/health`), then keeps both busy at once: REQUESTS completions of exactly TOKENS tokens each
(`ignore_eos`), sent CONCURRENCY at a time to each. Once as a user's shell runs them (no
`VLLM_CPU_OMP_THREADS_BIND`: "free_cores") and once with `VLLM_CPU_OMP_THREADS_BIND=auto` for both
("auto", which `serve` leaves alone), alternating, so that both see the same machine.

    python benchmarks/serve_binding.py [--profile tiny-cpu] [--role orchestrator] [--repeat 2]
                                       [--out benchmarks/results/serve-binding-cpu.json]

Output: one JSON object on stdout (and in --out): per run, the cores each server's model worker is
bound to (read from the processes), the line `serve` printed about it, each server's serving
seconds and the pair's; the median pair serving time per setting and the ratio free_cores / auto.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

from medclaw.bench import engine_benchmark_parser, parse_engine_benchmark, print_result

REQUESTS, TOKENS, CONCURRENCY = 24, 256, 8
START_TIMEOUT_S = 600
BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


class Server:
    """One `medclaw models serve MODEL` in a process group of its own, its stderr in a file."""

    def __init__(self, model_path: str, env: dict, log_dir: Path, k: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"server-{k}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("medclaw")), "models", "serve", model_path,
                 "--port", str(self.port)],                      # the venv's command, as a user's
                stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"server exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"server did not start in {START_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def binding_note(self) -> str | None:
        lines = [line for line in self.log.read_text(errors="replace").splitlines()
                 if line.startswith("medclaw: running vLLM workers")]
        return lines[0] if lines else None

    def worker_cores(self) -> list[int]:
        import psutil

        from medclaw.engine.backends.cpu_binding import WORKER_TITLE

        workers = [p for p in psutil.Process(self.process.pid).children(recursive=True)
                   if " ".join(p.cmdline()).startswith(WORKER_TITLE)]
        if not workers:
            raise SystemExit(f"no {WORKER_TITLE} process below server {self.url}")
        return sorted({core for worker in workers for core in worker.cpu_affinity()})

    def serve(self) -> float:
        """Seconds to answer REQUESTS completions of TOKENS tokens, CONCURRENCY at a time."""
        model = get_json(f"{self.url}/v1/models")["data"][0]["id"]

        def one(i: int) -> int:
            reply = get_json(f"{self.url}/v1/completions", {
                "model": model, "prompt": f"Describe step {i} of the procedure.",
                "max_tokens": TOKENS, "temperature": 1.0, "ignore_eos": True})
            return reply["usage"]["completion_tokens"]

        started = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            tokens = list(pool.map(one, range(REQUESTS)))
        if tokens != [TOKENS] * REQUESTS:           # the same work under both settings
            raise SystemExit(f"replies of {sorted(set(tokens))} tokens, not {TOKENS}")
        return time.perf_counter() - started

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def one_pair(model_path: str, setting: str, log_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != BIND_VARIABLE}
    if setting == "auto":
        env[BIND_VARIABLE] = "auto"
    servers: list[Server] = []
    try:
        for k in range(2):                            # one command after the other, as a user
            servers.append(Server(model_path, env, log_dir, k))
            servers[-1].wait_healthy()
        started = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:           # both busy at once
            serve_s = list(pool.map(Server.serve, servers))
        pair_s = time.perf_counter() - started
        return {"pair_serve_s": pair_s, "servers": [
            {"serve_s": s_, "worker_cores": server.worker_cores(), "note": server.binding_note()}
            for server, s_ in zip(servers, serve_s)]}
    finally:
        for server in servers:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = engine_benchmark_parser(__doc__, role="orchestrator",
                                     role_help="whose model both servers serve",
                                     repeat_help="pairs per setting (alternating)")
    args, specs = parse_engine_benchmark(parser, argv)       # before any server starts

    from medclaw.models.serve import vllm_is_cpu_build
    from medclaw.models.train_tiny import machine

    if not vllm_is_cpu_build():
        parser.error("this benchmark is about vLLM's CPU build (`make install`)")
    began = time.time()
    runs: dict[str, list[dict]] = {"auto": [], "free_cores": []}
    with tempfile.TemporaryDirectory(prefix="serve-binding-") as logs:
        for i in range(args.repeat):
            for name, rows in runs.items():
                rows.append(one_pair(specs[args.role].path, name, Path(logs)))
                print(f"{name} #{i + 1}: both serving {rows[-1]['pair_serve_s']:.1f} s, worker "
                      f"cores {[s['worker_cores'] for s in rows[-1]['servers']]}", file=sys.stderr)
    medians = {name: median(r["pair_serve_s"] for r in rows) for name, rows in runs.items()}
    result = {
        "benchmark": "serve_binding", "profile": args.profile, "role": args.role,
        "repeat": args.repeat, "requests_per_server": REQUESTS, "max_tokens": TOKENS,
        "concurrency": CONCURRENCY, "cpus": sorted(os.sched_getaffinity(0)), "machine": machine(),
        "runs": runs, "median_pair_serve_s": medians,
        "ratio_free_cores_to_auto": medians["free_cores"] / medians["auto"],
        "wall_s": time.time() - began,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
