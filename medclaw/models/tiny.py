"""Tiny random-weight checkpoints, built locally (never downloaded), for tests and the CPU demo.

`build_tiny_models(out_dir, seed)` writes two Hugging Face model folders:

- `out_dir/vlm`: a Qwen2.5-VL-architecture VLM (`Qwen2_5_VLForConditionalGeneration`) with a
  byte-level BPE tokenizer, a Qwen2-VL chat template (video/image parts become
  `<|vision_start|><|video_pad|><|vision_end|>`), `Qwen2VLImageProcessor` and
  `Qwen2VLVideoProcessor`, so `AutoProcessor`, transformers and vLLM all load it;
- `out_dir/llm`: a Qwen2-architecture text model (tiny orchestrator / judge) with a ChatML template.

Sizes follow STACK.md ("Tiny checkpoints"): head_dim 64 because vLLM's CPU attention rejects 16.
The result is deterministic in `seed`: same seed and builder version → byte-identical weights.
Building is idempotent: a marker file records (version, seed); a matching marker means reuse.
Concurrent builders of the same folder serialise on a file lock, and each model folder appears
atomically (built under a temporary name, then renamed), so a reader never sees half a model.

Random weights produce garbage text: what these models are good for is exercising structure —
token accounting, prefix caching, schema-constrained decoding, errors — not wording.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# Bump when anything that changes the written files changes (sizes, tokenizer corpus, templates).
TINY_VERSION = 2
MARKER_NAME = "medclaw-tiny.json"

# Qwen's special tokens, in Qwen's order, so they get the lowest ids. `<|video_pad|>` etc. must be
# single tokens: the processor expands them to one pad per visual token.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# Ordinary added tokens (not special: they survive decoding) for tool calls and reasoning output.
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<answer>", "</answer>")
BPE_VOCAB_SIZE = 1024

TEXT_SIZES = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=32768, rms_norm_eps=1e-6,
    max_window_layers=2,
)
VISION_SIZES = dict(
    depth=2, hidden_size=64, intermediate_size=128, num_heads=1, out_hidden_size=128,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2,
    window_size=112, fullatt_block_indexes=[1], in_channels=3,
)
ROPE_THETA = 1_000_000.0
MROPE_SECTION = [8, 12, 12]          # sums to head_dim / 2
# Pixel budgets of the saved processors (qwen-vl-utils meaning); callers may override per request.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 256 * 28 * 28

# Qwen2-VL's chat template: media parts are one placeholder each; the processor (or vLLM) expands
# the pad token to the number of visual tokens.
VLM_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# ChatML with Qwen2.5's hermes-style tool section; content may be a string or a list of text parts.
LLM_CHAT_TEMPLATE = (
    "{% macro text(content) %}{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}{% if 'text' in part %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% endmacro %}"
    "{% if messages[0]['role'] == 'system' %}{% set system = text(messages[0]['content']) %}"
    "{% set rest = messages[1:] %}{% else %}{% set system = 'You are a helpful assistant.' %}"
    "{% set rest = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
    "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    "{% endif %}<|im_end|>\n"
    "{% for message in rest %}"
    "{% if message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ text(message['content']) }}\n</tool_response><|im_end|>\n"
    "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "<|im_start|>assistant\n{{ text(message['content']) }}"
    "{% for call in message['tool_calls'] %}{% set fn = call['function'] if 'function' in call else call %}"
    "\n<tool_call>\n{\"name\": \"{{ fn['name'] }}\", \"arguments\": "
    "{{ fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ text(message['content']) }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A fixed corpus, so the BPE merges (and thus token ids) never depend on the machine.
_CORPUS = (
    "The surgeon dissects the gallbladder from the liver bed with the hook electrode.",
    "Clip the cystic artery and the cystic duct before cutting; check the critical view of safety.",
    "Grasper, bipolar, hook, clipper, scissors, irrigator, specimen bag, trocar, suction.",
    "Bleeding is controlled with bipolar coagulation. Smoke obscures the view; the camera is cleaned.",
    "Preparation, Calot triangle dissection, clipping and cutting, gallbladder dissection, "
    "gallbladder packaging, cleaning and coagulation, gallbladder retraction.",
    "Question: what happened right after the clipping? Answer: the duct was cut with scissors.",
    '{"tool": "crop_video", "args": {"start": 12.5, "end": 47.0}}',
    '{"tool": "select_video_frame", "args": {"time": 30.25}}',
    '{"tool": "final_answer", "args": {"answer": "B", "confidence": 0.8}}',
    '{"name": "view_full_video", "arguments": {"question": "Which instrument is used?"}}',
    "<think>The clip appears before the cut, so the answer is B.</think><answer>B</answer>",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 20 25 30 42 50 60 64 90 100 128 256 512 1000 3600",
    "00:00:12 00:01:30 01:02:03 frame 1500 at 25 fps, timestamp 60.0 s, duration 600 s.",
    "A, B, C, D, E. Yes. No. Left, right, upper, lower, anterior, posterior, medial, lateral.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
)


@dataclass(slots=True, frozen=True)
class TinyModels:
    """Folders of the tiny checkpoints: `vlm` (Qwen2.5-VL arch) and `llm` (Qwen2 arch)."""

    vlm: Path
    llm: Path
    seed: int = 0


def build_tiny_models(out_dir: str | os.PathLike, seed: int = 0) -> TinyModels:
    """Build (or reuse) the tiny VLM and LLM under `out_dir`; deterministic in `seed`."""
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = TinyModels(vlm=out / "vlm", llm=out / "llm", seed=seed)
    expected = {"version": TINY_VERSION, "seed": seed}
    if _read_marker(out) == expected and _complete(result):
        return result
    with _locked(out / ".medclaw-tiny.lock"):
        if _read_marker(out) == expected and _complete(result):   # built while we waited
            return result
        (out / MARKER_NAME).unlink(missing_ok=True)
        tokenizer = _train_tokenizer()
        _publish(result.vlm, lambda tmp: _write_vlm(tmp, tokenizer, seed))
        _publish(result.llm, lambda tmp: _write_llm(tmp, tokenizer, seed))
        (out / MARKER_NAME).write_text(json.dumps(expected) + "\n")
    return result


def _complete(models: TinyModels) -> bool:
    return all((p / "config.json").is_file() and (p / "model.safetensors").is_file()
               for p in (models.vlm, models.llm))


def _read_marker(out: Path) -> dict | None:
    try:
        return json.loads((out / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


class _locked:
    """An exclusive advisory lock on a file (POSIX), so parallel test runs build once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        import fcntl

        self._fh = open(self.path, "a")
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()


def _publish(dest: Path, write) -> None:
    """Write a folder under a temporary name, then swap it into place."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def _train_tokenizer(corpus=_CORPUS, vocab_size: int = BPE_VOCAB_SIZE):
    """Byte-level BPE trained on `corpus` (default `_CORPUS`, what tiny-cpu uses), wrapped as a
    transformers fast tokenizer. The trained miniature (`models.train_tiny`) passes a corpus of
    its own prompts and targets, so they are short in tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(list(corpus) * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]), model_max_length=TEXT_SIZES["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(ADDED_TOKENS))
    return tokenizer


def _token_ids(tokenizer) -> dict[str, int]:
    return {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS + ADDED_TOKENS}


def _save_tokenizer(folder: Path, tokenizer, chat_template: str) -> None:
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    # Name Qwen's tokenizer class so vLLM/transformers treat it as a Qwen tokenizer; the
    # tokenizer.json beside it is the whole definition.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    if not (folder / "processor_config.json").exists():
        config.pop("processor_class", None)      # a text model: AutoProcessor = the tokenizer
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _write_weights(model, folder: Path) -> None:
    """bf16 safetensors. Determinism comes from `torch.manual_seed` before construction: on CPU
    every parameter is drawn from the global generator in construction order."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()          # a 1-shard "Writing model shards" bar is noise
    try:
        model.to(dtype=torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()


def _generation_config(folder: Path, ids: dict[str, int]) -> None:
    config = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": False,
    }
    (folder / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_vlm(folder: Path, tokenizer, seed: int) -> None:
    import torch
    from transformers import (
        Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor, Qwen2VLVideoProcessor,
    )

    ids = _token_ids(tokenizer)
    vocab_size = len(tokenizer)
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab_size, **TEXT_SIZES, hidden_act="silu", tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                             "mrope_section": list(MROPE_SECTION)},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(VISION_SIZES, hidden_act="silu"),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    # Real Qwen2.5-VL configs carry these at the top level too; some loaders read them there.
    config.vocab_size = vocab_size
    config.bos_token_id = ids["<|endoftext|>"]
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    _write_weights(model, folder)
    _generation_config(folder, ids)

    merge = VISION_SIZES["spatial_merge_size"]
    patch = VISION_SIZES["patch_size"]
    common = dict(
        patch_size=patch, merge_size=merge, temporal_patch_size=VISION_SIZES["temporal_patch_size"],
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        # Frames arrive already resized by our planner (qwen-vl-utils budgets); keep the processor's
        # uncapped behaviour explicitly (silences the v5.22 default-change warning, matches vLLM).
        video_processor=Qwen2VLVideoProcessor(**common, cap_pixels_per_frame=False),
        tokenizer=tokenizer, chat_template=VLM_CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    _save_tokenizer(folder, tokenizer, VLM_CHAT_TEMPLATE)


def _write_llm(folder: Path, tokenizer, seed: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = _token_ids(tokenizer)
    config = Qwen2Config(
        vocab_size=len(tokenizer), **TEXT_SIZES, hidden_act="silu", tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(seed + 1)      # a different draw from the VLM's text tower
    model = Qwen2ForCausalLM(config)
    _write_weights(model, folder)
    _generation_config(folder, ids)
    _save_tokenizer(folder, tokenizer, LLM_CHAT_TEMPLATE)
