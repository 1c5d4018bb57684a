"""Does this machine follow the committed orchestrator's float path? A few minutes instead of a
20-minute `medclaw models train-tiny`: the orchestrator recipe's first STEPS steps (seed of the
committed report), its loss at every step the report logs, against the committed report's
(rounded to four decimals). JSON on stdout.

    python benchmarks/orchestrator_float_path.py [--steps 80]
        > benchmarks/results/cpu-2core-orchestrator-float-path.json

`parts_at_step` is the first logged step whose loss, rounded, differs from the committed one (null:
none within STEPS). Runs of this recipe part within a few dozen steps on another CPU, and end far
apart (docs/tiny-trained.md, "Reproducing on another CPU"); so a machine where this parts early
should not be expected to give the committed orchestrator's score. Environment variables that
steer torch's kernels (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA) apply as set when it
starts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile


class _Stop(Exception):
    """Raised by the step loss after STEPS steps: the run ends there, before anything is saved."""


def first_losses(steps: int, seed: int) -> list[float]:
    """Every step's loss of the orchestrator recipe's first `steps` steps (train_orchestrator with
    its shared training loop cut short)."""
    from medclaw.models import train_orchestrator as O
    from medclaw.models import train_tiny as T

    losses: list[float] = []
    real = T.fit_steps

    def cut_short(model, groups, total, step_loss, **kwargs):
        def counted(model, step):
            if step == steps:
                raise _Stop
            loss = step_loss(model, step)
            losses.append(float(loss.detach()))
            return loss
        return real(model, groups, total, counted, **kwargs)

    T.fit_steps = cut_short
    try:
        with tempfile.TemporaryDirectory(prefix="medclaw-float-path-") as out:
            O.train_orchestrator(out, seed=seed, progress=False)
    except _Stop:
        return losses
    finally:
        T.fit_steps = real
    raise RuntimeError(f"the recipe ended before step {steps}")


def main(argv: list[str] | None = None) -> int:
    from medclaw.models import train_tiny as T
    from medclaw.models.train_orchestrator import loss_log_every

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80, help="steps to run (default 80)")
    args = parser.parse_args(argv)
    committed = json.loads((T.COMMITTED / "train-report.json").read_text())
    orchestrator = committed["orchestrator"]
    every = loss_log_every(orchestrator["steps"])
    if not 0 < args.steps <= orchestrator["steps"]:
        parser.error(f"--steps must be 1..{orchestrator['steps']}")
    losses = first_losses(args.steps, committed["seed"])
    logged = list(range(0, args.steps, every))
    rows = [{"step": k, "here": losses[k], "committed": orchestrator["losses"][k // every]}
            for k in logged]
    parts = next((r["step"] for r in rows if round(r["here"], 4) != r["committed"]), None)
    json.dump({"machine": T.machine(), "committed_machine": committed.get("machine"),
               "seed": committed["seed"], "steps": args.steps, "losses": rows,
               "parts_at_step": parts}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
