"""Several workers of one node: the node's caps while reads are active follow a saturated store, as one
scheduler's do (saturation_scale). Each worker publishes what the store delivered to it and how busy its
reads kept it (optional report fields); the node scales its caps by the saturation scale of the workers'
sum (core.node_lanes.node_cap_scale). Simulated: two workers' schedulers on one fake clock in front of one
FIFO store slower than configured."""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter
from dataclasses import replace

import pytest

from s3lanes.core.cluster_budget import NodeReport, ReportError, decode_report, encode_report
from s3lanes.core.node_lanes import node_cap_scale, node_lane_limit
from s3lanes.core.scheduler import Grant, Scheduler, WaitUntil, saturation_scale
from tests.core.test_node_lanes import CAP, CFG, PIECE, T0, C, _Node, _report, report

# -- the report ---------------------------------------------------------------------------------------------


def test_what_a_worker_delivered_travels_in_the_report_and_an_older_report_has_none() -> None:
    r = replace(report("n.w0", {"dataset": C}, reads=True), delivered_bps=3.5e7, reads_busy=0.97)
    doc = json.loads(encode_report(r))
    assert doc["dlv"] == 3.5e7 and doc["rb"] == 0.97
    back = decode_report(encode_report(r))
    assert back.delivered_bps == 3.5e7 and back.reads_busy == 0.97
    old = json.loads(encode_report(replace(r, delivered_bps=None, reads_busy=None)))
    assert "dlv" not in old and "rb" not in old
    assert decode_report(json.dumps(old)).delivered_bps is None
    assert decode_report(json.dumps(old)).reads_busy is None
    # An older version reads this one: everything it knows is where it was.
    assert {k: v for k, v in doc.items() if k not in ("dlv", "rb")} == old


@pytest.mark.parametrize(("key", "bad"), [("dlv", -1.0), ("dlv", "fast"), ("rb", 1.5), ("rb", -0.1)])
def test_a_bad_delivered_rate_or_busy_fraction_is_refused(key: str, bad: object) -> None:
    doc = json.loads(encode_report(report("n.w0", {"dataset": C}, reads=True)))
    doc[key] = bad
    with pytest.raises(ReportError):
        decode_report(json.dumps(doc))


# -- the node's scale ---------------------------------------------------------------------------------------


def _w(node: str, delivered: float | None, busy: float | None, *, reads: bool) -> NodeReport:
    return replace(report(node, {}, reads=reads), delivered_bps=delivered, reads_busy=busy)


def test_the_node_scale_is_the_saturation_of_the_workers_sum_once_some_readers_keep_the_store_busy() -> None:
    busy = [_w("n.w0", 0.7 * C, 0.99, reads=True), _w("n.w1", 0.24 * C, 0.0, reads=False)]
    assert node_cap_scale(busy, C) == pytest.approx(saturation_scale(0.94))
    assert node_cap_scale(busy, C) == pytest.approx(0.94)
    # Readers with idle gaps, nobody reading, an older report, no capacity: not taken for saturated.
    idle = [_w("n.w0", 0.7 * C, 0.5, reads=True), _w("n.w1", 0.24 * C, 0.0, reads=False)]
    assert node_cap_scale(idle, C) == 1.0
    quiet = [_w("n.w0", 0.7 * C, 0.99, reads=False), _w("n.w1", 0.24 * C, 0.0, reads=False)]
    assert node_cap_scale(quiet, C) == 1.0
    older = [_w("n.w0", 0.7 * C, 0.99, reads=True), _w("n.w1", None, None, reads=False)]
    assert node_cap_scale(older, C) == 1.0
    assert node_cap_scale(busy, 0.0) == 1.0
    # A store that carries its configured capacity, or half of it (readers not saturating it): 1.
    assert node_cap_scale([_w("n.w0", C, 1.0, reads=True)], C) == 1.0
    assert node_cap_scale([_w("n.w0", 0.5 * C, 1.0, reads=True)], C) == 1.0


def test_the_scale_applies_to_the_caps_while_reads_are_active_only() -> None:
    ckpt = CFG.lanes[1]
    assert node_lane_limit(
        ckpt, reads_active=True, strict=True, cap_headroom=CFG.cap_headroom, cap_scale=0.93
    ) == pytest.approx(CAP * 0.93)
    assert math.isinf(
        node_lane_limit(ckpt, reads_active=False, strict=True, cap_headroom=CFG.cap_headroom, cap_scale=0.93)
    )


# -- simulation: a store slower than configured ------------------------------------------------------------


class _SlowStore(_Node):
    """The two workers in front of one FIFO store that carries ``store_bps`` (less than the configured
    C): a granted piece completes when the store has moved it. Every lane of a worker keeps two pieces
    outstanding (queued or at the store). Counts what the store delivered, per lane."""

    def __init__(self, lanes: dict[str, set[str]], store_bps: float) -> None:
        super().__init__(lanes)
        self.store_bps = store_bps
        self.free_at = T0  # when the store has moved everything it was given
        self.done: list[tuple[float, int, str, int, str, int]] = []  # (at, seq, worker, ticket, lane, bytes)
        self.seq = 0
        self.streams = 2  # pieces each lane keeps outstanding

    def report(self, w: str, s: Scheduler) -> NodeReport:
        delivered, busy = s.delivered_last_s(self.now)
        return replace(
            _report(w, s, self.now),
            delivered_bps=delivered,
            reads_busy=busy,
            store_saturated=s.store_saturated(self.now),
        )

    def run(self, until: float) -> Counter[str]:
        got: Counter[str] = Counter()
        due = dict.fromkeys(self.workers, self.now)
        for s, lanes in self.workers.values():
            for lane in lanes:
                ln = s.snapshot(self.now).lane(lane)
                for _ in range(self.streams - ln.queued_tickets - ln.inflight_tickets):
                    s.submit(lane, PIECE, self.now)
        while True:
            w = min(due, key=lambda k: (due[k], k))
            if self.done and self.done[0][0] <= due[w]:
                at, _, v, ticket, lane, cost = self.done[0]
                if at >= until:
                    return got
                heapq.heappop(self.done)
                s, lanes = self.workers[v]
                s.complete(ticket, at)
                s.observe_delivered(lane, cost, at)
                got[lane] += cost
                if lane in lanes:
                    s.submit(lane, PIECE, at)
                due[v] = min(due[v], at)
                continue
            at = due[w]
            if at >= until:
                return got
            s, _ = self.workers[w]
            d = s.pull(at)
            if isinstance(d, Grant):
                self.free_at = max(self.free_at, at) + d.cost_bytes / self.store_bps
                self.seq += 1
                heapq.heappush(self.done, (self.free_at, self.seq, w, d.ticket, d.lane, d.cost_bytes))
            elif isinstance(d, WaitUntil):
                due[w] = d.at
            else:
                due[w] = math.inf


def _writes_share(scale_caps: bool) -> tuple[list[float], _SlowStore]:
    node = _SlowStore({"n.w0": {"dataset"}, "n.w1": {"checkpoint"}}, store_bps=0.93 * C)
    node.scale_caps = scale_caps
    node.seconds(6)  # reads become active, a second of history, the split settles
    shares = []
    for sec in node.seconds(6):
        total = sum(sec.values())
        assert total >= 0.9 * 0.93 * C, sec  # the readers keep the store busy
        shares.append(sec["checkpoint"] / total)
    return shares, node


def test_simulation_the_writes_keep_to_their_cap_of_what_a_slower_store_delivers() -> None:
    shares, node = _writes_share(scale_caps=True)
    assert node.last_split is not None
    assert node.last_split.cap_scale == pytest.approx(0.93, abs=0.01)
    # The node's cap (27 %) of what the store delivers, paced at 1 / 1.05 of it as one scheduler paces it:
    # 25.7 % of what the store delivers.
    for share in shares:
        assert 0.22 <= share <= 0.26, shares
    # Shares of the configured capacity instead: the writes take 25.7 % of the configured 100, 27-28 % of
    # the 93 the store delivers.
    unscaled, _ = _writes_share(scale_caps=False)
    assert sum(unscaled) / len(unscaled) > 0.265, unscaled
