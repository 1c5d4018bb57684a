"""The live stream: each trace step arrives as server-sent events while the job runs (uvicorn on a
loopback port, read with httpx as it streams)."""
from __future__ import annotations

import json
import queue
import threading

import httpx

from tests.server.conftest import EVIDENCE, QUESTION, wait_for


def read_events(response, out: queue.Queue) -> None:
    """Parse `event:`/`data:`/`id:` blocks off a streaming response into `out` as they come."""
    event, data, event_id = "message", [], None
    for line in response.iter_lines():
        if line == "":
            if data:
                out.put((event, json.loads("".join(data)), event_id))
            event, data, event_id = "message", [], None
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line.startswith("id:"):
            event_id = line[3:].strip()
    out.put(("closed", None, None))


def next_event(out: queue.Queue, kind: str, timeout: float = 30.0):
    """The next event of `kind`, skipping others (status updates)."""
    while True:
        event, data, event_id = out.get(timeout=timeout)
        if event in (kind, "closed"):
            return event, data, event_id


def test_steps_arrive_live_while_the_job_runs(make_service, live_server, video_root):
    service = make_service(hold_at=1)            # step 1 completes, step 2's call waits
    base = live_server(service)
    with httpx.Client(base_url=base, headers=service.auth, timeout=30) as client:
        job = client.post("/api/jobs", json={"question": QUESTION,
                                             "video": str(video_root / "case.mp4")}).json()
        events: queue.Queue = queue.Queue()
        with client.stream("GET", f"/api/jobs/{job['id']}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = threading.Thread(target=read_events, args=(response, events), daemon=True)
            reader.start()

            event, first, event_id = next_event(events, "step")
            assert event == "step" and event_id == "1"
            assert first["step"]["tool"] == "view_full_video" and first["step"]["frames"]
            assert first["view"]["windows"] and first["view"]["frames"][0]["key"]
            # the job is still running: step 2 has not happened, and nothing else was sent
            assert client.get(f"/api/jobs/{job['id']}").json()["status"] == "running"
            assert events.empty()

            service.orchestrator.release.set()
            _, second, event_id = next_event(events, "step")
            assert event_id == "2" and second["step"]["tool"] == "crop_video_frame"
            _, third, _ = next_event(events, "step")
            assert third["step"]["tool"] == "final_answer"
            event, end, _ = next_event(events, "end")
            assert event == "end" and end["job"]["status"] == "done"
            assert [e["time_s"] for e in end["view"]["answer"]["evidence"]] == EVIDENCE
            assert next_event(events, "closed")[0] == "closed"     # the stream ends with the job
            reader.join(5)


def test_a_stream_resumes_after_last_event_id_and_replays_finished_jobs(make_service, live_server,
                                                                        video_root):
    service = make_service()
    base = live_server(service)
    with httpx.Client(base_url=base, headers=service.auth, timeout=30) as client:
        job = client.post("/api/jobs", json={"question": QUESTION,
                                             "video": str(video_root / "case.mp4")}).json()
        wait_for(lambda: client.get(f"/api/jobs/{job['id']}").json()["status"] == "done")
        for after, expected in (("0", ["1", "2", "3"]), ("2", ["3"]), ("3", [])):
            events: queue.Queue = queue.Queue()
            with client.stream("GET", f"/api/jobs/{job['id']}/events",
                               headers={"Last-Event-ID": after}) as response:
                read_events(response, events)
            kinds = []
            while not events.empty():
                kinds.append(events.get())
            assert [i for e, _, i in kinds if e == "step"] == expected
            assert [e for e, _, _ in kinds][-2:] == ["end", "closed"]
        unknown = client.get("/api/jobs/" + "B" * 22 + "/events")
        assert unknown.status_code == 404
