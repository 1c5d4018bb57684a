"""The POSIX shared memory a vLLM engine's processes leave behind when they are killed.

vLLM's engine core and model worker talk through message queues in shared memory (`/dev/shm/psm_*`,
Python's `multiprocessing.shared_memory`). On a clean exit they unlink them; killed, they cannot.
vLLM 0.32's CPU worker does not exit on request, so every CPU engine is killed at shutdown
(`vllm_local.CPU_SHUTDOWN_GRACE_S`): one queue per engine was left to Python's resource tracker,
which unlinks it when this process exits and prints "There appear to be N leaked shared_memory
objects" on the way, at the end of every `medclaw ask` and `make demo`. A process group killed
outright (a crashed server) takes the tracker with it, and the queues stay in /dev/shm for good.

- `shared_memory_of(pid)`: the segments `pid` and its children map (read from the processes
  while they run, so only that engine's own).
- `release_shared_memory(paths)`: unlinks those still there once their processes are gone, and
  tells the resource tracker, so it neither warns nor unlinks a name twice.
"""
from __future__ import annotations

import contextlib
import os
from multiprocessing import shared_memory

SEGMENT_PREFIX = "/dev/shm/psm_"     # Python's names: "psm_" + 8 hex digits


def shared_memory_of(pid: int) -> set[str]:
    """Paths of the shared-memory segments process `pid` and its descendants map (empty when the
    process is gone or cannot be read)."""
    import psutil

    paths: set[str] = set()
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                paths |= {m.path for m in process.memory_maps() if m.path.startswith(SEGMENT_PREFIX)}
    return paths


def release_shared_memory(paths: set[str]) -> list[str]:
    """Unlink the segments of `paths` still present (call once the processes that mapped them
    are gone); returns those it unlinked."""
    released = []
    for path in sorted(paths):
        with contextlib.suppress(FileNotFoundError):    # unlinked by its owner on a clean exit
            # attaching registers the name with this process's resource tracker (Python < 3.13
            # always does) and unlink() unregisters it: the tracker forgets it either way
            segment = shared_memory.SharedMemory(name=os.path.basename(path))
            segment.close()
            segment.unlink()
            released.append(path)
    return released
