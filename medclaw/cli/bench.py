"""`medclaw bench …`: benchmarks that print JSON. Each one is also runnable from `benchmarks/`."""
from __future__ import annotations

import argparse
import importlib

# name → (module:function that adds the subparser, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "decode": ("medclaw.bench.decode:register",
               "decode speed / memory / frame accuracy vs qwen-vl-utils and ffmpeg"),
    "kv": ("medclaw.bench.kv:register",
           "prefix-cache reuse across questions, stages and turns on the configured preset"),
    "routing": ("medclaw.bench.routing:register",
                "prefix-cache hit rate over several vLLM servers: cache-aware vs least-in-flight"),
    "e2e": ("medclaw.bench.e2e:register",
            "end-to-end episodes: sequential vs concurrent throughput on shared engines"),
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    subparsers = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, (target, help_text) in BENCHMARKS.items():
        module_name, function_name = target.split(":")
        add = getattr(importlib.import_module(module_name), function_name)
        add(subparsers.add_parser(name, help=help_text, description=help_text))
