"""Several workers of one node: the node's bandwidth split per lane with the scheduler's own lane table
(core.node_lanes.split_node_lanes), the per-lane demands in a worker's report, a scheduler that leaves the
caps to the node (Scheduler.set_node_caps), and a simulation of two workers on a fake clock: readers on one,
writers on the other, 70/30 for the node."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.cluster_budget import (
    LaneDemandReport,
    NodeReport,
    ReportError,
    decode_report,
    encode_report,
    lane_demand_bps,
)
from s3lanes.core.node_lanes import LANE_FLOOR, NodeLaneSplit, capped_for_reads, split_node_lanes
from s3lanes.core.scheduler import (
    CEILING_DEPTH_S,
    DEFAULT_CAP_HEADROOM,
    SHARE_WINDOW_S,
    Grant,
    LaneSpec,
    Scheduler,
    SchedulerConfig,
    WaitUntil,
    external_paced_bps,
)
from s3lanes.runtime.wiring import scheduler_config
from tests.core.test_scheduler_external_limit import rate_of

C = 100_000_000.0
T0 = 1_700_000_000.0
MiB = 1024 * 1024
CFG: SchedulerConfig = replace(scheduler_config(Config(), C), burst_bytes=MiB)
CAP = 0.30 * (1.0 - DEFAULT_CAP_HEADROOM)  # the checkpoint lane's cap while reads are active, paced


def report(node: str, demands: dict[str, float] | None, *, reads: bool, at: float = T0) -> NodeReport:
    return NodeReport(
        node_id=node,
        instance=f"i-{node}",
        reported_at=at,
        capacity_bps=C,
        reads_active=reads,
        mode="normal",
        node_lanes=None
        if demands is None
        else {name: LaneDemandReport(d, d, 0) for name, d in demands.items()},
    )


def split(*reports: NodeReport) -> NodeLaneSplit:
    got = split_node_lanes(
        reports, CFG.lanes, now=T0, ttl_s=1.5, strict=True, cap_headroom=DEFAULT_CAP_HEADROOM
    )
    assert got is not None
    return got


# -- the report ---------------------------------------------------------------------------------------------


def test_the_per_lane_demands_travel_in_the_report_and_an_older_report_has_none() -> None:
    r = report("n.w0", {"dataset": 5e7, "checkpoint": 0.0}, reads=True)
    back = decode_report(encode_report(r))
    assert back.node_lanes == r.node_lanes
    old = json.loads(encode_report(replace(r, node_lanes=None)))
    assert "nl" not in old
    assert decode_report(json.dumps(old)).node_lanes is None


def test_unknown_fields_are_ignored_and_a_malformed_lane_table_is_refused() -> None:
    doc = json.loads(encode_report(report("n.w0", {"dataset": 5e7}, reads=True)))
    doc["future"] = {"x": 1}
    doc["nl"]["dataset"]["p99"] = 0.004
    assert decode_report(json.dumps(doc)).node_lanes == {"dataset": LaneDemandReport(5e7, 5e7, 0)}
    for bad in ([1, 2], {"dataset": 3}, {"dataset": {"rate": -1, "demand": 0, "backlog": 0}}):
        doc["nl"] = bad
        with pytest.raises(ReportError):
            decode_report(json.dumps(doc))


# -- the split ----------------------------------------------------------------------------------------------


def test_readers_on_one_worker_and_writers_on_the_other_split_the_node_70_30() -> None:
    s = split(
        report("n.w0", {"dataset": C}, reads=True),
        report("n.w1", {"checkpoint": C}, reads=False),
    )
    assert s.reads_active
    assert s.lanes["checkpoint"] == pytest.approx(CAP * C)
    assert s.lanes["dataset"] == pytest.approx((1 - CAP) * C)  # the rest: work-conserving
    assert sum(s.shares.values()) == pytest.approx(1.0)
    # The readers' worker gets the dataset lane but its floor part; the writers' the checkpoint lane's.
    assert s.shares["n.w0"] == pytest.approx((1 - CAP) * (1 - LANE_FLOOR / 2) + CAP * LANE_FLOOR / 2)
    assert s.limits["n.w1"]["checkpoint"] == pytest.approx(CAP * C * (1 - LANE_FLOOR / 2))
    assert s.limits["n.w0"]["checkpoint"] == pytest.approx(CAP * C * LANE_FLOOR / 2)
    assert s.limits["n.w0"]["dataset"] == pytest.approx(s.parts["n.w0"]["dataset"])
    # Lanes nobody uses: a capped one at its floor part of the cap, another within its worker's part.
    assert s.limits["n.w0"]["restore"] == pytest.approx(LANE_FLOOR * CAP * C / 2)
    assert s.limits["n.w0"]["metadata"] is None


def test_without_reads_anywhere_the_writes_get_the_whole_node() -> None:
    s = split(
        report("n.w0", {"dataset": 0.0}, reads=False),
        report("n.w1", {"checkpoint": 0.4 * C}, reads=False),
    )
    assert s.lanes["checkpoint"] == pytest.approx(C)  # beyond its demand: it may grow into the rest
    assert s.shares["n.w1"] == pytest.approx(1 - LANE_FLOOR / 2)
    assert s.limits["n.w1"]["checkpoint"] == pytest.approx(C * (1 - LANE_FLOOR / 2))


def test_what_the_demands_leave_goes_to_the_backlogged_lanes() -> None:
    w0 = replace(
        report("n.w0", {}, reads=True),
        node_lanes={
            "dataset": LaneDemandReport(0.4 * C, 0.5 * C, 4 * MiB),
            "metadata": LaneDemandReport(0.8e6, 1e6, 0),
        },
    )
    s = split(w0, report("n.w1", {"checkpoint": 0.1 * C}, reads=False))
    assert s.lanes["metadata"] == pytest.approx(1e6)  # its demand (rate and a quarter), no more
    assert s.lanes["checkpoint"] == pytest.approx(0.1 * C)
    assert s.lanes["dataset"] == pytest.approx(C - 0.1 * C - 1e6)  # backlogged: the rest


def test_reads_on_any_worker_cap_the_writes_of_every_worker() -> None:
    s = split(
        report("n.w0", {"dataset": 0.2 * C}, reads=True),
        report("n.w1", {"checkpoint": C}, reads=False),
        report("n.w2", {"checkpoint": C}, reads=False),
    )
    assert math.fsum(s.parts[w]["checkpoint"] for w in s.shares) == pytest.approx(CAP * C)
    assert s.limits["n.w1"]["checkpoint"] == pytest.approx(s.limits["n.w2"]["checkpoint"])


def test_mixed_traffic_on_every_worker_gives_equal_parts_with_70_30_in_each() -> None:
    both = {"dataset": C, "checkpoint": C}
    s = split(report("n.w0", both, reads=True), report("n.w1", both, reads=True))
    assert s.shares == pytest.approx({"n.w0": 0.5, "n.w1": 0.5})
    for w in ("n.w0", "n.w1"):
        assert s.parts[w]["dataset"] == pytest.approx((1 - CAP) * C / 2)
        assert s.parts[w]["checkpoint"] == pytest.approx(CAP * C / 2)


def test_a_lane_that_appears_on_a_worker_has_a_floor_there() -> None:
    s = split(report("n.w0", {"dataset": C}, reads=True), report("n.w1", {}, reads=False))
    assert s.parts["n.w1"]["dataset"] == pytest.approx(LANE_FLOOR * C / 2)
    assert s.shares["n.w1"] > 0


def test_an_older_report_wants_everything_a_stale_one_drops_out_and_the_order_does_not_matter() -> None:
    s = split(report("n.w0", None, reads=True), report("n.w1", {"checkpoint": C}, reads=False))
    # The older report wants all of every lane: it shares the checkpoint lane equally, and has the rest.
    assert s.parts["n.w0"]["checkpoint"] == pytest.approx(s.parts["n.w1"]["checkpoint"])
    for lane in ("dataset", "restore", "metadata"):
        assert s.parts["n.w0"][lane] == pytest.approx(s.lanes[lane] * (1 - LANE_FLOOR / 2))
    stale = report("n.w2", {"dataset": C}, reads=True, at=T0 - 10)
    alone = split(stale, report("n.w1", {"checkpoint": C}, reads=False))
    assert alone.shares == {"n.w1": 1.0}
    assert not alone.reads_active
    assert split_node_lanes([stale], CFG.lanes, now=T0, ttl_s=1.5) is None
    a = report("n.w0", {"dataset": 0.3 * C}, reads=True)
    b = report("n.w1", {"checkpoint": C, "metadata": 1e6}, reads=False)
    assert split(a, b) == split(b, a)


def test_workers_that_know_no_capacity_yet_share_the_node_equally() -> None:
    # Before any capacity is known (a report of 0 B/s), no lane has a rate to split: each worker gets an
    # equal share and nothing to pace to.
    a = replace(report("n.w0", {"dataset": C}, reads=True), capacity_bps=0.0)
    b = replace(report("n.w1", {"checkpoint": C}, reads=False), capacity_bps=0.0)
    s = split(a, b)
    assert s.shares == {"n.w0": 0.5, "n.w1": 0.5}
    assert s.capacity_bps == 0.0
    assert all(v == 0.0 for v in s.lanes.values()), s.lanes


def test_work_conserving_mode_keeps_no_cap_while_reads_are_active() -> None:
    def lanes(dataset: float) -> dict[str, float]:
        got = split_node_lanes(
            [
                report("n.w0", {"dataset": dataset}, reads=True),
                report("n.w1", {"checkpoint": C}, reads=False),
            ],
            CFG.lanes,
            now=T0,
            ttl_s=1.5,
            strict=False,
        )
        assert got is not None
        return dict(got.lanes)

    backlogged = lanes(C)
    assert backlogged["dataset"] == pytest.approx(0.7 * C)  # its reservation; by weight 7:3 too
    assert backlogged["checkpoint"] == pytest.approx(0.3 * C)
    light = lanes(0.1 * C)
    assert light["dataset"] == pytest.approx(0.1 * C)
    assert light["checkpoint"] == pytest.approx(0.9 * C)  # what the reads leave


# -- the scheduler leaves the caps to the node ---------------------------------------------------------------


def test_a_scheduler_with_node_caps_paces_a_capped_lane_to_its_external_limit_only() -> None:
    s = Scheduler(CFG, 1000.0)
    s.set_external_limit("checkpoint", 0.6 * C, 1000.0)
    local, now = rate_of(s, "checkpoint", seconds=4.0, now=1000.0, reads=True)
    assert s.snapshot(now).reads_active
    assert local < 0.31 * C  # its own cap while reads are active, tighter than the external limit
    s.set_node_caps(True, now)
    node, now = rate_of(s, "checkpoint", seconds=4.0, now=now, reads=True)
    assert node == pytest.approx(0.3 * C, rel=0.05)  # its weight's share: the cap is the node's business
    s.set_external_limit("checkpoint", 0.1 * C, now)
    capped, now = rate_of(s, "checkpoint", seconds=4.0, now=now, reads=True)
    assert capped == pytest.approx(0.1 * C, rel=0.05)
    s.set_node_caps(False, now)
    s.set_external_limit("checkpoint", None, now)
    back, _ = rate_of(s, "checkpoint", seconds=4.0, now=now, reads=True)
    assert back == pytest.approx(local, rel=0.05)


# -- a node part of a lane capped for the reads' sake is paced as the cap would be locally ------------------


def test_the_split_says_which_lanes_parts_are_shares_of_the_reads_cap() -> None:
    s = split(
        report("n.w0", {"dataset": C}, reads=True),
        report("n.w1", {"checkpoint": C}, reads=False),
    )
    assert s.for_reads == frozenset({"checkpoint", "restore"})  # not the reads, not the metadata lane
    quiet = split(report("n.w0", {}, reads=False), report("n.w1", {"checkpoint": C}, reads=False))
    assert quiet.for_reads == frozenset()
    ckpt = CFG.lanes[1]
    assert ckpt.name == "checkpoint"

    def capped(spec: LaneSpec, *, strict: bool = True) -> bool:
        return capped_for_reads(spec, reads_active=True, strict=strict, cap_headroom=DEFAULT_CAP_HEADROOM)

    assert capped(ckpt)
    assert not capped(ckpt, strict=False)  # work_conserving: no reads' cap
    assert not capped(replace(ckpt, limit=0.2))  # the plain limit is the tighter cap
    assert capped(replace(ckpt, limit=0.28))  # 0.27 under 0.28: the reads' cap binds
    assert not capped(replace(ckpt, read_protected=True, paced_by_guard=False))


def _granted_per_second(s: Scheduler, lane: str, *, now: float, bursts: int) -> tuple[list[float], float]:
    """Keep ``lane`` backlogged with 64 KiB tickets for 1.3 s, then idle 0.7 s (its ceiling bucket refills),
    ``bursts`` times; grants completed at once. Returns the bytes granted in every 1 s window that starts at
    a grant (the fullest windows start there), and the long-run rate."""
    piece = 64 * 1024
    grants: list[tuple[float, int]] = []
    start = now
    for _ in range(bursts):
        stop = now + 1.3
        for _ in range(2):
            s.submit(lane, piece, now)
        while True:
            d = s.pull(now)
            if isinstance(d, Grant):
                grants.append((now, d.cost_bytes))
                s.complete(d.ticket, now)
                if now < stop:
                    s.submit(lane, piece, now)
            elif isinstance(d, WaitUntil):
                now = d.at
            else:
                break
        now = max(now, stop) + 0.7
    windows = []
    for i, (t, _) in enumerate(grants):
        windows.append(float(sum(c for u, c in grants[i:] if u < t + 1.0)))
    return windows, sum(c for _, c in grants) / (now - start)


def test_a_node_part_of_the_reads_cap_keeps_to_the_part_in_every_second() -> None:
    """A writers-only worker (no reads of its own) paced to its part of the node's checkpoint cap: its part
    already has the headroom off, and like the cap in one scheduler it paces a little under it, so that even
    a second that starts with the lane's ceiling bucket full stays within the part."""
    s = Scheduler(CFG, T0)
    s.set_node_caps(True, T0)
    s.set_capacity_share(0.5, T0)
    part = CAP * C * (1 - LANE_FLOOR / 2)  # the writers' worker's part: 25.65 MB/s of a 100 MB/s node
    s.set_external_limit("checkpoint", part, T0, for_reads=True, headroom_taken=True)
    lane = s.snapshot(T0).lane("checkpoint")
    assert lane.external_for_reads and lane.external_headroom_taken
    assert lane.limit_bps == pytest.approx(part)  # the headroom is not taken twice
    windows, _ = _granted_per_second(s, "checkpoint", now=T0, bursts=4)
    assert max(windows) <= part, (max(windows), part)
    assert max(windows) >= 0.97 * part  # under it, not far under it
    # Given as a plain external limit (the factor not applied), a second that starts with a full bucket
    # goes over the part.
    plain = Scheduler(CFG, T0)
    plain.set_node_caps(True, T0)
    plain.set_capacity_share(0.5, T0)
    plain.set_external_limit("checkpoint", part, T0)
    over, _ = _granted_per_second(plain, "checkpoint", now=T0, bursts=4)
    assert max(over) > part


def test_a_share_of_the_reads_cap_that_has_its_headroom_is_paced_as_an_allowance_is() -> None:
    def paced(**kw: bool) -> float:
        s = Scheduler(CFG, T0)
        s.set_external_limit("checkpoint", 0.2 * C, T0, **kw)
        rate, _ = rate_of(s, "checkpoint", seconds=4.0, now=T0)
        return rate

    at_cap = SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)
    assert paced(for_reads=True, headroom_taken=True) == pytest.approx(0.2 * C * at_cap, rel=0.02)
    assert paced(for_reads=True) == pytest.approx(0.2 * C * at_cap * (1 - DEFAULT_CAP_HEADROOM), rel=0.02)
    assert paced(headroom_taken=True) == pytest.approx(0.2 * C, rel=0.02)  # not for the reads: at the limit
    for kw, want in (
        ({"for_reads": True, "headroom_taken": True}, 0.2 * C * at_cap),
        ({"for_reads": True, "headroom_taken": False}, 0.2 * C * at_cap * (1 - DEFAULT_CAP_HEADROOM)),
        ({"for_reads": False, "headroom_taken": True}, 0.2 * C),
    ):
        got = external_paced_bps(0.2 * C, cap_headroom=DEFAULT_CAP_HEADROOM, **kw)
        assert got == pytest.approx(want)


# -- simulation: two workers on one fake clock ---------------------------------------------------------------

INTERVAL_S = 0.5
PIECE = 256 * 1024


def _report(node: str, s: Scheduler, now: float) -> NodeReport:
    snap = s.snapshot(now)
    return NodeReport(
        node_id=node,
        instance=f"i-{node}",
        reported_at=now,
        capacity_bps=s.node_capacity_bps(),
        reads_active=snap.reads_active,
        mode="normal",
        node_lanes={
            ln.name: LaneDemandReport(
                rate_bps=ln.granted_rate_bps,
                demand_bps=lane_demand_bps(
                    rate_bps=ln.granted_rate_bps,
                    backlog_bytes=ln.queued_bytes,
                    capacity_bps=s.node_capacity_bps(),
                    horizon_s=INTERVAL_S,
                ),
                backlog_bytes=ln.queued_bytes,
            )
            for ln in snap.lanes
        },
        guard_multiplier=snap.guard_multiplier,
    )


def _run(
    workers: dict[str, tuple[Scheduler, set[str]]],
    now: float,
    until: float,
    read_ttfb_s: Mapping[str, float] | None = None,
    depth: Mapping[str, int] | None = None,
) -> Counter[str]:
    """Drive every worker's scheduler until ``until``, each keeping its lanes in ``set`` backlogged (two
    pieces queued per lane, or the worker's ``depth``: one per stream; grants completed at once). Returns
    the bytes granted per lane, node-wide. A worker in ``read_ttfb_s`` tells its guard that every read grant
    took that long to its first byte."""
    got: Counter[str] = Counter()
    due = dict.fromkeys(workers, now)
    for w, (s, lanes) in workers.items():
        for lane in lanes:
            while s.snapshot(now).lane(lane).queued_bytes < (depth or {}).get(w, 2) * PIECE:
                s.submit(lane, PIECE, now)
    while True:
        w = min(due, key=lambda k: (due[k], k))
        at = due[w]
        if at >= until:
            return got
        s, lanes = workers[w]
        d = s.pull(at)
        if isinstance(d, Grant):
            got[d.lane] += d.cost_bytes
            if d.lane == "dataset" and read_ttfb_s is not None and w in read_ttfb_s:
                s.observe_read(d.lane, 0.0, read_ttfb_s[w], at)
            s.complete(d.ticket, at)
            if d.lane in lanes:
                s.submit(d.lane, PIECE, at)
        elif isinstance(d, WaitUntil):
            due[w] = d.at
        else:
            due[w] = until


class _Node:
    """Two workers' schedulers on one fake clock, split per lane every round as ClusterMember does."""

    def __init__(
        self,
        lanes: dict[str, set[str]],
        *,
        node_caps: bool = True,
        node_guard: bool = True,
        node_floors: bool = True,
    ) -> None:
        self.workers = {w: (Scheduler(CFG, T0), set(ls)) for w, ls in lanes.items()}
        self.node_caps = node_caps
        self.node_guard = node_guard  # apply the node's guard multiplier (set_node_guard)
        self.node_floors = node_floors  # apply each worker's part of the node's floors (set_node_floor)
        self.read_ttfb_s: dict[str, float] = {}  # workers whose reads report a time to first byte
        self.silent: dict[str, NodeReport] = {}  # workers that stopped reporting: their last report
        self.scale_caps = True  # the node's caps follow a saturated store (split_node_lanes(scale_caps))
        self.depth: dict[str, int] = {}  # worker -> streams per lane (pieces kept queued; default 2)
        self.estimated = False  # the workers estimate the capacity (split_node_lanes(estimated))
        self.last_split: NodeLaneSplit | None = None
        self.now = T0

    def seconds(self, n: int) -> list[Counter[str]]:
        """Run ``n`` seconds (two rounds each); the bytes granted per lane, node-wide, in each second."""
        out: list[Counter[str]] = []
        for _ in range(n):
            second: Counter[str] = Counter()
            for _ in range(2):
                reps = [self.silent.get(w) or self.report(w, s) for w, (s, _) in self.workers.items()]
                sp = split_node_lanes(
                    reps,
                    CFG.lanes,
                    now=self.now,
                    ttl_s=3 * INTERVAL_S,
                    cap_headroom=CFG.cap_headroom,
                    scale_caps=self.scale_caps,
                    estimated=self.estimated,
                )
                self.last_split = sp
                assert sp is not None
                for w, (s, _) in self.workers.items():
                    if w not in sp.shares:
                        continue  # its report is stale: not in the split (ClusterMember applies nothing)
                    if self.node_guard:
                        s.set_node_guard(sp.guard_multiplier, self.now)
                    if self.node_floors:
                        assert sp.floors is not None
                        for lane, floor in sp.floors[w].items():
                            s.set_node_floor(lane, floor, self.now)
                    s.set_node_caps(self.node_caps, self.now)
                    s.set_capacity_share(sp.shares[w], self.now)
                    for lane, bps in sp.limits[w].items():
                        # as ClusterMember applies a node part: a share of the reads' cap, headroom off
                        s.set_external_limit(
                            lane, bps, self.now, for_reads=lane in sp.for_reads, headroom_taken=True
                        )
                second += self.run(self.now + INTERVAL_S)
                self.now += INTERVAL_S
            out.append(second)
        return out

    def report(self, w: str, s: Scheduler) -> NodeReport:
        """Worker ``w``'s report now."""
        return _report(w, s, self.now)

    def run(self, until: float) -> Counter[str]:
        """Drive the workers from now until ``until``; the bytes per lane, node-wide."""
        return _run(self.workers, self.now, until, self.read_ttfb_s, self.depth)


def test_simulation_readers_on_one_worker_writers_on_the_other_keep_70_30_for_the_node() -> None:
    node = _Node({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}})
    node.seconds(4)  # reads become active, the split settles
    for sec in node.seconds(6):
        assert sec["dataset"] >= 0.70 * C, sec
        assert 0.2 * C <= sec["checkpoint"] <= 0.30 * C, sec  # capped, not starved
    node.workers["n.w0"][1].clear()  # the readers stop
    last = node.seconds(6)[-1]  # the reads' hysteresis (read_idle_s) passes, the cap lifts
    assert last["checkpoint"] >= 0.9 * C, last
    assert last["dataset"] == 0


def test_simulation_a_worker_with_readers_and_writers_gives_its_writes_the_node_share() -> None:
    """Readers on both workers, writers on one: the writers' worker holds part of the node's reads and all of
    its writes. Its own scheduler capping the writes at 30 % of its part would leave them ~20 % of the
    node; the node's cap is what counts."""
    lanes = {"n.w0": {"dataset"}, "n.w1": {"dataset", "checkpoint"}}
    node = _Node(lanes)
    node.seconds(4)
    for sec in node.seconds(6):
        assert sec["dataset"] >= 0.70 * C, sec
        # the node's cap (27 %), paced at 1 / 1.05 of it as one scheduler paces its own: 25.7 %
        assert 0.24 * C <= sec["checkpoint"] <= 0.27 * C, sec
    local = _Node(lanes, node_caps=False)
    local.seconds(4)
    assert max(sec["checkpoint"] for sec in local.seconds(6)) < 0.22 * C
