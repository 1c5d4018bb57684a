"""How right a distillation run's diagnoses were, by the trained miniature's own rule: the
scripted reviewer that `medclaw models train-distiller` teaches (`train_distiller.expected_category`:
C when the answer is the reference, A when a crop looked at another time than the question asks,
B otherwise) applied to the very diagnosis turn each mining episode sent. JSON on stdout.

    python benchmarks/distill_review_check.py RUN_DIR DATASET

RUN_DIR is `medclaw distill --out`'s folder (its mine/mining.jsonl and the traces it names),
DATASET the `--mine` dataset it read. Meaningful for synthetic zoom questions on the
`tiny-trained` profile (the only questions that rule was written for); `benchmarks/
tiny_trained_distill.sh` runs it after the distillation.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def check(run_dir: Path, dataset: Path) -> dict:
    from medclaw.engine.trace import Trace
    from medclaw.eval.dataset import read_dataset
    from medclaw.models.train_distiller import expected_category
    from medclaw.skills.prompts import diagnose_turn, episode_summary

    records = {r.id: r for r in read_dataset(dataset)[0]}
    rows = []
    for line in (run_dir / "mine" / "mining.jsonl").read_text().splitlines():
        mined = json.loads(line)
        record = records[mined["id"]]
        trace = Path(mined["trace"])
        summary = episode_summary(Trace.load(trace)) if trace.is_file() else "(no trace)"
        turn = diagnose_turn(record, mined["answer"], summary)
        rows.append({"id": record.id, "answer": mined["answer"], "gold": record.gold,
                     "expected": expected_category(turn), "got": mined["diagnosis"]["category"]})
    pairs = Counter(f"{r['expected']}->{r['got']}" for r in rows)
    return {"run_dir": str(run_dir), "questions": len(rows),
            "agreed": sum(r["expected"] == r["got"] for r in rows),
            "expected": dict(sorted(Counter(r["expected"] for r in rows).items())),
            "expected_to_got": dict(sorted(pairs.items())), "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("dataset", type=Path, metavar="DATASET")
    args = parser.parse_args(argv)
    if not (args.run_dir / "mine" / "mining.jsonl").is_file():
        print(f"distill_review_check: {args.run_dir} holds no mine/mining.jsonl", file=sys.stderr)
        return 2
    print(json.dumps(check(args.run_dir, args.dataset), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
