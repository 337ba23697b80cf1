"""Several workers of one node in front of one store: the demand in a worker's report, and a scheduler paced
to its share of the node (Scheduler.set_capacity_share). The split itself: test_node_lanes.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.cluster_budget import NodeReport, decode_report, encode_report
from s3lanes.core.scheduler import Scheduler
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
