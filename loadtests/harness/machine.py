"""Machine facts: CPU and memory of processes from /proc, the machine's busy time, what runs where."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from loadtests.harness.gateway import GATEWAY_SOURCE
from s3lanes import __version__ as GATEWAY_VERSION
from s3lanes.seaweed.command import find_weed_binary

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def pin_process(pid: int, cpus: frozenset[int]) -> int:
    """Pin every thread of a process to ``cpus`` (threads it starts later inherit it); the thread count."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)
    return len(tids)


def cpu_user_sys_seconds(pid: int) -> tuple[float, float]:
    """(user, sys) CPU seconds of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        rest = fh.read().rsplit(b")", 1)[1].split()
    # After "pid (comm)": field 3 is rest[0], so utime (14) and stime (15) are rest[11] and rest[12].
    return int(rest[11]) / CLK_TCK, int(rest[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """user+sys CPU seconds of a process (all its threads)."""
    return sum(cpu_user_sys_seconds(pid))


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def memory_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (``clear_refs`` 5, Linux >= 4.0). False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent not idle since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat", "rb") as fh:
        f = fh.readline().split()
    return sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8)) / CLK_TCK


@dataclass(slots=True)
class CpuMeter:
    """CPU seconds spent by the gateway, SeaweedFS and this client between ``start()`` and ``stop()``, and
    by everything else on the machine ("other": a shared machine's background load skews a round)."""

    pids: dict[str, int]
    _start: dict[str, float] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        out["client"] = self_cpu_seconds()
        out["machine"] = machine_busy_seconds()
        return out

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        out = {name: round(end[name] - self._start[name], 3) for name in end}
        machine = out.pop("machine")
        out["other"] = round(max(0.0, machine - sum(out.values())), 3)
        return out


def python_speed_ns() -> float:
    """Nanoseconds per iteration of a fixed pure-Python loop, best of 5: this VM's per-core speed moves
    with its host's load (we saw 57 and 127 ns on the same machine an hour apart), and every CPU-time
    number in the report moves with it. Compare runs only when this probe agrees."""
    best = float("inf")
    n = 300_000
    for _ in range(5):
        t0 = time.perf_counter()
        x = 0
        for i in range(n):
            x += i
        best = min(best, (time.perf_counter() - t0) / n * 1e9)
    return best


def machine_facts() -> dict[str, str]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    cpu_model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in read("/proc/cpuinfo").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem_kib = next(
        (int(ln.split()[1]) for ln in read("/proc/meminfo").splitlines() if ln.startswith("MemTotal")), 0
    )
    try:
        weed_version = (
            subprocess.run(
                [find_weed_binary(), "version"], capture_output=True, text=True, timeout=30, check=False
            )
            .stdout.splitlines()[0]
            .strip()
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        weed_version = "?"
    source = GATEWAY_SOURCE
    git = ["git", "-C", str(source)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
        ).stdout.strip()
        where = f"commit {commit.strip()}" + (", gateway/ modified" if dirty else "") if commit else "no git"
    except OSError:
        where = "no git"
    commit = f"{source} ({where})"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))}) x {cpu_model}",
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "uvloop": importlib.metadata.version("uvloop"),
        "seaweedfs": weed_version,
        "s3lanes": f"{GATEWAY_VERSION} from {commit}",
    }
