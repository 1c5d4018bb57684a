"""Decode benchmark (same as `medclaw bench decode`): ours vs qwen-vl-utils fetch_video vs ffmpeg.

    python benchmarks/decode.py VIDEO [--json] [--device cpu|cuda] [--cases coarse,window,sparse]
                                      [--repeat N] [--no-baseline]

Make the reference video first: `medclaw video synth artifacts/bench-10min.mp4 --minutes 10`
(its ground-truth JSON beside it turns on the frame-accuracy check). See
`medclaw/kernels/bench_decode.py` for the cases and the measurement method.
"""
from __future__ import annotations

import argparse
import sys

from medclaw.errors import MedClawError
from medclaw.kernels.bench_decode import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/decode.py",
                                     description=__doc__.splitlines()[0])
    register(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MedClawError as err:
        print(f"decode.py: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
