"""Engine start on vLLM's CPU build: the model worker in a process of its own (vLLM's CPU default,
what MedClaw runs) against the worker inside the engine-core process (the "uni" executor, which
vLLM's CPU platform accepts only with V1 multiprocessing off). The second saves a process spawn
at every engine start; this measures whether that is worth what it costs in serving (vLLM's CPU
platform warns that its OpenMP set-up needs the worker in a process of its own).

    python benchmarks/engine_start.py [--profile tiny-cpu] [--role video_expert] [--repeat 2]
                                      [--out benchmarks/results/engine-start-cpu.json]

Every start runs in a fresh Python process (imports included, as `medclaw ask` pays them); the two
settings alternate so that both see the same machine load. Each start is followed by 8 concurrent
greedy text requests of 32 tokens, so a setting that starts faster but serves slower shows. Output: one JSON object
(each start's seconds, the requests' wall time and first reply, the medians, and the ratio
in_engine_core / own_process of the median start) on stdout and in --out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from statistics import median

from medclaw.bench import engine_benchmark_parser, parse_engine_benchmark, print_result

SETTINGS = {
    # name: (engine arguments over the profile's, environment)
    "own_process": ({}, {}),                                  # vLLM's CPU default: "mp"
    "in_engine_core": ({"distributed_executor_backend": "uni"},
                       {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
}

CHILD = r"""
import dataclasses, json, sys, time
from medclaw.models.registry import load_models
from medclaw.engine.backends.vllm_local import VLLMBackend
from medclaw.requests.conversation import Conversation
import asyncio

def main():
    profile, role, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spec = load_models(profile=profile)[role]
    spec = dataclasses.replace(spec, extra={**spec.extra, **extra})
    began = time.perf_counter()
    backend = VLLMBackend(spec)
    started = time.perf_counter()
    requests = [Conversation("You are terse.").add_user(f"Name surgical instrument {i}.")
                .to_request(max_tokens=32, temperature=0.0) for i in range(8)]
    served = time.perf_counter()
    results = asyncio.run(backend.generate(requests))
    print(json.dumps({"start_s": started - began, "requests_s": time.perf_counter() - served,
                      "reply_tokens": sum(r.num_completion_tokens for r in results),
                      "reply": results[0].text}))
    backend.shutdown()

if __name__ == "__main__":
    main()
"""


def one_start(profile: str, role: str, setting: str) -> dict:
    extra, env = SETTINGS[setting]
    done = subprocess.run([sys.executable, "-c", CHILD, profile, role, json.dumps(extra)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"engine start ({setting}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = engine_benchmark_parser(__doc__, role="video_expert",
                                     repeat_help="starts per setting (alternating)")
    args, _ = parse_engine_benchmark(parser, argv)

    began = time.time()
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for i in range(args.repeat):
        for name in SETTINGS:
            runs[name].append(one_start(args.profile, args.role, name))
            print(f"{name} #{i + 1}: start {runs[name][-1]['start_s']:.1f} s", file=sys.stderr)
    medians = {name: {"start_s": median(r["start_s"] for r in rows),
                      "requests_s": median(r["requests_s"] for r in rows)}
               for name, rows in runs.items()}
    result = {
        "benchmark": "engine_start", "profile": args.profile, "role": args.role,
        "repeat": args.repeat, "cpus": os.cpu_count(), "runs": runs, "median": medians,
        "start_ratio_in_engine_core_to_own_process":
            medians["in_engine_core"]["start_s"] / medians["own_process"]["start_s"],
        "serving_ratio_in_engine_core_to_own_process":
            medians["in_engine_core"]["requests_s"] / medians["own_process"]["requests_s"],
        "same_greedy_reply": len({r["reply"] for rows in runs.values() for r in rows}) == 1,
        "wall_s": time.time() - began,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
