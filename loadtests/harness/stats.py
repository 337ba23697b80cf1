"""Units, rounds and their statistics: medians, percentiles, A/B/B/A order, running rounds concurrently."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

MIB = 1024 * 1024
MB = 1_000_000
GB = 1_000_000_000
T = TypeVar("T")


@dataclass(slots=True)
class Round:
    phase: str
    side: str  # "direct" or "gateway"
    index: int
    bytes_moved: int
    seconds: float
    cpu_s: dict[str, float]
    latencies_ms: list[float] = field(default_factory=list)
    requests: int = 0

    @property
    def mbps(self) -> float:
        return rate_mbps(self.bytes_moved, self.seconds)

    def percentile_ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_ms), q)

    @property
    def other_cores(self) -> float:
        """How many cores other processes kept busy during the round, on average."""
        return other_cores(self.cpu_s, self.seconds)

    def cpu_per_gb(self, who: str) -> float:
        return self.cpu_s[who] / (self.bytes_moved / GB) if self.bytes_moved else float("nan")

    def as_json(self) -> dict[str, Any]:
        out = timed_json(
            self.phase, ("side", self.side), self.index, self.bytes_moved, self.seconds, self.cpu_s
        )
        out["requests"] = self.requests
        if self.latencies_ms:
            out["p50_ms"] = round(self.percentile_ms(50), 4)
            out["p99_ms"] = round(self.percentile_ms(99), 4)
            out["mean_ms"] = round(statistics.fmean(self.latencies_ms), 4)
            out["max_ms"] = round(max(self.latencies_ms), 4)
        return out


def timed_json(
    phase: str, label: tuple[str, str], index: int, bytes_moved: int, seconds: float, cpu_s: dict[str, float]
) -> dict[str, Any]:
    """What the JSON of every timed round opens with: its phase, what ran (``label``: the key and its value,
    such as ``("side", "gateway")``), the round's number, and the bytes, time, rate and CPU it measured."""
    return {
        "phase": phase,
        label[0]: label[1],
        "round": index,
        "bytes": bytes_moved,
        "seconds": round(seconds, 4),
        "MBps": round(rate_mbps(bytes_moved, seconds), 1),
        "cpu_s": cpu_s,
        "other_cores": round(other_cores(cpu_s, seconds), 3),
    }


def rate_mbps(bytes_moved: int, seconds: float) -> float:
    """MB/s (10^6 bytes); NaN for a round that took no time."""
    return bytes_moved / seconds / MB if seconds > 0 else float("nan")


def other_cores(cpu_s: Mapping[str, float], seconds: float) -> float:
    """How many cores other processes (``cpu_s["other"]``) kept busy on average; NaN for no time."""
    return cpu_s.get("other", 0.0) / seconds if seconds > 0 else float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


async def run_all(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; on the first failure cancel the others, wait for them, and raise that failure."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


def abba(rounds: int) -> Iterator[tuple[int, str]]:
    """direct, gateway, gateway, direct, direct, gateway, ...: interleaved, and balanced against drift."""
    for i in range(rounds):
        first, second = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        yield i, first
        yield i, second


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals: sorted, none overlapping (touching ones are joined)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
