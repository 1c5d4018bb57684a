"""GPU memory plans: every shipped GPU profile fits the hardware it names, infeasible placements
are refused with the numbers, and the sizes come from real architectures (published values, or
the safetensors of a folder on this machine)."""
from __future__ import annotations

import re

import pytest

from medclaw.errors import ConfigError
from medclaw.models import memory_plan as mp
from medclaw.models.registry import catalog
from medclaw.models.spec import ModelSpec

GPU_PROFILES = sorted(name for name, prof in catalog().profiles.items() if prof.get("gpus"))


def _hardware_words(gpus: str) -> str:
    count, size = re.fullmatch(r"(\d+)x(\d+)GB", gpus).groups()
    return f"one {size} GB GPU" if count == "1" else f"{count} × {size} GB GPUs"


def test_parse_gpus():
    assert mp.parse_gpus("4x80GB") == [80 * 10 ** 9] * 4
    assert mp.parse_gpus("1x24GiB") == [24 * 2 ** 30]
    assert mp.parse_gpus("80GB,2x24GB") == [80 * 10 ** 9, 24 * 10 ** 9, 24 * 10 ** 9]
    for bad in ("4x80", "x80GB", "0x80GB", "four"):
        with pytest.raises(ConfigError, match="COUNTxSIZE"):
            mp.parse_gpus(bad)


def test_gpu_profiles_are_stated():
    assert {"qwen-7b", "qwen-7b-24gb", "qwen-32b", "qwen-72b", "video-r1", "qwen3-8b"} <= set(GPU_PROFILES)


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_every_shipped_profile_fits_the_hardware_its_description_names(profile):
    entry = catalog().profiles[profile]
    assert entry["description"].startswith(_hardware_words(entry["gpus"]))
    plan = mp.plan_profile(profile)
    assert plan.fits, plan.table()
    assert plan.gpus == mp.parse_gpus(entry["gpus"])
    placement = plan.placement
    assert set(placement) == {"orchestrator", "video_expert", "frame_verifier", "judge", "distiller"}
    assert placement["distiller"] == placement["orchestrator"]     # unassigned: the same engine
    for engine in plan.engines:
        assert engine.total <= engine.utilization * min(plan.gpus)       # fits what vLLM claims
        assert all(len(replica) == engine.tp for replica in engine.gpus)
    assert max(plan.gpu_share()) <= mp.MAX_GPU_SHARE + 1e-9


def test_qwen_72b_as_shipped_before_could_not_start(tmp_path):
    """The profile of the issue: 0.45 of each 80 GB GPU for a TP-4 shard of the 72B VLM plus its
    KV cache, with a TP-2 32B orchestrator beside it."""
    config = tmp_path / "old-72b.yaml"
    config.write_text(
        "profile: qwen-72b\nmodels:\n"
        + "".join(f"  {role}: {{preset: {preset}, gpu_memory_utilization: 0.45, max_model_len: 32768, "
                  f"tensor_parallel_size: {tp}}}\n"
                  for role, preset, tp in (("orchestrator", "qwen2.5-32b", 2),
                                           ("judge", "qwen2.5-32b", 2),
                                           ("video_expert", "qwen2.5-vl-72b", 4),
                                           ("frame_verifier", "qwen2.5-vl-72b", 4))))
    plan = mp.plan_profile(None, config_path=str(config))
    assert not plan.fits
    assert any(p.startswith("qwen2.5-vl-72b needs") and "0.45 x 80.0 GB gives 36.0 GB" in p
               for p in plan.problems)
    vlm = next(e for e in plan.engines if e.model == "qwen2.5-vl-72b")
    assert vlm.weights > 36 * mp.GB                    # a bf16 TP-4 shard alone is over 36 GB
    with pytest.raises(mp.PlanError) as err:
        plan.raise_if_unfit()
    assert "\n" not in str(err.value) and "does not fit on 4x80GB" in str(err.value)
    assert "qwen2.5-vl-72b" in err.value.table and "does not fit:" in err.value.table


def test_cli_accepts_the_24gb_profile_and_refuses_bf16_on_24gb(capsys):
    from medclaw import cli

    assert cli.main(["models", "plan", "qwen-7b-24gb", "--gpus", "1x24GB"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out.splitlines()[-1] and "bitsandbytes" in out
    assert cli.main(["models", "plan", "qwen-7b", "--gpus", "1x24GB"]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert error.count("\n") == 0 and error.startswith("medclaw: error: qwen-7b does not fit on 1x24GB")
    assert re.search(r"needs [\d.]+ GB per GPU \(weights 16\.\d", error)      # 8.3 B params in bf16
    assert "does not fit:" in captured.out and "KV" in captured.out          # the table


def test_cli_json_placement(capsys):
    import json

    from medclaw import cli

    assert cli.main(["models", "plan", "qwen-32b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["gpus_gb"] == [80.0] * 4
    # the two TP-2 engines cannot share GPUs (0.85 + 0.80 > 0.95): one pair each
    gpus = {tuple(data["placement"][role]["gpus"][0]) for role in ("orchestrator", "video_expert")}
    assert gpus == {(0, 1), (2, 3)}
    assert data["placement"]["video_expert"]["tensor_parallel_size"] == 2


def test_quantised_weights_count_less():
    spec = ModelSpec(name="qwen2.5-vl-7b", path="")
    arch = mp.architecture_of_spec(spec)
    assert arch.source == "published" and arch.params == pytest.approx(8.29e9, rel=0.01)
    full = mp.weight_bytes(arch, None)
    assert full == 2 * arch.params
    four, eight = mp.weight_bytes(arch, "bnb-4bit"), mp.weight_bytes(arch, "bnb-8bit")
    assert mp.weight_bytes(arch, "bitsandbytes") == four and mp.weight_bytes(arch, "awq") < four
    # linear layers packed; embeddings, lm head and the vision tower stay bf16
    unpacked = 2 * (arch.other_params + arch.vision_params)
    assert four == pytest.approx(unpacked + arch.linear_params * (0.5 + 4 / 64), rel=1e-6)
    assert unpacked < four < eight < full


def test_kv_cache_per_token():
    arch7 = mp.architecture_of_spec(ModelSpec(name="qwen2.5-7b", path=""))
    assert mp.kv_bytes_per_token(arch7) == 2 * 28 * 4 * 128 * 2            # 57,344 bytes
    arch3 = mp.architecture_of_spec(ModelSpec(name="qwen2.5-vl-3b", path=""))
    # 2 KV heads over 4 GPUs: each GPU still holds one (replicated), not half of one
    assert mp.kv_bytes_per_token(arch3, tp=4) == mp.kv_bytes_per_token(arch3, tp=2) == 2 * 36 * 128 * 2


def test_largest_clip_follows_the_context():
    long = ModelSpec(name="qwen2.5-vl-7b", path="", max_model_len=32768, min_pixels=100352,
                     max_pixels=602112, total_pixels=19267584, fps=2.0, max_frames=768)
    short = ModelSpec(name="qwen2.5-vl-7b", path="", max_model_len=16384, min_pixels=100352,
                      max_pixels=602112, total_pixels=19267584, fps=2.0, max_frames=768)
    coarse_long, any_long = mp.largest_clip_tokens(long)
    coarse_short, any_short = mp.largest_clip_tokens(short)
    assert coarse_short < coarse_long and any_short < any_long
    assert coarse_long <= any_long <= 32768 - 1024 - 512
    assert any_long > 0.9 * (32768 - 1024 - 512)            # the context room binds, not the pixels
    arch = mp.architecture_of_spec(long)
    assert mp.vision_activation_bytes(arch, any_long) > mp.vision_activation_bytes(arch, any_short) > 0


def test_tiny_folder_is_measured_from_its_safetensors(tiny_models):
    from transformers import AutoModelForImageTextToText

    arch = mp.architecture_of_spec(ModelSpec(name="tiny-vlm", path=str(tiny_models.vlm)))
    assert arch.source == "folder" and arch.vision is not None
    model = AutoModelForImageTextToText.from_pretrained(tiny_models.vlm)
    assert arch.params == sum(p.numel() for p in model.parameters())
    assert arch.vision_params == sum(p.numel() for p in model.model.visual.parameters())
    assert mp.weight_bytes(arch, None) == 2 * arch.params                  # bf16 on disk


def test_engine_start_hook(tiny_models):
    vlm = ModelSpec(name="qwen2.5-vl-7b", path="", max_model_len=32768, gpu_memory_utilization=0.9)
    specs = {"video_expert": vlm, "frame_verifier": vlm}
    # on a host with one 24 GB GPU: refused in one line before any engine starts
    with pytest.raises(mp.PlanError, match=r"^models does not fit on 1x24GB: qwen2.5-vl-7b needs"):
        mp.check_before_start(specs, concurrency=1, gpus=mp.parse_gpus("1x24GB"))
    plan = mp.check_before_start(specs, concurrency=1, gpus=mp.parse_gpus("1x80GB"))
    assert plan.fits and plan.placement["video_expert"]["gpus"] == [[0]]
    # this CPU host: nothing to check; fake / remote backends use no local GPU
    assert mp.detect_gpus() is None and mp.check_before_start(specs) is None
    remote = {"video_expert": ModelSpec(name="x", path="", backend="remote", endpoints=["http://h:1/v1"])}
    assert mp.check_before_start(remote, gpus=mp.parse_gpus("1x24GB")) is None


def test_transformers_backend_spreads_over_every_gpu():
    spec = ModelSpec(name="qwen2.5-vl-7b", path="", backend="transformers", quantization="bnb-4bit",
                     max_model_len=16384)
    plan = mp.plan_memory({"video_expert": spec}, mp.parse_gpus("2x24GB"))
    assert plan.fits, plan.table()
    (engine,) = plan.engines
    assert engine.gpus == [[0, 1]] and engine.concurrency == 1


def test_decoding_on_the_gpu_reserves_the_frame_cache():
    cpu = mp.plan_profile("qwen-7b")
    cuda = mp.plan_profile("qwen-7b", decode_device="cuda")
    assert cuda.gpu_share()[0] > cpu.gpu_share()[0] and cuda.reserved[0] > 2 ** 30


def test_unknown_model_without_a_folder_is_a_one_line_error():
    with pytest.raises(mp.PlanError, match="no local folder and no published architecture"):
        mp.architecture_of_spec(ModelSpec(name="my-own-vlm", path="/nonexistent/my-own-vlm"))


def test_open_runtime_refuses_engines_that_cannot_start_on_the_gpus_present(tiny_models, monkeypatch):
    """The engine-start hook in open_runtime: on a (simulated) host with one 1 GB GPU even the tiny
    engines' fixed overhead does not fit; on this CPU host nothing is checked."""
    from medclaw.engine.runtime import open_runtime

    runtime = open_runtime(profile="tiny-cpu")                  # CPU host: no GPU, no check
    assert runtime.live_backends() == {}
    monkeypatch.setattr(mp, "detect_gpus", lambda: mp.parse_gpus("1x1GB"))
    with pytest.raises(mp.PlanError, match=r"^tiny-cpu does not fit on 1x1GB: tiny-") as err:
        open_runtime(profile="tiny-cpu")
    assert "\n" not in str(err.value) and "overhead" in str(err.value)
