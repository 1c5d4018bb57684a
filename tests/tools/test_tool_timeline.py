"""Tolerant timestamp / window parsing (medclaw.tools.timeline)."""
import pytest

from medclaw.tools.timeline import (Window, find_windows, format_time, parse_timeline,
                                    parse_timestamp, parse_window, strip_reasoning)


@pytest.mark.parametrize("text, seconds", [
    ("00:12", 12.0), ("1:02", 62.0), ("01:02.5", 62.5), ("1:02:03", 3723.0), ("75:00", 4500.0),
    ("12.5s", 12.5), ("12.5 s", 12.5), ("30 sec", 30.0), ("90 seconds", 90.0), ("1m02s", 62.0),
    ("1m 2s", 62.0), ("2 min", 120.0), ("1.5 minutes", 90.0), ("1h2m3s", 3723.0), ("42", 42.0),
    ("1 hour 2 minutes", 3720.0), ("  7  ", 7.0),
])
def test_parse_timestamp_accepts(text, seconds):
    assert parse_timestamp(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "1:75", "1:60:00", "3:4:5:6", "1.5.2", "1.5:30",
                                  "12 apples", "-3", "mm:ss"])
def test_parse_timestamp_rejects(text):
    assert parse_timestamp(text) is None


@pytest.mark.parametrize("text, start, end", [
    ("[00:12-00:30]", 12, 30),
    ("12.5s - 30s", 12.5, 30),
    ("from 1:02 to 1:10", 62, 70),
    ("The event happens between 3 min and 4 min.", 180, 240),
    ("1m02s–1m10s", 62, 70),
    ("1:02:03 — 1:02:09.5", 3723, 3729.5),
    ("<think>first 0:01-0:02 maybe</think><answer>[00:40-00:45]</answer>", 40, 45),
    ("<answer>12s to 20s", 12, 20),                       # unclosed answer tag
    ('{"start": 12, "end": "0:30"}', 12, 30),
    ('Result: {"start_s": 5.5, "end_s": 9}', 5.5, 9),
    ("WINDOW: 12-30", 12, 30),                             # labelled: bare numbers allowed
    ("**Refined window**: 4 - 9", 4, 9),
    ("[12-30]", 12, 30),                                   # bracketed bare span
    ("WINDOW: [00:20]", 20, 20),                           # labelled single time: a moment
    ("[00:30-00:12]", 12, 30),                             # reversed → ordered
    ("The query mentions 0:10-0:50.\nWINDOW: [00:20-00:25]", 20, 25),   # labelled line wins
    ("seen at 0:10-0:20 and again at 0:31-0:33", 31, 33),  # last window
])
def test_parse_window(text, start, end):
    window = parse_window(text)
    assert window == Window(pytest.approx(start), pytest.approx(end))


@pytest.mark.parametrize("text", [
    "", "No clear event is visible.", "Answer: 3 graspers", "steps 1-2 then 5", "dated 2024-05-01", "WINDOW: unknown",
    "<think>0:10-0:20</think>",                            # only reasoning, answer empty
    '{"start": -1, "end": 3}',
])
def test_parse_window_none(text):
    assert parse_window(text) is None


def test_find_windows_bare_numbers_need_lenient():
    assert find_windows("instruments 2-3 are visible") == []
    assert find_windows("instruments 2-3 are visible", lenient=True) == [Window(2.0, 3.0)]
    # a time with a unit or a colon is enough on one side
    assert find_windows("from 12 to 30s") == [Window(12.0, 30.0)]


def test_parse_timeline_shapes_and_unparsed():
    text = """Timeline:
[00:00-00:10] trocar insertion
1. 00:10 - 00:20: dissection of Calot's triangle
- 20s-30s — clipping of the cystic duct
(0:30–0:35) cutting
* 00:40 gallbladder retrieved
1.5s - 3s: camera cleaning
3 graspers visible
WINDOW: [00:10-00:20]
"""
    timeline = parse_timeline(text)
    got = [(e.start_s, e.end_s, e.text) for e in timeline.entries]
    assert got == [
        (0.0, 10.0, "trocar insertion"),
        (1.5, 3.0, "camera cleaning"),
        (10.0, 20.0, "dissection of Calot's triangle"),
        (20.0, 30.0, "clipping of the cystic duct"),
        (30.0, 35.0, "cutting"),
        (40.0, 40.0, "gallbladder retrieved"),
    ]
    assert timeline.unparsed == ["3 graspers visible"]
    assert parse_window(text) == Window(10.0, 20.0)
    assert parse_window(text, require_label=True) == Window(10.0, 20.0)
    unlabelled = text.replace("WINDOW: [00:10-00:20]", "")
    assert parse_window(unlabelled) == Window(1.5, 3.0)            # last window in the text
    assert parse_window(unlabelled, require_label=True) is None     # timeline lines do not count


def test_parse_timeline_inside_answer():
    text = "<think>let me look</think><answer>\n[00:01-00:04] a\n[00:04-00:09.5] b\n</answer>"
    timeline = parse_timeline(text)
    assert [(e.start_s, e.end_s) for e in timeline.entries] == [(1.0, 4.0), (4.0, 9.5)]
    assert [e.text for e in timeline.entries] == ["a", "b"] and timeline.unparsed == []


def test_parse_timeline_garbage_is_all_unparsed():
    timeline = parse_timeline("zzkq  \n\n   fffff 12 apples\n")
    assert timeline.entries == []
    assert timeline.unparsed == ["zzkq", "fffff 12 apples"]


def test_strip_reasoning():
    assert strip_reasoning("<think>x</think>y") == "y"
    assert strip_reasoning("<think>never closed") == ""
    assert strip_reasoning("<answer>a</answer> trailing") == "a"
    assert strip_reasoning("plain") == "plain"


@pytest.mark.parametrize("seconds", [0.0, 5.25, 59.96, 61.2, 599.9, 3600.0, 3725.4, 40000.0])
def test_format_time_roundtrips(seconds):
    text = format_time(seconds)
    assert parse_timestamp(text) == pytest.approx(seconds, abs=0.05)


def test_window_clamp():
    assert Window(5, 20).clamp(0, 10) == Window(5, 10)
    assert Window(15, 20).clamp(0, 10) is None
