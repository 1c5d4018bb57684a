"""`medclaw bench kv`: how much prompt work the prefix cache saves, on the configured profile.

Starts one in-process vLLM engine for the VLM (role video_expert) and one for the LLM (role
orchestrator) and measures, with the prompt layouts of `medclaw.requests.conversation`:

- repeat_question_cached_fraction: questions 2..n about one clip — cached / prompt tokens;
- stage2_cached_fraction: view_full_video stage 2 (continues stage 1's conversation with a hi-res
  window) — stage 2's cached tokens / stage 1's prompt tokens (capped at 1 per call);
- turn_cached_fraction: orchestrator turn k+1 reusing turn k — same ratio, summed over turns;
- concurrent_requests_ok: "k/16" requests awaited concurrently on one engine that completed;
- constrained_tool_calls_parsed: "k/100" schema-constrained tool calls that `parse_action` accepts.

- cached_equals_cold: a request served from the prefix cache gives the same greedy output as the
  same request on the engine made cold again (prefix, media and encoder caches dropped), for the
  VLM (a clip question) and the LLM (an orchestrator turn).

Clips are random uint8 frames (what matters here is token layout, not content), each measurement
with its own media UUID so its first request is a genuine miss. The measurement coroutines are
also what the engine tests assert on. Output is one JSON object on stdout (`--json`) or a table.
The benchmark judges itself: `checks` holds each figure against its target (`TARGETS`: repeat
>= 0.90, stage 2 and turns >= 0.95, 16/16, 100/100, cached output == cold output) and the exit
status is 1 when any is missed.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys

VLM_SYSTEM = ("You are a surgical video expert. Describe only what is visible in the video; name "
              "phases, instruments and anatomy precisely, and give times in seconds.")
ORCHESTRATOR_SYSTEM = ("You answer questions about a long surgical video that you cannot see. "
                       "Use the tools to look at it, coarse to fine, then give the final answer.")
QUESTIONS = ("Which surgical phase is shown?", "Which instruments are visible?",
             "Is there bleeding?", "When is the first clip applied?", "What happens at the end?")
TOOL_CALL_MAX_TOKENS = 1536      # bounded schema: thought + longest string args + structure
# report key → minimum (fractions; "k/n" counts must be n/n; booleans must be true)
TARGETS = {"repeat_question_cached_fraction": 0.90, "stage2_cached_fraction": 0.95,
           "turn_cached_fraction": 0.95, "concurrent_requests_ok": 1.0,
           "constrained_tool_calls_parsed": 1.0, "cached_equals_cold": True}


def _clip(seed: int, num_frames: int, side: int, fps: float, max_pixels: int):
    """A MediaItem of random frames with its own UUID (so its first use is a cache miss)."""
    import numpy as np

    from medclaw.requests.conversation import media_uuid
    from medclaw.types import MediaItem

    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (num_frames, side, side, 3), dtype=np.uint8)  # (T, H, W, 3)
    sha = hashlib.sha256(f"bench-kv-{seed}-{rng.integers(1 << 62)}".encode()).hexdigest()
    return MediaItem(kind="video", uuid=media_uuid(sha, 0, num_frames - 1, fps, max_pixels),
                     frames=frames, fps=fps, frame_indices=list(range(num_frames)),
                     source_fps=fps, source_num_frames=num_frames)


async def repeat_question_reuse(vlm, seed: int = 0, questions=QUESTIONS) -> dict:
    """Ask several questions about one clip, one after another (each a fresh conversation)."""
    from medclaw.requests.conversation import Conversation

    clip = _clip(seed, num_frames=16, side=224, fps=2.0, max_pixels=224 * 224)
    prompt, cached = [], []
    for question in questions:
        request = Conversation(VLM_SYSTEM).add_user(question, media=[clip]).to_request(max_tokens=8)
        result = await vlm.generate_one(request)
        prompt.append(result.num_prompt_tokens)
        cached.append(result.num_cached_tokens)
    return {"prompt_tokens": prompt, "cached_tokens": cached,
            "fraction": sum(cached[1:]) / max(1, sum(prompt[1:]))}


async def stage2_reuse(vlm, seed: int = 1) -> dict:
    """Stage 1 on the low-res clip, then stage 2 appends the answer and a hi-res window."""
    from medclaw.requests.conversation import Conversation

    low = _clip(seed, num_frames=16, side=224, fps=1.0, max_pixels=224 * 224)
    high = _clip(seed + 1000, num_frames=8, side=336, fps=4.0, max_pixels=336 * 336)
    conversation = Conversation(VLM_SYSTEM).add_user(
        "Find the window where the clip is applied. Answer with start and end seconds.", media=[low])
    first = await vlm.generate_one(conversation.to_request(max_tokens=16))
    conversation.add_assistant(first.text).add_user(
        "Here is that window at higher resolution. Describe the clip application.", media=[high])
    second = await vlm.generate_one(conversation.to_request(max_tokens=16))
    return {"stage1_prompt_tokens": first.num_prompt_tokens,
            "stage2_prompt_tokens": second.num_prompt_tokens,
            "stage2_cached_tokens": second.num_cached_tokens,
            "fraction": min(second.num_cached_tokens, first.num_prompt_tokens)
            / max(1, first.num_prompt_tokens)}


def orchestrator_conversation(tool_specs: list[dict], question: str):
    from medclaw.requests.conversation import Conversation
    from medclaw.engine.toolcall import describe_tools

    return Conversation(ORCHESTRATOR_SYSTEM + "\n\n" + describe_tools(tool_specs)).add_user(
        f"Question: {question}")


async def turn_reuse(llm, tool_specs: list[dict], turns: int = 4) -> dict:
    """An orchestrator episode: each turn appends the action and its observation."""
    from medclaw.engine.toolcall import action_schema, parse_action

    schema = action_schema(tool_specs) if llm.supports_json_schema else None
    conversation = orchestrator_conversation(tool_specs, "When is the cystic duct clipped?")
    prompt, cached = [], []
    for turn in range(turns):
        result = await llm.generate_one(conversation.to_request(
            max_tokens=TOOL_CALL_MAX_TOKENS, json_schema=schema))
        prompt.append(result.num_prompt_tokens)
        cached.append(result.num_cached_tokens)
        action = parse_action(result.text, tool_specs)
        observation = getattr(action, "message", None) or f"(observation {turn}: nothing notable)"
        conversation.add_assistant(result.text).add_user(f"Observation: {observation}")
    reused = sum(min(c, p) for c, p in zip(cached[1:], prompt[:-1]))
    return {"prompt_tokens": prompt, "cached_tokens": cached,
            "fraction": reused / max(1, sum(prompt[:-1]))}


async def concurrent_requests(llm, tool_specs: list[dict], n: int = 16) -> dict:
    """`n` episodes' first turns awaited at once (separate tasks) on one engine."""
    requests = [orchestrator_conversation(tool_specs, f"Question {i}: what happens at minute {i}?")
                .to_request(max_tokens=16, request_id=f"concurrent-{i}") for i in range(n)]
    results = await asyncio.gather(*(llm.generate_one(r) for r in requests))
    done = sum(1 for r in results if r.finish_reason in ("stop", "length") and r.num_completion_tokens)
    return {"completed": done, "n": n, "cached_tokens": [r.num_cached_tokens for r in results],
            "prompt_tokens": [r.num_prompt_tokens for r in results]}


async def constrained_tool_calls(llm, tool_specs: list[dict], n: int = 100) -> dict:
    """`n` schema-constrained tool calls, all in flight together; how many parse and validate."""
    from medclaw.engine.toolcall import Action, action_schema, parse_action

    schema = action_schema(tool_specs)
    requests = [orchestrator_conversation(tool_specs, f"Case {i}: is the critical view reached?")
                .to_request(max_tokens=TOOL_CALL_MAX_TOKENS, json_schema=schema,
                            temperature=1.0, seed=i, request_id=f"toolcall-{i}")
                for i in range(n)]
    results = await llm.generate(requests)
    actions = [parse_action(r.text, tool_specs) for r in results]
    failures = [{"error": a.message, "finish_reason": r.finish_reason,
                 "completion_tokens": r.num_completion_tokens, "text_tail": r.text[-120:]}
                for a, r in zip(actions, results) if not isinstance(a, Action)]
    tools_used = sorted({a.tool for a in actions if isinstance(a, Action)})
    return {"parsed": n - len(failures), "n": n, "tools_used": tools_used,
            "failures": failures[:5],
            "completion_tokens_max": max(r.num_completion_tokens for r in results)}


async def cached_vs_cold(backend, request) -> dict:
    """Greedy output of `request` served from the prefix cache, then on the engine made cold."""
    await backend.generate_one(request)                        # warms the cache
    warm = await backend.generate_one(request)
    await asyncio.to_thread(backend.reset_caches)
    cold = await backend.generate_one(request)
    return {"warm_cached_tokens": warm.num_cached_tokens, "cold_cached_tokens": cold.num_cached_tokens,
            "prompt_tokens": warm.num_prompt_tokens, "warm_text": warm.text[:200],
            "cold_text": cold.text[:200],
            "same_output": warm.text == cold.text
            and warm.num_completion_tokens == cold.num_completion_tokens,
            "was_cached": warm.num_cached_tokens > 0 and cold.num_cached_tokens == 0}


async def cached_equals_cold(vlm, llm, tool_specs: list[dict]) -> dict:
    from medclaw.requests.conversation import Conversation

    clip = _clip(99, num_frames=16, side=224, fps=2.0, max_pixels=224 * 224)
    vlm_request = Conversation(VLM_SYSTEM).add_user(QUESTIONS[0], media=[clip]).to_request(
        max_tokens=16, temperature=0.0)
    llm_request = orchestrator_conversation(tool_specs, "Where is the gallbladder dissected?") \
        .to_request(max_tokens=16, temperature=0.0)
    out = {"vlm": await cached_vs_cold(vlm, vlm_request),
           "llm": await cached_vs_cold(llm, llm_request)}
    out["ok"] = all(r["same_output"] and r["was_cached"] for r in out.values())
    return out


def judge(report: dict) -> dict:
    """Each TARGETS figure of `report` against its target: {key: {value, target, ok}}."""
    checks = {}
    for key, target in TARGETS.items():
        value = report[key]
        if isinstance(value, str):             # "k/n"
            done, total = (int(v) for v in value.split("/"))
            ok = total > 0 and done / total >= target
        elif isinstance(target, bool):
            ok = value is target
        else:
            ok = value >= target
        checks[key] = {"value": value, "target": target, "ok": ok}
    return checks


async def measure(vlm, llm, tool_specs: list[dict], step=lambda name: None) -> dict:
    """Run every measurement; `step(name)` is called as each one starts (progress display)."""
    step("repeat questions")
    repeat = await repeat_question_reuse(vlm)
    step("stage 2")
    stage2 = await stage2_reuse(vlm)
    step("orchestrator turns")
    turns = await turn_reuse(llm, tool_specs)
    step("16 concurrent requests")
    concurrent = await concurrent_requests(llm, tool_specs)
    step("100 constrained tool calls")
    calls = await constrained_tool_calls(llm, tool_specs)
    step("cached vs cold output")
    cold = await cached_equals_cold(vlm, llm, tool_specs)
    return {
        "repeat_question_cached_fraction": round(repeat["fraction"], 4),
        "stage2_cached_fraction": round(stage2["fraction"], 4),
        "turn_cached_fraction": round(turns["fraction"], 4),
        "concurrent_requests_ok": f"{concurrent['completed']}/{concurrent['n']}",
        "constrained_tool_calls_parsed": f"{calls['parsed']}/{calls['n']}",
        "cached_equals_cold": cold["ok"],
        "raw": {"repeat_question": repeat, "stage2": stage2, "turns": turns,
                "concurrent": concurrent, "tool_calls": calls, "cached_vs_cold": cold},
    }


def bench_tool_specs() -> list[dict]:
    """The real tools' specs, exactly as the orchestrator gets them."""
    from medclaw.tools.registry import default_registry

    return default_registry().specs()


def _started(backend_class, spec, role: str):
    """Start one engine before any measurement; one line on stderr when it is up."""
    import time

    from tqdm import tqdm

    from medclaw.engine.runtime import EngineReady

    started = time.perf_counter()
    backend = backend_class(spec)
    tqdm.write(EngineReady(spec.name, spec.backend, [role], time.perf_counter() - started).line(),
               file=sys.stderr)
    return backend


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from medclaw.config_file import DEFAULT_PROFILE
    from medclaw.engine.backends.vllm_local import VLLMBackend
    from medclaw.models.registry import load_models

    specs = load_models(config_path=args.config, profile=args.profile)
    vlm_spec, llm_spec = specs["video_expert"], specs["orchestrator"]
    profile = args.profile or ("(from config)" if args.config else DEFAULT_PROFILE)
    report = {"profile": profile, "vlm": vlm_spec.name, "llm": llm_spec.name, "block_size": None}
    started = []
    with tqdm(total=8, desc="bench kv", unit="step", file=sys.stderr) as bar:
        def step(name: str) -> None:       # marks the previous step done, shows the next one
            if started:
                bar.update(1)
            started.append(name)
            bar.set_postfix_str(name)

        step(f"start VLM {vlm_spec.name}")
        vlm = _started(VLLMBackend, vlm_spec, "video_expert")
        try:
            step(f"start LLM {llm_spec.name}")
            llm = _started(VLLMBackend, llm_spec, "orchestrator")
            try:
                report["block_size"] = llm.block_size
                report.update(asyncio.run(measure(vlm, llm, bench_tool_specs(), step)))
                bar.update(1)
            finally:
                llm.shutdown()
        finally:
            vlm.shutdown()
    report["checks"] = judge(report)
    missed = [key for key, check in report["checks"].items() if not check["ok"]]
    report["ok"] = not missed
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            if key not in ("raw", "checks"):
                print(f"{key:34s} {value}")
    if missed:
        print(f"medclaw bench kv: target missed: {', '.join(missed)}", file=sys.stderr)
    return 0 if not missed else 1


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=None,
                        help="deployment profile (default: the config's, else tiny-cpu)")
    parser.add_argument("--config", default=None, help="models config file (YAML/JSON)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)
