"""Prefix-cache reuse benchmark; same as `medclaw bench kv` (JSON on stdout with --json).

    python benchmarks/kv.py [--profile tiny-cpu] [--config F] [--json]
"""

import sys

from medclaw.cli import main

if __name__ == "__main__":      # vLLM spawns worker processes: keep the entry point guarded
    sys.exit(main(["bench", "kv", *sys.argv[1:]]))
