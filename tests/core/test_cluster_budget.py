"""The cluster budget core with explicit times: apportionment, staleness, read activity, safe mode, codec."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.cluster_budget import (
    DEMAND_HEADROOM,
    SAFE_DECAY_INTERVALS,
    LaneReport,
    Mode,
    NodeLease,
    NodeReport,
    ReportError,
    SharedLane,
    apportion,
    decode_report,
    encode_report,
    fair_share,
    lane_demand_bps,
    live_reports,
)
from tests.budget import examples

C = 40_000_000.0
CKPT = SharedLane("checkpoint", limit=None, limit_while_reads_active=0.30, floor=0.02)
FLOOR = 0.02 * C
TTL = 1.5
INTERVAL = 0.5
T0 = 1_700_000_000.0


def report(
    node: str,
    *,
    at: float = T0,
    demand: float = 0.0,
    reads: bool = False,
    cap: float = C,
    floor: float = FLOOR,
    rate: float = 0.0,
    backlog: int = 0,
) -> NodeReport:
    return NodeReport(
        node_id=node,
        instance=f"i-{node}",
        reported_at=at,
        capacity_bps=cap,
        reads_active=reads,
        mode="normal",
        lanes={"checkpoint": LaneReport(rate, demand, backlog, floor, None)},
    )


def allowances(reports: list[NodeReport], lane: SharedLane = CKPT, now: float = T0) -> dict[str, float]:
    view = apportion(reports, [lane], now, TTL)
    assert view is not None
    return dict(view.lanes[lane.name].allowances)


# -- water-filling ------------------------------------------------------------------------------------------


def reference_fair_share(budget: float, wants: list[float]) -> list[float]:
    """Brute force: bisect the water level until sum(min(want, level)) meets the budget."""
    if sum(wants) <= budget:
        return list(wants)
    lo, hi = 0.0, max(wants)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(min(w, mid) for w in wants) > budget:
            hi = mid
        else:
            lo = mid
    return [min(w, lo) for w in wants]


wants_st = st.lists(st.floats(min_value=0, max_value=1e10, allow_nan=False), min_size=1, max_size=12)


@given(budget=st.floats(min_value=0, max_value=2e10, allow_nan=False), wants=wants_st)
@settings(max_examples=examples(300), deadline=None)
def test_fair_share_is_the_water_level_of_a_brute_force_search(budget: float, wants: list[float]) -> None:
    got = fair_share(budget, wants)
    ref = reference_fair_share(budget, wants)
    tol = 1e-6 * max(budget, 1.0)
    assert math.fsum(got) <= budget + tol
    for g, r, w in zip(got, ref, wants, strict=True):
        assert 0.0 <= g <= w + tol
        assert g == pytest.approx(r, abs=tol)


@given(budget=st.floats(min_value=0, max_value=2e10, allow_nan=False), wants=wants_st)
@settings(max_examples=examples(200), deadline=None)
def test_fair_share_is_max_min_fair(budget: float, wants: list[float]) -> None:
    got = fair_share(budget, wants)
    tol = 1e-6 * max(budget, 1.0)
    level = max(got)
    for g, w in zip(got, wants, strict=True):
        # Anyone short of their want is at the top level: nobody could get more without taking from a
        # node that has as little or less.
        if g < w - tol:
            assert g >= level - tol


def test_fair_share_by_hand() -> None:
    assert fair_share(12.0, [1.0, 2.0, 40.0]) == [1.0, 2.0, 9.0]
    assert fair_share(12.0, [40.0, 40.0, 40.0]) == [4.0, 4.0, 4.0]
    assert fair_share(12.0, [1.0, 1.0]) == [1.0, 1.0]
    assert fair_share(0.0, [5.0]) == [0.0]


# -- the budget ---------------------------------------------------------------------------------------------


def test_reads_active_on_any_node_caps_the_cluster_at_the_lane_fraction() -> None:
    reps = [report("a", demand=C), report("b", demand=C), report("c", demand=C, reads=True)]
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None and view.readers == ("c",)
    assert view.lanes["checkpoint"].budget_bps == pytest.approx(0.30 * C)
    got = allowances(reps)
    assert math.fsum(got.values()) == pytest.approx(0.30 * C)
    assert got["a"] == pytest.approx(0.10 * C)  # all backlogged: equal shares


def test_no_reads_anywhere_gives_the_whole_capacity() -> None:
    reps = [report("a", demand=C), report("b", demand=C), report("c")]
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None and not view.reads_active
    assert view.lanes["checkpoint"].budget_bps == pytest.approx(C)
    got = allowances(reps)
    assert math.fsum(got.values()) == pytest.approx(C)
    assert got["c"] == pytest.approx(FLOOR)  # no demand: its floor (which the scheduler would give anyway)


def test_a_limit_caps_the_budget_even_without_reads_and_work_conserving_mode_has_no_read_cap() -> None:
    limited = SharedLane("checkpoint", limit=0.5, limit_while_reads_active=0.30, floor=0.02)
    assert allowances([report("a", demand=C)], limited)["a"] == pytest.approx(0.5 * C)
    assert allowances([report("a", demand=C, reads=True)], limited)["a"] == pytest.approx(0.3 * C)
    wc = SharedLane("checkpoint", limit=None, limit_while_reads_active=None, floor=0.02)
    assert allowances([report("a", demand=C, reads=True)], wc)["a"] == pytest.approx(C)


def test_the_node_with_the_backlog_gets_most_of_the_budget_the_others_their_demand() -> None:
    reps = [
        report("n1", demand=C, reads=False),
        report("n2", demand=1_500_000.0, reads=True),
        report("n3", demand=1_000_000.0, reads=True),
    ]
    got = allowances(reps)
    b = 0.30 * C
    assert math.fsum(got.values()) == pytest.approx(b)
    assert got["n2"] == pytest.approx(1_500_000.0)
    assert got["n3"] == pytest.approx(1_000_000.0)
    assert got["n1"] == pytest.approx(b - 2_500_000.0)


def test_leftover_is_spread_equally_so_sudden_demand_has_room() -> None:
    reps = [report("a", demand=1e6, reads=True), report("b", demand=0.0)]
    got = allowances(reps)
    b = 0.30 * C
    assert math.fsum(got.values()) == pytest.approx(b)
    assert got["b"] > FLOOR  # nothing asked for, but part of the unused budget is there
    assert got["a"] - 1e6 == pytest.approx(got["b"] - FLOOR)


def test_floors_that_exceed_the_budget_win_and_are_flagged() -> None:
    reps = [report(f"n{i:02}", demand=C, reads=True) for i in range(20)]  # 20 x 2% > 30%
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None
    budget = view.lanes["checkpoint"]
    assert budget.floors_exceed_budget
    assert all(a == pytest.approx(FLOOR) for a in budget.allowances.values())
    fits = apportion(reps[:15], [CKPT], T0, TTL)
    assert fits is not None and not fits.lanes["checkpoint"].floors_exceed_budget


def test_the_median_capacity_ignores_one_wrong_node() -> None:
    reps = [report("a", cap=C), report("b", cap=C * 1.1), report("c", cap=1e9)]  # c: a start-up guess
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None and view.capacity_bps == pytest.approx(C * 1.1)
    reps[2] = report("c", cap=1e5)  # c: an estimator collapsed by a local fault
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None and view.capacity_bps == pytest.approx(C)


def test_stale_reports_are_dropped_and_the_newest_per_node_wins() -> None:
    reps = [
        report("a", at=T0 - 0.2, demand=C),
        report("b", at=T0 - TTL - 0.01, demand=C, reads=True),  # gone: its reads no longer count
        report("a", at=T0 - 1.0, demand=0.0),  # an older copy of a
    ]
    assert [r.node_id for r in live_reports(reps, T0, TTL)] == ["a"]
    view = apportion(reps, [CKPT], T0, TTL)
    assert view is not None and view.nodes == ("a",) and not view.reads_active
    assert view.lanes["checkpoint"].allowances["a"] == pytest.approx(C)
    assert apportion(reps[1:2], [CKPT], T0, TTL) is None


@st.composite
def snapshots(draw: st.DrawFn) -> list[NodeReport]:
    n = draw(st.integers(min_value=1, max_value=10))
    out = []
    for i in range(n):
        out.append(
            report(
                f"node-{draw(st.integers(0, 30)):02}-{i}",
                at=T0 - draw(st.floats(min_value=0, max_value=2 * TTL)),
                demand=draw(st.floats(min_value=0, max_value=2 * C)),
                reads=draw(st.booleans()),
                cap=draw(st.floats(min_value=1e6, max_value=1e9)),
                floor=draw(st.sampled_from([0.0, 1e5, FLOOR])),
            )
        )
    return out


@given(reps=snapshots(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=examples(300), deadline=None)
def test_allowances_never_exceed_the_budget_and_every_node_computes_the_same(
    reps: list[NodeReport], seed: int
) -> None:
    view = apportion(reps, [CKPT], T0, TTL)
    shuffled = list(reps)
    random.Random(seed).shuffle(shuffled)
    assert apportion(shuffled, [CKPT], T0, TTL) == view  # order of the snapshot does not matter
    if view is None:
        return
    budget = view.lanes["checkpoint"]
    total = math.fsum(budget.allowances.values())
    floors = math.fsum(
        min(r.lanes["checkpoint"].floor_bps, budget.budget_bps) for r in live_reports(reps, T0, TTL)
    )
    if budget.floors_exceed_budget:
        assert total == pytest.approx(floors)
    else:
        assert total <= budget.budget_bps * (1 + 1e-9)
    for r in live_reports(reps, T0, TTL):
        assert budget.allowances[r.node_id] >= min(r.lanes["checkpoint"].floor_bps, budget.budget_bps) - 1e-6


def test_demand_of_a_backlogged_lane_is_its_backlog_over_the_interval_up_to_capacity() -> None:
    assert lane_demand_bps(rate_bps=0.0, backlog_bytes=10**9, capacity_bps=C, horizon_s=0.5) == C
    assert lane_demand_bps(rate_bps=0.0, backlog_bytes=1_000_000, capacity_bps=C, horizon_s=0.5) == 2e6
    assert (
        lane_demand_bps(rate_bps=4e6, backlog_bytes=0, capacity_bps=C, horizon_s=0.5) == 4e6 * DEMAND_HEADROOM
    )
    assert lane_demand_bps(rate_bps=0.0, backlog_bytes=0, capacity_bps=C, horizon_s=0.5) == 0.0


# -- the codec ----------------------------------------------------------------------------------------------


def test_reports_survive_the_wire() -> None:
    r = report("gpu-node-7.cluster", demand=123.5, reads=True, rate=42.0, backlog=99)
    r = replace(r, lanes={**r.lanes, "restore": LaneReport(1.0, 2.0, 3, 4.0, 5.0)})
    assert decode_report(encode_report(r)) == r


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"v": 2}',
        b'{"v":1,"node":"","inst":"x","at":1,"cap":1,"reads":true,"mode":"normal","lanes":{}}',
        b'{"v":1,"node":"a","inst":"x","at":-1,"cap":1,"reads":true,"mode":"normal","lanes":{}}',
        b'{"v":1,"node":"a","inst":"x","at":1,"cap":1,"reads":"yes","mode":"normal","lanes":{}}',
        b'{"v":1,"node":"a","inst":"x","at":1,"cap":1,"reads":true,"mode":"normal","lanes":{"c":{"rate":1}}}',
        b'{"v":1,"node":"a","inst":"x","at":1,"cap":true,"reads":true,"mode":"normal","lanes":{}}',
    ],
)
def test_garbage_on_the_board_is_refused(raw: bytes) -> None:
    with pytest.raises(ReportError):
        decode_report(raw)


# -- one node's lease ---------------------------------------------------------------------------------------


class Node:
    """A node's lease plus what it reports, driven with a fake monotonic clock (``now``)."""

    def __init__(self, node_id: str, now: float = 0.0) -> None:
        self.id = node_id
        self.lease = NodeLease(node_id, [CKPT], interval_s=INTERVAL, ttl_s=TTL, now=now)
        self.demand = 0.0
        self.reads = False

    def own(self, at: float) -> NodeReport:
        return report(self.id, at=at, demand=self.demand, reads=self.reads)

    def round(self, board: list[NodeReport] | None, now: float) -> float:
        own = self.own(T0 + now)
        reports = None if board is None else [own, *board]
        return self.lease.decide(own, reports, board_now=T0 + now, now=now).allowances["checkpoint"]


def test_a_new_node_learns_for_one_ttl_at_its_floor_then_takes_its_share() -> None:
    n = Node("a")
    n.demand = C
    modes = [n.lease.mode]
    assert n.round([], 0.0) == pytest.approx(FLOOR)
    modes.append(n.lease.mode)
    assert n.round([], TTL - 0.01) == pytest.approx(FLOOR)
    assert n.round([], TTL) == pytest.approx(C)
    modes.append(n.lease.mode)
    assert modes == [Mode.STARTING, Mode.LEARNING, Mode.NORMAL]


def test_safe_mode_decays_to_the_read_budget_over_the_last_node_count_and_recovers() -> None:
    nodes = [Node("a"), Node("b"), Node("c")]
    nodes[0].demand = C
    nodes[1].demand = nodes[2].demand = 1e6
    nodes[2].reads = True
    t = 0.0
    for _ in range(6):  # through learning, into normal
        board = [n.own(T0 + t) for n in nodes]
        got = [n.round([r for r in board if r.node_id != n.id], t) for n in nodes]
        t += INTERVAL
    assert all(n.lease.mode is Mode.NORMAL for n in nodes)
    b = 0.30 * C
    assert math.fsum(got) == pytest.approx(b)
    assert got[0] == pytest.approx(b - 2e6)

    # Redis goes away for everybody: each moves linearly to B/N, the sum never above B.
    outage_at = t
    series = []
    while t <= outage_at + (SAFE_DECAY_INTERVALS + 2) * INTERVAL:
        got = [n.round(None, t) for n in nodes]
        series.append(got)
        assert all(n.lease.mode is Mode.SAFE for n in nodes)
        assert math.fsum(got) <= b * (1 + 1e-9)
        t += INTERVAL
    assert series[0][0] == pytest.approx(b - 2e6)  # starts from what it held
    assert series[2][0] < series[1][0] < series[0][0]  # decays
    assert series[-1] == pytest.approx([b / 3] * 3)  # safe share reached within a few intervals
    assert nodes[0].lease.safe_share(nodes[0].own(T0), "checkpoint") == pytest.approx(b / 3)

    # Redis is back: learning (never above what safe mode held) for one TTL, then the computed share.
    board = [n.own(T0 + t) for n in nodes]
    back = [n.round([r for r in board if r.node_id != n.id], t) for n in nodes]
    assert all(n.lease.mode is Mode.LEARNING for n in nodes)
    assert back[0] == pytest.approx(b / 3) and back[1] == pytest.approx(1e6)
    t += TTL
    board = [n.own(T0 + t) for n in nodes]
    final = [n.round([r for r in board if r.node_id != n.id], t) for n in nodes]
    assert all(n.lease.mode is Mode.NORMAL for n in nodes)
    assert final[0] == pytest.approx(b - 2e6)


def test_safe_mode_heads_for_the_read_budget_even_if_nobody_was_reading() -> None:
    n = Node("a")
    n.demand = C
    n.round([report("b")], 0.0)
    full = n.round([report("b", at=T0 + TTL)], TTL)
    assert full == pytest.approx(C - FLOOR)  # no reads: b keeps its floor, a the rest
    t = TTL + SAFE_DECAY_INTERVALS * INTERVAL + 5
    assert n.round(None, TTL + 0.01) == pytest.approx(full, rel=0.01)
    assert n.round(None, t) == pytest.approx(0.30 * C / 2)


def test_safe_mode_before_any_view_holds_the_floor_and_never_goes_below_it() -> None:
    n = Node("a")
    assert n.round(None, 0.0) == pytest.approx(FLOOR)
    assert n.lease.mode is Mode.SAFE
    assert n.round(None, 100.0) == pytest.approx(FLOOR)


def test_a_round_without_this_nodes_own_report_counts_as_a_failure() -> None:
    n = Node("a")
    own = n.own(T0)
    stale_own = replace(own, reported_at=T0 - 10)
    verdict = n.lease.decide(own, [stale_own, report("b")], board_now=T0, now=0.0)
    assert verdict.mode is Mode.SAFE and verdict.view is None


def test_lease_refuses_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        NodeLease("a", [], interval_s=0.5, ttl_s=1.5, now=0.0)
    with pytest.raises(ValueError):
        NodeLease("a", [CKPT], interval_s=0.5, ttl_s=0.5, now=0.0)


def test_an_allowance_is_marked_a_share_of_the_reads_cap_only_while_that_cap_is_the_budget() -> None:
    a = NodeLease("a", [CKPT], interval_s=INTERVAL, ttl_s=TTL, now=0.0)
    quiet = a.decide(report("a"), [report("a"), report("b")], board_now=T0, now=0.0)
    assert quiet.for_reads == frozenset()  # nobody reads: the work-conserving budget, paced at it
    reading = a.decide(report("a"), [report("a"), report("b", reads=True)], board_now=T0, now=0.1)
    assert reading.for_reads == frozenset({"checkpoint"})  # b reads: a's allowance is a share of its cap
    safe = a.decide(report("a"), None, board_now=T0, now=0.2)
    assert safe.mode is Mode.SAFE and safe.for_reads == frozenset({"checkpoint"})
    assert CKPT.for_reads(True) and not CKPT.for_reads(False)
    # A limit tighter than the reads' cap is the budget, a cap of its own: no headroom; work-conserving
    # mode has no reads' cap at all.
    assert not SharedLane("checkpoint", limit=0.2, limit_while_reads_active=0.30).for_reads(True)
    assert not SharedLane("checkpoint", limit=None, limit_while_reads_active=None).for_reads(True)
