"""Which cores a vLLM CPU engine computes on, when several run in one machine or one process.

vLLM's CPU build binds an engine's model worker to the cores named by `VLLM_CPU_OMP_THREADS_BIND`,
read in the engine-core process, which copies this process's environment the moment it is
spawned. Its default ("auto") binds every engine's worker to the same first core (on x86 the
next one is kept for the scheduler), so two engines started or serving at once share one core
(benchmarks/engine_binding.py: a pair with a core each took 0.68x the wall time).

- `core_shares(count)`: one binding per engine for `count` engines started together: this
  process's cores split into `count` runs. A trade on many-core machines: an engine then computes
  on its share even while the others idle, where "auto" let each use all but one core.
- `own_core_binding(index)`: the `index`-th core alone (the test suite gives each of its workers
  one).
- `construct_with_env(construct, env)`: runs `construct` (which spawns the engine core) with `env`
  set until its first multiprocessing child has started, then restores the environment. Calls run
  one at a time up to that point, so engines built in parallel threads each see their own binding.
- `worker_cores(pid)`: the cores the model worker below engine-core process `pid` is bound to,
  read from the process (what vLLM did, not what it was asked; `bound_as_asked` compares).
- `cores_of_running_workers()`, `free_cores(taken)`: the cores the vLLM workers already running on
  this host compute on, and the rest (`medclaw models serve` binds a second CPU server there, so
  that it does not compute on the first one's core).
"""
from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import TypeVar

BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"
SPAWN_POLL_S = 0.02             # how often the watcher looks for the spawned child
WORKER_TITLE = "VLLM::Worker"   # vLLM titles its model worker processes so

T = TypeVar("T")
_spawn_lock = threading.Lock()


def allowed_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def own_core_binding(index: int) -> str:
    """The binding that puts the `index`-th of several CPU engines on a core of its own (the cores
    this process may use, in order, wrapping round)."""
    cores = allowed_cores()
    return str(cores[index % len(cores)])


def core_shares(count: int) -> list[str]:
    """`count` bindings that split this process's cores into contiguous, near-equal runs, one per
    engine; with more engines than cores each gets one core, wrapping round."""
    cores = allowed_cores()
    if count >= len(cores):
        return [own_core_binding(k) for k in range(count)]
    bounds = [len(cores) * k // count for k in range(count + 1)]
    return [",".join(str(c) for c in cores[bounds[k]:bounds[k + 1]]) for k in range(count)]


def construct_with_env(construct: Callable[[], T], env: dict[str, str]) -> tuple[T, int | None]:
    """`construct()` with `env` set for the first multiprocessing child it spawns, and the pid of
    that child (None if it spawned none). The environment is restored, and the next caller let in,
    as soon as that child has started (it copied the environment), or when `construct` ends."""
    _spawn_lock.acquire()
    saved = {name: os.environ.get(name) for name in env}
    known = {p.pid for p in multiprocessing.active_children()}
    os.environ.update(env)
    done, spawned = threading.Event(), []

    def hold_until_spawned() -> None:
        try:
            while True:
                finished = done.wait(SPAWN_POLL_S)
                new = [p.pid for p in multiprocessing.active_children() if p.pid not in known]
                if new:
                    spawned.append(new[0])
                    return
                if finished:
                    return
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            _spawn_lock.release()

    watcher = threading.Thread(target=hold_until_spawned, name="medclaw-spawn-env", daemon=True)
    watcher.start()
    try:
        result = construct()
    finally:
        done.set()
        watcher.join()
    return result, (spawned[0] if spawned else None)


def bound_as_asked(binding: str | None, cores: list[int] | None) -> bool:
    """Whether a worker bound to `cores` follows `binding` (a comma list, as `core_shares` gives);
    True when either is unknown."""
    if not binding or cores is None:
        return True
    return sorted(int(core) for core in binding.split(",")) == cores


def _is_worker(process) -> bool:
    """Whether psutil `process` is a vLLM model worker (by the title vLLM gives it)."""
    return " ".join(process.cmdline()).startswith(WORKER_TITLE)


def worker_cores(engine_core_pid: int | None) -> list[int] | None:
    """The cores the model worker(s) below `engine_core_pid` are bound to; None when unknown."""
    if engine_core_pid is None:
        return None
    import psutil

    try:
        workers = [p for p in psutil.Process(engine_core_pid).children(recursive=True)
                   if _is_worker(p)]
        return sorted({core for worker in workers for core in worker.cpu_affinity()}) or None
    except psutil.Error:
        return None


def cores_of_running_workers() -> dict[int, list[int]]:
    """pid → cores of every vLLM model worker process this user can see on the host."""
    import psutil

    found = {}
    for process in psutil.process_iter():
        try:
            if _is_worker(process):
                found[process.pid] = sorted(process.cpu_affinity())
        except psutil.Error:            # gone, or another user's
            continue
    return found


def free_cores(taken: set[int]) -> list[int]:
    """This process's cores that are not in `taken`."""
    return [core for core in allowed_cores() if core not in taken]
