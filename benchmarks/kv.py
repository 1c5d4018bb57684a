"""Prefix-cache reuse benchmark; same as `medclaw bench kv` (JSON on stdout with --json).

    python benchmarks/kv.py [--profile tiny-cpu] [--config F] [--json]
"""
from __future__ import annotations

import argparse
import sys

from medclaw.engine.bench_kv import register
from medclaw.errors import MedClawError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/kv.py", description=__doc__.splitlines()[0])
    register(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MedClawError as err:
        print(f"kv.py: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":      # vLLM spawns worker processes: keep the entry point guarded
    sys.exit(main())
