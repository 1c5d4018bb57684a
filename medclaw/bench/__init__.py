"""Benchmark drivers behind `medclaw bench` (decode, kv, e2e). Each prints one JSON result; the
thin scripts in `benchmarks/` call the same code."""


def print_result(result: dict, out: str | None = None) -> None:
    """Print `result` as indented JSON on stdout and, with `out`, write the same text there
    (its folder made): what each benchmark script ends with."""
    import json
    from pathlib import Path

    text = json.dumps(result, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text)
