"""Jobs and their results, persisted in one SQLite file (stdlib `sqlite3`).

    store = JobStore(data_dir / "jobs.sqlite")
    store.insert(job); store.get(job_id); store.list(limit); store.update(job_id, status=...)
    store.requeue_unfinished() -> list[Job]     # at start: running → queued, oldest first

Every write is committed at once (WAL journal, `synchronous=FULL`), so a killed server loses no
submitted job and no finished result; `requeue_unfinished` puts the jobs that were queued or
running back in line. A job's trace lives on disk (`trace_path`); the row holds what a listing
needs (status, answer, step count, error). One connection guarded by a lock: the calls take
microseconds, so they run on the event loop.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = frozenset({"done", "failed", "cancelled"})


@dataclass(slots=True)
class Job:
    id: str
    question: str
    video: str                          # the real path the episode reads
    profile: str
    status: str = "queued"              # one of STATUSES
    created_at: float = 0.0
    updated_at: float = 0.0
    uploaded: bool = False              # the video is an upload the service owns
    attempts: int = 0                   # episode runs started (a restart may start another)
    trace_path: str | None = None       # the current attempt's trace file
    answer: str | None = None
    result_status: str | None = None    # the episode's: answered | forced_answer | failed: …
    error: str | None = None            # one line, when the job failed or was cancelled
    steps: int = 0

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def to_dict(self) -> dict:
        return asdict(self)


_COLUMNS = [f.name for f in fields(Job)]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    question TEXT NOT NULL,
    video TEXT NOT NULL,
    profile TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    uploaded INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    trace_path TEXT,
    answer TEXT,
    result_status TEXT,
    error TEXT,
    steps INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
"""


class JobStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def insert(self, job: Job) -> Job:
        now = time.time()
        job.created_at = job.created_at or now
        job.updated_at = now
        row = job.to_dict()
        row["uploaded"] = int(job.uploaded)
        with self._lock:
            self._db.execute(f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES "
                             f"({', '.join('?' for _ in _COLUMNS)})", [row[c] for c in _COLUMNS])
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?",
                                   (job_id,)).fetchone()
        return _job(row) if row else None

    def list(self, limit: int = 100) -> list[Job]:
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs "
                                    "ORDER BY created_at DESC LIMIT ?", (int(limit),)).fetchall()
        return [_job(r) for r in rows]

    def update(self, job_id: str, **changes) -> Job:
        unknown = set(changes) - set(_COLUMNS) - {"id"}
        if unknown or "id" in changes:
            raise ValueError(f"cannot update job field(s) {sorted(unknown | ({'id'} & set(changes)))}")
        if "status" in changes and changes["status"] not in STATUSES:
            raise ValueError(f"unknown job status {changes['status']!r}")
        changes["updated_at"] = time.time()
        if "uploaded" in changes:
            changes["uploaded"] = int(changes["uploaded"])
        names = list(changes)
        with self._lock:
            cursor = self._db.execute(
                f"UPDATE jobs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?",
                [changes[n] for n in names] + [job_id])
        if cursor.rowcount != 1:
            raise KeyError(job_id)
        return self.get(job_id)

    def requeue_unfinished(self) -> list[Job]:
        """Jobs a previous process left queued or running, back to `queued`, oldest first."""
        with self._lock:
            self._db.execute("UPDATE jobs SET status = 'queued', updated_at = ? "
                             "WHERE status = 'running'", (time.time(),))
            rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE status = 'queued' "
                                    "ORDER BY created_at").fetchall()
        return [_job(r) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _job(row) -> Job:
    job = Job(**dict(zip(_COLUMNS, row)))
    job.uploaded = bool(job.uploaded)
    return job
