"""Per-phase statistics for the Locust load tests: latency inside checkpoint bursts and outside them.

Locust's own statistics mix every request of a run into one distribution, so a dataset read that waited
behind a checkpoint burst and one that ran on an idle store land in the same percentile. This module keeps
them apart and writes ``<csv prefix>_phases.csv`` (and ``<csv prefix>_bursts.csv``) next to Locust's CSVs.

Theory of operation
-------------------
*Bursts are recorded as they happen.* A ``CheckpointWriter`` reports when it starts its share of burst
``n`` and when it finishes (:meth:`PhaseTracker.burst_started`/:meth:`~PhaseTracker.burst_ended`). Burst
``n``'s window is the earliest start to the latest end over its writers; overlapping windows are merged.
A burst whose writers have not all finished yet is open and ends "now" for a summary taken meanwhile.

*Requests are binned by time, then classified.* Which phase a read belongs to is not known when it
completes: the burst it overlaps may still be running on another worker. So every request goes into a
histogram cell keyed by ``(type, name, slot of its start, slot of its end)``, slots being ``slot_s`` wide
(0.25 s by default). A summary classifies each cell: *in burst* if the interval its slots span overlaps a
burst window, *outside* otherwise. A request that shares a slot with a burst's start or end therefore
counts as in burst even if it ended just before the burst began (or started just after it ended): the
classification errs towards the burst, by less than ``slot_s``. Memory is one small histogram per slot and
request name (a 30-minute run at 0.25 s is 7,200 slots).

*Distributed runs.* Workers record, and hand what they recorded since their last report to Locust's
``report_to_master`` event (:meth:`PhaseTracker.take_report`); the master merges the reports it receives
through ``worker_report`` (:meth:`PhaseTracker.merge_report`) and is the only one that summarises and
writes. In a local run one tracker does both. Timestamps are wall-clock (``time.time()``) because they are
compared across machines; keep the load generators' clocks in sync (NTP).

*Percentiles are Locust's.* Latencies are bucketed by :func:`locust.stats.bucket_response_time` (about two
significant digits) but in microseconds below 100 ms, where Locust's millisecond buckets would round a
1 ms read to 0 or 1, and percentiles come from :func:`locust.stats.calculate_response_time_percentile`,
kept within the observed minimum and maximum (a bucket key may round a value up by a few per cent).
Both are passed in (:func:`locust_bucket_us`, :func:`locust_percentile`), so that this core imports no
Locust (importing Locust monkey-patches the process with gevent).

*What this is not:* a replacement for Locust's CSVs. Failed requests are counted in their phase and their
response times are included, as Locust includes them; the pseudo-requests of type ``BURST`` (a writer's
whole share of a burst, reported so that Locust's own CSV shows the checkpoint save time) are not phased.
"""

from __future__ import annotations

import bisect
import csv
import io
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from loadtests.harness.stats import merge_intervals

if TYPE_CHECKING:
    from locust.argument_parser import LocustArgumentParser
    from locust.env import Environment
    from locust.event import EventHook, Events

log = logging.getLogger(__name__)

PHASE_OUTSIDE: Final = "outside_burst"
PHASE_IN_BURST: Final = "in_burst"
PHASES: Final = (PHASE_OUTSIDE, PHASE_IN_BURST)

# The request type of the pseudo-request a CheckpointWriter fires for its share of a burst.
BURST_REQUEST_TYPE: Final = "BURST"
REPORT_KEY: Final = "s3lanes_phases"  # key in the worker -> master report dict
REPORT_VERSION: Final = 1
DEFAULT_SLOT_S: Final = 0.25
PERCENTILES: Final = (0.5, 0.9, 0.95, 0.99, 0.999)

PHASE_CSV_COLUMNS: Final = (
    "Phase",
    "Type",
    "Name",
    "Request Count",
    "Failure Count",
    "Requests/s",
    "Average Response Time",
    "Min Response Time",
    "Max Response Time",
    "50%",
    "90%",
    "95%",
    "99%",
    "99.9%",
    "Phase Seconds",
)
BURST_CSV_COLUMNS: Final = (
    "Burst",
    "Start",
    "End",
    "Duration (s)",
    "Writers",
    "Failed Writers",
    "Bytes",
    "MB/s",
    "Open",
)

BucketFn = Callable[[float], int]  # latency in microseconds -> histogram key (microseconds)
PercentileFn = Callable[[dict[int, int], int, float], int]  # (histogram, count, fraction) -> key


# --------------------------------------------------------------------------------------------------
# The burst clock shared by the writers


@dataclass(frozen=True, slots=True)
class BurstSchedule:
    """When checkpoint bursts start: burst ``n`` at ``n * period_s + offset_s`` (wall clock, seconds).

    Every writer, on every worker, computes the same numbers from the clock alone, which is how K writers
    burst together without talking to each other. No burst starts before ``warmup_s`` after the test
    started, and a writer that arrives more than ``join_slack_s`` after a burst began waits for the next.
    """

    period_s: float
    offset_s: float = 0.0
    warmup_s: float = 0.0
    join_slack_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError("the burst period must be positive")
        if self.warmup_s < 0 or self.join_slack_s < 0:
            raise ValueError("warmup and join slack cannot be negative")

    def number_at(self, now: float) -> int:
        return math.floor((now - self.offset_s) / self.period_s)

    def start_of(self, burst: int) -> float:
        return burst * self.period_s + self.offset_s

    def next_burst(self, now: float, *, test_start: float, last_done: int | None) -> tuple[int, float]:
        """The burst a writer runs next and when it starts (up to ``join_slack_s`` in the past)."""
        burst = self.number_at(now)
        if now - self.start_of(burst) > self.join_slack_s:
            burst += 1
        if last_done is not None:
            burst = max(burst, last_done + 1)
        first = math.ceil((test_start + self.warmup_s - self.offset_s) / self.period_s)
        burst = max(burst, first)
        return burst, self.start_of(burst)


# --------------------------------------------------------------------------------------------------
# Records


@dataclass(slots=True)
class _Cell:
    """Requests of one (type, name) that started in one slot and ended in another (or the same)."""

    count: int = 0
    failures: int = 0
    total_us: int = 0
    min_us: int | None = None
    max_us: int = 0
    hist: dict[int, int] = field(default_factory=dict)

    def add(self, latency_us: int, key: int, failed: bool) -> None:
        self.count += 1
        self.failures += failed
        self.total_us += latency_us
        self.min_us = latency_us if self.min_us is None else min(self.min_us, latency_us)
        self.max_us = max(self.max_us, latency_us)
        self.hist[key] = self.hist.get(key, 0) + 1

    def extend(self, other: _Cell) -> None:
        self.count += other.count
        self.failures += other.failures
        self.total_us += other.total_us
        if other.min_us is not None:
            self.min_us = other.min_us if self.min_us is None else min(self.min_us, other.min_us)
        self.max_us = max(self.max_us, other.max_us)
        for key, n in other.hist.items():
            self.hist[key] = self.hist.get(key, 0) + n


@dataclass(slots=True)
class _WriterBurst:
    """One writer's share of one burst."""

    start: float
    end: float | None = None
    size_bytes: int = 0
    ok: bool = True

    def merge(self, other: _WriterBurst) -> None:
        self.start = min(self.start, other.start)
        if other.end is not None:
            self.end = other.end if self.end is None else max(self.end, other.end)
            self.size_bytes = other.size_bytes
            self.ok = other.ok


@dataclass(frozen=True, slots=True)
class BurstWindow:
    """Burst ``burst`` as the writers saw it: first start to last end (``open``: some writer is not done)."""

    burst: int
    start: float
    end: float
    writers: int
    failed_writers: int
    size_bytes: int
    open: bool

    @property
    def duration_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One line of the phase CSV. Times are milliseconds; the Aggregated rows have an empty type."""

    phase: str
    request_type: str
    name: str
    count: int
    failures: int
    rps: float
    avg_ms: float
    min_ms: float
    max_ms: float
    percentiles_ms: tuple[float, ...]
    phase_s: float

    def as_csv_row(self) -> list[str]:
        return [
            self.phase,
            self.request_type,
            self.name,
            str(self.count),
            str(self.failures),
            f"{self.rps:.3f}",
            f"{self.avg_ms:.3f}",
            f"{self.min_ms:.3f}",
            f"{self.max_ms:.3f}",
            *(f"{p:.3f}" for p in self.percentiles_ms),
            f"{self.phase_s:.3f}",
        ]

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(PHASE_CSV_COLUMNS, self.as_csv_row(), strict=True))


# --------------------------------------------------------------------------------------------------
# The tracker


class PhaseTracker:
    """Request histograms binned by time, burst windows, and their classification into phases.

    Pure: every method that depends on time takes it (wall-clock seconds). One tracker per Locust process;
    the glue in :func:`install` feeds it from Locust's events.
    """

    def __init__(self, *, slot_s: float = DEFAULT_SLOT_S, bucket: BucketFn) -> None:
        if not slot_s > 0:
            raise ValueError("slot_s must be positive")
        self.slot_s = slot_s
        self._bucket = bucket
        self._cells: dict[tuple[str, str, int, int], _Cell] = {}
        self._bursts: dict[tuple[int, str], _WriterBurst] = {}
        self._dirty_bursts: set[tuple[int, str]] = set()
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def reset(self, now: float) -> None:
        """A new test starts: forget everything."""
        self._cells.clear()
        self._bursts.clear()
        self._dirty_bursts.clear()
        self.started_at = now
        self.stopped_at = None

    def reset_samples(self, now: float) -> None:
        """Locust's "reset stats": forget the requests (bursts stay known), count phases from ``now``."""
        self._cells.clear()
        self.started_at = now

    def stop(self, now: float) -> None:
        self.stopped_at = now

    # -- recording ------------------------------------------------------------------------------------

    def record(self, request_type: str, name: str, start: float, end: float, failed: bool) -> None:
        """One request that ran from ``start`` to ``end`` (wall clock)."""
        if request_type == BURST_REQUEST_TYPE:
            return
        latency_us = max(0, round((end - start) * 1_000_000))
        key = (request_type, name, self._slot(start), self._slot(max(start, end)))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _Cell()
        cell.add(latency_us, self._bucket(latency_us), failed)
        if self.started_at is None:
            self.started_at = start

    def burst_started(self, burst: int, writer: str, now: float) -> None:
        self._merge_burst((burst, writer), _WriterBurst(start=now))

    def burst_ended(self, burst: int, writer: str, now: float, *, size_bytes: int, ok: bool) -> None:
        key = (burst, writer)
        start = self._bursts[key].start if key in self._bursts else now
        self._merge_burst(key, _WriterBurst(start=start, end=now, size_bytes=size_bytes, ok=ok))

    def _merge_burst(self, key: tuple[int, str], record: _WriterBurst) -> None:
        known = self._bursts.get(key)
        if known is None:
            self._bursts[key] = record
        else:
            known.merge(record)
        self._dirty_bursts.add(key)

    def _slot(self, t: float) -> int:
        return math.floor(t / self.slot_s)

    # -- distributed: worker -> master ----------------------------------------------------------------

    def take_report(self) -> dict[str, Any]:
        """What was recorded since the last report, as msgpack-able data; the samples are then dropped
        (a worker keeps nothing the master already has). Burst records stay, so a late end merges."""
        cells = [
            [
                t,
                n,
                s0,
                s1,
                c.count,
                c.failures,
                c.total_us,
                c.min_us,
                c.max_us,
                [[k, v] for k, v in c.hist.items()],
            ]
            for (t, n, s0, s1), c in self._cells.items()
        ]
        bursts = [
            [b, w, r.start, r.end, r.size_bytes, r.ok]
            for (b, w) in sorted(self._dirty_bursts)
            for r in (self._bursts[(b, w)],)
        ]
        self._cells.clear()
        self._dirty_bursts.clear()
        return {"v": REPORT_VERSION, "slot_s": self.slot_s, "cells": cells, "bursts": bursts}

    def merge_report(self, report: Mapping[str, Any]) -> None:
        """Fold a worker's :meth:`take_report` into this tracker (the master's)."""
        if report.get("v") != REPORT_VERSION:
            raise ValueError(f"phase report version {report.get('v')!r}, expected {REPORT_VERSION}")
        if not math.isclose(float(report["slot_s"]), self.slot_s):
            raise ValueError(
                f"a worker bins phases in {report['slot_s']} s slots, the master in {self.slot_s} s: "
                "give every node the same --phase-slot-s"
            )
        for t, n, s0, s1, count, failures, total_us, min_us, max_us, hist in report["cells"]:
            other = _Cell(count, failures, total_us, min_us, max_us, {int(k): int(v) for k, v in hist})
            key = (str(t), str(n), int(s0), int(s1))
            cell = self._cells.get(key)
            if cell is None:
                self._cells[key] = other
            else:
                cell.extend(other)
            if self.started_at is None:
                self.started_at = int(s0) * self.slot_s
        for b, w, start, end, size_bytes, ok in report["bursts"]:
            record = _WriterBurst(
                float(start), None if end is None else float(end), int(size_bytes), bool(ok)
            )
            self._merge_burst((int(b), str(w)), record)
        self._dirty_bursts.clear()  # a master reports to nobody

    # -- summaries ------------------------------------------------------------------------------------

    def windows(self, now: float) -> list[BurstWindow]:
        """One window per burst, in burst order; an open burst ends at ``now`` (or at the test's stop)."""
        horizon = now if self.stopped_at is None else min(now, self.stopped_at)
        per_burst: dict[int, list[_WriterBurst]] = {}
        for (burst, _writer), record in self._bursts.items():
            per_burst.setdefault(burst, []).append(record)
        out: list[BurstWindow] = []
        for burst in sorted(per_burst):
            records = per_burst[burst]
            start = min(r.start for r in records)
            is_open = any(r.end is None for r in records)
            end = max([*(r.end for r in records if r.end is not None), *([horizon] if is_open else [])])
            out.append(
                BurstWindow(
                    burst=burst,
                    start=start,
                    end=max(start, end),
                    writers=len(records),
                    failed_writers=sum(1 for r in records if r.end is not None and not r.ok),
                    size_bytes=sum(r.size_bytes for r in records),
                    open=is_open,
                )
            )
        return out

    def phase_of(
        self, first_slot: int, last_slot: int, merged: Sequence[tuple[float, float]], ends: Sequence[float]
    ) -> str:
        """The phase of requests binned in ``[first_slot, last_slot]``, given the merged, sorted windows
        and their ends."""
        lo, hi = first_slot * self.slot_s, (last_slot + 1) * self.slot_s
        # the first window that ends after lo; it overlaps iff it also starts before hi
        i = bisect.bisect_right(ends, lo)
        if i < len(merged) and merged[i][0] < hi:
            return PHASE_IN_BURST
        return PHASE_OUTSIDE

    def summary(
        self, now: float, *, percentile: PercentileFn, percentiles: Sequence[float] = PERCENTILES
    ) -> list[PhaseRow]:
        """Rows per phase and (type, name), then an ``Aggregated`` row per phase; both phases always appear
        in the Aggregated rows (with zero counts if nothing happened in one)."""
        merged = merge_intervals((w.start, w.end) for w in self.windows(now))
        ends = [end for _start, end in merged]
        groups: dict[tuple[str, str, str], _Cell] = {}
        totals: dict[str, _Cell] = {phase: _Cell() for phase in PHASES}
        for (rtype, name, s0, s1), cell in self._cells.items():
            phase = self.phase_of(s0, s1, merged, ends)
            groups.setdefault((phase, rtype, name), _Cell()).extend(cell)
            totals[phase].extend(cell)
        seconds = self.phase_seconds(now, merged)
        rows = [
            _row(phase, rtype, name, cell, seconds[phase], percentile, percentiles)
            for (phase, rtype, name), cell in sorted(
                groups.items(), key=lambda kv: (PHASES.index(kv[0][0]), kv[0])
            )
        ]
        rows += [
            _row(phase, "", "Aggregated", totals[phase], seconds[phase], percentile, percentiles)
            for phase in PHASES
        ]
        return rows

    def phase_seconds(self, now: float, merged: Sequence[tuple[float, float]]) -> dict[str, float]:
        """How long the test spent in each phase (between its start and its stop, or ``now``)."""
        if self.started_at is None:
            return {phase: 0.0 for phase in PHASES}
        begin = self.started_at
        end = now if self.stopped_at is None else self.stopped_at
        total = max(0.0, end - begin)
        inside = sum(max(0.0, min(e, end) - max(s, begin)) for s, e in merged)
        return {PHASE_OUTSIDE: max(0.0, total - inside), PHASE_IN_BURST: inside}


def _clamped(key_us: int, cell: _Cell) -> int:
    """A percentile from bucketed keys, kept within what was observed (a key rounds up to 5 %)."""
    return min(max(key_us, cell.min_us or 0), cell.max_us)


def _row(
    phase: str,
    rtype: str,
    name: str,
    cell: _Cell,
    phase_s: float,
    percentile: PercentileFn,
    percentiles: Sequence[float],
) -> PhaseRow:
    count = cell.count
    return PhaseRow(
        phase=phase,
        request_type=rtype,
        name=name,
        count=count,
        failures=cell.failures,
        rps=count / phase_s if phase_s > 0 else 0.0,
        avg_ms=cell.total_us / count / 1000 if count else 0.0,
        min_ms=(cell.min_us or 0) / 1000,
        max_ms=cell.max_us / 1000,
        percentiles_ms=tuple(
            _clamped(percentile(cell.hist, count, p), cell) / 1000 if count else 0.0 for p in percentiles
        ),
        phase_s=phase_s,
    )


# --------------------------------------------------------------------------------------------------
# CSV


def phases_csv(rows: Iterable[PhaseRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(PHASE_CSV_COLUMNS)
    for row in rows:
        writer.writerow(row.as_csv_row())
    return buf.getvalue()


def burst_row(w: BurstWindow) -> list[str]:
    rate_mbps = w.size_bytes / w.duration_s / 1e6 if w.duration_s > 0 else 0.0
    return [
        str(w.burst),
        f"{w.start:.3f}",
        f"{w.end:.3f}",
        f"{w.duration_s:.3f}",
        str(w.writers),
        str(w.failed_writers),
        str(w.size_bytes),
        f"{rate_mbps:.1f}",
        str(int(w.open)),
    ]


def bursts_csv(windows: Iterable[BurstWindow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(BURST_CSV_COLUMNS)
    for w in windows:
        writer.writerow(burst_row(w))
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# Locust's histogram functions (imported lazily: importing Locust monkey-patches the process)


def locust_bucket_us(latency_us: float) -> int:
    """Locust's two-significant-digit bucketing, applied to microseconds below 100 ms (Locust's own
    millisecond keys would round a 0.4 ms read to 0) and to milliseconds above."""
    from locust.stats import bucket_response_time

    if latency_us < 100_000:
        return bucket_response_time(latency_us)
    return bucket_response_time(latency_us / 1000) * 1000


def locust_percentile(hist: dict[int, int], count: int, fraction: float) -> int:
    from locust.stats import calculate_response_time_percentile

    return calculate_response_time_percentile(hist, count, fraction)


def format_table(rows: Iterable[PhaseRow]) -> str:
    """A console table of the rows (what the summary at the end of a run prints)."""
    head = (
        f"{'phase':<14} {'type':<6} {'name':<34} {'reqs':>8} {'fails':>6} {'p50':>9} {'p99':>9} {'p99.9':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        p50, p99, p999 = r.percentiles_ms[0], r.percentiles_ms[-2], r.percentiles_ms[-1]
        lines.append(
            f"{r.phase:<14} {r.request_type:<6} {r.name[:34]:<34} {r.count:>8} {r.failures:>6} "
            f"{p50:>7.2f}ms {p99:>7.2f}ms {p999:>7.2f}ms"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Locust glue: one tracker per process, fed by Locust's events


_tracker: PhaseTracker | None = None
_installed = False

H = TypeVar("H", bound=Callable[..., None])


def listener(hook: EventHook) -> Callable[[H], H]:
    """``@listener(events.init)``: ``hook.add_listener`` as a typed decorator (Locust's is untyped)."""

    def register(handler: H) -> H:
        hook.add_listener(handler)  # type: ignore[no-untyped-call]
        return handler

    return register


def current_tracker() -> PhaseTracker:
    """This process's tracker (created on first use, e.g. by ``locust.run_single_user``)."""
    global _tracker
    if _tracker is None:
        _tracker = PhaseTracker(bucket=locust_bucket_us)
    return _tracker


def write_csvs(prefix: str, tracker: PhaseTracker, now: float) -> tuple[Path, Path]:
    """Write ``<prefix>_phases.csv`` and ``<prefix>_bursts.csv`` (each replaced atomically)."""
    rows = tracker.summary(now, percentile=locust_percentile)
    phases_path = Path(f"{prefix}_phases.csv")
    bursts_path = Path(f"{prefix}_bursts.csv")
    for path, text in ((phases_path, phases_csv(rows)), (bursts_path, bursts_csv(tracker.windows(now)))):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return phases_path, bursts_path


def install(events: Events) -> None:
    """Register the phase tracker's listeners on Locust's events. Call once per process (the shared user
    module does, at import)."""
    from locust.runners import MasterRunner, WorkerRunner

    global _installed
    if _installed:  # a second call must not count every request twice
        return
    _installed = True
    env_ref: list[Environment] = []

    def is_worker() -> bool:
        return bool(env_ref) and isinstance(env_ref[0].runner, WorkerRunner)

    def is_master() -> bool:
        return bool(env_ref) and isinstance(env_ref[0].runner, MasterRunner)

    def csv_prefix() -> str | None:
        opts = env_ref[0].parsed_options if env_ref else None
        prefix = getattr(opts, "csv_prefix", None) if opts is not None else None
        return str(prefix) if prefix else None

    def write_final(reason: str) -> None:
        tracker = current_tracker()
        now = time.time()
        prefix = csv_prefix()
        if prefix:
            phases_path, _ = write_csvs(prefix, tracker, now)
            log.info("phase statistics (%s) written to %s", reason, phases_path)

    @listener(events.init_command_line_parser)
    def _add_arguments(parser: LocustArgumentParser, **_kw: Any) -> None:
        parser.add_argument(
            "--phase-slot-s",
            type=float,
            default=DEFAULT_SLOT_S,
            env_var="LOCUST_PHASE_SLOT_S",
            help="time resolution of the in-burst/outside-burst classification (docs/loadtests.md)",
        )

    @listener(events.init)
    def _on_init(environment: Environment, **_kw: Any) -> None:
        global _tracker
        env_ref[:] = [environment]
        opts = environment.parsed_options
        slot_s = float(getattr(opts, "phase_slot_s", DEFAULT_SLOT_S) or DEFAULT_SLOT_S)
        _tracker = PhaseTracker(slot_s=slot_s, bucket=locust_bucket_us)
        if environment.web_ui is not None:
            _add_web_routes(environment)

    @listener(events.test_start)
    def _on_test_start(environment: Environment, **_kw: Any) -> None:
        current_tracker().reset(time.time())

    @listener(events.reset_stats)
    def _on_reset_stats(**_kw: Any) -> None:
        current_tracker().reset_samples(time.time())

    @listener(events.request)
    def _on_request(
        request_type: str,
        name: str,
        response_time: float | None,
        exception: BaseException | None = None,
        start_time: float | None = None,
        **_kw: Any,
    ) -> None:
        if is_master() or response_time is None:
            return
        now = time.time()
        start = start_time if start_time is not None else now - response_time / 1000
        current_tracker().record(
            request_type, name, start, start + response_time / 1000, exception is not None
        )

    @listener(events.report_to_master)
    def _on_report_to_master(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        data[REPORT_KEY] = current_tracker().take_report()

    @listener(events.worker_report)
    def _on_worker_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        report = data.get(REPORT_KEY)
        if report is not None:
            current_tracker().merge_report(report)

    @listener(events.test_stop)
    def _on_test_stop(environment: Environment, **_kw: Any) -> None:
        current_tracker().stop(time.time())
        if not is_worker():
            write_final("test stopped")

    @listener(events.quit)
    def _on_quit(exit_code: int, **_kw: Any) -> None:
        # After runner.quit(): a master has the workers' last reports by now.
        if is_worker() or not env_ref:
            return
        tracker = current_tracker()
        if tracker.stopped_at is None:
            tracker.stop(time.time())
        write_final("final")
        rows = [r for r in tracker.summary(time.time(), percentile=locust_percentile) if r.count]
        if rows:
            log.info(
                "latency by phase (bursts: %d)\n%s", len(tracker.windows(time.time())), format_table(rows)
            )


def _add_web_routes(environment: Environment) -> None:
    """``/phases`` (JSON) and ``/phases.csv`` on Locust's web UI."""
    web_ui = environment.web_ui
    assert web_ui is not None and web_ui.app is not None

    def phases_json() -> dict[str, Any]:
        tracker = current_tracker()
        now = time.time()
        return {
            "rows": [r.as_dict() for r in tracker.summary(now, percentile=locust_percentile)],
            "bursts": [dict(zip(BURST_CSV_COLUMNS, burst_row(w), strict=True)) for w in tracker.windows(now)],
        }

    def phases_csv_route() -> tuple[str, int, dict[str, str]]:
        rows = current_tracker().summary(time.time(), percentile=locust_percentile)
        return phases_csv(rows), 200, {"Content-Type": "text/csv; charset=utf-8"}

    for rule, view in (("/phases", phases_json), ("/phases.csv", phases_csv_route)):
        guarded = web_ui.auth_required_if_enabled(view)  # type: ignore[no-untyped-call]
        web_ui.app.add_url_rule(rule, f"s3lanes{rule.replace('/', '_').replace('.', '_')}", guarded)
