"""Decode benchmark (same as `medclaw bench decode`): ours vs qwen-vl-utils fetch_video vs ffmpeg.

    python benchmarks/decode.py VIDEO [--json] [--device cpu|cuda] [--cases coarse,window,sparse]
                                      [--repeat N] [--no-baseline]

Make the reference video first: `medclaw video synth artifacts/bench-10min.mp4 --minutes 10`
(its ground-truth JSON beside it turns on the frame-accuracy check). See
`medclaw/bench/decode.py` for the cases and the measurement method.
"""

import sys

from medclaw.cli import main

if __name__ == "__main__":      # vLLM spawns worker processes: keep the entry point guarded
    sys.exit(main(["bench", "decode", *sys.argv[1:]]))
