"""`medclaw trace show FILE [--json]`: read an episode trace back, readably.

Reads only through `medclaw.engine.trace.Trace.load` (validated; a file that is not a trace is a
one-line error, exit 2). The text view (rich, on stdout) shows the header (question, video, models
+ revisions, version, seed, config and system-prompt hashes, skills), one row per step (tool,
args, observation or error, evidence frames, named time windows, sub-agent models, tokens /
cached tokens, latency) and the footer (answer, status, totals). `--json` prints the validated
trace as one JSON object (`{"header", "steps", "footer", "complete"}`; each step also carries its
derived `windows`). A trace without footer (killed process) is shown as "unfinished" (`"complete":
false`). Top level stays light: rich and pydantic are imported inside the handler.
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
    from medclaw.server.export import register_html_command   # `trace html`: argparse only

    register_html_command(sub)


def _show(args) -> int:
    from medclaw.engine.trace import Trace

    trace = Trace.load(args.file)
    if args.json:
        print(trace.to_json())
        return 0
    from rich.console import Console

    render(trace, Console())
    return 0


def render(trace, console) -> None:
    """Print `trace` (a `medclaw.engine.trace.Trace`) on a rich console."""
    from rich.markup import escape as e
    from rich.rule import Rule
    from rich.text import Text

    header, footer, video = trace.header, trace.footer, trace.header.video
    console.print(f"[bold]Episode[/] {e(header.episode_id)}  ({header.created_at:%Y-%m-%d %H:%M:%S %Z})")
    console.print(f"[bold]Question:[/] {e(header.question)}")
    console.print(f"[bold]Video:[/] {e(video.path)}  sha256 {video.sha256[:16]}…  "
                  f"{video.duration_s:.1f} s @ {video.fps:.2f} fps, {video.width}x{video.height}")
    for role, model in header.models.items():
        console.print(f"  {role:15s} {e(model.name)} ({e(model.backend)}) rev {e(model.revision or '-')}"
                      f"  {e(model.path)}")
    skills = ", ".join(f"{s.name} v{s.version}" for s in header.skills) or "none"
    console.print(Text(f"medclaw {header.medclaw_version}"
                       f"{' (' + header.git_describe + ')' if header.git_describe else ''}, "
                       f"seed {header.seed}, config sha256 {header.config_sha256[:12]}…, "
                       f"system prompt sha256 {header.system_prompt_sha256[:12]}…, skills: {skills}",
                       style="dim"))

    console.print(Rule("steps"))
    for step in trace.steps:
        console.print(_step_line(step))
        if step.thought:
            console.print(Text(f"      thought: {_short(step.thought, 200)}", style="italic"))
        if step.error:
            console.print(Text.assemble("      ", ("error: ", "bold red"), _short(step.error, 300)))
        else:
            console.print(Text(f"      obs: {_short(step.observation, 300)}"))
        extra = _evidence(step)
        if extra:
            console.print(Text("      " + extra, style="dim"))
    console.print(Rule())

    if footer is None:
        console.print("[yellow]Unfinished trace (no footer): the process stopped mid-episode.[/]")
        return
    totals, calls = footer.totals, footer.totals.all_models
    colour = {"answered": "green", "forced_answer": "yellow"}.get(footer.outcome, "red")
    forced = f" ({e(footer.forced_reason)})" if footer.forced_reason else ""
    console.print(f"[bold]Status:[/] [{colour}]{e(footer.status)}[/]{forced}")
    console.print(f"[bold]Answer:[/] {e(str(footer.answer))}")
    if footer.evidence_times:
        console.print(f"[bold]Evidence times:[/] {footer.evidence_times}")
    console.print(
        f"[bold]Totals:[/] {totals.steps} steps ({totals.errors} errors), tools {e(str(totals.tools))}, "
        f"{totals.unique_frames} unique frames, {totals.visual_tokens_used} visual tokens, "
        f"{calls.prompt_tokens} prompt tokens of which {calls.cached_tokens} cached "
        f"(hit rate {100 * totals.cached_hit_rate:.1f}%), wall {totals.wall_s:.1f} s")
    if footer.error:
        console.print(Text(footer.error, style="red"))


def _step_line(step):
    from rich.text import Text

    call = step.orchestrator_call
    line = Text(f"{step.index:>3} ", style="bold")
    line.append(step.tool or "(no valid call)", style="cyan" if step.tool else "red")
    if step.kind == "forced_answer":
        line.append(" (forced)", style="yellow")
    line.append(f"  {_short(json.dumps(step.args), 100)}")
    if call is None:
        line.append("   orch call cancelled", style="dim")
    else:
        line.append(f"   orch {call.num_prompt_tokens} tok ({call.num_cached_tokens} cached) "
                    f"{call.latency_s:.2f}s + tool {step.tool_latency_s:.2f}s", style="dim")
    return line


def _evidence(step) -> str:
    """Frames, windows and sub-agent calls of a step, on one line ('' when none)."""
    parts = []
    if step.frames:
        times = sorted(f.timestamp_s for f in step.frames)
        indices = [f.frame_index for f in step.frames]
        cropped = ", cropped" if any(f.crop_box for f in step.frames) else ""
        parts.append(f"frames: {len(step.frames)} (#{min(indices)}-#{max(indices)}, "
                     f"{times[0]:.2f}-{times[-1]:.2f} s{cropped})")
    named = [w for w in step.windows if w.kind != "inspected"]
    if named:
        parts.append("windows: " + ", ".join(f"{w.kind} {w.start_s:.1f}-{w.end_s:.1f} s" for w in named))
    subs = step.model_calls
    if subs:
        parts.append(f"sub-agents: {len(subs)} call(s) "
                     f"({', '.join(sorted({c.model_name + '@' + str(c.model_revision) for c in subs}))}), "
                     f"{sum(c.num_prompt_tokens for c in subs)} tok "
                     f"({sum(c.num_cached_tokens for c in subs)} cached), "
                     f"{sum(c.latency_s for c in subs):.2f}s")
    return "  ".join(parts)


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
