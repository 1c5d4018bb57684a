"""Bar chart of a decode benchmark JSON (from `medclaw bench decode --json`).

    python benchmarks/plot_decode.py RESULT.json [OUT.png]      (default: RESULT.png beside it)

One group of bars per case: ours, qwen-vl-utils `fetch_video` and ffmpeg decoding every frame,
in seconds on a log scale, each case labelled with our speedup and frame accuracy. Works on any
subset of the cases; cases run with --no-baseline simply have no baseline bar.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SERIES = (                          # (JSON key, legend label, colour)
    ("ours_s", "MedClaw", "#1b7837"),
    ("baseline_s", "qwen-vl-utils fetch_video", "#c2a5cf"),
    ("ffmpeg_all_s", "ffmpeg, every frame of the range", "#999999"),
)


def load(path: Path) -> dict:
    """The benchmark JSON, or SystemExit with one line saying what is wrong with it."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"plot_decode: cannot read {path}: {err}") from None
    cases = result.get("cases") if isinstance(result, dict) else None
    if not isinstance(cases, dict) or not cases:
        raise SystemExit(f"plot_decode: {path} has no 'cases' (is it `medclaw bench decode "
                         f"--json` output?)")
    return result


def plot(result: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")               # files only: no display on a server
    import matplotlib.pyplot as plt

    cases = list(result["cases"])
    width = 0.8 / len(SERIES)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, (key, label, colour) in enumerate(SERIES):
        xs = [c + (i - 1) * width for c in range(len(cases))]
        ys = [result["cases"][case].get(key) for case in cases]
        points = [(x, y) for x, y in zip(xs, ys) if y]
        if points:
            ax.bar([x for x, _ in points], [y for _, y in points], width, label=label,
                   color=colour)
    labels = []
    for case in cases:
        row = result["cases"][case]
        speedup = f"{row['speedup']:.1f}× vs fetch_video" if row.get("speedup") else "no baseline"
        accuracy = row.get("frame_accuracy")
        labels.append(f"{case} ({row.get('num_frames', '?')} frames)\n{speedup}"
                      + (f"\nframe accuracy {accuracy}" if accuracy is not None else ""))
    ax.set_xticks(range(len(cases)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log scale, lower is better)")
    ax.set_title(f"Decode: {Path(str(result.get('video', '?'))).name} on "
                 f"{result.get('device', '?')}")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or len(argv) > 2:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    source = Path(argv[0])
    out = Path(argv[1]) if len(argv) == 2 else source.with_suffix(".png")
    print(plot(load(source), out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
