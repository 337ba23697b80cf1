"""Several workers of one node without a configured bandwidth: each worker's estimator sees only its own
traffic, so the node's capacity is estimated from the workers' reports (core.node_lanes.node_capacity_bps):
what the store delivered to all of them while it was some worker's bottleneck, else at least that. With
it, the node's lanes are split as with a configured capacity. Simulated: two workers' estimating schedulers
on one fake clock in front of one FIFO store (test_node_saturation)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from s3lanes.core.cluster_budget import NodeReport, ReportError, decode_report, encode_report
from s3lanes.core.node_lanes import node_capacity_bps, split_node_lanes
from s3lanes.core.scheduler import Scheduler
from tests.core.test_node_lanes import CFG, T0, C, report
from tests.core.test_node_saturation import _SlowStore

STORE = 0.4 * C  # what the store carries: 40 MB/s
EST = replace(CFG, capacity_bps=None, initial_capacity_bps=2 * STORE)  # a first guess twice the store


def test_the_saturated_flag_travels_in_the_report_and_an_older_report_has_none() -> None:
    r = replace(report("n.w0", {"dataset": C}, reads=True), store_saturated=True)
    assert json.loads(encode_report(r))["sat"] is True
    assert decode_report(encode_report(r)).store_saturated is True
    old = json.loads(encode_report(replace(r, store_saturated=None)))
    assert "sat" not in old and decode_report(json.dumps(old)).store_saturated is None
    old["sat"] = "yes"
    with pytest.raises(ReportError):
        decode_report(json.dumps(old))


def _w(node: str, est: float, delivered: float | None, *, sat: bool) -> NodeReport:
    return replace(
        report(node, {}, reads=False), capacity_bps=est, delivered_bps=delivered, store_saturated=sat
    )


def test_the_node_estimate_is_the_sum_delivered_while_the_store_is_a_bottleneck_else_at_least_it() -> None:
    # Each worker saturated by its half of the traffic estimates about half the store: the sum is the store.
    both = [_w("n.w0", 0.5 * STORE, 0.6 * STORE, sat=True), _w("n.w1", 2 * STORE, 0.4 * STORE, sat=False)]
    assert node_capacity_bps(both, estimated=True) == pytest.approx(STORE)
    # Nobody's bottleneck: at least what they got together, the median estimate if more.
    light = [_w("n.w0", STORE, 0.2 * STORE, sat=False), _w("n.w1", 3 * STORE, 0.1 * STORE, sat=False)]
    assert node_capacity_bps(light, estimated=True) == pytest.approx(2 * STORE)
    low = [_w("n.w0", 0.1 * STORE, 0.3 * STORE, sat=False)]
    assert node_capacity_bps(low, estimated=True) == pytest.approx(0.3 * STORE)
    # Nothing delivered, or an older report: the median; a configured capacity: the median.
    idle = [_w("n.w0", STORE, 0.0, sat=True), _w("n.w1", 3 * STORE, 0.0, sat=False)]
    assert node_capacity_bps(idle, estimated=True) == pytest.approx(2 * STORE)
    older = [_w("n.w0", STORE, None, sat=True), _w("n.w1", 3 * STORE, 0.5 * STORE, sat=True)]
    assert node_capacity_bps(older, estimated=True) == pytest.approx(2 * STORE)
    assert node_capacity_bps(both, estimated=False) == pytest.approx(1.25 * STORE)


def test_an_estimated_split_limits_only_the_capped_lanes_and_keeps_floors_of_each_workers_estimate() -> None:
    r0 = replace(
        report("n.w0", {"dataset": STORE}, reads=True),
        capacity_bps=0.5 * STORE,
        delivered_bps=0.7 * STORE,
        store_saturated=True,
    )
    r1 = replace(
        report("n.w1", {"checkpoint": STORE}, reads=False),
        capacity_bps=2 * STORE,
        delivered_bps=0.3 * STORE,
        store_saturated=False,
    )
    sp = split_node_lanes(
        [r0, r1], CFG.lanes, now=T0, ttl_s=1.5, cap_headroom=CFG.cap_headroom, estimated=True
    )
    assert sp is not None
    assert sp.capacity_bps == pytest.approx(STORE)
    assert sp.cap_scale == 1.0
    assert sp.lanes["checkpoint"] == pytest.approx(0.27 * STORE)
    assert sp.limits["n.w0"]["dataset"] is None  # no cap: the worker's own estimate paces it
    assert sp.limits["n.w1"]["checkpoint"] is not None
    assert sp.limits["n.w1"]["checkpoint"] == pytest.approx(sp.parts["n.w1"]["checkpoint"])
    assert sp.floors is not None
    # w1 carries (nearly) the node's 2 % checkpoint floor, as a fraction of its own estimate (2 x the store)
    carried = sp.floors["n.w1"]["checkpoint"] * 2 * STORE
    assert carried == pytest.approx(0.02 * STORE * sp.parts["n.w1"]["checkpoint"] / sp.lanes["checkpoint"])


def _node(*, estimated: bool) -> _SlowStore:
    node = _SlowStore({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}}, store_bps=STORE)
    node.workers = {w: (Scheduler(EST, T0), lanes) for w, (_, lanes) in node.workers.items()}
    node.estimated = estimated
    node.streams = 32  # 8 MiB per lane outstanding: more than the 4 MiB in-flight window
    return node


def test_simulation_two_estimating_workers_split_one_store_70_30() -> None:
    node = _node(estimated=True)
    node.seconds(8)  # the estimates learn the store, reads become active, the split settles
    for sec in node.seconds(6):
        total = sum(sec.values())
        assert total >= 0.9 * STORE, sec  # the store stays busy
        assert sec["checkpoint"] <= 0.30 * total, sec  # the writes keep to their cap of what it carries
        assert sec["checkpoint"] >= 0.15 * total, sec  # capped, not starved
    assert node.last_split is not None
    assert node.last_split.capacity_bps == pytest.approx(STORE, rel=0.05)
    # Why not the workers' estimates: each sees its own traffic. Their largest is the readers' part of
    # the store (75 %), their sum well over the store (w1's estimate only coasts down from the first guess).
    ests = [s.node_capacity_bps() for s, _ in node.workers.values()]
    assert max(ests) < 0.85 * STORE < 1.15 * STORE < sum(ests), ests
    # Without the node's estimate the writers' worker, which sees no reads, does not cap its writes: the
    # store's queue splits by the outstanding bytes, about half each.
    alone = _node(estimated=True)
    for _ in range(16):
        alone.run(alone.now + 0.5)  # no split applied: as before, with an estimated capacity
        alone.now += 0.5
    got = alone.run(alone.now + 1.0)
    assert got["checkpoint"] >= 0.4 * sum(got.values()), got
