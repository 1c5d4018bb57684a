"""`medclaw trace show FILE [--json]`: read an episode trace back, readably.

The text view (rich, on stdout) shows the header (question, video, models), one row per step
(tool, args, observation or error, evidence frames, tokens / cached tokens, latency) and the
footer (answer, status, totals). `--json` prints the whole trace as one JSON object
(`{"header", "steps", "footer"}`). A trace without footer (killed process) is shown as
"unfinished". Top level stays light: rich is imported inside the handler.
"""
from __future__ import annotations

import argparse
import json


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    show = sub.add_parser("show", help="print one episode trace (JSONL)",
                          description="print one episode trace (JSONL)")
    show.add_argument("file", help="trace file written by `medclaw ask`")
    show.add_argument("--json", action="store_true", help="print the trace as one JSON object")
    show.set_defaults(handler=_show)


def _show(args) -> int:
    from medclaw.engine.trace import Trace

    trace = Trace.load(args.file)
    if args.json:
        print(json.dumps(trace.to_dict(), indent=2))
        return 0
    from rich.console import Console

    render(trace, Console())
    return 0


def render(trace, console) -> None:
    """Print `trace` (a `Trace`) on a rich console."""
    from rich.markup import escape as e
    from rich.rule import Rule
    from rich.text import Text

    header, footer = trace.header, trace.footer
    video = header.get("video", {})
    console.print(f"[bold]Episode[/] {e(str(header.get('episode_id', '?')))}  ({header.get('created_at', '')})")
    console.print(f"[bold]Question:[/] {e(header.get('question', ''))}")
    console.print(f"[bold]Video:[/] {e(str(video.get('path')))}  sha256 {str(video.get('sha256', ''))[:16]}…  "
                  f"{video.get('duration_s', 0):.1f} s @ {video.get('fps', 0):.2f} fps, "
                  f"{video.get('width')}x{video.get('height')}")
    for role, model in (header.get("models") or {}).items():
        revision = model.get("revision") or "-"
        console.print(f"  {role:15s} {e(str(model.get('name')))} ({model.get('backend')}) rev {e(str(revision))}  {e(str(model.get('path')))}")

    console.print(Rule("steps"))
    for step in trace.steps:
        call = step.get("orchestrator_call") or {}
        line = Text(f"{step['index']:>3} ", style="bold")
        line.append(step.get("tool") or "(no valid call)", style="cyan" if step.get("tool") else "red")
        if step.get("kind") == "forced_answer":
            line.append(" (forced)", style="yellow")
        line.append(f"  {_short(json.dumps(step.get('args', {})), 100)}")
        line.append(f"   orch {call.get('num_prompt_tokens', 0)} tok ({call.get('num_cached_tokens', 0)} cached) "
                    f"{call.get('latency_s', 0):.2f}s + tool {step.get('tool_latency_s', 0):.2f}s", style="dim")
        console.print(line)
        if step.get("thought"):
            console.print(Text(f"      thought: {_short(step['thought'], 200)}", style="italic"))
        if step.get("error"):
            console.print(Text.assemble("      ", ("error: ", "bold red"), _short(step["error"], 300)))
        else:
            console.print(Text(f"      obs: {_short(step.get('observation', ''), 300)}"))
        frames = step.get("frames") or []
        subs = step.get("model_calls") or []
        if frames or subs:
            extra = "      "
            if frames:
                times = sorted(f["timestamp_s"] for f in frames)
                extra += (f"frames: {len(frames)} (#{min(f['frame_index'] for f in frames)}-"
                          f"#{max(f['frame_index'] for f in frames)}, {times[0]:.2f}-{times[-1]:.2f} s"
                          f"{', cropped' if any(f.get('crop_box') for f in frames) else ''})  ")
            if subs:
                extra += (f"sub-agents: {len(subs)} call(s), {sum(c['num_prompt_tokens'] for c in subs)} tok "
                          f"({sum(c['num_cached_tokens'] for c in subs)} cached), "
                          f"{sum(c['latency_s'] for c in subs):.2f}s")
            console.print(Text(extra, style="dim"))
    console.print(Rule())

    if footer is None:
        console.print("[yellow]Unfinished trace (no footer): the process stopped mid-episode.[/]")
        return
    totals = footer.get("totals", {})
    status = footer.get("status", "?")
    colour = "green" if status == "answered" else "yellow" if status == "forced_answer" else "red"
    forced = f" ({e(footer['forced_reason'])})" if footer.get("forced_reason") else ""
    console.print(f"[bold]Status:[/] [{colour}]{e(status)}[/]{forced}")
    console.print(f"[bold]Answer:[/] {e(str(footer.get('answer')))}")
    if footer.get("evidence_times"):
        console.print(f"[bold]Evidence times:[/] {footer['evidence_times']}")
    all_models = totals.get("all_models", {})
    console.print(
        f"[bold]Totals:[/] {totals.get('steps', 0)} steps ({totals.get('errors', 0)} errors), "
        f"tools {e(str(totals.get('tools', {})))}, {totals.get('unique_frames', 0)} unique frames, "
        f"{totals.get('visual_tokens_used', 0)} visual tokens, "
        f"{all_models.get('prompt_tokens', 0)} prompt tokens of which "
        f"{all_models.get('cached_tokens', 0)} cached "
        f"(hit rate {100 * totals.get('cached_hit_rate', 0):.1f}%), wall {totals.get('wall_s', 0):.1f} s")
    if footer.get("error"):
        console.print(Text(str(footer["error"]), style="red"))


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
