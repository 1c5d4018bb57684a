"""Two vLLM CPU engines at once: which cores their model workers compute on.

vLLM's CPU build binds an engine's model worker to cores it picks itself
(`VLLM_CPU_OMP_THREADS_BIND=auto`: on x86 the first core of the NUMA node, the next one kept for
the engine core's scheduler). Two engines on one machine (the test suite's two workers, or a
runtime's orchestrator and VLM) are then both bound to the same core. This starts two engines at
once, each in a fresh Python process (imports included, as `medclaw ask` pays them), each then
serving REQUESTS sampled requests of up to TOKENS tokens; once with vLLM's binding ("auto") and
once with a core each (`VLLM_CPU_OMP_THREADS_BIND=<core>`, "core_each"), alternating, so that both
see the same machine.

    python benchmarks/engine_binding.py [--profile tiny-cpu] [--role orchestrator] [--repeat 2]
                                        [--out benchmarks/results/engine-binding-cpu.json]

Output: one JSON object on stdout (and in --out): per run, each engine's start and serving
seconds, the cores its model worker process was bound to (read from the process, not assumed),
and the pair's wall time; the medians and the ratio core_each / auto of the median pair wall time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from statistics import median

from medclaw.bench import engine_benchmark_parser, parse_engine_benchmark, print_result

REQUESTS, TOKENS = 24, 256

CHILD = r"""
import asyncio, json, sys, time
from medclaw.models.registry import load_models
from medclaw.engine.backends.vllm_local import VLLMBackend
from medclaw.requests.conversation import Conversation

def main():
    profile, role, requests, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    began = time.perf_counter()
    backend = VLLMBackend(load_models(profile=profile)[role])
    started = time.perf_counter()
    if backend.worker_cores is None:          # read from its model worker (cpu_binding.worker_cores)
        raise SystemExit("no VLLM::Worker process found below the engine core")
    asks = [Conversation("You are terse.").add_user(f"Describe step {i}.")
            .to_request(max_tokens=tokens, temperature=1.0) for i in range(requests)]
    results = asyncio.run(backend.generate(asks))
    print(json.dumps({"start_s": started - began, "serve_s": time.perf_counter() - started,
                      "reply_tokens": sum(r.num_completion_tokens for r in results),
                      "worker_cores": backend.worker_cores}))
    backend.shutdown()

if __name__ == "__main__":
    main()
"""


def binding(setting: str, k: int) -> dict:
    """The environment of engine `k` under `setting` ("core_each": the test suite's choice)."""
    from medclaw.engine.backends.cpu_binding import own_core_binding

    return {"VLLM_CPU_OMP_THREADS_BIND": "auto" if setting == "auto" else own_core_binding(k)}


def one_pair(profile: str, role: str, setting: str) -> dict:
    began = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, profile, role, str(REQUESTS), str(TOKENS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **binding(setting, k)}) for k in range(2)]
    engines = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"engine ({setting}) failed:\n{err[-3000:]}")
        engines.append(json.loads(out.strip().splitlines()[-1]))
    return {"wall_s": time.perf_counter() - began, "engines": engines}


def main(argv: list[str] | None = None) -> int:
    parser = engine_benchmark_parser(__doc__, role="orchestrator",
                                     role_help="whose engine to start, twice",
                                     repeat_help="pairs per setting (alternating)")
    args, _ = parse_engine_benchmark(parser, argv)           # before any engine starts

    from medclaw.models.train_tiny import machine

    began = time.time()
    runs: dict[str, list[dict]] = {"auto": [], "core_each": []}
    for i in range(args.repeat):
        for name, rows in runs.items():
            rows.append(one_pair(args.profile, args.role, name))
            print(f"{name} #{i + 1}: pair {rows[-1]['wall_s']:.1f} s, worker cores "
                  f"{[e['worker_cores'] for e in rows[-1]['engines']]}", file=sys.stderr)
    medians = {name: {"wall_s": median(r["wall_s"] for r in rows),
                      "start_s": median(e["start_s"] for r in rows for e in r["engines"]),
                      "serve_s": median(e["serve_s"] for r in rows for e in r["engines"])}
               for name, rows in runs.items()}
    result = {
        "benchmark": "engine_binding", "profile": args.profile, "role": args.role,
        "repeat": args.repeat, "requests": REQUESTS, "max_tokens": TOKENS,
        "cpus": sorted(os.sched_getaffinity(0)), "machine": machine(), "runs": runs, "median": medians,
        "wall_ratio_core_each_to_auto": medians["core_each"]["wall_s"] / medians["auto"]["wall_s"],
        "wall_s": time.time() - began,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
