"""Prometheus metrics: counters and histograms the shells update, gauges read from scheduler snapshots.

One :class:`Metrics` per application with its own registry (no process-global state, so tests and
several gateways in one process do not collide). Labels are bounded: lanes come from config, operations
from the fixed S3 operation names, status codes from HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import platform
from collections.abc import Callable, Iterable
from typing import TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from s3lanes import __version__

# Latency buckets from 0.5 ms to 60 s: read latency targets are in milliseconds, checkpoint parts in seconds.
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# No ``*_created`` series beside every counter and histogram: one timestamp per label set that no dashboard
# or alert reads, doubling the series count. (prometheus_client's switch is process-wide.)
disable_created_metrics()  # type: ignore[no-untyped-call]

_M = TypeVar("_M", Counter, Histogram)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        r = self.registry
        # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total, ...: a slow leak of
        # memory or descriptors shows in these; s3lanes_event_loop_tasks shows a leak of tasks.
        ProcessCollector(registry=r)
        # s3lanes_build_info{version, python} 1: which version runs where (joins onto any series by instance).
        Info("s3lanes_build", "The s3lanes version and the Python it runs on.", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        r.register(_FnCollector(_loop_families))
        counter = functools.partial(Counter, registry=r)
        histogram = functools.partial(Histogram, registry=r)
        latency_histogram = functools.partial(Histogram, buckets=LATENCY_BUCKETS_S, registry=r)
        self.requests = counter(
            "s3lanes_requests",
            "Requests answered, by lane, S3 operation and HTTP status.",
            ["lane", "operation", "status"],
        )
        self.duration = latency_histogram(
            "s3lanes_request_duration_seconds",
            "Time from a request's headers to the end of its answer (bodies the gateway streams included), "
            "by lane, S3 operation and what served it (spool or backend).",
            ["lane", "operation", "served_by"],
        )
        self.bytes = counter(
            "s3lanes_lane_bytes",
            "Body bytes moved to or from the backend, by lane and direction.",
            ["lane", "direction"],
        )
        self.zero_copy_bytes = counter(
            "s3lanes_zero_copy_bytes",
            "Body bytes sent without a copy through the gateway (counted in s3lanes_lane_bytes too "
            "where they move to or from the backend): GET bodies spliced from the backend's socket, "
            "spooled objects sent with sendfile to clients and, by the drain, to the backend.",
            ["lane"],
        )
        self.wait = latency_histogram(
            "s3lanes_lane_wait_seconds",
            "Time a request waited in its lane before its backend I/O started.",
            ["lane"],
        )
        self.backend_latency = latency_histogram(
            "s3lanes_backend_latency_seconds",
            "Backend time to response headers, by lane.",
            ["lane"],
        )
        self.backend_errors = counter(
            "s3lanes_backend_errors",
            "Backend answers >= 500 and transport failures, by lane and kind.",
            ["lane", "kind"],
        )
        self.auth_failures = counter(
            "s3lanes_auth_failures",
            "Requests refused before reaching the backend, by S3 error code.",
            ["code"],
        )

        self.spool_acked = counter(
            "s3lanes_spool_acked_bytes",
            "Bytes acknowledged into the write spool (durable on local disk), by lane.",
            ["lane"],
        )
        self.spool_write_through = counter(
            "s3lanes_spool_write_through",
            "Writes of a spooled lane sent straight to the backend, by reason.",
            ["reason"],
        )

        self.spool_durable_latency = histogram(
            "s3lanes_spool_ack_to_durable_seconds",
            "Time from a spooled write's acknowledgement until the backend confirmed it.",
            buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200),
        )

    def child(self, metric: _M, *values: str) -> _M:
        """``metric.labels(*values)``, looked up once: ``labels()`` takes a lock and builds its key on every
        call, a few microseconds per request and metric on the request path. Label values are bounded (see
        the module doc), and so is this cache; children are never removed."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return cast(_M, found)

    def add_snapshot_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_FnCollector(collect))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _FnCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Metric]:
        return self._fn()

    def describe(self) -> Iterable[Metric]:
        return []


def event_loop_tasks() -> int | None:
    """Tasks alive on the running event loop (None outside one)."""
    try:
        return len(asyncio.all_tasks(asyncio.get_running_loop()))
    except RuntimeError:
        return None


def _loop_families() -> Iterable[Metric]:
    n = event_loop_tasks()
    if n is not None:
        g = gauge(
            "s3lanes_event_loop_tasks",
            "asyncio tasks alive on the gateway's event loop (requests, drains, timers); a rise under steady "
            "load is a leak.",
        )
        g.add_metric([], n)
        yield g


def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)
