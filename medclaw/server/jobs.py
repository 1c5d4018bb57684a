"""Jobs: questions about videos, run as agent episodes on engines shared by every job.

    manager = JobManager(store, runtimes={"tiny-cpu": runtime}, episode_configs={...},
                         data_dir=..., concurrency=2)
    await manager.start()               # engines first (progress on stderr), then unfinished jobs
    job = await manager.submit(video=path, question=q, profile="tiny-cpu")
    manager.cancel(job.id); manager.trace_path(job.id)
    marker = manager.change_marker(job.id); ...; await manager.wait_for_change(marker, 15)
    await manager.close()

- `concurrency` workers take queued jobs in submission order; each runs `run_episode` on its
  profile's `Runtime`, so at most `concurrency` episodes share the engines at once (vLLM batches
  their requests). A job's video is probed at submission (off the event loop): a bad file is
  refused then, with the probe's one-line error.
- Every state change is written to the `JobStore` first. On `start`, jobs a previous process left
  queued or running are queued again; a re-run writes a new trace in its own attempt folder
  (`<data_dir>/jobs/<id>/attempt-<n>/`), so the interrupted attempt's trace stays as it was.
- Cancelling a queued job drops it; cancelling a running one cancels its episode, whose trace is
  saved with a footer (the episode loop writes it on cancellation).
- Progress: the episode's step callback wakes whoever waits in `wait_for_change` (the live stream),
  which then reads the trace file back through `Trace.load`.
- Job ids are `secrets.token_urlsafe(16)` (128 random bits).
"""
from __future__ import annotations

import asyncio
import secrets
import sys
import time
import traceback
from pathlib import Path

from medclaw.errors import MedClawError
from medclaw.server.store import Job, JobStore

MAX_QUESTION_CHARS = 4000
JOB_ID_BYTES = 16


class JobError(MedClawError):
    """A submission or request the service refuses (the API answers 400 / 404 / 409)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class JobManager:
    def __init__(self, store: JobStore, runtimes: dict, episode_configs: dict, *,
                 data_dir: str | Path, concurrency: int = 2, log=None):
        if set(runtimes) != set(episode_configs):
            raise ValueError("every profile needs a runtime and an episode config")
        self.store = store
        self.runtimes = dict(runtimes)
        self.episode_configs = dict(episode_configs)
        self.data_dir = Path(data_dir)
        self.concurrency = int(concurrency)
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self._queue: asyncio.Queue[str] | None = None
        self._workers: list[asyncio.Task] = []
        self._running: dict[str, asyncio.Task] = {}
        self._infos: dict[str, object] = {}          # job id → VideoInfo probed at submission
        self._changes: dict[str, asyncio.Event] = {}
        self._closing = False
        self.ready = False

    @property
    def profiles(self) -> list[str]:
        return sorted(self.runtimes)

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self, *, start_engines: bool = True) -> None:
        if start_engines:
            for profile, runtime in self.runtimes.items():
                began = time.monotonic()
                self.log(f"medclaw serve: starting the engines of profile {profile!r}…")
                await runtime.start(on_engine=lambda ready: self.log(f"medclaw serve: {ready.line()}"))
                self.log(f"medclaw serve: profile {profile!r} ready "
                         f"({time.monotonic() - began:.1f} s)")
        self._queue = asyncio.Queue()
        requeued = self.store.requeue_unfinished()
        for job in requeued:
            self._queue.put_nowait(job.id)
        if requeued:
            self.log(f"medclaw serve: {len(requeued)} unfinished job(s) queued again")
        self._workers = [asyncio.create_task(self._worker(), name=f"medclaw-job-worker-{n}")
                         for n in range(self.concurrency)]
        self.ready = True

    async def close(self) -> None:
        """Stop the workers (running jobs stay `queued` for the next start), close the engines."""
        self._closing = True
        self.ready = False
        episodes = list(self._running.values())
        for task in episodes:              # each writes its trace footer as it stops
            task.cancel()
        await asyncio.gather(*episodes, return_exceptions=True)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        errors = []
        for runtime in self.runtimes.values():
            try:
                await runtime.close()
            except Exception as err:       # noqa: BLE001 — close every runtime, then report
                errors.append(err)
        if errors:
            raise errors[0]

    # --- requests ---------------------------------------------------------------------------
    async def submit(self, *, video: str | Path, question: str, profile: str | None = None,
                     uploaded: bool = False) -> Job:
        if self._queue is None or self._closing:
            raise JobError("the service is not accepting jobs right now", 503)
        if not isinstance(question, str) or not question.strip():
            raise JobError("the question is empty")
        if len(question) > MAX_QUESTION_CHARS:
            raise JobError(f"the question is longer than {MAX_QUESTION_CHARS} characters")
        profile = profile or self.profiles[0]
        if profile not in self.runtimes:
            raise JobError(f"profile {profile!r} is not served here; served: {self.profiles}")
        from medclaw.kernels.probe import probe_video

        try:
            info = await asyncio.to_thread(probe_video, str(video))
        except MedClawError as err:
            raise JobError(str(err)) from None
        job = Job(id=secrets.token_urlsafe(JOB_ID_BYTES), question=question.strip(),
                  video=str(video), profile=profile, uploaded=uploaded)
        self.store.insert(job)
        self._infos[job.id] = info
        self._queue.put_nowait(job.id)
        self._notify(job.id)
        return job

    def get(self, job_id: str) -> Job:
        job = self.store.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise JobError("no such job", 404)
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.finished:
            raise JobError(f"the job has already finished ({job.status})", 409)
        task = self._running.get(job_id)
        if task is not None:
            task.cancel()                  # the worker records the cancellation
        else:
            job = self.store.update(job_id, status="cancelled", error="cancelled before it started")
            self._infos.pop(job_id, None)
            self._notify(job_id)
        return job

    def trace_path(self, job_id: str) -> Path | None:
        """The trace of the job's latest attempt (None before its episode wrote a header)."""
        job = self.get(job_id)
        if job.trace_path:
            return Path(job.trace_path)
        if job.attempts < 1:
            return None
        found = sorted(self._attempt_dir(job).glob("*.jsonl"))
        return found[-1] if found else None

    def change_marker(self, job_id: str) -> asyncio.Event:
        """An event set at the job's next change (a step, a status). Take it *before* reading the
        job's state, then `await wait_for_change(marker, timeout)`: nothing is missed in between."""
        return self._changes.setdefault(job_id, asyncio.Event())

    @staticmethod
    async def wait_for_change(marker: asyncio.Event, timeout: float) -> bool:
        """True when the job changed, False after `timeout` seconds without a change."""
        try:
            await asyncio.wait_for(marker.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # --- running ----------------------------------------------------------------------------
    def _notify(self, job_id: str) -> None:
        event = self._changes.pop(job_id, None)
        if event is not None:
            event.set()

    def _attempt_dir(self, job: Job) -> Path:
        return self.data_dir / "jobs" / job.id / f"attempt-{job.attempts}"

    async def _worker(self) -> None:
        while not self._closing:
            job_id = await self._queue.get()
            if self._closing:
                return
            job = self.store.get(job_id)
            if job is None or job.status != "queued":
                continue                   # cancelled while it waited
            await self._run(job)

    async def _run(self, job: Job) -> None:
        from medclaw.engine.episode import run_episode

        job = self.store.update(job.id, status="running", attempts=job.attempts + 1,
                                trace_path=None, steps=0, error=None)
        config = self.episode_configs[job.profile].replace(trace_dir=str(self._attempt_dir(job)))
        self._notify(job.id)

        def on_step(step, budget) -> None:
            self.store.update(job.id, steps=step.index)
            self._notify(job.id)

        task = asyncio.create_task(run_episode(
            job.question, job.video, self.runtimes[job.profile], config, episode_id=job.id,
            video_info=self._infos.pop(job.id, None), on_step=on_step))
        self._running[job.id] = task
        try:
            result = await task
        except asyncio.CancelledError:
            trace = self.trace_path(job.id)
            if self._closing:              # shutdown: run it again at the next start
                self.store.update(job.id, status="queued")
                return
            self.store.update(job.id, status="cancelled", error="cancelled by request",
                              trace_path=str(trace) if trace else None)
        except MedClawError as err:
            self._failed(job, str(err))
        except Exception as err:           # noqa: BLE001 — one job's crash never stops the service
            self.log(f"medclaw serve: job {job.id[:8]}… crashed:\n{traceback.format_exc(limit=8)}")
            self._failed(job, f"{type(err).__name__}: {err}")
        else:
            failed = result.status.startswith("failed")
            self.store.update(job.id, status="failed" if failed else "done", answer=result.answer,
                              result_status=result.status, steps=result.steps,
                              trace_path=result.trace_path,
                              error=result.status if failed else None)
        finally:
            self._running.pop(job.id, None)
            self._notify(job.id)

    def _failed(self, job: Job, message: str) -> None:
        trace = self.trace_path(job.id)
        first = message.strip().splitlines()[0] if message.strip() else "failed"
        self.store.update(job.id, status="failed", error=first[:500],
                          trace_path=str(trace) if trace else None)
