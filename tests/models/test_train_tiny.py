"""The trained miniature's data and training step: targets follow the ground truth, replies line
up with their labels, a few real optimiser steps lower the loss, the CLI refuses a used OUT."""
from __future__ import annotations

import time

import numpy as np
import pytest

from medclaw.cli import main
from medclaw.models import train_tiny as T
from medclaw.models.train_data import (
    FIELD, NOTHING, clip_target, frame_sample, frame_target, read_field, region_sample, region_target,
)
from medclaw.synth.truth import make_ground_truth
from medclaw.synth.zoom import QUESTION_KIND, VISIT_KIND, ZoomOptions
from medclaw.tools.timeline import format_time


def _gt(seed=7):
    return make_ground_truth(0.5, seed=seed, width=320, height=180, zoom=ZoomOptions.all())


def test_targets_follow_the_ground_truth():
    gt = _gt()
    for visit in gt.zoom["visits"]:
        frame = (visit["start_frame"] + visit["end_frame"]) // 2
        key = FIELD[QUESTION_KIND[visit["kind"]]]
        name = visit["name"].replace("_", " ")
        assert read_field(frame_target(gt, frame), key) == name
        assert read_field(region_target(gt, frame, visit["box"]), key) == name
        # the same region before the visit holds nothing of note
        if visit["start_frame"] > 0 and not any(
                v["start_frame"] <= visit["start_frame"] - 1 < v["end_frame"] for v in gt.zoom["visits"]
                if v["kind"] == visit["kind"]):
            assert region_target(gt, visit["start_frame"] - 1, visit["box"]) in (NOTHING, "flash: yes")
    flash = gt.zoom["flashes"][0]
    assert read_field(frame_target(gt, flash["frame"]), "flash") == "yes"
    assert read_field(frame_target(gt, flash["end_frame"]), "flash") == "no"
    assert read_field(frame_target(gt, 0), "phase") == "preparation"


def test_a_clip_timeline_names_each_flash_seen_and_the_instrument_brought_in_after_it():
    """Sampled at every frame, the clip shows each flash whole and the arrival the ground truth
    names after it (`instrument_in_after`, computed by the generator on its own)."""
    from medclaw.tools.timeline import parse_timeline

    gt = _gt()
    start = 2.0
    times = [f / gt.fps for f in range(int(start * gt.fps), gt.num_frames)]
    entries = parse_timeline(clip_target(gt, times)).entries
    flashes = [e for e in entries if e.text == "cautery flash"]
    assert len(flashes) == len(gt.zoom["flashes"]) == 2
    for entry, flash in zip(flashes, gt.zoom["flashes"]):
        assert entry.start_s == pytest.approx(flash["time_s"] - start, abs=0.05)       # clip time
        assert entry.end_s == pytest.approx((flash["end_frame"] - 1) / gt.fps - start, abs=0.05)
        arrival = next(e for e in entries if e.start_s >= entry.end_s and e is not entry)
        after = flash["instrument_in_after"]
        assert arrival.text == after["instrument"].replace("_", " ") + " brought in"
        assert arrival.end_s == pytest.approx(after["time_s"] - start, abs=0.05)
    # sampled once a second, a 0.6 s flash falls between samples or on one of them
    sparse = [start + k for k in range(int(gt.num_frames / gt.fps - start))]
    seen = [any(f["frame"] <= gt.frame_at(t) < f["end_frame"] for t in sparse)
            for f in gt.zoom["flashes"]]
    assert clip_target(gt, sparse).count("cautery flash") == sum(seen)
    before = [t for t in times if t < gt.zoom["flashes"][0]["time_s"] - 0.1]
    assert clip_target(gt, before) == NOTHING


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from transformers import AutoProcessor

    folder = tmp_path_factory.mktemp("train-tiny") / "base"
    T.build_base(folder, seed=0)
    return folder, AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    from medclaw.models.train_data import render

    return render(tmp_path_factory.mktemp("train-videos"), (11,), minutes=0.2)


@pytest.fixture(scope="module")
def two_samples(videos):
    """The whole frame and the region of the first visit's middle frame, as the tools send them."""
    video, frames = videos[0]
    visit = video.gt.zoom["visits"][0]
    frame = (visit["start_frame"] + visit["end_frame"]) // 2
    return [frame_sample(video.gt, frames, frame, T._Budget(), "Describe what is visible."),
            region_sample(video.gt, frames, frame, T._Budget(), visit["box"], "What is in this region?")]


def test_prompts_and_targets_are_short_and_labels_line_up(base, two_samples):
    _, processor = base
    samples = two_samples
    # the tools size images like this: a whole frame at 140x84, a region at >= 56x56
    assert samples[0].image.shape == (84, 140, 3)
    assert min(samples[1].image.shape[:2]) >= 56
    batch = T._encode(processor, samples)
    for i, sample in enumerate(samples):
        labelled = batch["labels"][i][batch["labels"][i] != -100]
        text = processor.tokenizer.decode(labelled)
        assert text == sample.target + "<|im_end|>"
        assert len(labelled) < 40                                   # the vocabulary keeps it short
    assert batch["input_ids"].shape[1] < 200


def test_a_few_steps_lower_the_loss(base, videos):
    import torch

    from medclaw.models.train_data import random_sample

    folder, processor = base
    torch.manual_seed(0)
    model = T.load_vlm(folder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    batch = T._encode(processor, [random_sample(videos, T._Budget(), rng) for _ in range(4)])
    losses = []
    for _ in range(6):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.5


def test_the_training_mix_is_balanced_and_the_time_stamp_says_nothing(videos):
    """Every answer of a kind is equally frequent (the prior cannot answer), and the prompt's
    time is not the frame's (it cannot identify the training visit)."""
    from collections import Counter

    from medclaw.models.train_data import random_sample

    rng = np.random.default_rng(0)
    samples = [random_sample(videos, T._Budget(), rng) for _ in range(600)]
    names = {key: Counter() for key in FIELD.values()}
    for s in samples:
        for key, counts in names.items():
            value = read_field(s.target, key)
            if value not in (None, "none"):
                counts[value] += 1
    gt = videos[0][0].gt
    for question_kind, key in FIELD.items():
        expected = {v["name"].replace("_", " ") for v in gt.zoom["visits"]
                    if v["kind"] == VISIT_KIND[question_kind]}
        assert set(names[key]) == expected
        low, high = min(names[key].values()), max(names[key].values())
        assert high <= 1.4 * low, names[key]
    said_own_frame = sum(f"(frame {s.meta['frame']})" in s.prompt for s in samples)
    assert said_own_frame < 0.05 * len(samples)


def test_empty_spot_samples_crop_an_objects_box_when_nothing_of_its_kind_is_there(videos, monkeypatch):
    """With EMPTY_SPOT_SHARE 1 every sample is a region near a zoom visit's box, on a frame at
    which no visit of that kind is on screen, and its target says nothing is there."""
    from medclaw.models import train_data as D
    from medclaw.synth.zoom import visible_at

    monkeypatch.setattr(D, "EMPTY_SPOT_SHARE", 1.0)
    rng = np.random.default_rng(0)
    gt = videos[0][0].gt
    kinds = set()
    for _ in range(40):
        sample = D.random_sample(videos, T._Budget(), rng)
        near = [v for v in gt.zoom["visits"]
                if all(abs(a - b) <= 0.03 for a, b in zip(sample.meta["region"], v["box"]))]
        assert sample.meta["tool"] == "crop_video_frame" and near, sample.meta
        kind = near[0]["kind"]
        assert not visible_at(gt.zoom, kind, sample.meta["frame"])
        assert sample.target == NOTHING
        kinds.add(kind)
    assert kinds == {"small", "look_alike"}


def test_sample_loss_weighs_every_reply_alike(base, two_samples, monkeypatch):
    """A five-field frame reply and a one-line region reply count the same in the loss."""
    import torch

    monkeypatch.setattr(T, "FOCAL_GAMMA", 0.0)             # the plain loss, as transformers' own

    folder, processor = base
    samples = two_samples
    model = T.load_vlm(folder).eval()
    with torch.no_grad():
        alone = [float(model(**T._encode(processor, [s])).loss) for s in samples]
        both = float(T.sample_loss(model, T._encode(processor, samples)))
    assert both == pytest.approx(sum(alone) / 2, rel=1e-4)


def test_focal_loss_weighs_each_reply_token_by_how_wrong_it_still_is(base, two_samples, monkeypatch):
    """FOCAL_GAMMA > 0: each reply token's cross-entropy times (1 - p)^gamma (p: the right
    token's probability), then the same means as the plain loss; 0 is the plain loss."""
    import torch

    folder, processor = base
    batch = T._encode(processor, two_samples)
    model = T.load_vlm(folder).eval()
    monkeypatch.setattr(T, "FOCAL_GAMMA", 0.0)
    with torch.no_grad():
        plain = float(T.sample_loss(model, batch))
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1]
        log_p = torch.log_softmax(logits.double(), dim=-1)
        expected = []
        for row, labels in zip(log_p, batch["labels"][:, 1:]):
            picked = row[labels != -100].gather(1, labels[labels != -100][:, None])[:, 0]
            ce = -picked
            expected.append(float((ce * (1 - picked.exp()) ** 2).mean()))
        monkeypatch.setattr(T, "FOCAL_GAMMA", 2.0)
        focal = float(T.sample_loss(model, batch))
    assert focal == pytest.approx(sum(expected) / 2, rel=1e-4)
    assert focal < plain                                 # every token's factor is below 1


def test_oneshot_sample_is_the_baselines_request(base, videos):
    """The one-shot view `evaluate` scores: the whole video as the baseline plans it, its
    instructions and a zoom question, encoded with exactly the planned visual tokens."""
    from medclaw.eval.oneshot import split_answer
    from medclaw.models.train_data import oneshot_sample

    _, processor = base
    video, frames = videos[0]
    visit = next(v for v in video.gt.zoom["visits"] if v["kind"] == "small")
    t = round((visit["start_frame"] + visit["end_frame"]) / 2 / video.gt.fps, 1)
    sample = oneshot_sample(video, frames, T._Budget(), "small_object", t)
    assert sample.is_video and sample.fps == T.VIDEO_FPS
    assert f"at {t:g} s" in sample.prompt and "EVIDENCE" in sample.prompt
    answer, times = split_answer(sample.target)
    assert answer == visit["name"].replace("_", " ") and times[0] <= t <= times[1]
    batch = T._encode(processor, [sample])
    pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((batch["input_ids"] == pad).sum()) == sample.meta["visual_tokens"]


def test_oneshot_steps_are_batches_of_their_own(videos, monkeypatch):
    """Every ONESHOT_EVERY-th step is one-shot requests alone (a clip in a frame batch would pad
    every row to its length), drawn balanced over kinds, each asking about a time its visit is
    on screen; the other steps draw the frame mix from the same stream as without them."""
    from collections import Counter

    from medclaw.synth.zoom import visible_at

    monkeypatch.setattr(T, "ONESHOT_EVERY", 3)
    monkeypatch.setattr(T, "ONESHOT_BATCH", 24)
    rng, oneshot_rng = np.random.default_rng(0), np.random.default_rng(1)
    steps = [T.step_samples(videos, step, rng, oneshot_rng) for step in range(6)]
    video = videos[0][0]
    kinds, named = Counter(), 0
    for step, samples in enumerate(steps):
        if step % 3 != 2:
            assert len(samples) == T.BATCH and not any(s.is_video for s in samples)
            continue
        assert len(samples) == 24 and all(s.meta["tool"] == "oneshot" for s in samples)
        for s in samples:
            kinds[s.meta["kind"]] += 1
            frame = video.gt.frame_at(s.meta["time_s"])
            on = visible_at(video.gt.zoom, "small" if s.meta["kind"] == "small_object" else "look_alike",
                            frame)
            # "none" where the time, rounded to 0.1 s, falls just outside the visit
            assert s.target.split("\n")[0] == (on[0].replace("_", " ") if on else "none")
            named += bool(on)
    assert set(kinds) == {"small_object", "look_alike"} and min(kinds.values()) >= 12
    assert named >= 0.8 * sum(kinds.values())
    monkeypatch.setattr(T, "ONESHOT_EVERY", 0)
    rng = np.random.default_rng(0)
    plain = [T.step_samples(videos, step, rng, None) for step in range(4)]
    assert [s.prompt for s in plain[2]] == [s.prompt for s in steps[3]]


def test_clip_steps_are_crop_video_requests_of_their_own(videos, monkeypatch):
    """Every CLIP_EVERY-th step is `crop_video` requests alone, sampled at CLIP_FPS, most of them
    over a flash; their targets are `clip_target` of the times the plan samples."""
    monkeypatch.setattr(T, "CLIP_EVERY", 2)
    monkeypatch.setattr(T, "CLIP_BATCH", 12)
    rng, extra_rng = np.random.default_rng(0), np.random.default_rng(1)
    steps = [T.step_samples(videos, step, rng, extra_rng) for step in range(4)]
    assert not any(s.is_video for s in steps[0] + steps[2])
    clips = steps[1] + steps[3]
    assert len(clips) == 24 and all(s.meta["tool"] == "crop_video" for s in clips)
    video = videos[0][0]
    for s in clips:
        assert s.image.shape[0] == len(s.meta["times"])
        assert 0.75 * T.CLIP_FPS <= s.fps <= 1.05 * T.CLIP_FPS     # frames come in pairs
        assert s.target == clip_target(video.gt, s.meta["times"])
        assert f"the clip starts at {format_time(s.meta['window'][0])}" in s.prompt
    assert sum("cautery flash" in s.target for s in clips) >= 0.5 * len(clips)


def test_the_report_counts_what_was_read_for_each_answer(base, videos, monkeypatch):
    """`confusion` holds every reply once, agrees with `accuracy`, and shows a name the model
    never says: here a model that always reads "needle" and "bipolar"."""
    _, processor = base
    monkeypatch.setattr(T, "describe", lambda model, processor, sample:
                        "small object: needle\nleft instrument: bipolar")
    accuracy, counts, confusion = T.evaluate(None, processor, videos)
    gt = videos[0][0].gt
    for kind, views in confusion.items():
        golds = {q["answer"] for q in gt.zoom["qa"] if q["kind"] == kind}
        for view, table in views.items():
            assert set(table) == golds
            assert sum(sum(read.values()) for read in table.values()) == counts[kind]
            right = sum(read.get(gold, 0) for gold, read in table.items())
            assert round(right / counts[kind], 4) == accuracy[kind][view]
    assert all(set(read) == {"needle"} for read in confusion["small_object"]["region"].values())
    assert all(set(read) == {"bipolar"} for read in confusion["look_alike"]["frame"].values())


def test_manifest_detects_a_changed_file(tmp_path):
    (tmp_path / "vlm").mkdir()
    (tmp_path / "vlm" / "a.bin").write_bytes(b"weights")
    (tmp_path / "train-report.json").write_text("{}")
    T.write_manifest(tmp_path)
    assert T.check_manifest(tmp_path) == []
    (tmp_path / "vlm" / "a.bin").write_bytes(b"weightz")
    assert T.check_manifest(tmp_path) == ["vlm/a.bin"]


def test_cli_refuses_a_used_out_folder(tmp_path, capsys):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    assert main(["models", "train-tiny", str(tmp_path / "used")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medclaw: error:") and "\n" not in err and "empty folder" in err
    assert main(["models", "train-tiny", str(tmp_path / "new"), "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").environ.get("MEDCLAW_RETRAIN"),
                    reason="retrains the miniature (CPU minutes); set MEDCLAW_RETRAIN=1")
def test_train_tiny_reproduces_the_committed_scores(tmp_path, capsys):
    """The README's recipe, end to end: the committed checkpoint's held-out scores come back
    within noise, and on the machine that made them (the report's `machine`) the same bytes.
    `targets_met` is not compared: the orchestrator's runs spread about 0.1 around its 0.9
    target, so a run within noise may land on either side of it. On another CPU the floats part
    after some steps, and the scores can land far off (docs/tiny-trained.md, reproducing)."""
    import json

    committed = json.loads((T.COMMITTED / "train-report.json").read_text())
    seed = committed["seed"]
    assert main(["models", "train-tiny", str(tmp_path / "out"), "--seed", str(seed)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert T.check_manifest(tmp_path / "out") == []
    where = {"committed on": committed.get("machine"), "retrained on": report["machine"]}
    if committed.get("machine") == report["machine"]:
        hashes = {p: (T.COMMITTED / p).read_bytes() == (tmp_path / "out" / p).read_bytes()
                  for p in ("vlm/model.safetensors", "llm/model.safetensors")}
        assert all(hashes.values()), (hashes, where)
    for kind in T.TARGETS:
        views, before = report["accuracy"][kind], committed["accuracy"][kind]
        assert abs(views["region"] - before["region"]) <= 0.15, (kind, views, before, where)
        assert views["region"] >= views["frame"] + T.ZOOM_GAIN[kind], (kind, views)
    actions = report["orchestrator"]["held_out"]["action_accuracy"]
    before = committed["orchestrator"]["held_out"]["action_accuracy"]
    assert abs(actions - before) <= 0.15, (actions, before, where)
    if "held_out_whole_second" in committed["orchestrator"]:       # reports before it lack it
        # Questions asked at a whole second are a blind spot whose score is mostly the float
        # path's draw: seed 0 scored 0.12 on the AMD EPYC host and 0.31 on an Intel Xeon, the
        # recipe's seeds 0-2 on one host 0.08-0.33 (docs/tiny-trained.md), so 0.15 would fail a
        # faithful retrain on another CPU; 0.35 still catches a recipe that lost or gained it.
        whole = report["orchestrator"]["held_out_whole_second"]["action_accuracy"]
        before = committed["orchestrator"]["held_out_whole_second"]["action_accuracy"]
        assert abs(whole - before) <= 0.35, (whole, before, where)
    assert T.meets_targets(report["accuracy"]), report["accuracy"]
    assert report["targets_met"] == (actions >= T.ORCHESTRATOR_TARGET)


def test_background_returns_raises_and_stops():
    """The orchestrator's spawned process (train_tiny._Background): its value comes back, its
    exception is raised in the caller, stop() ends a run that is still working, and a process
    that dies raises instead of leaving the caller waiting."""
    import json
    import os

    job = T._Background(json.dumps, obj={"a": [1, 2]})
    assert json.loads(job.result()) == {"a": [1, 2]}
    job.stop()
    job = T._Background(json.loads, s="{")
    with pytest.raises(json.JSONDecodeError):
        job.result()
    job.stop()
    started = time.monotonic()
    job = T._Background(time.sleep, 60)
    time.sleep(0.5)
    job.stop()
    assert time.monotonic() - started < 30
    job = T._Background(os._exit, 3)            # dies without a word: an error, not a hang
    with pytest.raises(RuntimeError, match="exit code 3"):
        job.result()
    job.stop()


def test_the_report_says_where_it_ran():
    """`machine()`, which every train-tiny report carries: the CPU, the vector instructions
    torch's kernels dispatch to, and the builds (a retrain elsewhere is compared knowing them)."""
    import importlib.metadata

    import torch

    where = T.machine()
    assert set(where) == {"cpu", "cpu_capability", "torch", "transformers"}
    assert where["cpu"] and where["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert where["torch"] == torch.__version__
    assert where["transformers"] == importlib.metadata.version("transformers")
    assert "machine" in T.TrainReport("c", 0, 1, 1, 0.1, 0.1, [], [], "s", machine=where).to_dict()


def test_targets_need_every_kind_on_the_region():
    assert T.meets_targets({"small_object": {"region": 1.0, "frame": 0.0},
                            "look_alike": {"region": 0.95, "frame": 0.5}})
    assert not T.meets_targets({"small_object": {"region": 1.0}, "look_alike": {"region": 0.5}})
    assert not T.meets_targets({"small_object": {"frame": 1.0, "region": 0.0}})
    assert not T.meets_targets({})


@pytest.mark.parametrize("steps,part,warmup", [(2400, 20, 120), (2400, 5, 480), (800, 20, 40),
                                               (10, 20, 1)])
def test_the_rate_warms_up_over_its_part_of_the_steps_then_falls_to_zero(steps, part, warmup):
    """`warmup_cosine`: linear to the peak over the first steps // part (the recipe's 20, and 5,
    the longer warm-up docs/tiny-trained.md measured), then cosine to 0."""
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = T.warmup_cosine(optimizer, steps, part)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[0] == pytest.approx(1 / warmup)
    assert max(rates) == pytest.approx(rates[warmup - 1], rel=1e-6)         # the peak ends it
    assert rates[warmup - 1] == pytest.approx(np.cos(np.pi * (warmup - 1) / steps) / 2 + 0.5)
    assert all(a <= b for a, b in zip(rates[:warmup - 1], rates[1:warmup]))
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1:]))
    assert rates[-1] == pytest.approx((1 + np.cos(np.pi * (steps - 1) / steps)) / 2)   # ~0
