"""The viewer's data (`server.view`) and the self-contained case file (`medclaw trace html`)."""
from __future__ import annotations

import json
import re

import pytest

from medclaw.cli import main
from medclaw.server.view import MAX_THUMBS_PER_STEP, build_view, frame_requests, step_view
from tests.server.conftest import run_scripted_episode

HOSTILE = "</script><img src=x onerror=\"document.title='pwned'\">"


def hostile_orchestrator(request) -> str:
    done = sum(1 for m in request.messages if m["role"] == "assistant")
    if done == 0:
        return json.dumps({"thought": HOSTILE, "tool": "select_video_frame",
                           "args": {"time_s": 12.0, "query": HOSTILE}})
    return json.dumps({"thought": "", "tool": "final_answer",
                       "args": {"text": HOSTILE, "evidence_times": [12.0]}})


def embedded_case(page: str) -> dict:
    match = re.search(r'<script id="medclaw-case" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no embedded case data"
    return json.loads(match.group(1))


def ref(index: int, t: float, crop=None) -> dict:
    return {"video_sha256": "0" * 64, "frame_index": index, "timestamp_s": t, "width": 280,
            "height": 168, "crop_box": crop}


def test_a_step_shows_at_most_the_cap_every_region_included_evenly_spaced():
    frames = [ref(i, i / 10) for i in range(200)] + [ref(7, 0.7, [0.1, 0.1, 0.5, 0.5]),
                                                     ref(150, 15.0, [0.5, 0.5, 1.0, 1.0])]
    step = step_view({"index": 1, "tool": "view_full_video", "frames": frames}, 30.0)
    assert step["frames_total"] == 202
    shown = [f for f in step["frames"] if f["shown"]]
    assert len(shown) == MAX_THUMBS_PER_STEP
    assert sum(1 for f in shown if f["crop_box"]) == 2
    plain = [f["frame_index"] for f in shown if not f["crop_box"]]
    assert plain[0] == 0 and plain[-1] == 199                       # the ends, and even gaps between
    gaps = {b - a for a, b in zip(plain, plain[1:])}
    assert max(gaps) - min(gaps) <= 1
    assert step["windows"] == [{"start_s": 0.0, "end_s": 19.9, "label": "frames shown",
                                "kind": "inspected"}]            # no windows in the row: the span
    requests = frame_requests({"steps": [step]}, shown_only=True)
    assert requests["7@0.1000,0.1000,0.5000,0.5000"] == (7, [0.1, 0.1, 0.5, 0.5])
    assert requests["7"] == (7, None)                               # the frame under the region


def test_trace_html_writes_one_offline_file_with_every_thumbnail(tmp_path, video_root):
    from medclaw.engine.trace import Trace
    from medclaw.server.view import trace_record

    trace = run_scripted_episode(tmp_path, video_root / "case.mp4")
    out = tmp_path / "case.html"
    assert main(["trace", "html", str(trace), "--out", str(out)]) == 0
    page = out.read_text()
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'' in page
    assert not re.search(r'(src|href)="(?!data:)', page)            # nothing to fetch, ever
    data = embedded_case(page)
    view = build_view(trace_record(Trace.load(trace)))
    assert data["view"] == json.loads(json.dumps(view))
    wanted = frame_requests(view, shown_only=True)
    assert set(data["thumbs"]) == set(wanted) and len(wanted) > 10
    assert all(uri.startswith("data:image/jpeg;base64,/9j/") for uri in data["thumbs"].values())


def test_model_text_cannot_break_out_of_the_case_file(tmp_path, video_root):
    trace = run_scripted_episode(tmp_path, video_root / "case.mp4", hostile_orchestrator)
    out = tmp_path / "case.html"
    assert main(["trace", "html", str(trace), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<img src=x" not in page and page.count("</script>") == 2      # only our two scripts
    data = embedded_case(page)
    assert data["view"]["answer"]["text"] == HOSTILE                     # kept, as text


@pytest.mark.parametrize("problem, message", [
    ("no trace", "trace file not found"),
    ("not a trace", "is this a medclaw trace?"),
    ("video changed", "changed since the trace was written"),
    ("video gone", "cannot read the trace's video"),
    ("no out folder", "does not exist"),
])
def test_trace_html_bad_inputs_are_one_line_errors(tmp_path, video_root, capsys, problem, message):
    trace = run_scripted_episode(tmp_path, video_root / "case.mp4")
    out = tmp_path / "case.html"
    if problem == "no trace":
        trace = tmp_path / "missing.jsonl"
    elif problem == "not a trace":
        trace = tmp_path / "other.jsonl"
        trace.write_text('{"hello": 1}\n')
    elif problem == "video changed":
        with open(video_root / "case.mp4", "ab") as file:
            file.write(b"\0")
    elif problem == "video gone":
        (video_root / "case.mp4").unlink()
    else:
        out = tmp_path / "nowhere" / "case.html"
    capsys.readouterr()
    assert main(["trace", "html", str(trace), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()
