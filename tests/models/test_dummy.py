"""Real-size weightless folders: published architecture values, Qwen's vocabulary layout, parameter
counts that match the model cards (counted on the meta device: nothing of 7B size is allocated)."""
from __future__ import annotations

import json

import pytest

from medclaw.models.dummy import (
    PUBLISHED, PUBLISHED_PARAMS, QWEN_SPECIAL_TOKENS, TOKEN_ID, architecture_of, build_dummy_model,
)
from medclaw.models.memory_plan import count_params

# preset → (hub id, the transformers auto class that loads it)
BUILT = {
    "qwen2.5-vl-3b": ("Qwen/Qwen2.5-VL-3B-Instruct", "AutoModelForImageTextToText"),
    "qwen2.5-vl-7b": ("Qwen/Qwen2.5-VL-7B-Instruct", "AutoModelForImageTextToText"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "AutoModelForCausalLM"),
}


@pytest.fixture(scope="module")
def dummy_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dummy")
    return {name: build_dummy_model(name, root / name) for name in BUILT}


def _meta_param_count(folder, auto_class: str) -> int:
    import transformers
    from accelerate import init_empty_weights

    config = transformers.AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        model = getattr(transformers, auto_class).from_config(config)
    model.tie_weights()                       # as from_pretrained does (3B ties its embeddings)
    assert next(model.parameters()).device.type == "meta"
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(BUILT))
def test_config_loads_with_published_values(dummy_folders, name):
    from transformers import AutoConfig

    hub_id, _ = BUILT[name]
    published = PUBLISHED[hub_id]
    config = AutoConfig.from_pretrained(dummy_folders[name])
    text = config.get_text_config()
    assert config.architectures == published["architectures"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size"):
        assert getattr(text, key) == published[key], key
    assert config.tie_word_embeddings == published["tie_word_embeddings"]
    if "vision_config" in published:
        vision = config.vision_config
        assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (32, 1280, text.hidden_size)
        assert config.video_token_id == TOKEN_ID["<|video_pad|>"] == 151656
        assert text.rope_parameters["mrope_section"] == [16, 24, 24]
    assert not list(dummy_folders[name].glob("*.safetensors"))           # no weights written


@pytest.mark.parametrize("name", sorted(BUILT))
def test_parameter_count_matches_the_model_card(dummy_folders, name):
    hub_id, auto_class = BUILT[name]
    counted = _meta_param_count(dummy_folders[name], auto_class)
    assert counted == pytest.approx(PUBLISHED_PARAMS[hub_id] * 1e9, rel=0.02)
    assert sum(count_params(architecture_of(name))) == counted     # the planner's formula, exactly


def test_every_published_architecture_counts_like_its_card():
    for hub_id, config in PUBLISHED.items():
        assert sum(count_params(config)) == pytest.approx(PUBLISHED_PARAMS[hub_id] * 1e9, rel=0.02), hub_id


def test_tokenizer_has_qwens_vocabulary_layout(dummy_folders):
    from transformers import AutoProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dummy_folders["qwen2.5-7b"])
    assert len(tokenizer) == 151_643 + len(QWEN_SPECIAL_TOKENS) == 151_665
    assert [tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS] == list(range(151_643, 151_665))
    ids = tokenizer("clip the cystic duct <|im_end|>").input_ids
    assert ids[-1] == TOKEN_ID["<|im_end|>"] and max(ids[:-1]) < 151_643
    assert tokenizer.decode(ids[:-1]) == "clip the cystic duct "
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    processor = AutoProcessor.from_pretrained(dummy_folders["qwen2.5-vl-7b"])
    rendered = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}],
        tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|video_pad|><|vision_end|>" in rendered


def test_rebuild_is_reused(dummy_folders, tmp_path):
    folder = dummy_folders["qwen2.5-7b"]
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert build_dummy_model("qwen2.5-7b", folder) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 28


@pytest.mark.slow
def test_vllm_reads_the_dummy_config(dummy_folders):
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(dummy_folders["qwen2.5-vl-7b"]), load_format="dummy",
                        max_model_len=4096).create_model_config()
    assert config.architectures == ["Qwen2_5_VLForConditionalGeneration"]
    assert config.is_multimodal_model and config.get_vocab_size() == 152064
    assert (config.get_total_num_kv_heads(), config.get_head_size()) == (4, 128)
