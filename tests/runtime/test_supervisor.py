"""The supervisor of several workers with real forked processes (no gateway in them): it waits for every
worker to serve, restarts one that dies, passes SIGTERM on, kills a worker that does not stop in time, and
gives up when a worker exits before it serves."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from s3lanes.runtime import workers
from s3lanes.runtime.workers import Supervisor


@pytest.fixture(autouse=True)
def _restore_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(workers, "RESTART_HOLD_S", 0.0)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def serving(index: int, ready_fd: int) -> int:
    """A worker that serves until SIGTERM, then exits 0."""
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    while not stop:
        time.sleep(0.02)
    return 0


def test_workers_are_restarted_and_stopped_by_sigterm() -> None:
    sup = Supervisor(2, serving, stop_timeout_s=10)
    sup.start()
    assert sup.wait_ready(10)
    first = sup.pids()
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sup._reap(restart=True)
        if sup._restart_at:
            break
        time.sleep(0.05)
    assert sup._restart_at, "the dead worker was not noticed"
    ticks = iter(range(200))  # StopIteration after about 20 s: a replacement that never serves fails

    def stop_after_restart() -> bool:  # run() until the replacement serves, then SIGTERM ourselves
        next(ticks)
        pids = sup.pids()
        if len(pids) == 2 and pids[0] != first[0] and sup._workers[0].ready_fd is None:
            os.kill(os.getpid(), signal.SIGTERM)
        return False

    assert sup.run(should_stop=stop_after_restart) == 0
    assert sup.restarts == 1
    assert sup.pids() == []  # all reaped
    for pid in first[1:]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def stubborn(index: int, ready_fd: int) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    time.sleep(60)
    return 0


def test_a_worker_that_does_not_stop_is_killed_and_the_exit_status_says_so() -> None:
    sup = Supervisor(1, stubborn, stop_timeout_s=0.5)
    sup.start()
    assert sup.wait_ready(10)
    (pid,) = sup.pids()
    t = time.monotonic()
    assert sup.stop() == 1
    assert time.monotonic() - t < 5
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def failing(index: int, ready_fd: int) -> int:
    return 3  # exits before it serves


def test_a_worker_that_exits_before_serving_fails_the_start() -> None:
    sup = Supervisor(2, lambda i, fd: failing(i, fd) if i == 1 else serving(i, fd), stop_timeout_s=5)
    sup.start()
    assert not sup.wait_ready(10)
    assert sup.stop() == 1
    assert sup.pids() == []
