"""Several workers of one node in front of one store: the node's capacity split among them by demand
(cluster_budget.node_shares), and a scheduler paced to its share (Scheduler.set_capacity_share)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.cluster_budget import (
    NODE_SHARE_FLOOR,
    NodeReport,
    decode_report,
    encode_report,
    node_shares,
)
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


def test_busy_workers_split_the_node_equally_and_shares_add_up_to_one() -> None:
    shares = node_shares([worker("n.w0", C), worker("n.w1", 2 * C)], T0, 2.0)
    assert shares == pytest.approx({"n.w0": 0.5, "n.w1": 0.5})


def test_an_idle_workers_part_goes_to_the_busy_one() -> None:
    shares = node_shares([worker("n.w0", C), worker("n.w1", 0.0)], T0, 2.0)
    assert shares["n.w1"] == pytest.approx(NODE_SHARE_FLOOR / 2)
    assert shares["n.w0"] == pytest.approx(1 - NODE_SHARE_FLOOR / 2)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_demands_below_the_capacity_are_met_and_the_rest_is_spread() -> None:
    shares = node_shares([worker("n.w0", 0.1 * C), worker("n.w1", 0.3 * C), worker("n.w2", 0.9 * C)], T0, 2.0)
    assert shares["n.w0"] == pytest.approx(0.1)  # its demand (above its floor part): met
    assert shares["n.w1"] == pytest.approx(0.3)
    assert shares["n.w2"] == pytest.approx(0.6)  # what is left
    # Everybody met: the rest is split equally.
    shares = node_shares([worker("n.w0", 0.1 * C), worker("n.w1", 0.1 * C)], T0, 2.0)
    assert shares == pytest.approx({"n.w0": 0.5, "n.w1": 0.5})


def test_a_report_without_a_demand_wants_everything_and_a_stale_one_drops_out() -> None:
    shares = node_shares([worker("n.w0", None), worker("n.w1", 0.0, at=T0 - 10)], T0, 2.0)
    assert shares == {"n.w0": 1.0}
    assert node_shares([], T0, 2.0) == {}


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


def test_workers_of_a_store_with_no_capacity_figure_split_equally() -> None:
    zero = [replace(worker("n.w0", C), capacity_bps=0.0), replace(worker("n.w1", 0.0), capacity_bps=0.0)]
    assert node_shares(zero, T0, 2.0) == {"n.w0": 0.5, "n.w1": 0.5}
