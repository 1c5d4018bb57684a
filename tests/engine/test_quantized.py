"""Quantised backbones: whole episodes on the transformers backend with the tiny checkpoints in
4-bit and 8-bit (bitsandbytes on CPU), with the layers checked and the quantisation in the trace;
vLLM's quantised loading refused where vLLM or the device cannot honour it, never full precision."""
from __future__ import annotations

import json
import shutil

import pytest

from medclaw.errors import ConfigError
from medclaw.models import quantization as q
from medclaw.models.spec import ModelSpec

QUESTION = "Which instrument was brought in just before the vessel was cut?"
ROLES = {"orchestrator": "tiny-llm", "video_expert": "tiny-vlm", "frame_verifier": "tiny-vlm",
         "judge": "tiny-llm"}
LAYER = {"bnb-4bit": "Linear4bit", "bnb-8bit": "Linear8bitLt"}


def _awq_copy(folder, tmp_path):
    """The tiny LLM's folder with an AWQ quantization_config declared (config only)."""
    out = tmp_path / "awq"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_vllm_quantization_is_refused_where_it_cannot_be_honoured(tiny_models, tmp_path):
    plain = str(tiny_models.llm)
    awq = str(_awq_copy(tiny_models.llm, tmp_path))

    def spec(quant, path=plain):
        return ModelSpec(name="m", path=path, quantization=quant)

    assert q.vllm_quantization(spec(None), on_cpu=True) is None
    assert q.vllm_quantization(spec("bitsandbytes"), on_cpu=False) == "bitsandbytes"
    assert q.vllm_quantization(spec("bnb-4bit"), on_cpu=False) == "bitsandbytes"
    assert q.vllm_quantization(spec("awq", awq), on_cpu=False) == "awq"
    assert q.vllm_quantization(spec(None, awq), on_cpu=False) is None       # vLLM reads the folder
    refusals = [
        (spec("bitsandbytes"), True, "needs a CUDA GPU"),
        (spec("bnb-8bit"), False, "4-bit only"),
        (spec("awq"), False, "not quantised"),
        (spec("gptq", awq), False, "is a awq checkpoint"),
        (spec("bnb-4bit", awq), False, "is a awq checkpoint"),
    ]
    for bad, on_cpu, match in refusals:
        with pytest.raises(ConfigError, match=match) as err:
            q.vllm_quantization(bad, on_cpu=on_cpu)
        assert "\n" not in str(err.value)
    # after start: what vLLM reports must be what was asked
    q.check_vllm_loaded(spec("awq", awq), "awq_marlin")
    q.check_vllm_loaded(spec(None), None)
    with pytest.raises(ConfigError, match="loaded it as full precision, not bitsandbytes"):
        q.check_vllm_loaded(spec("bitsandbytes"), None)
    with pytest.raises(ConfigError, match="transformers"):
        from medclaw.engine.backends.vllm_local import engine_kwargs

        engine_kwargs(spec("bnb-4bit"), on_cpu=True)


def test_transformers_refuses_a_contradicting_folder(tiny_models, tmp_path):
    awq = str(_awq_copy(tiny_models.llm, tmp_path))
    with pytest.raises(ConfigError, match="already a awq checkpoint"):
        q.check_transformers(ModelSpec(name="m", path=awq, quantization="bnb-4bit"))
    with pytest.raises(ConfigError, match="not quantised"):
        q.check_transformers(ModelSpec(name="m", path=str(tiny_models.llm), quantization="gptq"))
    q.check_transformers(ModelSpec(name="m", path=str(tiny_models.llm), quantization="bnb-8bit"))


@pytest.mark.slow
def test_asking_for_bitsandbytes_and_getting_full_precision_is_an_error(tiny_models):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="no Linear4bit layer was loaded"):
        q.expect_quantized(ModelSpec(name="m", path=str(tiny_models.llm), quantization="bnb-4bit"), model)
    assert q.expect_quantized(ModelSpec(name="m", path=str(tiny_models.llm)), model) is None


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["bnb-4bit", "bnb-8bit"])
def test_episode_on_quantised_tiny_models(quant, tiny_models, synth_video, tmp_path, monkeypatch,
                                          capsys):
    pytest.importorskip("bitsandbytes")
    import medclaw.engine.backends as backends_module
    from medclaw import cli
    from medclaw.engine.trace import Trace
    from medclaw.models.store import revision_hash

    monkeypatch.setattr(cli, "COMMANDS", {"ask": cli.COMMANDS["ask"]})
    loaded: dict[str, dict] = {}                   # model name -> bitsandbytes layers at load
    real_expect = q.expect_quantized

    def spying_expect(spec, model):
        loaded[spec.name] = q.quantized_layers(model)
        return real_expect(spec, model)

    monkeypatch.setattr(q, "expect_quantized", spying_expect)
    real_backend_class = backends_module.backend_class

    def no_vllm(kind):
        assert kind == "transformers", f"a {kind} engine was built"
        return real_backend_class(kind)

    monkeypatch.setattr(backends_module, "backend_class", no_vllm)
    config = tmp_path / "quantised.yaml"
    config.write_text("profile: tiny-cpu\nepisode: {orchestrator_max_tokens: 256, "
                      "forced_answer_max_tokens: 128}\nmodels:\n" + "".join(
                          f"  {role}: {{preset: {preset}, backend: transformers, quantization: {quant}}}\n"
                          for role, preset in ROLES.items()))
    rc = cli.main(["ask", str(synth_video.path), QUESTION, "--config", str(config), "--json",
                   "--max-steps", "2", "--trace-dir", str(tmp_path / "traces")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] in ("answered", "forced_answer"), out

    # the layers really are quantised: every linear layer of the decoder (2 layers x 7)
    assert set(loaded) <= {"tiny-llm", "tiny-vlm"} and "tiny-llm" in loaded
    for name, layers in loaded.items():
        assert layers.get(LAYER[quant], 0) >= 14, (name, layers)
        assert set(layers) == {LAYER[quant]}
    trace = Trace.load(out["trace"])
    for role, preset in ROLES.items():
        model = trace.header["models"][role]
        assert model["quantization"] == quant and model["backend"] == "transformers"
        path = tiny_models.llm if preset == "tiny-llm" else tiny_models.vlm
        assert model["revision"] == revision_hash(path)
    calls = [step["orchestrator_call"] for step in trace.steps if step.get("orchestrator_call")]
    assert calls and all(c["model_revision"] == revision_hash(tiny_models.llm) for c in calls)


@pytest.mark.engine
@pytest.mark.slow
def test_vllm_engine_reports_what_it_loaded(llm_engine):
    assert llm_engine.quantization is None                 # the tiny model, full precision
