"""Several workers of one node: the read-latency guard holds for the node. A worker publishes its guard's
multiplier in its report (an optional field), the node's multiplier is the smallest among the workers that
read (core.node_lanes.node_guard_multiplier), and every worker's scheduler paces its paced lanes by it
(Scheduler.set_node_guard), so readers missing their target on one worker cut the writes on another."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from s3lanes.core.cluster_budget import NodeReport, ReportError, decode_report, encode_report
from s3lanes.core.node_lanes import node_guard_multiplier, split_node_lanes
from s3lanes.core.scheduler import Grant, Scheduler, WaitUntil
from tests.core.test_node_lanes import CFG, T0, C, _Node, _report, report, split
from tests.core.test_scheduler_external_limit import rate_of

SLOW_S = 0.05  # a read's time to first byte 45 ms over its 5 ms baseline: far over the 5 ms target
FAST_S = 0.005

# -- the report ---------------------------------------------------------------------------------------------


def test_the_guard_multiplier_travels_in_the_report_and_an_older_report_has_none() -> None:
    r = replace(report("n.w0", {"dataset": C}, reads=True), guard_multiplier=0.25)
    doc = json.loads(encode_report(r))
    assert doc["gm"] == 0.25
    assert decode_report(encode_report(r)).guard_multiplier == 0.25
    # A report of an older version (no "gm") decodes, without a multiplier ...
    old = json.loads(encode_report(replace(r, guard_multiplier=None)))
    assert "gm" not in old
    assert decode_report(json.dumps(old)).guard_multiplier is None
    # ... and an older version reads this one: everything it knows is where it was, "gm" is one more key.
    assert {k: v for k, v in doc.items() if k != "gm"} == old


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.5, "half", True])
def test_a_guard_multiplier_outside_0_1_is_refused(bad: object) -> None:
    doc = json.loads(encode_report(report("n.w0", {"dataset": C}, reads=True)))
    doc["gm"] = bad
    with pytest.raises(ReportError):
        decode_report(json.dumps(doc))


# -- the node's multiplier ----------------------------------------------------------------------------------


def test_the_node_multiplier_is_the_smallest_among_the_workers_that_read() -> None:
    def w(node: str, m: float | None, *, reads: bool) -> NodeReport:
        return replace(report(node, {}, reads=reads), guard_multiplier=m)

    readers = [w("n.w0", 0.5, reads=True), w("n.w1", 0.125, reads=True), w("n.w2", 1.0, reads=False)]
    assert node_guard_multiplier(readers) == 0.125
    # A worker that stopped reading has nothing to say (its guard lets go only 5 s later) ...
    stopped = [w("n.w0", 0.5, reads=True), w("n.w1", 0.125, reads=False)]
    assert node_guard_multiplier(stopped) == 0.5
    # ... nobody reading, or only older reports without a multiplier, cuts nothing.
    assert node_guard_multiplier([w("n.w0", 0.25, reads=False)]) == 1.0
    assert node_guard_multiplier([w("n.w0", None, reads=True)]) == 1.0
    # The split carries it, from the live reports only.
    fresh = replace(report("n.w0", {"dataset": C}, reads=True), guard_multiplier=0.25)
    stale = replace(report("n.w2", {"dataset": C}, reads=True, at=T0 - 10), guard_multiplier=1 / 32)
    assert split(fresh, stale, report("n.w1", {"checkpoint": C}, reads=False)).guard_multiplier == 0.25


# -- the scheduler applies it -------------------------------------------------------------------------------


def test_the_node_guard_cuts_a_paced_lane_without_reads_here_and_never_under_its_floor() -> None:
    s = Scheduler(CFG, T0)
    full, now = rate_of(s, "checkpoint", seconds=2.0, now=T0)
    assert full >= 0.95 * C  # no reads anywhere
    s.set_node_guard(0.25, now)
    snap = s.snapshot(now)
    assert not snap.reads_active
    assert snap.node_guard_multiplier == 0.25
    assert snap.guard_multiplier == 1.0  # its own guard: what it publishes
    assert snap.lane("checkpoint").guard_multiplier == 0.25
    assert snap.lane("metadata").guard_multiplier == 1.0  # not paced by the guard
    cut, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert cut == pytest.approx(0.25 * C, rel=0.05)
    s.set_node_guard(1 / 64, now)
    floored, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert floored == pytest.approx(0.02 * C, rel=0.05)  # the checkpoint lane's 2 % floor
    s.set_node_guard(1.0, now)
    back, _ = rate_of(s, "checkpoint", seconds=2.0, now=now)
    assert back >= 0.95 * C
    with pytest.raises(ValueError):
        s.set_node_guard(0.0, now)
    with pytest.raises(ValueError):
        s.set_node_guard(1.5, now)


def test_a_worker_keeps_its_part_of_the_nodes_floor_under_the_node_guard() -> None:
    s = Scheduler(CFG, T0)
    s.set_node_guard(1 / 64, T0)
    s.set_node_floor("checkpoint", 0.08, T0)  # its part of the node's floor, of its own capacity
    assert s.snapshot(T0).lane("checkpoint").floor_fraction == pytest.approx(0.08)
    floored, now = rate_of(s, "checkpoint", seconds=4.0, now=T0)
    assert floored == pytest.approx(0.08 * C, rel=0.05)
    s.set_node_floor("checkpoint", 0.0, now)  # back to the configured 2 %
    floored, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert floored == pytest.approx(0.02 * C, rel=0.05)
    with pytest.raises(ValueError):
        s.set_node_floor("checkpoint", 1.5, now)
    with pytest.raises(KeyError):
        s.set_node_floor("nope", 0.1, now)


def test_the_node_guard_scales_a_paced_lanes_concurrency() -> None:
    lanes = tuple(replace(ln, max_concurrency=8) if ln.name == "checkpoint" else ln for ln in CFG.lanes)
    s = Scheduler(replace(CFG, lanes=lanes), T0)
    s.set_node_guard(0.25, T0)
    for _ in range(6):
        s.submit("checkpoint", 64 * 1024, T0)
    granted = 0
    now = T0
    for _ in range(50):
        d = s.pull(now)
        if isinstance(d, Grant):
            granted += 1
        elif isinstance(d, WaitUntil):
            now = d.at
        else:
            break
    assert granted == 2  # 8 x 0.25 in flight at once (nothing completes)


# -- two workers on one fake clock --------------------------------------------------------------------------


def _slow_readers_on_w0(*, node_floors: bool = True) -> _Node:
    node = _Node({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}}, node_floors=node_floors)
    node.read_ttfb_s["n.w0"] = FAST_S
    node.seconds(4)  # reads become active, the guard learns its baseline, the split settles
    for sec in node.seconds(2):
        assert sec["checkpoint"] >= 0.2 * C, sec  # the writers' part of the node's cap
    node.read_ttfb_s["n.w0"] = SLOW_S  # the store answers the reads late
    return node


def test_readers_missing_their_target_on_one_worker_cut_the_writes_on_another() -> None:
    node = _slow_readers_on_w0()
    cut = node.seconds(4)[-1]
    assert cut["checkpoint"] <= 0.05 * C, cut  # near the floor: the guard of w0 cut w1's writes
    # ... but not under the node's 2 % floor: w1 carries the whole checkpoint lane, so it keeps the node's
    # floor for it, not 2 % of its own part of the node.
    assert cut["checkpoint"] >= 0.9 * 0.02 * C, cut
    w1 = node.workers["n.w1"][0].snapshot(node.now)
    assert not w1.reads_active and w1.node_guard_multiplier < 0.1
    # Once the reads meet their target again, the guard lets go and the writes grow back.
    node.read_ttfb_s["n.w0"] = FAST_S
    back = node.seconds(6)[-1]
    assert back["checkpoint"] >= 0.2 * C, back


def test_without_the_node_floor_a_cut_worker_would_keep_only_the_floor_of_its_own_part() -> None:
    node = _slow_readers_on_w0(node_floors=False)
    cut = node.seconds(4)[-1]
    assert cut["checkpoint"] < 0.015 * C, cut  # 2 % of w1's part of the node, under the node's 2 %


def test_a_lanes_floor_is_split_among_the_workers_as_its_allocation_is() -> None:
    node = _Node({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}})
    node.seconds(3)
    reps = [_report(w, s, node.now) for w, (s, _) in node.workers.items()]
    sp = split_node_lanes(reps, CFG.lanes, now=node.now, ttl_s=1.5, cap_headroom=CFG.cap_headroom)
    assert sp is not None and sp.floors is not None
    # The node's 2 % checkpoint floor, in bytes/s, is carried by the worker that has the writers.
    carried = {w: sp.floors[w]["checkpoint"] * sp.shares[w] * C for w in sp.shares}
    assert sum(carried.values()) == pytest.approx(0.02 * C, rel=1e-6)
    assert carried["n.w1"] >= 0.9 * 0.02 * C
    assert sp.floors["n.w1"]["checkpoint"] > 0.02  # more than 2 % of its own part
    assert sp.floors["n.w0"]["dataset"] == 0.0  # no configured floor: nothing to split


def test_the_writes_grow_back_when_the_slow_reads_stop() -> None:
    node = _slow_readers_on_w0()
    node.seconds(4)
    node.workers["n.w0"][1].clear()  # the readers stop; w0's guard still holds its cut for 5 s
    assert node.workers["n.w0"][0].snapshot(node.now).guard_multiplier < 0.1
    last = node.seconds(4)[-1]  # read_idle_s later w0 no longer reads: its guard has nothing to say
    assert last["checkpoint"] >= 0.9 * C, last  # and no cap either: the whole node


def test_the_writes_grow_back_when_the_slow_readers_worker_stops_reporting() -> None:
    node = _slow_readers_on_w0()
    node.seconds(4)
    last_word = _report("n.w0", node.workers["n.w0"][0], node.now)
    assert last_word.reads_active
    assert last_word.guard_multiplier is not None and last_word.guard_multiplier < 0.1
    node.silent["n.w0"] = last_word  # w0 hangs: its report stays as it was, and ages
    node.workers["n.w0"][1].clear()
    last = node.seconds(4)[-1]  # it goes stale after the ttl (1.5 s): w1 is alone on the node
    assert last["checkpoint"] >= 0.9 * C, last


def test_without_the_node_guard_the_writes_are_not_cut() -> None:
    node = _Node({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}}, node_guard=False)
    node.read_ttfb_s["n.w0"] = FAST_S
    node.seconds(6)
    node.read_ttfb_s["n.w0"] = SLOW_S
    last = node.seconds(4)[-1]
    assert node.workers["n.w0"][0].snapshot(node.now).guard_multiplier < 0.1  # w0's guard cut ...
    assert last["checkpoint"] >= 0.2 * C, last  # ... nothing that moves bytes: w0 has no writes
