"""`medclaw doctor`: is this machine ready to run MedClaw, and does it stay air-gapped?

    medclaw doctor [--config FILE] [--profile NAME] [--json]
    medclaw doctor --airgap [--log FILE] [--json] -- COMMAND [ARG …]

Without `--airgap`: one line per check, in four sections (a table, `SECTIONS`):
- offline   the settings `medclaw` forces at import (hub offline, no usage stats, vLLM's host IP on
            loopback), and whether your shell also has them (a hand-started `vllm serve` does not
            get medclaw's);
- devices   CPU cores and memory; CUDA GPUs as torch sees them, probed in a child process so that
            this process never initialises CUDA;
- decoders  video decoders usable on CPU (and on CUDA when there is a GPU);
- models    every role of the profile (resolved exactly as `ask` does), present and matching its
            import manifest (stat check; `medclaw models verify NAME` re-hashes every byte), and
            every other model in the store.
Exit status 1 when a required check fails (status FAIL), else 0; `warn` lines never fail.

With `--airgap`: runs COMMAND with the socket guard of `medclaw.airgap` in every Python process
it starts (engine processes included) and the offline settings in its environment, then lists
what was refused. Only loopback is allowed, plus, with `--config FILE`, the host:port of each
remote endpoint that file names (the hospital's `vllm serve` hosts). Exit status: COMMAND's when it failed, else 1 if anything was refused, else 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

# Runs in a child interpreter: whatever torch does to find GPUs happens there, not here.
CUDA_PROBE = """
import json
try:
    import torch
except Exception as err:
    print(json.dumps({"torch": None, "error": repr(err)[:200]})); raise SystemExit
info = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "available": torch.cuda.is_available()}
info["devices"] = [
    {"name": torch.cuda.get_device_name(i),
     "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
    for i in range(torch.cuda.device_count())] if info["available"] else []
print(json.dumps(info))
"""
PROBE_TIMEOUT_S = 120


@dataclass(slots=True)
class Check:
    section: str
    name: str
    status: str          # "ok" | "warn" | "FAIL"
    detail: str

    def line(self) -> str:
        return f"  {self.status:<4}  {self.name:<26} {self.detail}"


def register(parser: argparse.ArgumentParser) -> None:
    from medclaw.cli.models import add_model_arguments

    parser.epilog = ("exit status: 0 every required check passed (--airgap: nothing was refused); "
                     "1 a required check failed (--airgap: something was refused; COMMAND's own "
                     "status when COMMAND failed); 2 bad arguments")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--airgap", action="store_true",
                        help="run COMMAND (after --) with the socket guard in every process")
    parser.add_argument("--log", metavar="FILE", help="--airgap: keep the guard's log here")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="--airgap: the command to run, after --")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from medclaw.errors import ConfigError

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.airgap:
        if not command:
            raise ConfigError("doctor --airgap needs a command: medclaw doctor --airgap -- COMMAND …")
        return run_airgapped(command, args.log, as_json=args.json, allow=_configured_endpoints(args))
    if command:
        raise ConfigError(f"unexpected arguments {' '.join(command)!r} (a command runs only with --airgap)")
    checks = [check for section in SECTIONS.values() for check in section(args)]
    failed = [c for c in checks if c.status == "FAIL"]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        for name in SECTIONS:
            print(f"{name}:")
            for check in (c for c in checks if c.section == name):
                print(check.line())
        print(f"\n{len(failed)} required check(s) failed" if failed else "\nall required checks passed")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# --airgap

def _configured_endpoints(args) -> list[str]:
    """host:port of every remote endpoint the config names (none without --config)."""
    if not args.config:
        return []
    from medclaw.models.engine_args import endpoint_hosts
    from medclaw.models.registry import load_models, parse_overrides

    specs = load_models(args.config, profile=args.profile, overrides=parse_overrides(args.model))
    hosts = [host for spec in specs.values() if spec.backend == "remote"
             for host in endpoint_hosts(spec.endpoints)]
    return sorted(set(hosts))


def run_airgapped(command: list[str], log_path: str | None = None, as_json: bool = False,
                  allow: list[str] = ()) -> int:
    """Run `command` guarded (loopback + `allow`, host:port each); see the module docstring."""
    import tempfile

    from medclaw import OFFLINE_ENV, airgap
    from medclaw.errors import ConfigError

    keep_log = log_path is not None
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="medclaw-airgap-", suffix=".jsonl")
        os.close(fd)
    else:
        open(log_path, "w").close()            # this run's records only
    env = {**airgap.guarded_env(log_path, allow=list(allow)), **OFFLINE_ENV}
    airgap.enable(log_path, allow=list(allow))     # this process too
    try:
        returncode = subprocess.run(command, env=env).returncode
    except FileNotFoundError:
        raise ConfigError(f"command not found: {command[0]}") from None
    records = airgap.read_log(log_path)
    guarded = sorted({r.get("pid") for r in records if r.get("event") == "install"} - {os.getpid()})
    refused = [r for r in records if r.get("event") != "install"]
    if as_json:
        print(json.dumps({"returncode": returncode, "guarded_processes": len(guarded), "allowed": list(allow),
                          "violations": refused, "log": log_path if keep_log or refused else None}))
    summary = (f"medclaw air gap: {len(guarded)} Python process(es) guarded, "
               f"{len(refused)} connection(s) refused")
    if allow:
        summary += f"; allowed beyond loopback (config endpoints): {', '.join(allow)}"
    print(summary + (f" (log: {log_path})" if keep_log or refused else ""), file=sys.stderr)
    for record in refused:
        print(f"  refused: {airgap.describe(record)}", file=sys.stderr)
    if not guarded:
        print("  note: no Python process ran under the guard (the guard sees Python sockets only)",
              file=sys.stderr)
    if not (keep_log or refused):
        os.unlink(log_path)
    if returncode:
        return returncode
    return 1 if refused else 0


# ---------------------------------------------------------------------------------------------
# checks

def _offline(args) -> list[Check]:
    import medclaw
    from medclaw import airgap

    checks = []
    for key, value in medclaw.OFFLINE_ENV.items():
        here = os.environ.get(key)
        status = "ok" if here == value else "FAIL"
        detail = f"={value}" if here == value else f"{here!r} in this process, expected {value!r}"
        checks.append(Check("offline", key, status, detail))
    # medclaw forces these in its own processes; a `vllm serve` started by hand does not get them
    unset = [k for k, v in medclaw.OFFLINE_ENV.items() if medclaw.ENVIRONMENT_AT_IMPORT.get(k) != v]
    if unset:
        checks.append(Check("offline", "your shell", "warn", f"lacks {', '.join(unset)}: export them "
                            "before starting `vllm serve` by hand (medclaw sets them for itself)"))
    site = os.path.join(airgap.SITE_DIR, "sitecustomize.py")
    checks.append(Check("offline", "air-gap guard", "ok" if os.path.isfile(site) else "FAIL",
                        "`medclaw doctor --airgap -- COMMAND` available" if os.path.isfile(site)
                        else f"missing {site}"))
    proxies = sorted(k for k in os.environ if k.lower() in ("http_proxy", "https_proxy", "all_proxy"))
    if proxies:
        checks.append(Check("offline", "proxy variables", "ok",
                            f"{', '.join(proxies)} set; MedClaw's HTTP client ignores them"))
    return checks


def _devices(args) -> list[Check]:
    checks = [Check("devices", "cpu", "ok", f"{os.cpu_count()} cores, {_memory_gib():.0f} GiB memory")]
    cuda = _probe_cuda()
    if cuda.get("torch") is None:
        checks.append(Check("devices", "torch", "FAIL", f"not importable: {cuda.get('error', '?')}"))
    elif cuda.get("available"):
        for i, device in enumerate(cuda["devices"]):
            checks.append(Check("devices", f"cuda:{i}", "ok", f"{device['name']}, {device['memory_gib']} GiB"))
    else:
        checks.append(Check("devices", "cuda", "warn",
                            f"no CUDA GPU visible to torch {cuda['torch']} (CPU engines only)"))
    args._cuda = bool(cuda.get("available"))
    return checks


def _decoders(args) -> list[Check]:
    from medclaw.kernels.decoders import AUTO_ORDER, DECODERS, available_decoders

    checks = []
    devices = ["cpu"] + (["cuda"] if getattr(args, "_cuda", False) else [])
    for device in devices:
        usable = available_decoders(device)
        missing = [n for n in DECODERS if device in DECODERS[n].devices and n not in usable]
        auto = next((n for n in AUTO_ORDER[device] if n in usable), None)
        detail = (f"auto = {auto}; usable: {', '.join(usable)}" if usable else "none usable") + \
                 (f"; not installed: {', '.join(missing)}" if missing else "")
        # a CPU decoder is required (probing and CPU decoding); CUDA decoding is optional
        status = "ok" if usable else ("FAIL" if device == "cpu" else "warn")
        checks.append(Check("decoders", device, status, detail))
    return checks


def _models(args) -> list[Check]:
    from medclaw.errors import MedClawError
    from medclaw.models import store
    from medclaw.models.registry import load_models, parse_overrides

    checks = []
    used = set()
    try:
        specs = load_models(args.config, profile=args.profile, overrides=parse_overrides(args.model))
    except MedClawError as err:
        return [Check("models", "profile", "FAIL", str(err))]
    for role, spec in specs.items():
        if not spec.path:
            checks.append(Check("models", role, "ok", f"{spec.name} ({spec.backend}: {', '.join(spec.endpoints)})"))
            continue
        used.add(os.path.realpath(spec.path))
        try:
            revision = store.revision_hash(spec.path)
        except MedClawError as err:
            checks.append(Check("models", role, "FAIL", str(err)))
            continue
        if revision.startswith(store.UNIMPORTED_PREFIX):
            checks.append(Check("models", role, "warn", f"{spec.name}: not imported, revision is a "
                                f"fingerprint ({spec.path})"))
        else:
            checks.append(Check("models", role, "ok", f"{spec.name} rev {revision[:12]}… ({spec.path})"))
    for name in store.list_stored():
        folder = store.store_path(name)
        if os.path.realpath(folder) in used:
            continue
        problem = store.integrity_problem(folder)
        checks.append(Check("models", f"store: {name}", "warn" if problem else "ok",
                            problem or "matches its manifest (stat check)"))
    if not store.list_stored():
        checks.append(Check("models", "store", "ok", f"{store.models_dir()} (no imported models)"))
    return checks


SECTIONS = {"offline": _offline, "devices": _devices, "decoders": _decoders, "models": _models}


def _probe_cuda() -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as err:
        return {"torch": None, "error": f"probe failed ({type(err).__name__})"}


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0
