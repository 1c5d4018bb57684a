"""The committed trained miniature (`tiny-trained` profile): its files are the ones its manifest
names, its report says how to reproduce it and that it met the targets, and the budgets it trained
at are the ones the profile serves it with."""
from __future__ import annotations

import json

from medclaw.models import train_tiny as T
from medclaw.models.registry import load_models
from medclaw.synth import zoom


def _report() -> dict:
    return json.loads((T.COMMITTED / "train-report.json").read_text())


def test_committed_files_match_their_manifest():
    assert (T.COMMITTED / "MANIFEST.sha256").is_file()
    assert T.check_manifest(T.COMMITTED) == []
    names = (T.COMMITTED / "MANIFEST.sha256").read_text()
    for name in ("vlm/model.safetensors", "llm/model.safetensors", "train-report.json"):
        assert name in names


def test_report_names_the_command_and_shows_the_zoom_gain():
    report = _report()
    assert report["command"].startswith("medclaw models train-tiny ")
    assert report["command"].endswith(f" --seed {report['seed']}")
    assert set(report["eval_seeds"]).isdisjoint(report["train_seeds"])
    assert set(report["eval_seeds"]).isdisjoint(T.ONESHOT_SEEDS)      # the one-shot's videos too
    # what the miniature is for: the region a crop sends is read better than the whole frame
    for kind in T.TARGETS:
        views = report["accuracy"][kind]
        assert views["region"] >= views["frame"] + T.ZOOM_GAIN[kind], (kind, views)
    assert report["targets_met"] == (T.meets_targets(report["accuracy"]) and
                                     report["orchestrator"]["held_out"]["action_accuracy"]
                                     >= T.ORCHESTRATOR_TARGET)


def test_the_committed_orchestrator_is_this_recipes():
    """Its report names the recipe in the code (a recipe change without a retrain fails here),
    scored on the VLM's held-out videos."""
    from medclaw.models import orchestrator_data
    from medclaw.models import train_orchestrator as O

    orchestrator = _report()["orchestrator"]
    assert orchestrator["steps"] == O.STEPS and orchestrator["lr"] == O.LR
    assert orchestrator["batch"] == O.BATCH and orchestrator["short_with_full"] == O.SHORT_WITH_FULL
    assert orchestrator.get("digit_weight", 1.0) == O.DIGIT_WEIGHT   # reports before it: off
    assert orchestrator.get("focal_gamma", 0.0) == O.FOCAL_GAMMA
    assert orchestrator.get("whole_second_share", 0.0) == O.WHOLE_SECOND_SHARE
    assert orchestrator.get("name_tokens", False) == O.NAME_TOKENS
    assert orchestrator.get("quote_in_thoughts", False) == orchestrator_data.QUOTE_IN_THOUGHTS
    assert orchestrator["eval_seeds"] == list(O.EVAL_SEEDS) == _report()["eval_seeds"]
    assert orchestrator["held_out"]["episodes"] == 4 * len(O.EVAL_SEEDS)   # 2 questions per kind


def test_the_profile_serves_the_budgets_it_trained_at():
    specs = load_models(profile="tiny-trained")
    vlm = specs["frame_verifier"]
    assert vlm.path == str(T.COMMITTED / "vlm") and specs["video_expert"].path == vlm.path
    assert specs["orchestrator"].path == str(T.COMMITTED / "llm")
    budget = T._Budget()
    for name in budget.__slots__:
        assert getattr(vlm, name) == getattr(budget, name), name


def test_the_seed_benchmark_ran_the_committed_recipe():
    """benchmarks/results/cpu-2core-tiny-vlm-seeds.json (the README's seed spread) was made with
    this recipe: its seed-0 VLM scored exactly what the committed checkpoint's report says, and
    every seed in it read both kinds from the region as well as the targets ask."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu-2core-tiny-vlm-seeds.json"
    seeds = json.loads(path.read_text())
    report = _report()
    assert seeds["recipe"]["steps"] == report["steps"] == T.STEPS
    assert seeds["recipe"]["lr"] == report["lr"] == report["vision_lr"] == T.LR == T.VISION_LR
    assert seeds["eval_seeds"] == report["eval_seeds"]
    assert seeds["recipe"].get("oneshot_every", 0) == report.get("oneshot_every", 0) == T.ONESHOT_EVERY
    assert seeds["recipe"].get("focal_gamma", 0.0) == report.get("focal_gamma", 0.0) == T.FOCAL_GAMMA
    assert (seeds["recipe"].get("mark_fraction", 0.07) == report.get("mark_fraction", 0.07)
            == zoom.MARK_FRACTION)                  # the videos it saw: reports before it, 0.07
    assert (seeds["recipe"].get("mark_pattern", "solid") == report.get("mark_pattern", "solid")
            == zoom.MARK_PATTERN)                   # reports before it: the solid mark
    seed0 = next(run for run in seeds["runs"] if run["seed"] == report["seed"])
    assert seed0["accuracy"] == report["accuracy"]
    assert seed0["loss_last"] == report["loss_last"]
    assert len(seeds["runs"]) >= 5
    for run in seeds["runs"]:
        assert T.meets_targets(run["accuracy"]), run
