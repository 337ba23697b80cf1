"""Several workers of one node: a board that fails does not freeze the node's rules. A worker without a
fresh split keeps the last one for a TTL, then falls back to the safe local rule (its own guard, 1 / N of
the node and of each lane's cap while reads are active); a fresh split applies again at once
(core.node_lanes.NodeRulesLease)."""

from __future__ import annotations

import math

import pytest

from s3lanes.core.node_lanes import (
    NodeRulesLease,
    NodeRulesMode,
    WorkerRules,
    safe_worker_rules,
    split_node_lanes,
)
from s3lanes.core.scheduler import Scheduler
from tests.core.test_node_guard import _slow_readers_on_w0
from tests.core.test_node_lanes import CAP, CFG, INTERVAL_S, C, _Node, _report, _run, report, split

TTL_S = 3 * INTERVAL_S


def _lease(node: str, *, workers: int = 2, now: float = 0.0) -> NodeRulesLease:
    return NodeRulesLease(
        node, CFG.lanes, ttl_s=TTL_S, workers=workers, strict=True, cap_headroom=CFG.cap_headroom, now=now
    )


def _mode(lease: NodeRulesLease) -> NodeRulesMode:
    return lease.mode  # read afresh (mypy would narrow the attribute across the rounds)


def _apply(s: Scheduler, r: WorkerRules, now: float) -> None:
    """As ClusterMember applies a worker's rules (no cluster allowance besides)."""
    s.set_node_caps(True, now)
    s.set_capacity_share(r.share, now)
    s.set_node_guard(r.guard_multiplier, now)
    for lane, floor in r.floors.items():
        s.set_node_floor(lane, floor, now)
    for lane, bps in r.limits.items():
        s.set_external_limit(lane, bps, now, for_reads=lane in r.for_reads, headroom_taken=True)


def test_the_safe_rule_is_1_over_n_of_the_node_and_of_each_cap_with_reads_assumed_active() -> None:
    r = safe_worker_rules(CFG.lanes, workers=4, capacity_bps=C, strict=True, cap_headroom=CFG.cap_headroom)
    assert r.mode is NodeRulesMode.SAFE
    assert r.share == 0.25
    assert r.guard_multiplier == 1.0  # the worker's own guard alone
    assert r.limits["checkpoint"] == pytest.approx(CAP * C / 4)
    assert r.limits["restore"] == pytest.approx(CAP * C / 4)
    assert r.limits["dataset"] is None and r.limits["metadata"] is None
    assert r.for_reads == frozenset({"checkpoint", "restore"})
    assert all(f == 0.0 for f in r.floors.values())  # the configured floors, of its own part
    # Four workers in safe mode at once keep the node's cap, no more.
    assert 4 * (r.limits["checkpoint"] or 0.0) == pytest.approx(CAP * C)
    loose = safe_worker_rules(CFG.lanes, workers=0, capacity_bps=C, strict=False, cap_headroom=0.1)
    assert loose.share == 1.0 and loose.limits["checkpoint"] is None and loose.for_reads == frozenset()


def test_the_lease_holds_the_last_split_for_a_ttl_then_goes_safe_and_comes_back() -> None:
    lease = _lease("n.w1")
    assert lease.decide(None, capacity_bps=C, now=0.0) is None  # starting: nothing to apply yet
    assert lease.mode is NodeRulesMode.STARTING
    sp = split(report("n.w0", {"dataset": C}, reads=True), report("n.w1", {"checkpoint": C}, reads=False))
    got = lease.decide(sp, capacity_bps=C, now=1.0)
    assert got is not None and got.mode is NodeRulesMode.NODE
    assert got.share == sp.shares["n.w1"] and got.limits == sp.limits["n.w1"]
    held = lease.decide(None, capacity_bps=C, now=1.0 + TTL_S - 0.01)
    assert held is not None and held.mode is NodeRulesMode.HELD and held.limits == got.limits
    # A split without this worker (its own report went stale) is no fresher than none.
    alone = split(report("n.w0", {"dataset": C}, reads=True))
    safe = lease.decide(alone, capacity_bps=C, now=1.0 + TTL_S)
    assert safe is not None and safe.mode is NodeRulesMode.SAFE
    assert safe.share == 0.5 and safe.limits["checkpoint"] == pytest.approx(CAP * C / 2)
    assert lease.board_age_s(1.0 + TTL_S) == pytest.approx(TTL_S)
    back = lease.decide(sp, capacity_bps=C, now=10.0)
    assert back is not None and back.mode is NodeRulesMode.NODE and back.share == sp.shares["n.w1"]
    assert lease.board_age_s(10.0) == 0.0


def test_a_worker_that_never_sees_the_board_goes_safe_after_a_ttl_with_the_configured_workers() -> None:
    lease = _lease("n.w1", workers=3, now=5.0)
    assert lease.decide(None, capacity_bps=C, now=5.0 + TTL_S / 2) is None
    got = lease.decide(None, capacity_bps=C, now=5.0 + TTL_S)
    assert got is not None and got.mode is NodeRulesMode.SAFE and got.share == pytest.approx(1 / 3)


def test_the_safe_share_counts_the_last_splits_workers_if_more_than_configured() -> None:
    lease = _lease("n.w1", workers=1)
    sp = split(*(report(f"n.w{i}", {"checkpoint": C}, reads=False) for i in range(4)))
    lease.decide(sp, capacity_bps=C, now=0.0)
    got = lease.decide(None, capacity_bps=C, now=TTL_S)
    assert got is not None and got.share == 0.25


def _rounds(node: _Node, leases: dict[str, NodeRulesLease], *, board_up: bool, seconds: int) -> None:
    """Like _Node.seconds, but each worker applies what its lease decides (the board up or down)."""
    for _ in range(2 * seconds):
        sp = None
        if board_up:
            reps = [_report(w, s, node.now) for w, (s, _) in node.workers.items()]
            sp = split_node_lanes(reps, CFG.lanes, now=node.now, ttl_s=TTL_S, cap_headroom=CFG.cap_headroom)
        for w, (s, _) in node.workers.items():
            r = leases[w].decide(sp, capacity_bps=C, now=node.now)
            if r is not None:
                _apply(s, r, node.now)
        _run(node.workers, node.now, node.now + INTERVAL_S, node.read_ttfb_s)
        node.now += INTERVAL_S


def test_simulation_a_failed_board_expires_the_nodes_guard_and_split_after_a_ttl() -> None:
    node = _slow_readers_on_w0()  # slow reads on w0 about to cut w1's writes through the node's guard
    node.seconds(4)
    w1 = node.workers["n.w1"][0]
    assert w1.snapshot(node.now).node_guard_multiplier < 0.1
    leases = {w: _lease(w, now=node.now) for w in node.workers}
    _rounds(node, leases, board_up=True, seconds=1)
    cut = w1.snapshot(node.now)
    assert cut.node_guard_multiplier < 0.1
    # The board fails: for a TTL the last split holds ...
    _rounds(node, leases, board_up=False, seconds=1)
    assert _mode(leases["n.w1"]) is NodeRulesMode.HELD
    assert w1.snapshot(node.now).node_guard_multiplier < 0.1
    # ... then each worker's own guard (w1 has no reads: no cut) and the safe caps: half the node each,
    # half the node's checkpoint cap each.
    _rounds(node, leases, board_up=False, seconds=1)
    assert _mode(leases["n.w1"]) is NodeRulesMode.SAFE
    snap = w1.snapshot(node.now)
    assert snap.node_guard_multiplier == 1.0
    assert snap.guard_multiplier == 1.0
    assert snap.capacity_bps == pytest.approx(C / 2)
    assert snap.lane("checkpoint").external_limit_bps == pytest.approx(CAP * C / 2)
    w0 = node.workers["n.w0"][0].snapshot(node.now)
    assert w0.guard_multiplier < 1.0  # w0's own guard still judges its reads
    assert w0.capacity_bps == pytest.approx(C / 2)
    # The writes, no longer cut by w0's guard, run at w1's safe part of the cap; together within the cap.
    node.read_ttfb_s["n.w0"] = 0.005
    _rounds(node, leases, board_up=False, seconds=2)
    got = _run(node.workers, node.now, node.now + 1.0, node.read_ttfb_s)
    node.now += 1.0
    assert 0.8 * CAP * C / 2 <= got["checkpoint"] <= CAP * C / 2 * 1.02, got
    # The board is back: the split applies again at once (w1 has all the writers: most of the node's cap).
    _rounds(node, leases, board_up=True, seconds=1)
    assert _mode(leases["n.w1"]) is NodeRulesMode.NODE
    limit = w1.snapshot(node.now).lane("checkpoint").external_limit_bps
    assert limit is not None and limit > 0.9 * CAP * C
    assert not math.isclose(w1.snapshot(node.now).capacity_bps, C / 2)
