"""The service's gates: bearer token, allowed roots, upload cap, no CORS, unguessable job ids."""
from __future__ import annotations

import os
import re
import stat

import pytest

from medclaw.errors import ConfigError
from medclaw.server.security import (
    PathRejectedError, load_or_create_token, resolve_video_path, token_matches,
)


# --- the token ----------------------------------------------------------------------------------

def test_token_is_created_once_with_mode_0600(tmp_path):
    path = tmp_path / "server" / "token"
    token = load_or_create_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 43 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert load_or_create_token(path) == token                      # read back, not replaced
    assert load_or_create_token(tmp_path / "other") != token


def test_a_token_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "token"
    load_or_create_token(path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="accessible by other users.*chmod 600"):
        load_or_create_token(path)


def test_token_check_is_exact():
    token = "x" * 43
    assert token_matches(f"Bearer {token}", token)
    assert token_matches(f"bearer {token}", token)
    for header in (None, "", token, f"Basic {token}", f"Bearer {token[:-1]}", f"Bearer {token}y",
                   "Bearer "):
        assert not token_matches(header, token), header


def api_routes(app) -> list[tuple[str, str]]:
    out = []
    for route in app.routes:
        path = getattr(route, "path", "")
        if path.startswith("/api/"):
            for method in sorted(route.methods - {"HEAD"}):
                out.append((method, path.replace("{job_id}", "x" * 22).replace("{key}", "0")))
    return out


def test_every_api_endpoint_needs_the_token(make_service, client_for):
    service = make_service()
    client = client_for(service)
    routes = api_routes(service.app)
    assert len(routes) >= 10                        # every endpoint of the module docstring
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong-token-" + "x" * 30},
                        {"Authorization": f"Basic {service.token}"}):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
    # with the token the same requests get past the gate (404: no such job, 400/422: bad body)
    for method, path in routes:
        assert client.request(method, path, headers=service.auth).status_code != 401


def test_health_and_the_page_need_no_token_and_hold_no_data(make_service, client_for, video_root):
    service = make_service()
    client = client_for(service)
    job = client.post("/api/jobs", headers=service.auth,
                      json={"question": "What is secret here?", "video": str(video_root / "case.mp4")})
    assert job.status_code == 201
    assert client.get("/health").json() == {"status": "ok"}
    for path in ("/", "/static/viewer.js", "/static/viewer.css"):
        page = client.get(path)
        assert page.status_code == 200
        assert job.json()["id"] not in page.text and "secret" not in page.text
    assert client.get("/static/../jobs.sqlite").status_code == 404
    assert client.get("/static/token").status_code == 404


# --- paths --------------------------------------------------------------------------------------

def test_paths_outside_the_allowed_roots_are_400(make_service, client_for, video_root, tmp_path):
    service = make_service()
    client = client_for(service)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.mp4").write_bytes((video_root / "case.mp4").read_bytes())
    (video_root / "link.mp4").symlink_to(outside / "secret.mp4")           # symlink out of the root
    (video_root / "linkdir").symlink_to(outside, target_is_directory=True)
    cases = [
        str(video_root / ".." / "elsewhere" / "secret.mp4"),                 # `..`
        str(video_root / "link.mp4"),
        str(video_root / "linkdir" / "secret.mp4"),
        str(outside / "secret.mp4"),                                          # absolute elsewhere
        "/etc/passwd",
        "case.mp4",                                                           # relative
        str(video_root / "missing.mp4"),
        str(video_root),                                                      # a folder
        "",
    ]
    for path in cases:
        response = client.post("/api/jobs", headers=service.auth, json={"question": "q", "video": path})
        assert response.status_code == 400, (path, response.text)
        assert "\n" not in response.json()["detail"]
    assert client.get("/api/jobs", headers=service.auth).json()["jobs"] == []   # nothing queued
    # the same file inside the root is accepted
    ok = client.post("/api/jobs", headers=service.auth,
                     json={"question": "q", "video": str(video_root / "case.mp4")})
    assert ok.status_code == 201, ok.text


def test_resolve_video_path_without_roots_refuses_every_path(video_root):
    with pytest.raises(PathRejectedError, match="uploads only"):
        resolve_video_path(str(video_root / "case.mp4"), [])
    assert resolve_video_path(str(video_root / "case.mp4"), [video_root]) == \
        (video_root / "case.mp4").resolve()


# --- uploads ------------------------------------------------------------------------------------

def test_uploads_over_the_cap_are_413(make_service, client_for):
    service = make_service(max_upload_mb=0.01)                   # 10 KiB
    client = client_for(service)
    cap = service.settings.max_upload_bytes
    big = b"\0" * (cap + 1)
    declared = client.post("/api/uploads", headers=service.auth, content=big)
    assert declared.status_code == 413

    def chunks():                                                # no Content-Length: streamed
        for _ in range(4):
            yield b"\0" * (cap // 2)

    streamed = client.post("/api/uploads", headers=service.auth, content=chunks())
    assert streamed.status_code == 413
    uploads = service.data_dir / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []   # nothing left behind
    small = client.post("/api/uploads", headers=service.auth, content=b"\0" * 100)
    assert small.status_code == 201 and small.json()["bytes"] == 100


# --- CORS, headers, hosts -----------------------------------------------------------------------

def test_no_cors_headers_by_default(make_service, client_for):
    service = make_service()
    client = client_for(service)
    origin = {"Origin": "http://evil.example"}
    preflight = client.options("/api/jobs", headers={**origin, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "authorization"})
    assert not any(h.startswith("access-control-") for h in preflight.headers)
    response = client.get("/api/jobs", headers={**origin, **service.auth})
    assert response.status_code == 200
    assert not any(h.startswith("access-control-") for h in response.headers)
    page = client.get("/", headers=origin)
    csp = page.headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"


def test_cors_only_for_configured_origins(make_service, client_for):
    service = make_service(cors_origins=["http://viewer.local"])
    client = client_for(service)
    allowed = client.get("/api/jobs", headers={"Origin": "http://viewer.local", **service.auth})
    assert allowed.headers["access-control-allow-origin"] == "http://viewer.local"
    other = client.get("/api/jobs", headers={"Origin": "http://evil.example", **service.auth})
    assert "access-control-allow-origin" not in other.headers


def test_a_loopback_service_answers_loopback_host_names_only(make_service):
    from fastapi.testclient import TestClient

    with TestClient(make_service().app, base_url="http://attacker.example") as client:
        assert client.get("/health").status_code == 400           # DNS rebinding refused
    with TestClient(make_service().app, base_url="http://localhost:8080") as client:
        assert client.get("/health").status_code == 200


# --- job ids ------------------------------------------------------------------------------------

def test_job_ids_are_unguessable(make_service, client_for, video_root):
    service = make_service(hold_at=0)            # nothing finishes: only ids are looked at
    client = client_for(service)
    ids = [client.post("/api/jobs", headers=service.auth,
                       json={"question": f"q{n}", "video": str(video_root / "case.mp4")}).json()["id"]
           for n in range(12)]
    assert len(set(ids)) == len(ids)
    for job_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,}", job_id)         # >= 128 random bits
    prefixes = {job_id[:4] for job_id in ids}
    assert len(prefixes) > 6                                      # not a counter or a timestamp
    assert client.get("/api/jobs/" + "A" * 22, headers=service.auth).status_code == 404
