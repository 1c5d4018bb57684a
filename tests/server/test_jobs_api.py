"""Jobs through the HTTP API: submit, run, trace, view, thumbnails, cancel, limits, restarts."""
from __future__ import annotations

import io

import numpy as np
import pytest

from tests.server.conftest import EVIDENCE, QUESTION, ZOOM, wait_for


def submit(client, service, **body):
    body.setdefault("question", QUESTION)
    if "upload" not in body:
        body.setdefault("video", str(service.roots[0] / "case.mp4"))
    return client.post("/api/jobs", headers=service.auth, json=body)


def job_of(client, service, job_id) -> dict:
    return client.get(f"/api/jobs/{job_id}", headers=service.auth).json()


def finished(client, service, job_id, timeout: float = 60.0) -> dict:
    return wait_for(lambda: (j := job_of(client, service, job_id))["status"] in
                    ("done", "failed", "cancelled") and j, timeout)


def jpeg(data: bytes) -> np.ndarray:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    assert image.format == "JPEG"
    return np.asarray(image.convert("RGB"))


def test_a_job_runs_to_an_answer_with_trace_view_and_exact_thumbnails(make_service, client_for):
    from medclaw.synth.barcode import read_frame_index

    service = make_service()
    client = client_for(service)
    created = submit(client, service)
    assert created.status_code == 201, created.text
    job = finished(client, service, created.json()["id"])
    assert job["status"] == "done" and job["answer"] == "scissors"
    assert job["result_status"] == "answered" and job["steps"] == 3

    trace = client.get(f"/api/jobs/{job['id']}/trace", headers=service.auth).json()
    assert trace["header"]["question"] == QUESTION
    assert [s["tool"] for s in trace["steps"]] == ["view_full_video", "crop_video_frame", "final_answer"]
    assert trace["footer"]["status"] == "answered"

    view = client.get(f"/api/jobs/{job['id']}/view", headers=service.auth).json()["view"]
    overview, zoom, final = view["steps"]
    assert {w["kind"] for w in overview["windows"]} == {"inspected", "named"}
    whole = [w for w in overview["windows"] if w["kind"] == "inspected"][0]
    assert whole["start_s"] < 2.0 and whole["end_s"] > 55.0                 # stage 1: whole video
    assert overview["calls"][0]["model"] == "scripted-vlm" and overview["orchestrator"]["revision"]
    [region] = zoom["frames"]
    assert region["crop_box"] == [ZOOM["x1"], ZOOM["y1"], ZOOM["x2"], ZOOM["y2"]]
    assert abs(region["timestamp_s"] - ZOOM["time_s"]) < 0.05
    assert [w["kind"] for w in final["windows"]] == ["evidence", "evidence"]
    evidence = view["answer"]["evidence"]
    assert [e["time_s"] for e in evidence] == EVIDENCE
    assert evidence[0]["frame"]["key"] == region["key"]                     # 20 s → the zoomed frame
    assert abs(evidence[1]["frame"]["timestamp_s"] - EVIDENCE[1]) < 1.5     # 41 s → a stage-2 frame

    shown = [f for s in view["steps"] for f in s["frames"] if f["shown"]]
    assert len(shown) >= 10
    for frame in shown:
        url = f"/api/jobs/{job['id']}/frames/{frame['frame_key']}"
        response = client.get(url, headers=service.auth)
        assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
        pixels = jpeg(response.content)
        assert pixels.shape[1] == 240                                       # longest side
        assert read_frame_index(pixels) == frame["frame_index"]             # the very frame
    zoomed = client.get(f"/api/jobs/{job['id']}/frames/{region['key']}", headers=service.auth)
    assert zoomed.status_code == 200
    assert jpeg(zoomed.content).shape[:2] == (108, 160)      # the region: 0.5 x 0.6 of 320 x 180

    missing = client.get(f"/api/jobs/{job['id']}/frames/12345", headers=service.auth)
    assert missing.status_code == 404 and "references no such frame" in missing.json()["detail"]


def test_a_thumbnail_of_a_changed_video_is_refused(make_service, client_for, video_root, synth_video):
    service = make_service()
    client = client_for(service)
    job = finished(client, service, submit(client, service).json()["id"])
    view = client.get(f"/api/jobs/{job['id']}/view", headers=service.auth).json()["view"]
    key = view["steps"][0]["frames"][0]["key"]
    with open(video_root / "case.mp4", "ab") as file:       # the file is no longer the evidence
        file.write(b"\0" * 16)
    response = client.get(f"/api/jobs/{job['id']}/frames/{key}", headers=service.auth)
    assert response.status_code == 409 and "changed since the trace was written" in response.text


def test_an_uploaded_video_runs_like_a_path(make_service, client_for, video_root):
    service = make_service(allowed_roots=[])                # uploads only
    client = client_for(service)
    assert client.get("/api/info", headers=service.auth).json()["accepts_paths"] is False
    data = (video_root / "case.mp4").read_bytes()
    upload = client.post("/api/uploads?filename=case.mp4", headers=service.auth, content=data)
    assert upload.status_code == 201 and upload.json()["bytes"] == len(data)
    job = finished(client, service, submit(client, service, upload=upload.json()["upload"]).json()["id"])
    assert job["status"] == "done" and job["uploaded"] is True
    assert job["video"].startswith(str(service.data_dir / "uploads"))
    by_path = submit(client, service)
    assert by_path.status_code == 400 and "uploads only" in by_path.json()["detail"]
    for bad in ("../token", "x" * 22 + ".mp4", upload.json()["upload"] + "/.."):
        assert submit(client, service, upload=bad).status_code == 400


@pytest.mark.parametrize("body, status, message", [
    ({"question": "   "}, 400, "the question is empty"),
    ({"question": "x" * 5000}, 422, ""),
    ({"profile": "no-such-profile"}, 400, "not served here"),
    ({"upload": "abc", "video": "/x.mp4"}, 400, "either a video path or an upload"),
    ({"surprise": 1}, 422, ""),
])
def test_bad_submissions_are_refused_with_one_line(make_service, client_for, body, status, message):
    service = make_service()
    client = client_for(service)
    response = submit(client, service, **body)
    assert response.status_code == status, response.text
    if message:
        assert message in response.json()["detail"] and "\n" not in response.json()["detail"]


def test_a_corrupt_video_is_refused_at_submission(make_service, client_for, video_root):
    service = make_service()
    client = client_for(service)
    (video_root / "broken.mp4").write_bytes((video_root / "case.mp4").read_bytes()[:5000])
    response = submit(client, service, video=str(video_root / "broken.mp4"))
    assert response.status_code == 400 and "broken.mp4" in response.json()["detail"]
    assert client.get("/api/jobs", headers=service.auth).json()["jobs"] == []


def test_cancel_a_queued_and_a_running_job(make_service, client_for):
    service = make_service(hold_at=0, concurrency=1)       # every orchestrator call waits
    client = client_for(service)
    running = submit(client, service).json()["id"]
    queued = submit(client, service).json()["id"]
    wait_for(lambda: job_of(client, service, running)["status"] == "running")
    assert job_of(client, service, queued)["status"] == "queued"

    cancelled = client.post(f"/api/jobs/{queued}/cancel", headers=service.auth).json()
    assert cancelled["status"] == "cancelled" and cancelled["attempts"] == 0
    client.post(f"/api/jobs/{running}/cancel", headers=service.auth)
    job = finished(client, service, running)
    assert job["status"] == "cancelled" and job["error"] == "cancelled by request"
    trace = client.get(f"/api/jobs/{running}/trace", headers=service.auth).json()
    assert trace["footer"]["status"].startswith("failed")              # the episode saved its end
    again = client.post(f"/api/jobs/{running}/cancel", headers=service.auth)
    assert again.status_code == 409
    service.orchestrator.release.set()
    assert job_of(client, service, queued)["status"] == "cancelled"       # never ran


def test_at_most_concurrency_jobs_run_at_once_on_shared_engines(make_service, client_for):
    service = make_service(hold_at=0, concurrency=2)
    client = client_for(service)
    ids = [submit(client, service).json()["id"] for _ in range(3)]

    def statuses():
        return [job_of(client, service, i)["status"] for i in ids]

    wait_for(lambda: statuses().count("running") == 2)
    held = len(service.orchestrator.requests)
    assert statuses() == ["running", "running", "queued"]
    service.orchestrator.release.set()
    for job_id in ids:
        assert finished(client, service, job_id)["status"] == "done"
    assert held == 0 and len(service.orchestrator.requests) == 9        # one engine, 3 x 3 calls


def test_a_restart_loses_no_job_and_reruns_unfinished_ones(make_service, client_for, tmp_path):
    data = tmp_path / "shared-data"
    first = make_service(hold_at=0, concurrency=1, data_dir=data)
    client = client_for(first)
    running = submit(client, first).json()["id"]
    queued = submit(client, first).json()["id"]
    wait_for(lambda: job_of(client, first, running)["status"] == "running")
    client.__exit__(None, None, None)                       # the server stops mid-episode

    from medclaw.server.store import JobStore

    store = JobStore(data / "jobs.sqlite")
    assert [store.get(i).status for i in (running, queued)] == ["queued", "queued"]
    assert store.get(running).attempts == 1
    store.close()

    second = make_service(data_dir=data)                    # same data folder, same token
    assert second.token == first.token
    client = client_for(second)
    for job_id in (running, queued):
        assert finished(client, second, job_id)["status"] == "done"
    job = job_of(client, second, running)
    assert job["attempts"] == 2 and "attempt-2" in job["trace_path"]
    interrupted = list((data / "jobs" / running / "attempt-1").glob("*.jsonl"))
    assert len(interrupted) == 1                            # the first attempt's trace is kept

    third = make_service(data_dir=data)                     # results persist across restarts
    client = client_for(third)
    jobs = {j["id"]: j for j in client.get("/api/jobs", headers=third.auth).json()["jobs"]}
    assert jobs[running]["answer"] == jobs[queued]["answer"] == "scissors"
