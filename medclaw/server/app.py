"""The HTTP service: the jobs API, the live trace stream, evidence thumbnails and the audit viewer.

    app = create_app(manager, settings, token)         # uvicorn.run(app) — see medclaw.cli.serve

Public (no data in them): `GET /health`, the viewer page `/` and its script and style
`/static/…`. Everything under `/api/` needs `Authorization: Bearer <token>` (401 otherwise):

    POST /api/uploads               raw video bytes (body), at most max_upload_mb → {"upload": id}
    POST /api/jobs                  {"question", "video": path | "upload": id, "profile"?} → 201 job
    GET  /api/jobs                  newest first          GET /api/jobs/{id}   one job
    POST /api/jobs/{id}/cancel      409 once finished
    GET  /api/jobs/{id}/trace       the whole trace {"header", "steps", "footer"} (validated)
    GET  /api/jobs/{id}/view        {"job", "view"}: what the viewer draws (medclaw.server.view)
    GET  /api/jobs/{id}/events      server-sent events: `job` (status), `step` (each trace step as
                                    it is written, with its view), `end`; resumes after
                                    Last-Event-ID (a step index)
    GET  /api/jobs/{id}/frames/{key}   JPEG of a frame (or zoomed region) the trace references
    GET  /api/info                  profiles served, upload cap, whether video paths are accepted

Video paths must resolve (symlinks, `..`) inside `allowed_roots` (400 otherwise); uploads past the
cap get 413 (checked on Content-Length and again while streaming to disk). No CORS headers unless
`cors_origins` lists origins; every response carries a Content-Security-Policy that lets the page
talk to its own origin only. Engines start in the lifespan, before the first request is served.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from medclaw.errors import MedClawError
from medclaw.server.jobs import MAX_QUESTION_CHARS, JobError, JobManager
from medclaw.server.security import PathRejectedError, resolve_video_path, token_matches
from medclaw.server.settings import ServerSettings
from medclaw.server.thumbnails import Thumbnailer, ThumbnailError
from medclaw.server.view import build_view, frame_requests, step_view, trace_record

HEARTBEAT_S = 15.0
UPLOAD_SUFFIXES = {".mp4", ".m4v", ".mov", ".mkv", ".avi", ".webm", ".ts", ".mts", ".mpg", ".mpeg"}
UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{22}\.[a-z0-9]{2,5}$")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' blob: data:; connect-src 'self'; "
                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
STATIC_FILES = {"index.html": "text/html; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8",
                "viewer.css": "text/css; charset=utf-8"}


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(max_length=MAX_QUESTION_CHARS)
    video: str | None = None
    upload: str | None = None
    profile: str | None = None


def create_app(manager: JobManager, settings: ServerSettings, token: str, *,
               thumbnailer: Thumbnailer | None = None, start_engines: bool = True) -> FastAPI:
    thumbs = thumbnailer or Thumbnailer()
    uploads = settings.resolved_data_dir() / "uploads"

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await manager.start(start_engines=start_engines)
        try:
            yield
        finally:
            await manager.close()
            await asyncio.to_thread(thumbs.close)

    app = FastAPI(title="MedClaw", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    def authorised(authorization: str | None = Header(default=None)) -> None:
        if not token_matches(authorization, token):
            raise HTTPException(401, "missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    api = APIRouter(prefix="/api", dependencies=[Depends(authorised)])

    # --- public -----------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok" if manager.ready else "starting"}

    @app.get("/")
    async def index():
        return _static("index.html")

    @app.get("/static/{name}")
    async def static(name: str):
        if name not in STATIC_FILES:
            raise HTTPException(404, "not found")
        return _static(name)

    # --- API --------------------------------------------------------------------------------
    @api.get("/info")
    async def info():
        return {"profiles": manager.profiles, "max_upload_bytes": settings.max_upload_bytes,
                "accepts_paths": bool(settings.allowed_roots)}

    @api.post("/uploads", status_code=201)
    async def upload(request: Request, filename: str = "video.mp4"):
        cap = settings.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            raise HTTPException(413, f"upload larger than the {settings.max_upload_mb:g} MB cap")
        suffix = Path(filename).suffix.lower()
        upload_id = secrets.token_urlsafe(16) + (suffix if suffix in UPLOAD_SUFFIXES else ".video")
        uploads.mkdir(parents=True, exist_ok=True)
        part = uploads / (upload_id + ".part")
        written = 0
        try:
            with open(part, "xb") as file:
                async for chunk in request.stream():
                    written += len(chunk)
                    if written > cap:      # a body longer than it declared, or chunked
                        raise HTTPException(413, f"upload larger than the "
                                                 f"{settings.max_upload_mb:g} MB cap")
                    file.write(chunk)
            if written == 0:
                raise HTTPException(400, "the upload is empty")
            os.replace(part, uploads / upload_id)
        finally:
            part.unlink(missing_ok=True)
        return {"upload": upload_id, "bytes": written}

    @api.post("/jobs", status_code=201)
    async def submit(body: JobRequest):
        if (body.video is None) == (body.upload is None):
            raise JobError("give either a video path or an upload id")
        if body.video is not None:
            path = resolve_video_path(body.video, settings.allowed_roots)
        else:
            if not UPLOAD_ID.match(body.upload) or not (uploads / body.upload).is_file():
                raise JobError("no such upload")
            path = uploads / body.upload
        job = await manager.submit(video=path, question=body.question, profile=body.profile,
                                   uploaded=body.upload is not None)
        return job.to_dict()

    @api.get("/jobs")
    async def list_jobs(limit: int = 100):
        return {"jobs": [job.to_dict() for job in manager.store.list(max(1, min(limit, 1000)))]}

    @api.get("/jobs/{job_id}")
    async def get_job(job_id: str):
        return manager.get(job_id).to_dict()

    @api.post("/jobs/{job_id}/cancel")
    async def cancel(job_id: str):
        return manager.cancel(job_id).to_dict()

    async def load_record(job_id: str) -> dict:
        path = manager.trace_path(job_id)
        if path is None:
            raise JobError("the job has no trace yet", 404)
        from medclaw.engine.trace import Trace

        return trace_record(await asyncio.to_thread(Trace.load, path))

    @api.get("/jobs/{job_id}/trace")
    async def trace(job_id: str):
        return await load_record(job_id)

    @api.get("/jobs/{job_id}/view")
    async def view(job_id: str):
        job = manager.get(job_id)
        try:
            record = await load_record(job_id)
        except MedClawError:               # no trace yet, or its header is being written
            return {"job": job.to_dict(), "view": None}
        return {"job": job.to_dict(), "view": build_view(record)}

    @api.get("/jobs/{job_id}/frames/{key}")
    async def frame(job_id: str, key: str):
        record = await load_record(job_id)
        requests = frame_requests(build_view(record))
        if key not in requests:
            raise JobError("the trace references no such frame", 404)
        try:
            video = await asyncio.to_thread(thumbs.open_video, record["header"].get("video") or {})
            jpeg = (await asyncio.to_thread(thumbs.render, video, {key: requests[key]}))[key]
        except ThumbnailError as err:
            raise JobError(str(err), 409) from None
        return Response(jpeg, media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=86400"})

    @api.get("/jobs/{job_id}/events")
    async def events(job_id: str, last_event_id: str | None = Header(default=None)):
        manager.get(job_id)                          # 404 before the stream starts
        after = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0
        return StreamingResponse(_event_stream(manager, job_id, after), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    app.include_router(api)

    # --- errors and headers -----------------------------------------------------------------
    @app.exception_handler(JobError)
    async def job_error(request: Request, err: JobError):
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    @app.exception_handler(PathRejectedError)
    async def path_rejected(request: Request, err: PathRejectedError):
        return JSONResponse({"detail": str(err)}, status_code=400)

    @app.exception_handler(MedClawError)
    async def bad_input(request: Request, err: MedClawError):
        return JSONResponse({"detail": str(err)}, status_code=400)

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    if settings.host in LOOPBACK_HOSTS:
        # A loopback service answers to loopback names only (DNS-rebinding protection).
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]"])
    return app


def _static(name: str) -> Response:
    data = resources.files("medclaw.server").joinpath("static", name).read_bytes()
    return Response(data, media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})


def _sse(event: str, data, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _event_stream(manager: JobManager, job_id: str, after: int):
    """`job` when the status changes, `step` for each trace step past `after`, then `end`."""
    from medclaw.engine.trace import Trace

    sent, last_state, attempt = after, None, None
    while True:
        marker = manager.change_marker(job_id)
        job = manager.get(job_id)
        if attempt is not None and job.attempts != attempt:
            sent = 0                                  # a re-run: its steps start from 1 again
        attempt = job.attempts
        state = (job.status, job.attempts)
        if state != last_state:
            last_state = state
            yield _sse("job", job.to_dict())
        path = manager.trace_path(job_id)
        record = None
        if path is not None:
            try:
                record = trace_record(await asyncio.to_thread(Trace.load, path))
            except MedClawError:
                record = None                         # header not written yet
        if record is not None:
            duration = float((record["header"].get("video") or {}).get("duration_s") or 0.0)
            for row in record["steps"][sent:]:
                index = int(row.get("index", sent + 1))
                yield _sse("step", {"step": row, "view": step_view(row, duration)}, index)
                sent = max(sent, index)
        if job.finished:
            view = build_view(record) if record is not None else None
            yield _sse("end", {"job": job.to_dict(), "view": view})
            return
        if not await manager.wait_for_change(marker, HEARTBEAT_S):
            yield ": keep-alive\n\n"
