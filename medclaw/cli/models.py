"""`medclaw models …`: list presets/profiles, build tiny checkpoints, import and verify weights.

    medclaw models list [--json]
    medclaw models resolve [--config FILE] [--profile NAME] [--model ROLE=PRESET_OR_PATH ...]
    medclaw models make-tiny [DIR] [--seed N]
    medclaw models train-tiny OUT [--seed N] [--steps N]
    medclaw models train-distiller OUT [--orchestrator DIR] [--seed N]
    medclaw models import NAME SRC [--copy] [--force]
    medclaw models verify NAME
    medclaw models plan [PROFILE] [--gpus 4x80GB] [--concurrency N] [--decode-device cuda] [--json]
    medclaw models serve NAME [--host H] [--port P] [--tensor-parallel-size N]
                              [--data-parallel-size N] [--role ROLE] [--dry-run] [vLLM args …]

Also exports `add_model_arguments(parser)` / `models_from_args(args)` so that other commands
(`ask`, `eval`, `demo`, …) take the same `--config/--profile/--model` flags.
Top level is argparse only; everything heavy is imported inside the handlers.
"""
from __future__ import annotations

import argparse
import json
import sys

ROLES_FOR_SERVE = ("orchestrator", "video_expert", "frame_verifier", "judge")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The shared model-selection flags: --config, --profile, --model ROLE=PRESET_OR_PATH."""
    parser.add_argument("--config", metavar="FILE", help="YAML config (profile:, models:, …)")
    parser.add_argument("--profile", metavar="NAME",
                        help="deployment profile (default: the config's, else tiny-cpu)")
    parser.add_argument("--model", metavar="ROLE=PRESET_OR_PATH", action="append", default=[],
                        help="put a preset, an imported model or a local folder in a role (repeatable)")


def models_from_args(args: argparse.Namespace) -> dict:
    """{role: ModelSpec} from the flags added by `add_model_arguments`."""
    from medclaw.models.registry import load_models, parse_overrides

    return load_models(args.config, profile=args.profile, overrides=parse_overrides(args.model))


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND")

    p = sub.add_parser("list", help="profiles and presets, and which weights are present locally")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
    p.set_defaults(handler=_list)

    p = sub.add_parser("resolve", help="show the ModelSpec of every role (JSON)")
    add_model_arguments(p)
    p.set_defaults(handler=_resolve)

    p = sub.add_parser("make-tiny", help="build the tiny random-weight checkpoints (no download)")
    p.add_argument("dir", nargs="?", help="output folder (default: $MEDCLAW_HOME/tiny)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_make_tiny)

    p = sub.add_parser("train-tiny", help="train the miniature (tiny-trained profile) on synthetic procedures (CPU)",
                       description="Render synthetic procedures with content worth zooming into, train a "
                       "tiny Qwen2.5-VL on the frame and region descriptions the frame tools ask for "
                       "and, at the same time on the second core, a tiny orchestrator by imitation of a "
                       "scripted expert (transformers + accelerate, CPU, about 20 minutes on 2 cores); "
                       "score both on held-out seeds and write OUT/vlm, OUT/llm, "
                       "OUT/train-report.json and OUT/MANIFEST.sha256.")
    p.add_argument("out", help="output folder (must not exist or be empty)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default 0, the committed one)")
    p.add_argument("--steps", type=int, default=None,
                   help="the VLM's optimiser steps (default: the recipe's; the orchestrator's are fixed)")
    p.set_defaults(handler=_train_tiny)

    p = sub.add_parser("train-distiller", help="fine-tune the miniature's orchestrator to review episodes "
                       "for `medclaw distill` (CPU)",
                       description="Play synthetic zoom episodes that end right, misread, missed or "
                       "looked at the wrong time; let a scripted reviewer diagnose each (A/B/C) and write "
                       "the lesson of each A as a skill, through distillation's own prompts and "
                       "skill_manage tool; fine-tune a copy of the orchestrator on those replies and score "
                       "it on held-out seeds (transformers, one thread, about 30 minutes). Writes the "
                       "model folder OUT with OUT/distiller-report.json and OUT/MANIFEST.sha256.")
    p.add_argument("out", help="output folder (must not exist or be empty)")
    p.add_argument("--orchestrator", default=None,
                   help="the orchestrator folder to start from (default: the committed tiny-trained one)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default 0, the committed one)")
    p.set_defaults(handler=_train_distiller)

    p = sub.add_parser("import", help="import a local model folder into the store")
    p.add_argument("name", help="preset or model name, e.g. qwen2.5-vl-7b")
    p.add_argument("src", help="folder with config.json, weights and tokenizer files")
    p.add_argument("--copy", action="store_true", help="copy the files (default: symlink them)")
    p.add_argument("--force", action="store_true", help="replace an existing model of that name")
    p.set_defaults(handler=_import)

    p = sub.add_parser("verify", help="re-hash every byte of a stored model against its manifest")
    p.add_argument("name")
    p.set_defaults(handler=_verify)

    p = sub.add_parser("plan", help="GPU memory plan: where each role's engine goes, or why it cannot",
                       description="Add up weights (quantised where set), KV cache for max_model_len x "
                       "concurrency and vision-encoder activations for the largest planned clip, "
                       "for every engine of a profile; print a placement (role -> GPUs, TP size, "
                       "gpu_memory_utilization) or refuse with the numbers (exit 2).")
    p.add_argument("profile", nargs="?", help="profile name (default: the config's, else tiny-cpu)")
    p.add_argument("--gpus", metavar="COUNTxSIZE",
                   help="e.g. 4x80GB or 1x24GB (GB = 10^9 bytes; default: the profile's own)")
    p.add_argument("--concurrency", type=int, metavar="N",
                   help="episodes in flight, each at full context (default: the profile's)")
    p.add_argument("--decode-device", default="cpu", metavar="DEVICE",
                   help="where frames are decoded; cuda reserves the frame cache on GPU 0")
    p.add_argument("--config", metavar="FILE", help="YAML config (profile:, models:, …)")
    p.add_argument("--model", metavar="ROLE=PRESET_OR_PATH", action="append", default=[],
                   help="put a preset, an imported model or a local folder in a role (repeatable)")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
    p.set_defaults(handler=_plan)

    p = sub.add_parser("serve", allow_abbrev=False,
                       help="start vLLM's OpenAI-compatible server for a model, with MedClaw's flags",
                       description="Start vLLM's OpenAI-compatible server for a preset, an imported "
                       "model or a folder, with every flag MedClaw relies on; prints the config "
                       "lines that point a role at it. Unknown flags (e.g. --max-num-seqs 64) "
                       "go to vLLM unchanged.")
    p.add_argument("name", help="preset, imported model name or model folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, metavar="N", help="GPUs per replica")
    p.add_argument("--data-parallel-size", type=int, metavar="N", help="replicas behind this port")
    p.add_argument("--profile", metavar="NAME", help="apply this profile's vLLM defaults (presets)")
    p.add_argument("--role", choices=ROLES_FOR_SERVE,
                   help="role in the printed config (default: video_expert for a VLM, else orchestrator)")
    p.add_argument("--dry-run", action="store_true", help="print the config and the command only")
    p.set_defaults(handler=_serve, pass_through=True)


def _list(args) -> int:
    from medclaw.models import registry, store

    cat = registry.catalog()
    presets = {}
    for name, fields in cat.presets.items():
        path = registry.preset_path(name)
        presets[name] = {
            "architecture": fields.get("architecture", ""),
            "backend": fields.get("backend", "vllm"),
            "present": path is not None and store.folder_problem(path) is None,
            "path": str(path) if path else None,
            "description": fields.get("description", ""),
        }
    profiles = {name: {"description": prof.get("description", ""), "roles": prof["roles"]}
                for name, prof in cat.profiles.items()}
    if args.json:
        print(json.dumps({"profiles": profiles, "presets": presets,
                          "models_dir": str(store.models_dir()), "imported": store.list_stored()}, indent=2))
        return 0
    print("profiles:")
    for name, prof in profiles.items():
        print(f"  {name:<12} {prof['description']}")
        print("               " + ", ".join(f"{role}={_preset_of(entry)}" for role, entry in prof["roles"].items()))
    print(f"\npresets (weights under {store.models_dir()}):")
    for name, info in presets.items():
        mark = "present" if info["present"] else "missing"
        print(f"  {name:<30} {mark:<8} {info['description']}")
    return 0


def _preset_of(entry) -> str:
    """A profile's role entry is a preset name, or a mapping with `preset:` and overrides."""
    return entry if isinstance(entry, str) else str(entry.get("preset") or entry.get("path") or entry)


def _resolve(args) -> int:
    specs = models_from_args(args)
    print(json.dumps({role: spec.to_dict() for role, spec in specs.items()}, indent=2))
    return 0


def _make_tiny(args) -> int:
    from medclaw.models.store import medclaw_home
    from medclaw.models.tiny import build_tiny_models

    print("building tiny checkpoints …", file=sys.stderr)
    models = build_tiny_models(args.dir or medclaw_home() / "tiny", seed=args.seed)
    print(json.dumps({"vlm": str(models.vlm), "llm": str(models.llm), "seed": models.seed}))
    return 0


def _train_tiny(args) -> int:
    from pathlib import Path

    from medclaw.errors import ConfigError
    from medclaw.models.train_tiny import STEPS, train_tiny

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty folder; choose a new OUT")
    steps = STEPS if args.steps is None else args.steps
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    command = f"medclaw models train-tiny {args.out} --seed {args.seed}" + (
        f" --steps {steps}" if args.steps is not None else "")
    report = train_tiny(out, seed=args.seed, steps=steps, progress=sys.stderr.isatty(), command=command)
    print(json.dumps(report.to_dict(), indent=2))
    if not report.targets_met:
        print(f"medclaw: the trained models miss held-out targets (region accuracy "
              f"{json.dumps(report.accuracy)}, orchestrator actions "
              f"{report.orchestrator['held_out']['action_accuracy']}); see train-report.json",
              file=sys.stderr)
    return 0


def _train_distiller(args) -> int:
    from pathlib import Path

    from medclaw.errors import ConfigError
    from medclaw.models.train_distiller import train_distiller
    from medclaw.models.train_tiny import COMMITTED

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty folder; choose a new OUT")
    source = Path(args.orchestrator) if args.orchestrator else COMMITTED / "llm"
    if not (source / "model.safetensors").is_file():
        raise ConfigError(f"--orchestrator {source}: no model.safetensors there")
    report = train_distiller(out, source, seed=args.seed, progress=sys.stderr.isatty())
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}, indent=2))
    if not report["targets_met"]:
        held = report["held_out"]
        print(f"medclaw: the distiller misses its held-out targets (diagnoses "
              f"{held['diagnosis_accuracy']}, lessons written {held['lessons_written']}); "
              f"see {out}/distiller-report.json", file=sys.stderr)
    return 0


def _import(args) -> int:
    from medclaw.models.store import import_model, revision_hash

    dest = import_model(args.name, args.src, copy=args.copy, force=args.force)
    print(json.dumps({"name": args.name, "path": str(dest), "revision": revision_hash(dest)}))
    return 0


def _serve(args) -> int:
    from medclaw.models.registry import catalog
    from medclaw.models.serve import ServeOptions, default_role, resolve_served_model, serve

    options = ServeOptions(host=args.host, port=args.port,
                           tensor_parallel_size=args.tensor_parallel_size,
                           data_parallel_size=args.data_parallel_size,
                           extra_args=list(args.passed_through))
    spec = resolve_served_model(args.name, profile=args.profile)
    return serve(spec, options, role=args.role or default_role(spec),
                 is_preset=args.name in catalog().presets, dry_run=args.dry_run)


def _verify(args) -> int:
    from medclaw.models.store import verify_model

    result = verify_model(args.name)
    print(json.dumps(result.to_dict(), indent=2))
    if not result.ok:
        print(f"medclaw: model {args.name!r} does not match its manifest ({len(result.changed)} "
              f"changed, {len(result.missing)} missing, {len(result.unexpected)} added): "
              f"{', '.join(result.changed + result.missing + result.unexpected)}", file=sys.stderr)
    elif result.refreshed:
        print(f"medclaw: every byte matches; recorded new file times for "
              f"{', '.join(result.refreshed)}", file=sys.stderr)
    return 0 if result.ok else 1


def _plan(args) -> int:
    from medclaw.models.memory_plan import plan_profile
    from medclaw.models.registry import parse_overrides

    plan = plan_profile(args.profile, args.gpus, args.concurrency, config_path=args.config,
                        overrides=parse_overrides(args.model), decode_device=args.decode_device)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.table())
    plan.raise_if_unfit()        # the numbers are printed above; the reason as one line
    return 0
