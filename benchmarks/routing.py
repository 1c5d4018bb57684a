"""Cache-aware routing benchmark; same as `medclaw bench routing` (JSON on stdout with --json).

    python benchmarks/routing.py [--servers 2] [--episodes 8] [--json]
"""

import sys

from medclaw.cli import main

if __name__ == "__main__":      # vLLM spawns worker processes: keep the entry point guarded
    sys.exit(main(["bench", "routing", *sys.argv[1:]]))
