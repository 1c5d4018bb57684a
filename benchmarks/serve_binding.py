"""Two `medclaw models serve` on one CPU host: the second on the cores the first leaves free,
against both on vLLM's own binding.

`medclaw models serve` on vLLM's CPU build binds a server started while other vLLM workers run to
the cores they leave free (`serve.bind_to_free_cores`); vLLM's own binding ("auto") puts every
server's model worker on the same first core. This starts two servers of the profile's ROLE model
the way a user would, one command after the other (the second once the first answers
`/health`; `medclaw.bench.routing.start_servers`), then keeps both busy at once: REQUESTS
completions of exactly TOKENS tokens each (`ignore_eos`), sent CONCURRENCY at a time to each.
Once as a user's shell runs them (no `VLLM_CPU_OMP_THREADS_BIND`: "free_cores") and once with
`VLLM_CPU_OMP_THREADS_BIND=auto` for both ("auto", which `serve` leaves alone), alternating, so
that both see the same machine.

    python benchmarks/serve_binding.py [--profile tiny-cpu] [--role orchestrator] [--repeat 2]
                                       [--out benchmarks/results/serve-binding-cpu.json]

Output: one JSON object on stdout (and in --out): per run, the cores each server's model worker is
bound to (read from the processes), the line `serve` printed about it, each server's serving
seconds and the pair's; the median pair serving time per setting and the ratio free_cores / auto.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

from medclaw.bench import engine_benchmark_parser, parse_engine_benchmark, print_result
from medclaw.engine.backends.cpu_binding import BIND_VARIABLE

REQUESTS, TOKENS, CONCURRENCY = 24, 256, 8
NOTE_START = "medclaw: running vLLM workers"      # the line `serve` prints when it binds


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def worker_cores(server) -> list[int]:
    """The cores the model worker below server process `server` is bound to (read, not assumed)."""
    from medclaw.engine.backends.cpu_binding import worker_cores as cores_below

    cores = cores_below(server.pid)
    if cores is None:
        raise SystemExit(f"no vLLM model worker process below server pid {server.pid}")
    return cores


def keep_busy(base_url: str) -> float:
    """Seconds for one server to answer REQUESTS completions of TOKENS tokens, CONCURRENCY at a
    time (`ignore_eos`: the same work under both settings)."""
    with urllib.request.urlopen(f"{base_url}/models", timeout=10) as reply:
        model = json.loads(reply.read())["data"][0]["id"]

    def one(i: int) -> int:
        reply = post_json(f"{base_url}/completions", {
            "model": model, "prompt": f"Describe step {i} of the procedure.",
            "max_tokens": TOKENS, "temperature": 1.0, "ignore_eos": True})
        return reply["usage"]["completion_tokens"]

    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        tokens = list(pool.map(one, range(REQUESTS)))
    if tokens != [TOKENS] * REQUESTS:
        raise SystemExit(f"replies of {sorted(set(tokens))} tokens, not {TOKENS}")
    return time.perf_counter() - started


def one_pair(model_path: str, setting: str, log_dir: Path) -> dict:
    """Two servers started one after the other (as two commands), then both kept busy at once."""
    from medclaw.bench.routing import start_servers, stop_servers

    os.environ.pop(BIND_VARIABLE, None)               # as a user's shell: none
    if setting == "auto":
        os.environ[BIND_VARIABLE] = "auto"            # vLLM's binding, which `serve` leaves alone
    processes, urls, logs = [], [], []
    try:
        for k in range(2):
            logs.append(log_dir / f"{setting}-{k}")
            try:
                started, (url,) = start_servers(model_path, 1, None, str(logs[-1]))
            except RuntimeError as err:               # its log says why: show the end of it
                log = (logs[-1] / "server-0.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{err}\n{log}") from None
            processes += started
            urls.append(url)
        began = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            serve_s = list(pool.map(keep_busy, urls))
        pair_s = time.perf_counter() - began
        notes = [next((line for line in (log / "server-0.log").read_text(errors="replace")
                       .splitlines() if line.startswith(NOTE_START)), None) for log in logs]
        return {"pair_serve_s": pair_s, "servers": [
            {"serve_s": seconds, "worker_cores": worker_cores(process), "note": note}
            for process, seconds, note in zip(processes, serve_s, notes)]}
    finally:
        stop_servers(processes)


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
