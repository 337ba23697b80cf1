"""Prometheus metrics of the write spool, read from Spool.figures() at scrape time (no per-request cost)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from s3lanes.clock import Clock
from s3lanes.runtime.spool import Spool

# Per-prefix series are bounded: the largest prefixes only.
MAX_PREFIX_SERIES = 50


def spool_collector(spool: Spool, clock: Clock) -> Callable[[], Iterable[Metric]]:
    def collect() -> Iterable[Metric]:
        fig = spool.figures()
        yield GaugeMetricFamily(
            "s3lanes_spool_capacity_bytes", "Bytes the spool may hold.", value=float(fig.capacity_bytes)
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_used_bytes",
            "Bytes on spool disk (objects, parts of open uploads) plus writes in progress.",
            value=float(fig.used_bytes + fig.reserved_bytes),
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_full",
            "1 while the spool is above its high-water mark (until it falls below low water).",
            value=1.0 if fig.full else 0.0,
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_degraded",
            "1 if the spool stopped taking writes after a journal or disk failure.",
            value=0.0 if spool.degraded is None else 1.0,
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_pending_objects",
            "Acknowledged operations not yet on the backend.",
            value=float(fig.pending_objects),
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_pending_bytes",
            "Acknowledged bytes not yet on the backend.",
            value=float(fig.pending_bytes),
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_open_uploads",
            "Multipart uploads open in the spool.",
            value=float(fig.open_uploads),
        )
        oldest = fig.oldest_acked_at
        age = 0.0 if oldest is None else max(0.0, clock.wall() - oldest)
        yield GaugeMetricFamily(
            "s3lanes_spool_oldest_pending_age_seconds",
            "Age of the oldest acknowledged write not yet on the backend (acked-but-not-durable time).",
            value=age,
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_overdue",
            "1 while the oldest pending write is older than [spool].max_age_s (3600 s when unset).",
            value=1.0 if age > spool.cfg.overdue_after_s else 0.0,
        )
        yield GaugeMetricFamily(
            "s3lanes_spool_keys_in_doubt",
            "Keys an older drain request may still reach the store for: their newest state is read back"
            " after a fence interval before it counts as durable.",
            value=float(fig.keys_in_doubt),
        )
        # The spool's running totals since it started.
        totals = (
            (
                "s3lanes_spool_fence_reapplies",
                "Newest states drained again because the store showed an older one after the fence interval.",
                spool.fence_reapplies,
            ),
            ("s3lanes_spool_acked_bytes_all", "Bytes acknowledged into the spool.", spool.acked_bytes),
            (
                "s3lanes_spool_drained_bytes",
                "Bytes the drainer confirmed on the backend (rate() = drain rate).",
                spool.drained_bytes,
            ),
        )
        for name, documentation, total in totals:
            yield CounterMetricFamily(name, documentation, value=float(total))
        per_prefix = GaugeMetricFamily(
            "s3lanes_spool_prefix_pending_bytes",
            f"Pending bytes per bucket and top-level prefix (the {MAX_PREFIX_SERIES} largest).",
            labels=["bucket", "prefix"],
        )
        top = sorted(fig.pending_by_prefix.items(), key=lambda kv: -kv[1])[:MAX_PREFIX_SERIES]
        for (bucket, prefix), nbytes in top:
            per_prefix.add_metric([bucket, prefix], float(nbytes))
        yield per_prefix

    return collect
