"""The shell around the spool's durability deadline (:mod:`s3lanes.core.spool_deadline`).

Twice a second :meth:`DeadlineKeeper.tick` reads the spool (backlog bytes, the acknowledgement time of its
oldest entry, whether new writes were acknowledged), subtracts what the drains have already sent of the
objects still uploading (the spool counts an object as pending until its upload completes: a 64 MiB object
half sent is 32 MiB of work left, not 64), asks :func:`~s3lanes.core.spool_deadline.plan` for the
drain lane's floor and hands it to every scheduler with ``Scheduler.set_floor``: the lane's existing floor
parameter, which the latency guard and the caps already respect. When the plan says the deadline cannot be
met even at the lane's cap, it logs a warning (at most every :data:`WARNING_INTERVAL_S`); the metrics
(:meth:`DeadlineKeeper.collector`) and ``GET /_s3lanes/status`` (``spool.drain.deadline``) show the same at
any time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from s3lanes.clock import Clock
from s3lanes.core.scheduler import LaneSpec
from s3lanes.core.spool_deadline import CheckpointCadence, DeadlinePlan, plan
from s3lanes.runtime.dispatcher import LaneDispatcher

log = logging.getLogger("s3lanes.spool")

TICK_S = 0.5
WARNING_INTERVAL_S = 30.0


class _Entry(Protocol):
    @property
    def size(self) -> int: ...


class SpoolView(Protocol):
    """What the keeper reads of :class:`s3lanes.runtime.spool.Spool`."""

    def entries(self) -> Sequence[_Entry]: ...

    def oldest_acked_at(self) -> float | None: ...

    @property
    def acked_bytes(self) -> int: ...

    @property
    def drained_bytes(self) -> int: ...


def _cap(spec: LaneSpec, reads_active: bool, headroom: float = 0.0) -> float:
    """What the lane's floor may rise to: its share while reads are active (its ``limit`` and
    ``limit_while_reads_active``, less the scheduler's ``cap_headroom``); without reads only its ``limit``
    holds it."""
    if not reads_active:
        return max(spec.limit if spec.limit is not None else 1.0, spec.floor)
    cap = 1.0
    for lim in (spec.limit, spec.limit_while_reads_active):
        if lim is not None:
            cap = min(cap, lim)
    return max(cap * (1.0 - headroom), spec.floor)


class DeadlineKeeper:
    """Owns the drain lanes' run-time floors. Not thread-safe; runs on the event loop."""

    def __init__(
        self,
        spool: SpoolView,
        dispatchers: Sequence[LaneDispatcher],
        lanes: Iterable[str],
        max_age_s: float | None,
        clock: Clock,
    ) -> None:
        self._spool = spool
        self._dispatchers = tuple(dispatchers)
        self._max_age_s = max_age_s
        self._clock = clock
        names = {s.name: s for d in self._dispatchers for s in d.scheduler.config.lanes}
        self._lanes = tuple(
            names[n] for n in dict.fromkeys(lanes) if n in names and not names[n].read_protected
        )
        self.cadence = CheckpointCadence()
        self._acked = spool.acked_bytes
        # Bytes the drain lanes delivered minus bytes the spool confirmed drained, when it was last empty:
        # what is sent beyond that belongs to objects still uploading.
        self._sent_offset = self._sent() - spool.drained_bytes
        self.remaining_bytes = 0
        self._last_warning = -math.inf
        self.last: DeadlinePlan | None = None
        self.backlog_bytes = 0
        self.oldest_age_s = 0.0
        self.warnings = 0

    def tick(self) -> DeadlinePlan | None:
        """Read the spool, set the floors, warn if the deadline is at risk. Returns the plan for the first
        drain lane (None without one)."""
        now = self._clock.monotonic()
        acked = self._spool.acked_bytes
        if acked != self._acked:
            # Bytes, not acknowledgements: a commit marker or a small file between checkpoints is no burst.
            self.cadence.observe_ack(now, acked - self._acked)
            self._acked = acked
        backlog = sum(e.size for e in self._spool.entries())
        in_flight = self._sent() - self._spool.drained_bytes
        if backlog == 0:
            self._sent_offset = in_flight
        # Clamped: a retried upload sends its bytes twice, a write that bypassed the spool is delivered in the
        # same lane; both only make this an underestimate until the spool is next empty.
        remaining = backlog - min(backlog, max(0, in_flight - self._sent_offset))
        self.remaining_bytes = remaining
        oldest = self._spool.oldest_acked_at()
        age = 0.0 if oldest is None or backlog == 0 else max(0.0, self._clock.wall() - oldest)
        deadline = self.cadence.deadline_s(self._max_age_s)
        self.backlog_bytes, self.oldest_age_s = backlog, age
        first: DeadlinePlan | None = None
        for d in self._dispatchers:
            sched = d.scheduler
            capacity = sched.capacity_bps
            for spec in self._lanes:
                p = plan(
                    backlog_bytes=remaining,
                    oldest_age_s=age,
                    deadline_s=deadline,
                    capacity_bps=capacity,
                    min_fraction=spec.floor,
                    cap_fraction=_cap(spec, sched.reads_active, sched.config.cap_headroom),
                )
                sched.set_floor(spec.name, p.floor_fraction if p.floor_fraction > spec.floor else 0.0, now)
                if first is None:
                    first = p
            d.wake()
        self.last = first
        if first is not None and first.at_risk and now - self._last_warning >= WARNING_INTERVAL_S:
            self._last_warning = now
            self.warnings += 1
            log.warning(
                "spool: durability deadline at risk: %d bytes still to upload, the oldest acknowledged %.0f s"
                " ago; the deadline is %.0f s and at the %s lane's cap that backlog takes %.0f s more (%.0f s"
                " left): checkpoints arrive faster than the lane's cap drains them, and the spool fills if"
                " this lasts (raise the lane's limit_while_reads_active, or checkpoint less often or less)",
                remaining,
                age,
                first.deadline_s,
                self._lanes[0].name,
                first.best_case_s,
                max(0.0, first.time_left_s),
            )
        return first

    def _sent(self) -> int:
        return sum(d.scheduler.delivered_bytes(s.name) for d in self._dispatchers for s in self._lanes)

    async def run(self) -> None:
        while True:
            self.tick()
            await self._clock.sleep(TICK_S)

    def status(self) -> dict[str, Any]:
        p = self.last
        return {
            "deadline_s": self.cadence.deadline_s(self._max_age_s),
            "max_age_s": self._max_age_s,
            "checkpoint_interval_s": self.cadence.interval_s,
            "lanes": [s.name for s in self._lanes],
            "backlog_bytes": self.backlog_bytes,
            "remaining_bytes": self.remaining_bytes,
            "oldest_pending_age_s": self.oldest_age_s,
            "floor_fraction": None if p is None else p.floor_fraction,
            "projected_durable_s": None if p is None else _finite(p.projected_s),
            "best_case_durable_s": None if p is None else p.best_case_s,
            "at_risk": False if p is None else p.at_risk,
            "status": self.status_line(),
        }

    def status_line(self) -> str:
        p = self.last
        if p is None or self.backlog_bytes == 0:
            return "ok: nothing pending"
        if p.at_risk:
            return (
                f"AT RISK: {self.backlog_bytes} bytes pending, oldest {self.oldest_age_s:.0f} s, deadline"
                f" {p.deadline_s:.0f} s; {p.best_case_s:.0f} s needed at the lane's cap"
            )
        return (
            f"ok: {self.backlog_bytes} bytes pending, oldest {self.oldest_age_s:.0f} s, deadline"
            f" {p.deadline_s:.0f} s; floor {p.floor_fraction:.0%}"
        )

    def collector(self) -> Callable[[], Iterable[Metric]]:
        """Prometheus families read at scrape time (register with ``Metrics.add_snapshot_collector``)."""

        def collect() -> Iterable[Metric]:
            p = self.last
            yield GaugeMetricFamily(
                "s3lanes_spool_deadline_seconds",
                "The durability deadline in force: [spool].max_age_s, or (unset) the checkpoint interval.",
                value=self.cadence.deadline_s(self._max_age_s),
            )
            yield GaugeMetricFamily(
                "s3lanes_spool_deadline_at_risk",
                "1 while the spool's backlog cannot reach the store by the deadline even at the lane's cap.",
                value=1.0 if p is not None and p.at_risk else 0.0,
            )
            yield GaugeMetricFamily(
                "s3lanes_spool_projected_durable_seconds",
                "Seconds until the backlog is on the store at the drain lane's floor (its guaranteed rate).",
                value=0.0 if p is None else _finite(p.projected_s) or 0.0,
            )
            yield GaugeMetricFamily(
                "s3lanes_spool_deadline_floor",
                "The drain lane's floor set for the deadline, as a fraction of backend capacity.",
                value=0.0 if p is None else p.floor_fraction,
            )

        return collect


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
