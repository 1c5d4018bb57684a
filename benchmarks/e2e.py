"""End-to-end episode benchmark; same as `medclaw bench e2e` (JSON on stdout with --json).

    python benchmarks/e2e.py [--profile tiny-cpu] [--config F] [--questions 8] [--concurrency 4]
                             [--minutes 2] [--max-steps 6] [--no-prefix-caching-compare]
                             [--out-dir DIR] [--json]

Sequential vs concurrent episodes on shared engines, the one-shot baseline, prefix caching off;
time to first token and per-tool latency; see `medclaw/bench/e2e.py`.
"""

import sys

from medclaw.cli import main

if __name__ == "__main__":      # vLLM spawns worker processes: keep the entry point guarded
    sys.exit(main(["bench", "e2e", *sys.argv[1:]]))
