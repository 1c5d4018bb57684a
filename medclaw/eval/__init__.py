"""Evaluation: datasets, exact scorers, the 4-dimension judge, the runner, reports, comparisons.

    dataset.py    JSONL records (native, MedClawBench-style, SVU-31K-style), bad-record handling
    synthetic.py  a synthetic set with exact gold from the procedure generator's ground truth
    scorers.py    exact scorers: label, count, label set, temporal IoU
    judge.py      the judge role's LLM scores CI / DO / CU / TU (1-5), schema-constrained
    oneshot.py    the one-shot baseline: the VLM sees the whole video once and answers
    results.py    the crash-safe, resumable results log
    runner.py     answer + judge + score + log, concurrently on shared engines
    report.py     per split × VTR/VPR tables, Δ agent vs one-shot; markdown, JSON, PNG
    compare.py    backbone-swap table and plot across run directories
    repro.py      traces compared modulo what legitimately varies between runs

Nothing here imports vLLM or torch at module level; `medclaw eval` drives it (medclaw/cli/eval.py).
"""
