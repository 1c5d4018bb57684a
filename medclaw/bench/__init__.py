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


def engine_benchmark_parser(doc: str, *, repeat_help: str, role: str | None = None,
                            role_help: str = "whose engine to start"):
    """The arguments of the engine-start benchmarks (benchmarks/engine_*.py, runtime_start.py):
    --profile, --role when the benchmark starts one role's engine (default `role`), --repeat and
    --out; the description is the first paragraph of the script's `doc`."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--profile", default="tiny-cpu")
    if role is not None:
        parser.add_argument("--role", default=role, help=role_help)
    parser.add_argument("--repeat", type=int, default=2, help=repeat_help)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    return parser


def parse_engine_benchmark(parser, argv: list[str] | None):
    """(arguments, the profile's role → spec): a bad profile, role or repeat count ends in a
    one-line usage error before any engine starts. Every role benchmarked (--role, else an
    episode's roles) must run on a vLLM engine."""
    from medclaw.engine.runtime import EPISODE_ROLES
    from medclaw.errors import MedClawError
    from medclaw.models.registry import load_models

    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    try:
        specs = load_models(profile=args.profile)
    except MedClawError as err:
        parser.error(str(err))
    roles = [args.role] if "role" in args else [r for r in EPISODE_ROLES if r in specs]
    for role in roles:
        if role not in specs or specs[role].backend != "vllm":
            parser.error(f"profile {args.profile}: role {role} runs on no vLLM engine")
    return args, specs
