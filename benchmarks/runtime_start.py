"""`Runtime.start` on a profile's vLLM engines: together, each on its share of the cores, against
one at a time.

What `medclaw ask`, `medclaw demo` and `medclaw serve` wait for before their first step: every
engine an episode needs. Each run is a fresh Python process (imports included, as the CLI pays
them) that builds the profile's runtime and starts it, once with the engines together (the
default on vLLM's CPU build) and once one at a time (`Runtime(start_together=False)`),
alternating, so that both see the same machine. `VLLM_CPU_OMP_THREADS_BIND` is removed from the
runs' environment, as a user's shell has none.

    python benchmarks/runtime_start.py [--profile tiny-cpu] [--repeat 2]
                                       [--out benchmarks/results/runtime-start-cpu.json]

Output: one JSON object on stdout (and in --out): per run, the whole start's seconds and each
engine's (seconds from the start call to ready, the CPU cores its model worker is bound to, read
from the process); the median start per mode and the ratio together / one at a time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from statistics import median

from medclaw.bench import engine_benchmark_parser, parse_engine_benchmark, print_result

CHILD = r"""
import asyncio, json, sys, time
from medclaw.engine.runtime import EPISODE_ROLES, Runtime
from medclaw.models.registry import load_models

async def start(profile, together):
    specs = load_models(profile=profile)
    runtime = Runtime({role: specs[role] for role in EPISODE_ROLES if role in specs},
                      start_together=together)
    began = time.perf_counter()
    ready = await runtime.start()
    took = time.perf_counter() - began
    await runtime.close()
    return {"start_s": took, "engines": [{"name": r.name, "roles": r.roles, "seconds": r.seconds,
                                          "worker_cores": r.cores} for r in ready]}

if __name__ == "__main__":
    print(json.dumps(asyncio.run(start(sys.argv[1], sys.argv[2] == "together"))))
"""
MODES = ("one_at_a_time", "together")


def one_run(profile: str, mode: str) -> dict:
    from medclaw.engine.backends.cpu_binding import BIND_VARIABLE

    env = {k: v for k, v in os.environ.items() if k != BIND_VARIABLE}
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", CHILD, profile, mode], capture_output=True,
                         text=True, env=env, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"runtime start ({mode}) failed:\n{run.stderr[-3000:]}")
    return {**json.loads(run.stdout.strip().splitlines()[-1]),
            "process_s": time.perf_counter() - began}


def main(argv: list[str] | None = None) -> int:
    parser = engine_benchmark_parser(__doc__, repeat_help="runs per mode (alternating)")
    args, _ = parse_engine_benchmark(parser, argv)           # before any engine starts

    from medclaw.models.train_tiny import machine

    began = time.time()
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for i in range(args.repeat):
        for mode, rows in runs.items():
            rows.append(one_run(args.profile, mode))
            print(f"{mode} #{i + 1}: start {rows[-1]['start_s']:.1f} s, worker cores "
                  f"{[e['worker_cores'] for e in rows[-1]['engines']]}", file=sys.stderr)
    medians = {mode: {"start_s": median(r["start_s"] for r in rows),
                      "process_s": median(r["process_s"] for r in rows)}
               for mode, rows in runs.items()}
    result = {
        "benchmark": "runtime_start", "profile": args.profile, "repeat": args.repeat,
        "command": "python benchmarks/runtime_start.py " + " ".join(argv if argv is not None
                                                                   else sys.argv[1:]),
        "cpus": sorted(os.sched_getaffinity(0)), "machine": machine(), "runs": runs,
        "median": medians,
        "start_ratio_together_to_one_at_a_time":
            medians["together"]["start_s"] / medians["one_at_a_time"]["start_s"],
        "wall_s": time.time() - began,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
