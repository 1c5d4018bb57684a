"""Wrong frames per decoder on every archive format of `medclaw.synth.formats`.

    python benchmarks/formats.py [--out FILE.json] [--folder DIR]

Builds each small barcoded format with ffmpeg (skipping, with the reason, those this ffmpeg cannot
encode), then runs `medclaw bench decode --check-all`'s comparison (`bench.decode.check_all`) on
its sparse and coarse cases: every frame returned through `FrameSource` and by each raw decoder
is compared with a sequential reference decode. JSON on stdout (and in --out): {format: {case:
{"checked_frames", "wrong_frames": {decoder: count or "error: …"}}}}. FrameSource must show 0
everywhere; the raw counts are what its pts check protects against.
"""
from __future__ import annotations

import argparse
import sys
import tempfile


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--folder", default=None, help="where to build the videos (default: temp)")
    args = parser.parse_args(argv)

    from medclaw.bench import print_result
    from medclaw.bench.decode import check_all
    from medclaw.kernels.probe import probe_video
    from medclaw.synth.formats import FORMATS, make_format, missing_encoder

    folder = args.folder or tempfile.mkdtemp(prefix="medclaw-formats-")
    result = {}
    for name in FORMATS:
        why = missing_encoder(name)
        if why:
            result[name] = {"skipped": why}
            continue
        path = make_format(name, folder)
        info = probe_video(path)
        result[name] = {"num_frames": info.num_frames, "codec": info.codec,
                        **check_all(str(path), info, ("sparse", "coarse"))}
        print(f"{name}: {result[name]['sparse']['wrong_frames']}", file=sys.stderr)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
