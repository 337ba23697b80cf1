"""``bench_proxy --gateway-cpus``: the option is checked, and every thread of a process ends up pinned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadtests.bench_proxy import parse_args
from loadtests.harness.machine import pin_process

THREADED_CHILD = """
import threading, time, sys
ev = threading.Event()
threads = [threading.Thread(target=ev.wait) for _ in range(3)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
ev.set()
"""


def test_gateway_cpus_is_parsed_and_must_leave_cpus_for_the_rest() -> None:
    usable = sorted(os.sched_getaffinity(0))
    with pytest.raises(SystemExit):
        parse_args(["--gateway-cpus", ",".join(str(c) for c in usable)])  # nothing left for the store
    with pytest.raises(SystemExit):
        parse_args(["--gateway-cpus", "one"])
    with pytest.raises(SystemExit):
        parse_args(["--gateway-cpus", str(max(usable) + 1000)])  # not a usable CPU
    assert parse_args([]).gateway_cpus is None
    if len(usable) >= 2:
        assert parse_args(["--gateway-cpus", str(usable[-1])]).gateway_cpus == frozenset({usable[-1]})


def test_pin_process_pins_every_thread_of_the_process() -> None:
    cpu = min(os.sched_getaffinity(0))
    child = subprocess.Popen(
        [sys.executable, "-c", THREADED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        n = pin_process(child.pid, frozenset({cpu}))
        assert n >= 4  # the main thread and its three
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert {frozenset(os.sched_getaffinity(t)) for t in tids} == {frozenset({cpu})}
    finally:
        try:
            child.communicate("\n", timeout=10)  # lets it end; closes both pipes
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
