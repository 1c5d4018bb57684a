"""`medclaw demo`: the whole pipeline end to end on tiny local models, in a few minutes.

1. synthesise a short procedure video (default 1 min, 320x180) with zoom content — small objects,
   look-alike instruments told apart by a small mark (`synth.zoom`) — and its ground truth
   → artifacts/demo/ (kept when an earlier run made the same one);
2. build the knowledge base from the corpus shipped with the package → artifacts/demo/kb/ (kept
   when an earlier run built it from the same corpus and encoder: `kb.build.current_index`);
3. ask the video's first small-object question ("Which small object lies in the field at 12.6 s:
   needle, bulldog clamp, gauze tag?") on the `tiny-trained` profile: the trained miniature
   (`medclaw models train-tiny`), real vLLM CPU engines, real decoding, real FAISS, the real agent
   loop and tools;
4. print the answer next to the ground truth — right or wrong, and whether its evidence times fall
   on the object's visit — the evidence frames (time, frame index, region, the video's sha256)
   and a summary of the trace (steps, tools, frames, tokens and cached tokens, timings).

The miniature was trained on synthetic procedures only: its answers say the machinery sees and
plans, not that it knows surgery. `--profile tiny-cpu` runs the same on random weights, where the
answer is noise. Every run prints which of the two it is. With `--json` the summary is one JSON
object on stdout.
"""
from __future__ import annotations

import argparse
import json

DEMO_KIND = "small_object"           # the zoom question family the demo asks (synth.zoom)
DEMO_SEED = 0                        # not among the miniature's training seeds
RANDOM_WEIGHTS_LABEL = ("TINY RANDOM WEIGHTS: the answer below is noise. The structure is real: "
                        "engines, tool calls, decoded frames, cache accounting and the trace.")
TRAINED_LABEL = ("TRAINED MINIATURE (synthetic procedures only, not clinical quality): the answer "
                 "below is checked against the video's ground truth.")
LABELS = {"tiny-trained": TRAINED_LABEL}           # any other profile: RANDOM_WEIGHTS_LABEL


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", default="artifacts/demo", help="where the video, KB and traces go")
    parser.add_argument("--minutes", type=float, default=1.0, help="length of the synthetic video")
    parser.add_argument("--max-steps", type=int, default=6, help="orchestrator steps before a forced answer")
    parser.add_argument("--profile", default="tiny-trained",
                        help="model profile (default tiny-trained; tiny-cpu: random weights)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=_handle)


def _handle(args) -> int:
    import asyncio
    import os
    import time
    from pathlib import Path

    # The demo is a show of the pipeline: vLLM's CPU-platform warnings (no Triton, no tcmalloc, …)
    # would bury it. `VLLM_LOGGING_LEVEL=WARNING medclaw demo` brings them back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from rich.console import Console

    from medclaw.errors import ConfigError

    if not 0.25 <= args.minutes <= 30:
        raise ConfigError("--minutes must be between 0.25 and 30")
    console = Console(stderr=True)
    label = LABELS.get(args.profile, RANDOM_WEIGHTS_LABEL)
    console.print(f"[bold yellow]{label}[/]")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    with console.status("synthesising the procedure video…"):
        started = time.perf_counter()
        video = _synth(out / "demo-procedure.mp4", args.minutes)
        timings["synth_s"] = time.perf_counter() - started
    from medclaw.synth.zoom import VISIT_KIND

    qa = next(q for q in video.gt.zoom["qa"] if q["kind"] == DEMO_KIND)
    visit = next(v for v in video.gt.zoom["visits"] if v["kind"] == VISIT_KIND[DEMO_KIND]
                 and v["start_s"] <= qa["evidence_times_s"][0] < v["end_s"])
    console.log(f"video {video.path} ({video.duration_s:.0f} s); the {qa['answer']} is on screen "
                f"{visit['start_s']:.1f}-{visit['end_s']:.1f} s")

    from medclaw.kb.build import build_index, current_index

    kept = current_index(None, out / "kb")          # built by an earlier run from the same corpus
    if kept is not None:
        console.log(f"knowledge base: {kept['count']} passages (kept from {kept['created']})")
    else:
        with console.status("building the knowledge base from the shipped corpus…"):
            started = time.perf_counter()
            kb = build_index(None, out / "kb", progress=False)
            timings["kb_build_s"] = time.perf_counter() - started
        console.log(f"knowledge base: {kb.count} passages ({timings['kb_build_s']:.1f} s)")

    from medclaw.engine.config import load_episode_config
    from medclaw.engine.runtime import open_runtime

    config = load_episode_config(None, profile=args.profile, max_steps=args.max_steps,
                                 trace_dir=str(out / "traces"))
    runtime = open_runtime(profile=args.profile, kb_dir=str(out / "kb"))
    result = asyncio.run(_ask(runtime, config, qa["question"], str(video.path), console, timings))

    from medclaw.engine.trace import Trace

    trace = Trace.load(result.trace_path)
    summary = _summary(trace, result, qa, visit, label, timings)
    if args.json:
        print(json.dumps(summary))
    else:
        _print(summary, trace)
    return 3 if result.status.startswith("failed") else 0       # exit statuses: medclaw --help


def _synth(path, minutes: float):
    """Reuse the video when it exists with the same ground truth (synthesis is deterministic)."""
    from medclaw.synth.video import SynthVideo, synthesize
    from medclaw.synth.truth import make_ground_truth
    from medclaw.synth.zoom import ZoomOptions

    size = dict(width=320, height=180, fps=25, zoom=ZoomOptions.all())
    gt = make_ground_truth(minutes, seed=DEMO_SEED, **size)
    gt_path = path.with_suffix(".json")
    if path.is_file() and gt_path.is_file():
        try:
            if json.loads(gt_path.read_text()) == json.loads(json.dumps(gt.to_dict())):
                return SynthVideo(path=path, gt_path=gt_path, gt=gt)
        except ValueError:
            pass
    return synthesize(path, minutes=minutes, seed=DEMO_SEED, progress=False, **size)


async def _ask(runtime, config, question, video_path, console, timings):
    import time

    from medclaw.engine.episode import run_episode
    from medclaw.errors import as_run_failure

    try:
        with console.status("starting the vLLM engines (CPU, about 40 s each)…"):
            started = time.perf_counter()
            await runtime.start(on_engine=lambda ready: console.log(ready.line()))
            timings["engine_start_s"] = time.perf_counter() - started
        console.log(f"engines up ({timings['engine_start_s']:.0f} s)")
        with console.status("episode: step 1…") as status:
            def on_step(step, budget):
                mark = " ✗ " + step.error[:60] if step.error else ""
                tool = "answer (forced)" if step.kind == "forced_answer" else \
                    (step.tool or "(no valid call)")
                console.log(f"step {step.index}/{config.max_steps} {tool}{mark}")
                if step.index < config.max_steps:
                    status.update(f"episode: step {step.index + 1}…")

            started = time.perf_counter()
            try:
                result = await run_episode(question, video_path, runtime, config,
                                           on_step=on_step)
            except Exception as err:     # engines ran: a failure is a run-time failure (exit 3)
                raise as_run_failure(err)
            timings["episode_s"] = time.perf_counter() - started
        return result
    finally:
        await runtime.close()


def _summary(trace, result, qa: dict, visit: dict, label: str, timings: dict) -> dict:
    from medclaw.eval.scorers import score_label
    from medclaw.synth.truth import spoken
    from medclaw.synth.zoom import LOOK_ALIKES, SMALL_OBJECTS

    totals = trace.footer.totals.to_dict() if trace.footer else {}
    names = SMALL_OBJECTS if DEMO_KIND == "small_object" else LOOK_ALIKES
    choices = [spoken(n) for n in names]
    times = list(result.evidence_times or [])
    return {
        "label": label,
        "question": qa["question"],
        "answer": result.answer,
        "ground_truth": qa["answer"],
        # right: names the object and no other; evidence: every cited time lies in its visit
        "correct": bool(result.answer) and score_label(result.answer, qa["answer"], choices) == 1.0,
        "evidence_times": times,
        "evidence_in_visit": bool(times) and all(visit["start_s"] <= t < visit["end_s"] for t in times),
        "visit_s": [round(visit["start_s"], 2), round(visit["end_s"], 2)],
        "evidence_frames": _evidence_frames(trace),
        "status": result.status,
        "forced_reason": trace.footer.forced_reason if trace.footer else None,
        "steps": result.steps,
        "tools": [s.tool or "(invalid)" for s in trace.steps],
        "errors": totals.get("errors", 0),
        "unique_frames": totals.get("unique_frames", 0),
        "visual_tokens": totals.get("visual_tokens_used", 0),
        "orchestrator": totals.get("orchestrator", {}),
        "sub_agents": totals.get("sub_agents", {}),
        "cached_hit_rate": totals.get("cached_hit_rate", 0.0),
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "trace": result.trace_path,
    }


def _evidence_frames(trace) -> list[dict]:
    """Every frame a frame tool showed a model: time, index in the video, region, video hash."""
    frames = []
    for step in trace.steps:
        if step.tool in ("crop_video_frame", "select_video_frame"):
            frames += [{"tool": step.tool, "time_s": round(f.timestamp_s, 3), "index": f.frame_index,
                        "crop_box": f.crop_box, "video_sha256": f.video_sha256} for f in step.frames]
    return frames


def _print(summary: dict, trace) -> None:
    from rich.console import Console

    from medclaw.cli.trace import render

    console = Console()
    render(trace, console)
    console.rule("demo summary")
    console.print(f"[bold yellow]{summary['label']}[/]")
    console.print(f"Question:     {summary['question']}", markup=False)
    forced = f"; forced: {summary['forced_reason']}" if summary.get("forced_reason") else ""
    console.print(f"Answer:       {summary['answer']!r}   (status: {summary['status']}{forced})",
                  markup=False)
    console.print(f"Ground truth: {summary['ground_truth']}  (on screen {summary['visit_s'][0]:.1f}-"
                  f"{summary['visit_s'][1]:.1f} s)", markup=False)
    console.print(f"Right:        {'yes' if summary['correct'] else 'no'}; evidence "
                  f"{summary['evidence_times']} s {'in' if summary['evidence_in_visit'] else 'NOT in'} "
                  "the visit", markup=False)
    for f in summary["evidence_frames"]:
        region = f" region {tuple(round(v, 2) for v in f['crop_box'])}" if f["crop_box"] else ""
        console.print(f"Evidence:     {f['tool']} t={f['time_s']:.2f} s = frame {f['index']}{region} "
                      f"of video sha256 {f['video_sha256'][:16]}…", markup=False)
    orch, subs = summary["orchestrator"], summary["sub_agents"]
    console.print(f"Steps: {summary['steps']}  tools: {', '.join(summary['tools'])}  "
                  f"({summary['errors']} error observations)", markup=False)
    console.print(f"Frames: {summary['unique_frames']} unique, {summary['visual_tokens']} visual tokens")
    console.print(f"Orchestrator: {orch.get('calls', 0)} calls, {orch.get('prompt_tokens', 0)} prompt tokens, "
                  f"{orch.get('cached_tokens', 0)} cached ({100 * orch.get('cached_hit_rate', 0):.0f}%)")
    console.print(f"Sub-agents:   {subs.get('calls', 0)} calls, {subs.get('prompt_tokens', 0)} prompt tokens, "
                  f"{subs.get('cached_tokens', 0)} cached ({100 * subs.get('cached_hit_rate', 0):.0f}%)")
    console.print("Timings: " + ", ".join(f"{k} {v:.1f}" for k, v in summary["timings_s"].items()))
    console.print(f"Trace: {summary['trace']}  (medclaw trace show {summary['trace']})", markup=False)
