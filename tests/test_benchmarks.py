"""benchmarks/plot_decode.py turns a decode JSON into a chart, and says what is wrong with bad JSON;
benchmarks/tiny_vlm_confusion.py scores a trained miniature VLM per gold answer; the seed
benchmarks' arguments are checked before any training starts (engine_start's, engine_binding's,
runtime_start's and serve_binding's before any engine or server starts), and the orchestrator's
sets every training setting its flags name;
benchmarks/zoom_contrast.py measures how far each zoom object's region stands from its empty spot."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(name: str):
    """benchmarks/<name>.py as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plots_the_committed_result(tmp_path):
    plot_decode = _benchmark("plot_decode")
    out = tmp_path / "decode.png"
    assert plot_decode.main([str(ROOT / "benchmarks/results/cpu-2core-decode.json"),
                             str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_partial_result_without_baseline(tmp_path):
    plot_decode = _benchmark("plot_decode")
    source = tmp_path / "ours-only.json"
    source.write_text(json.dumps({"video": "v.mp4", "device": "cpu", "cases": {
        "sparse": {"ours_s": 0.9, "baseline_s": None, "speedup": None, "ffmpeg_all_s": 2.6,
                   "num_frames": 64, "frame_accuracy": None}}}))
    assert plot_decode.main([str(source)]) == 0
    assert (tmp_path / "ours-only.png").exists()


@pytest.mark.parametrize("text", ["not json", json.dumps({"cases": {}}), json.dumps([1, 2])])
def test_bad_input_is_one_line(tmp_path, text):
    plot_decode = _benchmark("plot_decode")
    source = tmp_path / "bad.json"
    source.write_text(text)
    with pytest.raises(SystemExit) as err:
        plot_decode.main([str(source)])
    message = str(err.value)
    assert message.startswith("plot_decode:") and "\n" not in message


@pytest.mark.parametrize("name,args,message", [
    ("tiny_vlm_confusion", ["/nonexistent"], "not a model folder"),
    ("tiny_vlm_confusion", ["--min-pixels", "0"], "--min-pixels"),
    ("tiny_vlm_confusion", ["--minutes", "0"], "--minutes"),
    ("tiny_vlm_seeds", ["--seeds", "0", "--warmup-part", "0"], "--warmup-part"),
    ("tiny_vlm_seeds", ["--seeds", "0", "--steps", "10", "--warmup-part", "11"],
     "--warmup-part must be in 1..10"),
    ("tiny_vlm_seeds", ["--seeds", "0", "--min-pixels", "0"], "--min-pixels"),
    ("tiny_vlm_seeds", ["--seeds", "0", "--empty-spot-share", "0.9"], "--empty-spot-share"),
    ("orchestrator_seeds", [], "give --seeds"),
    ("orchestrator_seeds", ["--seeds", "0", "--checkpoint", "x"], "give --seeds"),
    ("orchestrator_seeds", ["--checkpoint", "/nonexistent"], "not a model folder"),
    ("orchestrator_seeds", ["--seeds", "0", "--focal-gamma", "9"], "--focal-gamma"),
    ("orchestrator_seeds", ["--seeds", "0", "--whole-second-share", "2"], "--whole-second-share"),
    ("zoom_contrast", ["--minutes", "0"], "--minutes"),
    ("engine_binding", ["--repeat", "0"], "--repeat"),
    ("engine_binding", ["--profile", "nope"], "unknown profile"),
    ("engine_binding", ["--role", "encoder"], "no vLLM engine"),
    ("engine_start", ["--repeat", "0"], "--repeat"),
    ("engine_start", ["--role", "encoder"], "no vLLM engine"),
    ("runtime_start", ["--repeat", "0"], "--repeat"),
    ("runtime_start", ["--profile", "nope"], "unknown profile"),
    ("serve_binding", ["--repeat", "0"], "--repeat"),
    ("serve_binding", ["--role", "encoder"], "no vLLM engine")])
def test_seed_benchmarks_refuse_bad_arguments_in_one_line(name, args, message, capsys):
    """Checked before any model loads or trains."""
    with pytest.raises(SystemExit) as err:
        _benchmark(name).main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert err.value.code == 2 and message in lines[-1] and "Traceback" not in "\n".join(lines)


def test_confusion_of_the_committed_vlm_on_a_held_out_video(capsys):
    """The committed VLM on one short held-out video: every region read right, every reply
    counted once under its gold answer."""
    assert _benchmark("tiny_vlm_confusion").main(["--seeds", "5000", "--minutes", "0.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    for kind, views in out["confusion"].items():
        region = views["region"]
        assert sum(sum(read.values()) for read in region.values()) == out["counts"][kind] > 0
        assert all(set(read) == {gold} for gold, read in region.items()), (kind, region)
        assert out["accuracy"][kind]["region"] == 1.0
    # the empty-spot reads: one per question whose spot is empty at some shifted time, each
    # counted once, the share of "nothing" consistent with the counts (the committed VLM names
    # a small object there: docs/tiny-trained.md)
    for kind, row in out["empty_spot"].items():
        assert 0 < row["count"] <= out["counts"][kind] and sum(row["read"].values()) == row["count"]
        assert row["reads_nothing"] == round(row["read"].get("(nothing)", 0) / row["count"], 4)


def test_an_empty_time_shows_nothing_of_its_kind(tmp_path):
    """`empty_time` picks a time inside the video at which no visit of the kind is on screen."""
    from medclaw.synth.video import synthesize
    from medclaw.synth.zoom import VISIT_KIND, ZoomOptions, empty_time, visible_at

    gt = synthesize(tmp_path / "zoom.mp4", minutes=0.5, seed=5000, width=320, height=180,
                    fps=25, zoom=ZoomOptions.all(), progress=False).gt
    picked = 0
    for q in gt.zoom["qa"]:
        kind = VISIT_KIND.get(q["kind"])
        if kind is None:
            continue
        t = empty_time(gt, kind, q["evidence_times_s"][0])
        assert t is not None and 0 <= t < gt.duration_s
        assert visible_at(gt.zoom, kind, gt.frame_at(q["evidence_times_s"][0]))
        assert not visible_at(gt.zoom, kind, gt.frame_at(t))
        picked += 1
    assert picked >= 2


def test_zoom_contrast_sees_each_object_against_its_empty_spot(capsys):
    """Every small object of a held-out video stands out of its empty spot in the region's pixels
    (a crop at a wrong time would measure about 0), and `distance` is 0 for the same view."""
    zoom_contrast = _benchmark("zoom_contrast")
    assert zoom_contrast.main(["--seeds", "5000", "--minutes", "0.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    small = out["contrast"]["small_object"]
    assert small and set(small) <= set(out["small_object_colors"])
    for row in small.values():
        assert row["count"] >= 1 and row["rgb"] > 100 and 0 < row["luma"] < row["rgb"]
    view = np.full((56, 56, 3), 120, np.uint8)
    painted = view.copy()
    painted[20:34, 20:34] = (0, 0, 128)
    assert zoom_contrast.distance(view, view) == (0.0, 0.0)
    rgb, luma = zoom_contrast.distance(painted, view)
    assert rgb == pytest.approx(float(np.linalg.norm([120, 120, 8]))) and luma > 0


def test_the_orchestrator_seed_benchmark_sets_each_setting_it_names(monkeypatch):
    """Every setting in benchmarks/orchestrator_seeds.py's table is a flag whose default is the
    recipe's value, and applying settings sets exactly the module constants named."""
    from medclaw.models import orchestrator_data as D
    from medclaw.models import train_orchestrator as O

    seeds = _benchmark("orchestrator_seeds")
    recipe = seeds.recipe_settings()
    assert recipe == {"digit_weight": O.DIGIT_WEIGHT, "focal_gamma": O.FOCAL_GAMMA,
                      "whole_second_share": O.WHOLE_SECOND_SHARE, "name_tokens": O.NAME_TOKENS,
                      "quote_in_thoughts": D.QUOTE_IN_THOUGHTS}
    for name in recipe:                      # restored after the test
        module, attr = seeds.SETTINGS[name]
        monkeypatch.setattr(__import__(module, fromlist=[attr]), attr, recipe[name])
    changed = {"digit_weight": 3.0, "focal_gamma": 0.5, "whole_second_share": 0.25,
               "name_tokens": not O.NAME_TOKENS, "quote_in_thoughts": not D.QUOTE_IN_THOUGHTS}
    seeds.apply_settings(changed)
    assert seeds.recipe_settings() == changed
    assert (O.DIGIT_WEIGHT, O.FOCAL_GAMMA, D.QUOTE_IN_THOUGHTS) == (3.0, 0.5, changed["quote_in_thoughts"])


def test_distill_review_check_applies_the_scripted_rule_to_each_mining_turn(tmp_path, synth_video):
    """Right answer -> C; wrong answer, no crop elsewhere (no trace here) -> B; the run's own
    diagnoses are compared with those, and a folder without a mining log is one line."""
    check = _benchmark("distill_review_check")
    rows = [{"id": "q1", "video": str(synth_video.path), "question": "At 3 s, which?", "type": "VPR",
             "gold": "needle"},
            {"id": "q2", "video": str(synth_video.path), "question": "At 4 s, which?", "type": "VPR",
             "gold": "gauze tag"}]
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run" / "mine").mkdir(parents=True)
    mined = [{"id": "q1", "answer": "needle", "trace": str(tmp_path / "none.jsonl"),
              "diagnosis": {"category": "C"}},
             {"id": "q2", "answer": "needle", "trace": str(tmp_path / "none.jsonl"),
              "diagnosis": {"category": "A"}}]
    (tmp_path / "run" / "mine" / "mining.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mined))
    result = check.check(tmp_path / "run", dataset)
    assert [(r["expected"], r["got"]) for r in result["rows"]] == [("C", "C"), ("B", "A")]
    assert (result["agreed"], result["expected_to_got"]) == (1, {"B->A": 1, "C->C": 1})
    assert check.main([str(tmp_path), str(dataset)]) == 2
