"""Three gateways sharing one checkpoint budget, in virtual time: the cluster cap while reads are active
anywhere, work conservation when they stop, and what a Redis outage does (s3lanes.core.cluster_budget).

A fluid model, not the discrete scheduler: every ``DT`` each node drains ``min(ceiling, backlog)`` where its
ceiling is what its own scheduler would allow (the cluster allowance, its lane's 30% while reads are active
*locally*, never below the floor). The nodes run their rounds out of phase with each other (as real ones
do), through a blackboard with Redis' semantics (reports expire after the TTL). Node 1 holds almost all
the checkpoint data; nodes 2 and 3 get a trickle and run the readers. Rates are measured in 1 s windows.
The same scenario without the cluster budget (every node alone) must break the cap: that is the bug.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from s3lanes.core.cluster_budget import LaneReport, Mode, NodeLease, NodeReport, SharedLane, lane_demand_bps

C = 400_000_000.0  # the store (every node is configured with it)
CAP = 0.30
FLOOR = 0.02
INTERVAL = 0.5
TTL = 3 * INTERVAL
DT = 0.01
LANE = SharedLane("checkpoint", limit=None, limit_while_reads_active=CAP, floor=FLOOR)
BOARD_T0 = 1_700_000_000.0

READS_UNTIL = 24.0  # readers stop; the nodes' read activity ends read_idle_s (2 s) later
READ_IDLE_S = 2.0
OUTAGE = (12.0, 18.0)
END = 34.0
TRICKLE_BPS = 0.01 * C  # nodes 2 and 3 get this much checkpoint data, node 1 a backlog larger than it drains
PHASES = (0.0, 0.17, 0.33)


@dataclass
class SimNode:
    node_id: str
    phase: float
    backlog: float
    arrivals_bps: float
    readers: bool
    lease: NodeLease
    allowance: float | None = None
    history: list[float] = field(default_factory=list)  # drained bytes per DT over the last second

    def reads_active(self, t: float) -> bool:
        return self.readers and t < READS_UNTIL + READ_IDLE_S

    def ceiling(self, t: float, *, cluster: bool) -> float:
        f = math.inf
        if cluster and self.allowance is not None:
            f = self.allowance / C
        if self.reads_active(t):
            f = min(f, CAP)
        return max(min(f, 1.0), FLOOR) * C

    def rate_last_s(self) -> float:
        return sum(self.history) / (len(self.history) * DT) if self.history else 0.0

    def report(self, t: float) -> NodeReport:
        rate = self.rate_last_s()
        return NodeReport(
            node_id=self.node_id,
            instance="sim",
            reported_at=BOARD_T0 + t,
            capacity_bps=C,
            reads_active=self.reads_active(t),
            mode=self.lease.mode.value,
            lanes={
                "checkpoint": LaneReport(
                    rate_bps=rate,
                    demand_bps=lane_demand_bps(
                        rate_bps=rate, backlog_bytes=int(self.backlog), capacity_bps=C, horizon_s=INTERVAL
                    ),
                    backlog_bytes=int(self.backlog),
                    floor_bps=FLOOR * C,
                    allowance_bps=self.allowance,
                )
            },
        )


@dataclass
class Result:
    rates: dict[str, list[float]]  # node -> bytes/s per 1 s window
    modes: dict[str, list[Mode]]  # node -> mode at the end of each window

    def total(self, w: int) -> float:
        return sum(r[w] for r in self.rates.values())


def run(*, cluster: bool, outage_for: Callable[[str], bool] = lambda _n: True) -> Result:
    nodes = [
        SimNode(
            node_id=f"n{i + 1}",
            phase=PHASES[i],
            backlog=100 * C if i == 0 else 0.0,
            arrivals_bps=0.0 if i == 0 else TRICKLE_BPS,
            readers=i > 0,
            lease=NodeLease(f"n{i + 1}", [LANE], interval_s=INTERVAL, ttl_s=TTL, now=0.0),
        )
        for i in range(3)
    ]
    board: dict[str, tuple[float, NodeReport]] = {}  # node -> (expires at, report)
    next_round = {n.node_id: n.phase for n in nodes}
    rates: dict[str, list[float]] = defaultdict(list)
    modes: dict[str, list[Mode]] = defaultdict(list)
    window_bytes: dict[str, float] = defaultdict(float)
    steps_per_window = round(1.0 / DT)
    for step in range(round(END / DT)):
        t = step * DT
        if cluster:
            for n in nodes:
                if t + 1e-9 < next_round[n.node_id]:
                    continue
                next_round[n.node_id] += INTERVAL
                own = n.report(t)
                down = OUTAGE[0] <= t < OUTAGE[1] and outage_for(n.node_id)
                reports = None
                if not down:
                    board[n.node_id] = (t + TTL, own)
                    reports = [r for exp, r in board.values() if exp > t]
                verdict = n.lease.decide(own, reports, board_now=BOARD_T0 + t, now=t)
                n.allowance = verdict.allowances["checkpoint"]
        for n in nodes:
            n.backlog += n.arrivals_bps * DT
            moved = min(n.ceiling(t, cluster=cluster) * DT, n.backlog)
            n.backlog -= moved
            n.history.append(moved)
            del n.history[:-steps_per_window]
            window_bytes[n.node_id] += moved
        if (step + 1) % steps_per_window == 0:
            for n in nodes:
                rates[n.node_id].append(window_bytes.pop(n.node_id, 0.0) / 1.0)
                modes[n.node_id].append(n.lease.mode)
    return Result(dict(rates), dict(modes))


@functools.cache
def clustered() -> Result:
    return run(cluster=True)


def test_with_readers_active_the_cluster_sum_stays_within_the_cap_and_node_1_gets_most() -> None:
    r = clustered()
    # From 3 s (start-up learning, read activity propagated) to the outage, and after recovery.
    for w in [*range(3, 12), *range(20, 24)]:
        total = r.total(w)
        assert total <= (CAP + 0.05) * C, (w, total / C)
        assert total >= (CAP - 0.05) * C, (w, total / C)  # and the budget is used: node 1 is backlogged
        assert r.rates["n1"][w] >= 0.6 * total, (w, r.rates["n1"][w] / total)


def test_when_readers_stop_the_drains_use_the_whole_capacity() -> None:
    r = clustered()
    # Reads stop at 24 s, their activity ends at 26 s, one more round spreads the news.
    for w in range(28, 34):
        assert r.total(w) >= 0.95 * C, (w, r.total(w) / C)
        assert r.total(w) <= 1.0 * C + 1


def test_a_redis_outage_keeps_the_cap_and_every_node_draining_then_recovers() -> None:
    r = clustered()
    for w in range(int(OUTAGE[0]), int(OUTAGE[1])):
        assert all(r.modes[n][w] is Mode.SAFE for n in r.rates), w
        assert r.total(w) <= (CAP + 0.05) * C, (w, r.total(w) / C)
        assert r.rates["n1"][w] > 0
    # Safe share reached: node 1 drains about B/N, nodes 2 and 3 keep up with their trickle.
    w = int(OUTAGE[1]) - 1
    assert r.rates["n1"][w] == pytest.approx(CAP * C / 3, rel=0.05)
    assert r.rates["n2"][w] == pytest.approx(TRICKLE_BPS, rel=0.05)
    # Back to normal within a TTL of learning after Redis returns.
    assert all(r.modes[n][int(OUTAGE[1]) + 2] is Mode.NORMAL for n in r.rates)
    assert r.rates["n1"][21] >= 0.6 * r.total(21)


def test_a_partitioned_node_overshoots_by_at_most_its_safe_share() -> None:
    """Only node 1 loses Redis: the others drop its report after the TTL and share the budget without it,
    while it holds its safe share: the documented bound is B + B/N."""
    r = run(cluster=True, outage_for=lambda n: n == "n1")
    for w in range(int(OUTAGE[0]), int(OUTAGE[1])):
        assert r.modes["n1"][w] is Mode.SAFE
        assert r.total(w) <= CAP * C * (1 + 1 / 3) + 0.05 * C, (w, r.total(w) / C)


def test_without_the_cluster_budget_the_node_without_readers_breaks_the_cap() -> None:
    r = run(cluster=False)
    # Node 1 sees no reads of its own: it drains at full capacity while the others' readers suffer.
    assert all(r.total(w) > 0.9 * C for w in range(3, 12))
