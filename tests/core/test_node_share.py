"""Several workers of one node in front of one store: the demand in a worker's report, and a scheduler paced
to its share of the node (Scheduler.set_capacity_share). The split itself: test_node_lanes.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.cluster_budget import NodeReport, decode_report, encode_report
from s3lanes.core.scheduler import Grant, Scheduler
from s3lanes.runtime.wiring import scheduler_config
from tests.core.test_scheduler_external_limit import rate_of

C = 100_000_000.0
T0 = 1_700_000_000.0
MiB = 1024 * 1024


def worker(node: str, demand: float | None, *, at: float = T0) -> NodeReport:
    return NodeReport(
        node_id=node,
        instance=f"i-{node}",
        reported_at=at,
        capacity_bps=C,
        reads_active=True,
        mode="normal",
        demand_bps=demand,
    )


def test_the_demand_travels_in_the_report_and_an_old_report_has_none() -> None:
    r = worker("n.w0", 12345.0)
    assert decode_report(encode_report(r)).demand_bps == 12345.0
    assert decode_report(encode_report(replace(r, demand_bps=None))).demand_bps is None
    assert b"dem" not in encode_report(replace(r, demand_bps=None))


def test_a_scheduler_paces_to_its_share_of_a_configured_capacity() -> None:
    s = Scheduler(replace(scheduler_config(Config(), C), burst_bytes=MiB), 1000.0)
    alone, now = rate_of(s, "checkpoint", seconds=2.0, now=1000.0)
    assert alone >= 0.95 * C
    s.set_capacity_share(0.25, now)
    assert s.snapshot(now).capacity_bps == pytest.approx(0.25 * C)
    assert s.node_capacity_bps() == C
    shared, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert shared == pytest.approx(0.25 * C, rel=0.05)
    with pytest.raises(ValueError):
        s.set_capacity_share(0.0, now)


def test_the_same_share_again_changes_nothing_and_an_estimated_capacity_is_the_estimate() -> None:
    s = Scheduler(replace(scheduler_config(Config(), C), burst_bytes=MiB), 1000.0)
    s.set_capacity_share(0.5, 1000.0)
    before = s.snapshot(1000.0)
    s.set_capacity_share(0.5, 1000.0)  # no change: the rates are not recomputed
    assert s.snapshot(1000.0) == before
    estimated = Scheduler(
        replace(scheduler_config(Config(), C), capacity_bps=None, initial_capacity_bps=C / 2), 1000.0
    )
    assert estimated.node_capacity_bps() == C / 2  # the estimator's current figure


def _in_flight(s: Scheduler, lane: str, cost: int, now: float) -> int:
    """Grants of ``cost`` on ``lane`` that fit at once (nothing completes)."""
    for _ in range(64):
        s.submit(lane, cost, now)
    n = 0
    while isinstance(s.pull(now), Grant):
        n += 1
    return n


def test_a_worker_keeps_its_share_of_the_configured_in_flight_windows() -> None:
    cfg = replace(
        scheduler_config(Config(), C), burst_bytes=MiB, inflight_bytes_max=4 * MiB, inflight_requests_max=80
    )
    s = Scheduler(cfg, 1000.0)
    snap = s.snapshot(1000.0)
    assert (snap.inflight_bytes_max, snap.inflight_requests_max) == (4 * MiB, 80)
    s.set_capacity_share(0.25, 1000.0)
    snap = s.snapshot(1000.0)
    assert (snap.inflight_bytes_max, snap.inflight_requests_max) == (MiB, 20)  # a quarter of the node's
    assert _in_flight(s, "dataset", 64 * 1024, 1000.0) == 16  # 1 MiB of 64 KiB pieces (33 on their own)
    small = Scheduler(cfg, 1000.0)
    small.set_capacity_share(0.25, 1000.0)
    assert _in_flight(small, "dataset", 1024, 1000.0) == 20  # the request window binds
    # A worker with a sliver of the node keeps room for one piece and one request.
    tiny = Scheduler(cfg, 1000.0)
    tiny.set_capacity_share(1e-3, 1000.0)
    snap = tiny.snapshot(1000.0)
    assert snap.inflight_bytes_max == tiny.piece_bytes("checkpoint", 4 * MiB) == 64 * 1024
    assert snap.inflight_requests_max == 1
    # An estimated capacity is each worker's own view: its windows are the configured ones.
    estimated = Scheduler(replace(cfg, capacity_bps=None, initial_capacity_bps=C), 1000.0)
    estimated.set_capacity_share(0.25, 1000.0)
    snap = estimated.snapshot(1000.0)
    assert (snap.inflight_bytes_max, snap.inflight_requests_max) == (4 * MiB, 80)
    # No configured window: none with a configured capacity, whatever the share.
    unset = Scheduler(replace(cfg, inflight_bytes_max=None, inflight_requests_max=None), 1000.0)
    unset.set_capacity_share(0.25, 1000.0)
    assert unset.snapshot(1000.0).inflight_bytes_max is None
