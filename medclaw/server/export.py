"""`medclaw trace html TRACE --out case.html`: the audit view of one trace as one offline file.

The file holds the viewer's own script and style (the same `static/viewer.js` and `viewer.css` the
service serves), the view of the trace (`medclaw.server.view.build_view`) and every thumbnail it
shows as a `data:` URI, re-decoded from the trace's video through the frame-exact pipeline
(`thumbnails.Thumbnailer`; the video must still be where the trace says, with the same SHA-256).
Its Content-Security-Policy allows no request at all: it opens offline, from anywhere, and
cannot call out. Top level stays light (argparse only): the CLI imports this module at start.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import os
from pathlib import Path

CASE_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'")


def register_html_command(actions) -> None:
    """Add `html` to the `medclaw trace` actions (an argparse subparsers object)."""
    parser = actions.add_parser(
        "html", help="write one trace's audit view as a self-contained HTML file",
        description="write one trace's audit view (timeline, evidence frames, steps, answer) as "
                    "one HTML file with its thumbnails embedded; it opens offline")
    parser.add_argument("file", help="trace file written by `medclaw ask` (JSONL)")
    parser.add_argument("--out", required=True, metavar="CASE.html", help="the HTML file to write")
    parser.add_argument("--thumb-size", type=int, default=None, metavar="PX",
                        help="longest side of each thumbnail in pixels (default 240)")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from medclaw.errors import ConfigError

    if args.thumb_size is not None and not 16 <= args.thumb_size <= 1920:
        raise ConfigError("--thumb-size must be between 16 and 1920 pixels")
    out = write_case_html(args.file, args.out, max_side=args.thumb_size)
    print(out)
    return 0


def write_case_html(trace_path: str | os.PathLike, out_path: str | os.PathLike, *,
                    max_side: int | None = None, thumbnailer=None) -> Path:
    """Render `trace_path` into `out_path` (see module docstring); returns the path written."""
    from medclaw.engine.trace import Trace
    from medclaw.server.thumbnails import DEFAULT_MAX_SIDE, Thumbnailer
    from medclaw.server.view import build_view, frame_requests, trace_record

    out = Path(out_path)
    if not out.parent.is_dir():
        from medclaw.errors import ConfigError

        raise ConfigError(f"cannot write {out}: folder {out.parent} does not exist")
    record = trace_record(Trace.load(trace_path))
    view = build_view(record)
    requests = frame_requests(view, shown_only=True)
    thumbs: dict[str, str] = {}
    if requests:
        owner = thumbnailer is None
        thumbnailer = thumbnailer or Thumbnailer(max_side=max_side or DEFAULT_MAX_SIDE)
        try:
            info = thumbnailer.open_video(record["header"].get("video") or {})
            for key, jpeg in thumbnailer.render(info, requests).items():
                thumbs[key] = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
        finally:
            if owner:
                thumbnailer.close()
    page = case_page(view, thumbs, source=Path(trace_path).name)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def case_page(view: dict, thumbs: dict[str, str], *, source: str = "") -> str:
    from importlib import resources

    static = resources.files("medclaw.server").joinpath("static")
    css = static.joinpath("viewer.css").read_text(encoding="utf-8")
    js = static.joinpath("viewer.js").read_text(encoding="utf-8")
    # JSON inside <script>: no "<" may appear raw, or "</script>" in a model's text would end it.
    data = (json.dumps({"view": view, "thumbs": thumbs}, ensure_ascii=False)
            .replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    question = html.escape(str(view["episode"].get("question") or ""))[:120]
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CASE_CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>MedClaw case: {question}</title>\n<style>\n{css}</style>\n</head>\n<body>\n"
        "<header class=\"bar\"><h1>MedClaw <span>audit record</span></h1>"
        f"<span class=\"notice\">{html.escape(source)}</span></header>\n"
        "<main id=\"case\" class=\"case solo\"></main>\n"
        f"<script id=\"medclaw-case\" type=\"application/json\">{data}</script>\n"
        f"<script>\n{js}</script>\n</body>\n</html>\n")
