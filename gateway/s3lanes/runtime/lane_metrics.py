"""Prometheus gauges read from the scheduler's snapshot at scrape time (no per-request cost)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from s3lanes.clock import Clock
from s3lanes.core.scheduler import Scheduler


def scheduler_collector(scheduler: Scheduler, clock: Clock) -> Callable[[], Iterable[Metric]]:
    def collect() -> Iterable[Metric]:
        snap = scheduler.snapshot(clock.monotonic())
        cap = GaugeMetricFamily(
            "s3lanes_capacity_bytes_per_second",
            "Backend capacity the scheduler works with (configured, or the online estimate).",
            labels=["source"],
        )
        cap.add_metric(["configured" if snap.capacity_configured else "estimated"], snap.capacity_bps)
        yield cap
        yield GaugeMetricFamily(
            "s3lanes_reads_active",
            "1 while the read-protected lane is active (write caps apply).",
            value=1.0 if snap.reads_active else 0.0,
        )
        yield GaugeMetricFamily(
            "s3lanes_guard_multiplier",
            "Read-latency guard multiplier on paced lanes (1 = not pacing).",
            value=snap.guard_multiplier,
        )
        yield GaugeMetricFamily(
            "s3lanes_backend_inflight_bytes",
            "Granted budget not yet completed on the backend.",
            value=float(snap.inflight_bytes),
        )
        families = {
            "queued_requests": ("s3lanes_lane_queue_depth", "Tickets waiting in the lane."),
            "queued_bytes": ("s3lanes_lane_queued_bytes", "Bytes waiting in the lane."),
            "inflight_tickets": ("s3lanes_lane_inflight", "Tickets granted and not completed."),
            "rate": ("s3lanes_lane_rate_bytes_per_second", "Granted rate over the last second."),
            "allocation": (
                "s3lanes_lane_allocation_bytes_per_second",
                "Fluid allocation for current demand.",
            ),
            "limit": ("s3lanes_lane_limit_bytes_per_second", "Ceiling in force (absent: none)."),
            "share": ("s3lanes_lane_share", "Achieved share of backend bytes over the last second."),
            "reservation": ("s3lanes_lane_reservation_bytes_per_second", "Guaranteed rate when backlogged."),
            "multiplier": ("s3lanes_lane_multiplier", "Guard multiplier applied to the lane."),
        }
        out = {key: GaugeMetricFamily(name, doc, labels=["lane"]) for key, (name, doc) in families.items()}
        for ln in snap.lanes:
            out["queued_requests"].add_metric([ln.name], ln.queued_tickets)
            out["queued_bytes"].add_metric([ln.name], ln.queued_bytes)
            out["inflight_tickets"].add_metric([ln.name], ln.inflight_tickets)
            out["rate"].add_metric([ln.name], ln.granted_rate_bps)
            out["allocation"].add_metric([ln.name], ln.allocation_bps)
            if ln.limit_bps is not None:
                out["limit"].add_metric([ln.name], ln.limit_bps)
            out["share"].add_metric([ln.name], ln.achieved_share)
            out["reservation"].add_metric([ln.name], ln.reservation_bps)
            out["multiplier"].add_metric([ln.name], ln.guard_multiplier)
        yield from out.values()

    return collect


def pool_collector(schedulers: Mapping[str, Scheduler], clock: Clock) -> Callable[[], Iterable[Metric]]:
    """Per storage pool (bottleneck), when there are several: capacity, read activity and each lane's rate,
    share, limit and queue, labelled ``pool``. (The unlabelled families above describe the default pool.)"""

    def collect() -> Iterable[Metric]:
        cap = GaugeMetricFamily(
            "s3lanes_pool_capacity_bytes_per_second", "Capacity of the pool's scheduler.", labels=["pool"]
        )
        active = GaugeMetricFamily(
            "s3lanes_pool_reads_active", "1 while reads are active in the pool.", labels=["pool"]
        )
        lane_families = {
            "rate": GaugeMetricFamily(
                "s3lanes_pool_lane_rate_bytes_per_second",
                "Granted rate, last second.",
                labels=["pool", "lane"],
            ),
            "share": GaugeMetricFamily(
                "s3lanes_pool_lane_share", "Achieved share of the pool's bytes.", labels=["pool", "lane"]
            ),
            "limit": GaugeMetricFamily(
                "s3lanes_pool_lane_limit_bytes_per_second", "Ceiling in force.", labels=["pool", "lane"]
            ),
            "queue": GaugeMetricFamily(
                "s3lanes_pool_lane_queue_depth", "Tickets waiting in the lane.", labels=["pool", "lane"]
            ),
        }
        now = clock.monotonic()
        for pool, scheduler in sorted(schedulers.items()):
            snap = scheduler.snapshot(now)
            cap.add_metric([pool], snap.capacity_bps)
            active.add_metric([pool], 1.0 if snap.reads_active else 0.0)
            for ln in snap.lanes:
                lane_families["rate"].add_metric([pool, ln.name], ln.granted_rate_bps)
                lane_families["share"].add_metric([pool, ln.name], ln.achieved_share)
                if ln.limit_bps is not None:
                    lane_families["limit"].add_metric([pool, ln.name], ln.limit_bps)
                lane_families["queue"].add_metric([pool, ln.name], ln.queued_tickets)
        yield cap
        yield active
        yield from lane_families.values()

    return collect
