"""Qwen2-VL / Qwen2.5-VL multimodal RoPE positions in transformers, laid out as vLLM lays them.

    use_reference_positions(model) -> bool     # in place; True when the model needed it

Qwen2.5-VL gives each vision token a (time, row, column) position and each text token one
position on all three axes. The text after an image or a video resumes at the largest position
the image or video used + 1: so the original Qwen2-VL / Qwen2.5-VL code, and vLLM's
`get_mrope_input_positions`, which serves MedClaw's models. transformers 5.x (5.19 and 5.23
checked) resumes it at the vision part's start + max(rows, columns) instead, forgetting the time
axis. For an image (one time step) the two agree; after a video whose time positions run past
its rows and columns they do not. For a 30-frame clip of the trained miniature (grid 15x6x10,
2 positions a second) the text starts 52 positions earlier in transformers, and the same model
answers the same request differently in the two engines.

`use_reference_positions` wraps the model's `get_rope_index` so that transformers computes the
reference layout, in training (forward) and in `generate` (prefill positions and the decode
offset `rope_deltas`) alike. It shifts each text run after a vision run to start at the largest
position before it + 1 and leaves the vision runs as transformers computed them (their start
moves with the text before them). It checks what it wraps: text runs must be consecutive
positions, or it raises rather than guess. Where transformers already computes the reference
layout the wrapper changes nothing.
"""
from __future__ import annotations

import inspect
import itertools

# model_types whose reference code (and vLLM) puts the text after vision at its largest position + 1
REFERENCE_LAYOUT_MODELS = frozenset({"qwen2_vl", "qwen2_5_vl"})
TEXT = 0                           # mm_token_type_ids: 0 text, 1 image, 2 video


def use_reference_positions(model) -> bool:
    """Wrap `model`'s `get_rope_index` (a transformers Qwen2-VL or Qwen2.5-VL model, the
    conditional-generation class or its inner model) with `reference_rope_index`. Returns False,
    changing nothing, for other models; wrapping twice is a no-op."""
    inner = getattr(model, "model", model)
    if getattr(model.config, "model_type", None) not in REFERENCE_LAYOUT_MODELS:
        return False
    if not hasattr(inner, "get_rope_index"):
        raise RuntimeError(f"{type(model).__name__} has no get_rope_index: transformers changed "
                           "how Qwen2-VL positions are computed; medclaw.models.mrope needs updating")
    if getattr(inner.get_rope_index, "reference_layout", False):
        return True
    original = inner.get_rope_index
    signature = inspect.signature(original)

    def get_rope_index(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments        # callers pass either way
        positions, _ = original(*args, **kwargs)
        return reference_rope_index(positions, given["mm_token_type_ids"],
                                    given.get("attention_mask"))

    get_rope_index.reference_layout = True
    inner.get_rope_index = get_rope_index          # instance attribute: forward and generate use it
    return True


def reference_rope_index(positions, mm_token_type_ids, attention_mask=None):
    """(positions (3, B, L), rope deltas (B, 1)) with every text run that follows a vision run
    moved to start at the largest position before it + 1.

    `positions` is what transformers' `get_rope_index` returned for `mm_token_type_ids`
    (B, L); padding (`attention_mask` 0) keeps its positions. The deltas are what `generate`
    adds to a decode step's index: the sequence's largest position + 1 - its length."""
    import torch

    positions = positions.clone()
    deltas = []
    for row in range(positions.shape[1]):
        keep = (attention_mask[row].bool() if attention_mask is not None
                else torch.ones_like(mm_token_type_ids[row], dtype=torch.bool))
        own = positions[:, row, keep]                                      # (3, n)
        types = mm_token_type_ids[row][keep].tolist()
        start = 0
        for kind, run in itertools.groupby(types):
            end = start + len(list(run))
            if kind == TEXT:
                _check_text_run(own[:, start:end])
                if start > 0:
                    own[:, start:] += int(own[:, :start].max()) + 1 - int(own[0, start])
            start = end
        positions[:, row, keep] = own
        deltas.append(int(own.max()) + 1 - own.shape[1] if own.numel() else 0)
    return positions, torch.tensor(deltas, device=positions.device).unsqueeze(1)


def _check_text_run(run) -> None:
    """A text run has one position on all three axes, rising by one a token."""
    import torch

    expected = run[0, :1] + torch.arange(run.shape[1], device=run.device)
    if not bool((run == expected).all()):
        raise RuntimeError("transformers' get_rope_index no longer gives text runs consecutive "
                           "positions; medclaw.models.mrope needs updating")
