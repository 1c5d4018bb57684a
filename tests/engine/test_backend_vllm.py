"""The in-process vLLM backend on the tiny checkpoints: accounting, prefix-cache reuse with the
KV-friendly prompt layout, concurrency across event loops, schema-constrained tool calls.

All tests share one session-scoped engine per model (tests/conftest.py).
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from medclaw.bench import kv as bench_kv
from medclaw.requests.conversation import Conversation, media_uuid
from medclaw.types import MediaItem



def engine_test(test):
    return pytest.mark.slow(pytest.mark.engine(test))


def test_engine_kwargs_from_spec(tiny_models):
    from medclaw.engine.backends.vllm_local import CPU_BLOCK_SIZE, engine_kwargs
    from medclaw.models.spec import ModelSpec

    vlm = ModelSpec(name="v", path=str(tiny_models.vlm), tensor_parallel_size=2,
                    data_parallel_size=3, quantization="bnb-4bit", gpu_memory_utilization=0.5,
                    max_model_len=4096, extra={"block_size": 64, "enforce_eager": True})
    kwargs = engine_kwargs(vlm, on_cpu=False)        # bitsandbytes in vLLM: GPU only
    assert kwargs["model"] == str(tiny_models.vlm) and kwargs["served_model_name"] == "v"
    assert (kwargs["tensor_parallel_size"], kwargs["data_parallel_size"]) == (2, 3)
    assert kwargs["quantization"] == "bitsandbytes" and kwargs["max_model_len"] == 4096
    assert kwargs["enable_prefix_caching"] is True and kwargs["limit_mm_per_prompt"]["video"] >= 2
    assert kwargs["block_size"] == 64 and kwargs["enforce_eager"] is True     # extra wins
    llm = ModelSpec(name="l", path=str(tiny_models.llm))
    text_kwargs = engine_kwargs(llm, on_cpu=True)
    assert "limit_mm_per_prompt" not in text_kwargs and "quantization" not in text_kwargs
    assert text_kwargs["block_size"] == CPU_BLOCK_SIZE
    assert "block_size" not in engine_kwargs(llm, on_cpu=False)               # GPU: vLLM's default


def test_a_cpu_engine_gets_a_fixed_kv_cache_of_its_model(tiny_models):
    """On CPU, four max_model_len sequences of the model's own K and V (16-bit), never a RAM
    fraction; an explicit `extra` size wins; a GPU engine keeps gpu_memory_utilization."""
    import json

    from medclaw.engine.backends.vllm_local import CPU_KV_SEQUENCES, engine_kwargs
    from medclaw.models.spec import ModelSpec

    config = json.loads((tiny_models.llm / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2
    llm = ModelSpec(name="l", path=str(tiny_models.llm), max_model_len=2048)
    assert engine_kwargs(llm, on_cpu=True)["kv_cache_memory_bytes"] == per_token * 2048 * CPU_KV_SEQUENCES
    on_gpu = engine_kwargs(llm, on_cpu=False)
    assert "kv_cache_memory_bytes" not in on_gpu
    assert on_gpu["gpu_memory_utilization"] == llm.gpu_memory_utilization
    explicit = ModelSpec(name="l", path=str(tiny_models.llm), extra={"kv_cache_memory_bytes": 12345})
    assert engine_kwargs(explicit, on_cpu=True)["kv_cache_memory_bytes"] == 12345


@engine_test
async def test_video_request_accounting(vlm_engine, tiny_vlm_spec, random_clip):
    from medclaw.models.store import revision_hash

    clip = MediaItem(kind="video", uuid=media_uuid("c" * 64, 0, 15, 2.0, 224 * 224),
                     frames=random_clip(7), fps=2.0)
    request = Conversation("You watch videos.").add_user("What is shown?", media=[clip]) \
        .to_request(max_tokens=5)
    result = await vlm_engine.generate_one(request)
    # 16 frames at 224x224 → 8 temporal groups x 8x8 merged patches = 512 video tokens
    assert result.num_prompt_tokens > 512
    assert result.num_completion_tokens == 5 and result.finish_reason == "length"
    assert result.model_name == "tiny-vlm"
    assert result.model_revision == revision_hash(tiny_vlm_spec.path)
    assert result.latency_s > 0
    # time to first token: measured at the first streamed token, so within the call; prefill of
    # 512+ video tokens happens before it, the 4 decode steps after it
    assert 0 < result.ttft_s < result.latency_s


@engine_test
async def test_media_uuid_is_the_cache_identity(vlm_engine, random_clip):
    frames = random_clip(8)
    first = MediaItem(kind="video", uuid=media_uuid("d" * 64, 0, 15, 2.0, 224 * 224),
                      frames=frames, fps=2.0)
    renamed = MediaItem(kind="video", uuid=media_uuid("d" * 64, 0, 15, 2.0, 225 * 225),
                        frames=frames, fps=2.0)
    results = []
    for item in (first, first, renamed):
        request = Conversation("You watch videos.").add_user("Q?", media=[item]).to_request(max_tokens=2)
        results.append(await vlm_engine.generate_one(request))
    hit, miss = results[1], results[2]
    assert hit.num_cached_tokens >= 512            # same uuid: the video's KV is reused
    assert miss.num_cached_tokens < 512 // 2       # new uuid: only the text before the video


@engine_test
async def test_repeat_questions_reuse_the_video(vlm_engine):
    stats = await bench_kv.repeat_question_reuse(vlm_engine, seed=11)
    assert stats["cached_tokens"][0] < stats["prompt_tokens"][0] - 512   # first question: a miss
    assert stats["fraction"] >= 0.90, stats


@engine_test
async def test_stage2_extends_stage1(vlm_engine):
    stats = await bench_kv.stage2_reuse(vlm_engine, seed=12)
    assert stats["stage2_prompt_tokens"] > stats["stage1_prompt_tokens"]
    assert stats["fraction"] >= 0.95, stats


@engine_test
async def test_orchestrator_turns_reuse_previous_turn(llm_engine, tool_specs):
    stats = await bench_kv.turn_reuse(llm_engine, tool_specs, turns=3)
    assert stats["prompt_tokens"] == sorted(stats["prompt_tokens"])      # append-only growth
    assert stats["fraction"] >= 0.95, stats


@engine_test
async def test_concurrent_requests_from_two_event_loops(llm_engine, tool_specs):
    """16 requests in flight at once: 8 from this loop, 8 from another thread's own loop."""
    other: dict = {}

    def other_loop():
        other["stats"] = asyncio.run(bench_kv.concurrent_requests(llm_engine, tool_specs, n=8))

    thread = threading.Thread(target=other_loop)
    thread.start()
    here = await bench_kv.concurrent_requests(llm_engine, tool_specs, n=8)
    await asyncio.to_thread(thread.join)
    assert here["completed"] == 8
    assert other["stats"]["completed"] == 8


@engine_test
async def test_constrained_tool_calls_all_parse(llm_engine, tool_specs):
    stats = await bench_kv.constrained_tool_calls(llm_engine, tool_specs, n=40)
    assert stats["parsed"] == 40, stats["failures"]
    assert len(stats["tools_used"]) >= 2                 # sampling explores the anyOf branches



@engine_test
def test_render_keeps_order_placeholders_and_uuids(vlm_engine, random_clip):
    first = MediaItem(kind="video", uuid="clip-a", frames=random_clip(1, 4, 56, 56), fps=1.0)
    second = MediaItem(kind="video", uuid="clip-b", frames=random_clip(2, 6, 56, 56), fps=4.0)
    image = MediaItem(kind="image", uuid="img-c", frames=random_clip(3, 1, 56, 56)[0])
    conversation = (Conversation("SYSPROMPT").add_user("QUESTION-ONE", media=[first])
                    .add_assistant("ANSWER-ONE").add_user("QUESTION-TWO", media=[second, image]))
    prompt = vlm_engine.render(conversation.to_request())
    assert prompt["multi_modal_uuids"] == {"video": ["clip-a", "clip-b"], "image": ["img-c"]}
    text = prompt["prompt"]
    assert text.count("<|video_pad|>") == 2 and text.count("<|image_pad|>") == 1
    marks = ["SYSPROMPT", "<|video_pad|>", "QUESTION-ONE", "ANSWER-ONE", "QUESTION-TWO"]
    assert [text.index(m) for m in marks] == sorted(text.index(m) for m in marks)
    assert text.endswith("<|im_start|>assistant\n")
    frames, metadata = prompt["multi_modal_data"]["video"][1]
    assert frames.shape == (6, 56, 56, 3)
    assert metadata == {"fps": 4.0, "frames_indices": list(range(6)), "total_num_frames": 6,
                        "duration": 1.5, "do_sample_frames": False}


@engine_test
async def test_cancelled_request_is_aborted_and_engine_keeps_serving(llm_engine):
    long_request = Conversation("SYS").add_user("talk").to_request(max_tokens=4000)
    task = asyncio.create_task(llm_engine.generate_one(long_request))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await llm_engine.generate_one(
        Conversation("SYS").add_user("again").to_request(max_tokens=3))
    assert result.num_completion_tokens == 3
    assert llm_engine._engine.get_num_unfinished_requests() == 0      # the long one was aborted


@pytest.mark.engine
async def test_prompt_longer_than_the_context_is_a_one_line_error(llm_engine, tiny_llm_spec):
    from medclaw.engine.backends.base import RequestRejectedError

    too_long = "gallbladder " * (tiny_llm_spec.max_model_len + 100)
    request = Conversation("SYS").add_user(too_long).to_request(max_tokens=4)
    with pytest.raises(RequestRejectedError) as info:
        await llm_engine.generate_one(request)
    message = str(info.value)
    assert "tiny-llm" in message and "\n" not in message
    # the engine keeps serving after the rejection
    ok = await llm_engine.generate_one(Conversation("SYS").add_user("hi").to_request(max_tokens=2))
    assert ok.num_completion_tokens == 2


@engine_test
async def test_cached_output_equals_cold_output(vlm_engine, llm_engine, tool_specs):
    """bench kv's check on the shared engines: greedy output from the prefix cache is the output
    of the same request on the engine made cold again (reset_caches)."""
    stats = await bench_kv.cached_equals_cold(vlm_engine, llm_engine, tool_specs)
    for model in ("vlm", "llm"):
        assert stats[model]["was_cached"] and stats[model]["warm_cached_tokens"] > 256, stats
        assert stats[model]["same_output"], stats


@engine_test
async def test_resized_frames_are_a_fidelity_error(vlm_engine, random_clip):
    """210-px frames are not a multiple of 28: vLLM's processor resizes them to 224 (64 tokens a
    frame pair where 49 were planned): the count differs and the request is an error."""
    from medclaw.engine.backends.base import FidelityError

    clip = MediaItem(kind="video", uuid=media_uuid("f" * 64, 0, 3, 2.0, 210 * 210),
                     frames=random_clip(3, 4, 210, 210), fps=2.0)
    request = Conversation("SYS").add_user("x", media=[clip]).to_request(max_tokens=2)
    with pytest.raises(FidelityError) as info:
        await vlm_engine.generate_one(request)
    planned = int(str(info.value).split("planned ")[1].split(" ")[0])
    reported = int(str(info.value).split("saw ")[1].split(" ")[0])
    assert reported - planned == 2 * (64 - 49)


@engine_test
def test_an_engine_that_cannot_start_is_a_one_line_error(tiny_llm_spec):
    """vLLM's own start failure (here a KV cache larger than the machine) is one RunFailedError
    line naming the model, not vLLM's traceback."""
    from dataclasses import replace

    from medclaw.engine.backends.vllm_local import VLLMBackend
    from medclaw.errors import RunFailedError

    spec = replace(tiny_llm_spec, extra={**tiny_llm_spec.extra, "kv_cache_memory_bytes": 1 << 50})
    with pytest.raises(RunFailedError, match="the vLLM engine did not start") as caught:
        VLLMBackend(spec)
    message = str(caught.value)
    assert "\n" not in message and repr(spec.name) in message
