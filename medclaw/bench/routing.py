"""`medclaw bench routing`: prefix-cache hit rate across several vLLM servers, with cache-aware
routing (rendezvous hashing on the episode / the video) against least-in-flight routing.

Starts `--servers` loopback servers with `medclaw models serve MODEL` (or uses `--endpoints`),
then runs the same workload twice through the remote backend, once per routing mode, each on
content no server has seen (fresh videos and questions, so both start cold). One episode: an
orchestrator conversation of `--turns` turns (each appends a reply and an observation), and about
its video a view_full_video-like stage 1 + stage 2 and one more question on the same clip.
Episodes run `--concurrency` at a time, after one warm-up episode per server (first-request
set-up costs and the shared system prompt then weigh on neither mode).

Reported per mode: cached / prompt tokens as the backend saw them and as the servers counted them
(`vllm:prefix_cache_hits_total` / `…queries_total` from every server's /metrics, which must agree),
requests per server, media bytes uploaded, wall time. Self-judging: exits 1 unless affinity's hit
rate beats least-in-flight's and the two accountings agree.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

MODES = ("affinity", "least_in_flight")
START_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_servers(model: str, count: int, profile: str | None, log_dir: str) -> tuple[list, list]:
    """`count` loopback `medclaw models serve` processes; returns (processes, base URLs) once all
    answer /health."""
    medclaw = [sys.executable, "-c", "import sys; from medclaw.cli import main; sys.exit(main())"]
    processes, urls = [], []
    os.makedirs(log_dir, exist_ok=True)
    for i in range(count):
        port = _free_port()
        argv = medclaw + ["models", "serve", model, "--port", str(port)]
        if profile:
            argv += ["--profile", profile]
        with open(os.path.join(log_dir, f"server-{i}.log"), "wb") as log:
            processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + START_TIMEOUT_S
    for process, url in zip(processes, urls):
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                stop_servers(processes)
                raise RuntimeError(f"server {url} did not start; see {log_dir}")
            time.sleep(2)
    return processes, [f"{url}/v1" for url in urls]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def stop_servers(processes: list) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def server_counters(base_url: str) -> dict[str, float]:
    """Prefix-cache counters of one server (summed over label sets)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {"hits": 0.0, "queries": 0.0}
    for line in text.splitlines():
        for key, name in (("hits", "vllm:prefix_cache_hits_total"),
                          ("queries", "vllm:prefix_cache_queries_total")):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def _clip(tag: str, num_frames: int, side: int, fps: float):
    import numpy as np

    from medclaw.requests.conversation import media_uuid
    from medclaw.types import MediaItem

    sha = hashlib.sha256(tag.encode()).hexdigest()
    rng = np.random.default_rng(int(sha[:8], 16))
    frames = rng.integers(0, 256, (num_frames, side, side, 3), dtype=np.uint8)   # (T, H, W, 3)
    return MediaItem(kind="video", uuid=media_uuid(sha, 0, num_frames - 1, fps, side * side),
                     frames=frames, fps=fps, frame_indices=list(range(num_frames)))


async def episode(backend, run: str, index: int, turns: int, system: str) -> list:
    """One episode's calls (orchestrator turns, then the video calls after turn 1 and 2)."""
    from medclaw.bench.kv import VLM_SYSTEM
    from medclaw.requests.conversation import Conversation

    low = _clip(f"{run}-video-{index}", 32, 224, 2.0)        # 1024 visual tokens
    high = _clip(f"{run}-window-{index}", 16, 224, 2.0)      # 512 visual tokens (224 px: the tiny
    # VLM processor's pixel cap; a bigger frame would be resized and fail the fidelity check)
    orchestrator = Conversation(system).add_user(f"Question {run}-{index}: when is the clip applied?")
    results = []
    for turn in range(turns):
        reply = await backend.generate_one(orchestrator.to_request(max_tokens=8))
        results.append(("orchestrator", reply))
        observation = f"Observation {turn}: nothing notable in window {turn}."
        if turn == 0:       # view_full_video: stage 1, then stage 2 continues it
            video = Conversation(VLM_SYSTEM).add_user("Find the clip application.", media=[low])
            stage1 = await backend.generate_one(video.to_request(max_tokens=8))
            video.add_assistant(stage1.text).add_user("That window, closer.", media=[high])
            results += [("video", stage1),
                        ("video", await backend.generate_one(video.to_request(max_tokens=8)))]
        elif turn == 1:     # another question on the same whole-video clip
            again = Conversation(VLM_SYSTEM).add_user("Which instruments are visible?", media=[low])
            results.append(("video", await backend.generate_one(again.to_request(max_tokens=8))))
        orchestrator.add_assistant(reply.text).add_user(observation)
    return results


async def warm_up(spec, system: str) -> None:
    """One throwaway episode per server (one endpoint each), so neither mode pays first-request
    costs (grammar and processor set-up) and the shared system prompt is cached everywhere."""
    import dataclasses

    from medclaw.engine.backends.remote import RemoteBackend

    for i, url in enumerate(spec.endpoints):
        one = RemoteBackend(dataclasses.replace(spec, endpoints=[url]))
        await episode(one, "warm-up", i, 2, system)


async def run_mode(spec, mode: str, args, system: str) -> dict:
    import dataclasses

    from medclaw.engine.backends.remote import RemoteBackend

    spec = dataclasses.replace(spec, extra={**spec.extra, "routing": mode})
    backend = RemoteBackend(spec)
    before = [server_counters(url) for url in spec.endpoints]
    gate = asyncio.Semaphore(args.concurrency)

    async def one(index: int):
        async with gate:
            return await episode(backend, mode, index, args.turns, system)

    started = time.perf_counter()
    tagged = [c for batch in await asyncio.gather(*(one(i) for i in range(args.episodes)))
              for c in batch]
    calls = [c for _, c in tagged]
    wall = time.perf_counter() - started
    await asyncio.sleep(1.0)           # let the servers' metrics catch up with the last step
    after = [server_counters(url) for url in spec.endpoints]
    prompt = sum(c.num_prompt_tokens for c in calls)
    cached = sum(c.num_cached_tokens for c in calls)
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before))
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before))
    by_kind = {kind: round(sum(c.num_cached_tokens for k, c in tagged if k == kind)
                           / max(1, sum(c.num_prompt_tokens for k, c in tagged if k == kind)), 4)
               for kind in ("orchestrator", "video")}
    return {"requests": len(calls), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": round(cached / max(1, prompt), 4),
            "hit_rate_orchestrator": by_kind["orchestrator"], "hit_rate_video": by_kind["video"],
            "server_hit_rate": round(hits / max(1, queries), 4),
            "server_hits": int(hits), "server_queries": int(queries),
            "requests_per_server": list(backend.requests_served),
            "media_mb_uploaded": round(backend.media_bytes_sent / 1e6, 2), "wall_s": round(wall, 2)}


def measure(spec, args) -> dict:
    from medclaw.bench.kv import ORCHESTRATOR_SYSTEM, bench_tool_specs
    from medclaw.engine.toolcall import describe_tools

    system = ORCHESTRATOR_SYSTEM + "\n\n" + describe_tools(bench_tool_specs())
    asyncio.run(warm_up(spec, system))
    modes = {mode: asyncio.run(run_mode(spec, mode, args, system)) for mode in MODES}
    affinity, baseline = modes["affinity"], modes["least_in_flight"]
    checks = {
        "affinity_beats_least_in_flight": affinity["hit_rate"] > baseline["hit_rate"],
        "backend_equals_server_counters": all(
            m["cached_tokens"] == m["server_hits"] and m["prompt_tokens"] == m["server_queries"]
            for m in modes.values()),
    }
    return {"modes": modes, "hit_rate_gain": round(affinity["hit_rate"] - baseline["hit_rate"], 4),
            "checks": checks, "ok": all(checks.values())}


def run(args: argparse.Namespace) -> int:
    from medclaw.models.serve import resolve_served_model

    local = resolve_served_model(args.model, profile=args.profile)
    processes = []
    endpoints = [u for u in (args.endpoints or "").split(",") if u]
    if not endpoints:
        print(f"starting {args.servers} servers for {args.model} …", file=sys.stderr)
        processes, endpoints = start_servers(args.model, args.servers, args.profile, args.log_dir)
    try:
        import dataclasses

        spec = dataclasses.replace(local, backend="remote", endpoints=endpoints,
                                   extra={"per_request_seed": False})
        report = {"model": args.model, "servers": len(endpoints), "episodes": args.episodes,
                  "turns": args.turns, "concurrency": args.concurrency, **measure(spec, args)}
    finally:
        stop_servers(processes)
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0 if report["ok"] else 1


def _table(report: dict) -> str:
    lines = [f"{'mode':18s} {'hit rate':>9s} {'server':>8s} {'per server':>14s} {'MB up':>7s} {'wall s':>7s}"]
    for mode, m in report["modes"].items():
        lines.append(f"{mode:18s} {m['hit_rate']:9.3f} {m['server_hit_rate']:8.3f} "
                     f"{str(m['requests_per_server']):>14s} {m['media_mb_uploaded']:7.2f} {m['wall_s']:7.1f}")
    lines.append(f"checks: {report['checks']}")
    return "\n".join(lines)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-vlm",
                        help="preset / imported model to serve and route to (default: tiny-vlm)")
    parser.add_argument("--profile", default="tiny-cpu",
                        help="profile whose vLLM defaults the servers use (default: tiny-cpu)")
    parser.add_argument("--servers", type=int, default=2, help="loopback servers to start")
    parser.add_argument("--endpoints", help="comma-separated base URLs of running servers instead")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4, help="orchestrator turns per episode")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once")
    parser.add_argument("--log-dir", default="artifacts/routing-logs", help="server logs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)
