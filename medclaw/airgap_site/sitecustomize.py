"""Start-up hook of every guarded Python process (see medclaw/airgap.py).

`medclaw.airgap.guarded_env` puts this folder first on PYTHONPATH, so Python imports this file at
start-up, before any user code. With MEDCLAW_AIRGAP=1 it installs the socket guard; then it runs
the `sitecustomize` it shadows, if any (Debian's, for instance), so nothing else changes.
The guard is loaded by file path: this interpreter may not have `medclaw` importable.
"""
import os
import sys


def _load(name, path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("MEDCLAW_AIRGAP") == "1":
        try:
            guard = _load("_medclaw_airgap_guard", os.path.join(os.path.dirname(here), "airgap.py"))
            sys.modules["_medclaw_airgap_guard"] = guard
            guard.install()
        except Exception as err:          # an unguarded process is itself a violation: record it
            import json

            record = {"event": "violation", "call": "install failed", "address": repr(err)[:300],
                      "pid": os.getpid(), "argv": sys.argv[:6]}
            log = os.environ.get("MEDCLAW_AIRGAP_LOG")
            if log:
                with open(log, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            print(f"medclaw air gap: guard not installed in pid {os.getpid()}: {err!r}", file=sys.stderr)
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        shadowed = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(shadowed):
            _load("_shadowed_sitecustomize", shadowed)
            break


_start()
del _start, _load
