"""cpu_binding: core shares for engines started together, and an environment that reaches only the
child process each construct spawns (real spawned processes; their environment read from /proc)."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

import psutil
import pytest

from medclaw.engine.backends import cpu_binding
from medclaw.engine.backends.cpu_binding import (
    BIND_VARIABLE, bound_as_asked, construct_with_env, core_shares, own_core_binding,
)


@pytest.mark.parametrize("cores, count, shares", [
    ([0, 1], 2, ["0", "1"]),
    ([0, 1], 3, ["0", "1", "0"]),                      # more engines than cores: wrap round
    ([0, 1, 2, 3, 4, 5, 6, 7], 2, ["0,1,2,3", "4,5,6,7"]),
    ([0, 1, 2, 3, 4, 5, 6, 7], 3, ["0,1", "2,3,4", "5,6,7"]),
    ([2, 3, 6], 2, ["2", "3,6"]),                       # the cores this process may use only
    ([4], 2, ["4", "4"]),
])
def test_core_shares_split_the_allowed_cores(monkeypatch, cores, count, shares):
    monkeypatch.setattr(cpu_binding, "allowed_cores", lambda: cores)
    assert core_shares(count) == shares
    assert [own_core_binding(k) for k in range(count)] == [str(cores[k % len(cores)])
                                                          for k in range(count)]


def test_bound_as_asked():
    assert bound_as_asked("0,1", [0, 1]) and bound_as_asked("1,0", [0, 1])
    assert not bound_as_asked("1", [0])
    assert bound_as_asked(None, [0]) and bound_as_asked("1", None)      # unknown: no claim


def spawn_sleeper(seconds: float) -> multiprocessing.Process:
    """What an engine build does, in small: spawn a child (it copies the environment at start),
    then keep working a while."""
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(seconds,))
    child.start()
    time.sleep(0.3)
    return child


def test_each_parallel_construct_spawns_with_its_own_environment(monkeypatch):
    monkeypatch.delenv(BIND_VARIABLE, raising=False)
    results: dict[str, tuple] = {}

    def build(binding: str) -> None:
        results[binding] = construct_with_env(lambda: spawn_sleeper(5), {BIND_VARIABLE: binding})

    threads = [threading.Thread(target=build, args=(b,)) for b in ("0", "1", "0,1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert sorted(results) == ["0", "0,1", "1"]
        for binding, (child, pid) in results.items():
            assert pid == child.pid                  # the child this construct spawned
            assert psutil.Process(pid).environ()[BIND_VARIABLE] == binding
        assert BIND_VARIABLE not in os.environ       # restored once each child had started
    finally:
        for child, _ in results.values():
            child.kill()
            child.join()


def test_a_failed_construct_restores_the_environment_and_lets_the_next_in(monkeypatch):
    monkeypatch.setenv(BIND_VARIABLE, "users-own")

    def fail():
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError, match="no engine"):
        construct_with_env(fail, {BIND_VARIABLE: "1"})
    assert os.environ[BIND_VARIABLE] == "users-own"
    assert construct_with_env(lambda: "built", {}) == ("built", None)    # not locked out


def test_worker_cores_of_a_process_without_workers_is_unknown():
    import subprocess

    assert cpu_binding.worker_cores(None) is None
    with subprocess.Popen(["sleep", "5"]) as sleeper:
        try:
            assert cpu_binding.worker_cores(sleeper.pid) is None
        finally:
            sleeper.kill()
    assert cpu_binding.worker_cores(sleeper.pid) is None           # gone: unknown, not an error


FAKE_WORKER = ("import os, sys, time, setproctitle; setproctitle.setproctitle(sys.argv[1]); "
               "os.sched_setaffinity(0, {int(sys.argv[2])}); print('up', flush=True); time.sleep(60)")


def test_running_workers_are_found_with_their_cores_and_the_rest_is_free(monkeypatch):
    """A process titled as vLLM titles its model workers (setproctitle, as vLLM does), bound to
    one core, is found with that core; a process titled otherwise is not."""
    import subprocess
    import sys

    core = cpu_binding.allowed_cores()[-1]
    children = [subprocess.Popen([sys.executable, "-c", FAKE_WORKER, title, str(core)],
                                 stdout=subprocess.PIPE, text=True)
                for title in (f"{cpu_binding.WORKER_TITLE}_TP0", "VLLM::EngineCore")]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "up"      # titled and bound
        found = cpu_binding.cores_of_running_workers()
        assert found.get(children[0].pid) == [core] and children[1].pid not in found
    finally:
        for child in children:
            child.kill()
            child.wait()
    monkeypatch.setattr(cpu_binding, "allowed_cores", lambda: [0, 1, 2, 3])
    assert cpu_binding.free_cores({0}) == [1, 2, 3] and cpu_binding.free_cores({0, 1, 2, 3}) == []
