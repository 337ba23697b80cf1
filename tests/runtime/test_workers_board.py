"""The workers of one node share the write lanes' budget through a FileBoard (a directory of report files):
the cluster shell's members, each over a real scheduler and its own FileBoard on one directory, apportion
the budget as they do through Redis, split the node's bandwidth per lane (node_share), and forget a worker
that stopped reporting."""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from s3lanes.clock import FakeClock
from s3lanes.config import ClusterConfig, Config
from s3lanes.core.cluster_budget import Mode
from s3lanes.core.node_lanes import LANE_FLOOR
from s3lanes.core.scheduler import (
    CEILING_DEPTH_S,
    SHARE_WINDOW_S,
    LaneSnapshot,
    Scheduler,
    external_paced_bps,
)
from s3lanes.runtime.cluster import BoardRound, ClusterMember, MemoryBoard
from s3lanes.runtime.wiring import scheduler_config
from s3lanes.runtime.workers import FileBoard, clear_board

C = 40_000_000.0
MiB = 1024 * 1024
INTERVAL = 0.5


def workers(
    directory: Path,
    clock: FakeClock,
    backlogs: dict[str, int],
    readers: set[str],
    *,
    node_share: bool = False,
    capacity: float | None = C,
) -> dict[str, ClusterMember]:
    members = {}
    for node, backlog in sorted(backlogs.items()):
        cfg = replace(
            scheduler_config(Config(), C), burst_bytes=MiB, capacity_bps=capacity, initial_capacity_bps=C
        )
        sched = Scheduler(cfg, clock.monotonic())
        if node in readers:
            sched.submit("dataset", MiB, clock.monotonic())  # a queued read keeps the worker's reads active
        members[node] = ClusterMember(
            ClusterConfig(node_id=node, interval_s=INTERVAL),
            sched,
            clock,
            board=FileBoard(directory, clock),  # one board object per worker, as in separate processes
            backlog_bytes=lambda lane, b=backlog: b if lane == "checkpoint" else 0,  # type: ignore[misc]
            node_share=node_share,
        )
    return members


def _rounds(members: dict[str, ClusterMember], clock: FakeClock) -> Callable[[int], Awaitable[None]]:
    """``await rounds(n)``: n rounds of every member still in ``members``, one interval apart."""

    async def rounds(n: int) -> None:
        for _ in range(n):
            for m in members.values():
                await m.step()
            clock.advance(INTERVAL)

    return rounds


def _paced(lane: LaneSnapshot) -> float:
    """What the lane is paced at under its external limit alone (which must be set)."""
    assert lane.external_limit_bps is not None
    return external_paced_bps(
        lane.external_limit_bps,
        for_reads=lane.external_for_reads,
        headroom_taken=lane.external_headroom_taken,
        cap_headroom=0.1,
    )


def limit(member: ClusterMember, clock: FakeClock) -> float | None:
    return member._scheduler.snapshot(clock.monotonic()).lane("checkpoint").external_limit_bps


async def test_workers_on_a_file_board_hold_the_write_cap_for_the_node(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(tmp_path, clock, {"n.w0": 10**10, "n.w1": 10**10, "n.w2": 0}, readers={"n.w2"})
    for _ in range(6):  # past the learning TTL
        for m in members.values():
            await m.step()
        clock.advance(INTERVAL)
    assert all(m.lease.mode is Mode.NORMAL for m in members.values())
    limits = {n: limit(m, clock) for n, m in members.items()}
    # Reads on one worker cap the checkpoint lane of all three together at 30 % of the node's capacity
    # (each alone would allow itself 30 %: 90 % in all).
    assert math.fsum(v for v in limits.values() if v is not None) == pytest.approx(0.30 * C)
    assert limits["n.w2"] == pytest.approx(0.02 * C)  # idle: its floor
    assert limits["n.w0"] == pytest.approx(limits["n.w1"])  # equal backlogs, equal shares
    assert sorted(os.listdir(tmp_path)) == ["n.w0", "n.w1", "n.w2"]


async def test_a_worker_that_stops_reporting_is_forgotten_after_the_ttl(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(tmp_path, clock, {"n.w0": 10**10, "n.w1": 10**10}, readers={"n.w0"})
    board = FileBoard(tmp_path, clock)
    rnd = await board.exchange("probe", b"{}", ttl_s=1.0, score=0.0)
    assert rnd.payloads == [b"{}"] and rnd.previous is None
    for _ in range(6):
        for m in members.values():
            await m.step()
        clock.advance(INTERVAL)
    w0 = members["n.w0"]
    assert len(w0._last_reports) == 2
    for _ in range(6):  # n.w1 has died: its report expires after ttl_s (1.5 s)
        await w0.step()
        clock.advance(INTERVAL)
    assert [r.node_id for r in w0._last_reports] == ["n.w0"]
    clear_board(tmp_path)
    assert os.listdir(tmp_path) == []


async def test_workers_split_the_node_per_lane_and_pace_each_lane_to_its_part(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(tmp_path, clock, {"n.w0": 0, "n.w1": 10**10}, readers={"n.w0"}, node_share=True)
    for _ in range(6):
        for m in members.values():
            await m.step()
        clock.advance(INTERVAL)
    readers, writers = members["n.w0"], members["n.w1"]
    cap = 0.30 * 0.9  # the checkpoint lane's cap while reads are active anywhere, less cap_headroom
    # The readers' worker has the dataset lane (all of what the writes leave, but the writers' worker's
    # floor part of it); the writers' worker the checkpoint lane's cap, whatever the split of demands.
    assert readers.capacity_share == pytest.approx(
        (1 - cap) * (1 - LANE_FLOOR / 2) + cap * LANE_FLOOR / 2, rel=1e-6
    )
    assert readers.capacity_share + writers.capacity_share == pytest.approx(1.0)
    # The writers' checkpoint lane is paced to the smaller of its node part and the write budget's
    # allowance (which, a share of the reads' cap, is paced less its headroom).
    part = cap * C * (1 - LANE_FLOOR / 2)
    lane = writers._scheduler.snapshot(clock.monotonic()).lane("checkpoint")
    paced = _paced(lane)
    at_cap = SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)
    assert paced <= part * at_cap * (1 + 1e-9)  # the part, paced as the node's cap is: no second over it
    assert paced >= 0.9 * part * at_cap
    snap = writers._scheduler.snapshot(clock.monotonic())
    assert snap.capacity_bps == pytest.approx(writers.capacity_share * C)
    status = readers.status()
    assert status["capacity_share"] == readers.capacity_share
    assert status["node_cap_scale"] == 1.0  # the store is not saturated under its configured capacity
    assert readers._report(clock.monotonic()).delivered_bps == 0.0  # nothing delivered: no bodies here
    assert status["node_lanes"]["dataset"]["node_bps"] == pytest.approx((1 - cap) * C)
    assert status["node_lanes"]["checkpoint"]["part_bps"] == pytest.approx(cap * C * LANE_FLOOR / 2)


async def test_workers_carry_the_read_guard_to_the_node_on_the_file_board(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(tmp_path, clock, {"n.w0": 0, "n.w1": 10**10}, readers={"n.w0"}, node_share=True)
    readers, writers = members["n.w0"], members["n.w1"]

    rounds = _rounds(members, clock)

    await rounds(4)
    assert writers._scheduler.snapshot(clock.monotonic()).node_guard_multiplier == 1.0
    # The readers' guard cuts (their reads miss their target); the writers' worker, which has no reads of
    # its own, paces its writes by the node's multiplier from its next round on.
    guard = readers._scheduler._guard
    guard.multiplier, guard.last_read_at = 0.25, clock.monotonic()  # a guard that saw reads lets go after 5 s
    await rounds(1)
    assert readers._report(clock.monotonic()).guard_multiplier == 0.25  # what the readers' worker publishes
    snap = writers._scheduler.snapshot(clock.monotonic())
    assert not snap.reads_active
    assert snap.node_guard_multiplier == 0.25
    assert snap.lane("checkpoint").guard_multiplier == 0.25
    assert writers.status()["node_guard_multiplier"] == 0.25
    assert writers._report(clock.monotonic()).guard_multiplier == 1.0  # its own guard, not the node's
    # The writers' worker carries the node's 2 % checkpoint floor, more than 2 % of its own part of the node.
    share = writers.capacity_share
    floor = snap.lane("checkpoint").floor_fraction
    assert share < 0.9 and floor > 0.02
    assert floor * share == pytest.approx(0.02, rel=0.1)
    # The readers' worker stops reporting: after the ttl its cut no longer holds.
    del members["n.w0"]
    await rounds(4)
    assert writers._scheduler.snapshot(clock.monotonic()).node_guard_multiplier == 1.0
    assert writers.status()["node_guard_multiplier"] == 1.0


class _FailingBoard(FileBoard):
    """A FileBoard whose exchange fails while ``down`` (the state directory unwritable, say)."""

    down = False

    async def exchange(self, node_id: str, payload: bytes, ttl_s: float, score: float) -> BoardRound:
        if self.down:
            raise OSError("board unwritable")
        return await super().exchange(node_id, payload, ttl_s, score)


async def test_a_failed_file_board_expires_the_node_rules_after_the_ttl(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(tmp_path, clock, {"n.w0": 0, "n.w1": 10**10}, readers={"n.w0"}, node_share=True)
    boards = {}
    for node, m in members.items():
        boards[node] = m._board = _FailingBoard(tmp_path, clock)
    readers, writers = members["n.w0"], members["n.w1"]

    rounds = _rounds(members, clock)

    await rounds(4)
    guard = readers._scheduler._guard
    guard.multiplier, guard.last_read_at = 0.25, clock.monotonic()
    await rounds(1)
    assert writers.status()["node_rules_mode"] == "node"
    assert writers._scheduler.snapshot(clock.monotonic()).node_guard_multiplier == 0.25
    for b in boards.values():
        b.down = True
    await rounds(2)  # within the ttl (1.5 s): the last split holds
    assert writers.status()["node_rules_mode"] == "held"
    assert writers._scheduler.snapshot(clock.monotonic()).node_guard_multiplier == 0.25
    await rounds(2)
    status = writers.status()
    assert status["node_rules_mode"] == "safe"
    assert status["node_board_age_s"] >= writers.cfg.ttl_s
    assert status["node_guard_multiplier"] == 1.0
    assert status["capacity_share"] == 0.5
    snap = writers._scheduler.snapshot(clock.monotonic())
    assert snap.node_guard_multiplier == 1.0  # its own guard
    assert snap.capacity_bps == pytest.approx(C / 2)
    lane = snap.lane("checkpoint")
    # half the node's cap, or tighter still: the write budget's own safe mode
    assert lane.external_limit_bps is not None and lane.external_limit_bps <= 0.27 * C / 2 * (1 + 1e-9)
    for b in boards.values():
        b.down = False
    await rounds(4)  # the exchange's backoff passes
    assert writers.status()["node_rules_mode"] == "node"
    assert writers.capacity_share > 0.5 or readers.capacity_share > 0.5


async def test_workers_with_an_estimated_capacity_split_the_node_too(tmp_path: Path) -> None:
    clock = FakeClock()
    members = workers(
        tmp_path, clock, {"n.w0": 0, "n.w1": 10**10}, readers={"n.w0"}, node_share=True, capacity=None
    )
    await _rounds(members, clock)(4)
    readers, writers = members["n.w0"], members["n.w1"]
    status = writers.status()
    assert status["node_rules_mode"] == "node"
    # Nothing delivered yet (no bodies here): the workers' median estimate, their first guess.
    assert status["node_capacity_bps"] == writers._scheduler.node_capacity_bps()
    now = clock.monotonic()
    # The writes are held to their part of the node's cap while the readers' worker reads ...
    lane = writers._scheduler.snapshot(now).lane("checkpoint")
    paced = _paced(lane)
    assert paced <= 0.27 * status["node_capacity_bps"] * (1 + 1e-9)
    # ... and the reads, a lane without a cap, are paced by the readers' worker's own estimate only.
    assert readers._scheduler.snapshot(now).lane("dataset").external_limit_bps is None


async def test_workers_beside_the_clusters_redis_split_the_node_on_their_board(tmp_path: Path) -> None:
    """Two workers of node n (readers on w0, writers on w1) in a cluster whose other node m has writers too:
    the write budget is the cluster's (a MemoryBoard stands in for Redis), the node's split is on the
    workers' FileBoard, and the writers' worker paces its writes to the tighter of the two."""
    clock = FakeClock()
    cluster = MemoryBoard(clock)
    members: dict[str, ClusterMember] = {}
    for node, backlog, reads, worker in (
        ("m", 10**10, False, False),
        ("n.w0", 0, True, True),
        ("n.w1", 10**10, False, True),
    ):
        sched = Scheduler(replace(scheduler_config(Config(), C), burst_bytes=MiB), clock.monotonic())
        if reads:
            sched.submit("dataset", MiB, clock.monotonic())
        members[node] = ClusterMember(
            ClusterConfig(redis_url="redis://unused", node_id=node, interval_s=INTERVAL),
            sched,
            clock,
            board=cluster,
            backlog_bytes=lambda lane, b=backlog: b if lane == "checkpoint" else 0,  # type: ignore[misc]
            node_share=worker,
            node_workers=2 if worker else 1,
            node_board=FileBoard(tmp_path, clock) if worker else None,
        )
    await _rounds(members, clock)(6)
    writers = members["n.w1"]
    status = writers.status()
    assert status["node_rules_mode"] == "node"
    assert status["node_board_errors_total"] == 0
    assert sorted(os.listdir(tmp_path)) == ["n.w0", "n.w1"]  # node m is not on the node's board
    assert 0.0 < writers.capacity_share < 1.0
    assert writers.capacity_share + members["n.w0"].capacity_share == pytest.approx(1.0)
    now = clock.monotonic()
    lane = writers._scheduler.snapshot(now).lane("checkpoint")
    allowance = writers.lease.allowances["checkpoint"]
    assert writers.node_applied is not None
    part = writers.node_applied.limits["checkpoint"]
    assert part is not None
    # The cluster's 30 % of the store is shared with node m: the allowance (paced less the headroom) is
    # tighter than the node's part of its 27 % cap, and it is what paces the writes.
    assert external_paced_bps(allowance, for_reads=True, headroom_taken=False, cap_headroom=0.1) < (
        external_paced_bps(part, for_reads=True, headroom_taken=True, cap_headroom=0.1)
    )
    assert lane.external_limit_bps == pytest.approx(allowance)
    assert members["m"].node_split is None and members["m"].capacity_share == 1.0
    # The node's board fails: the workers keep the cluster's budget and, after a TTL, the safe node rule.
    for m in members.values():
        if m._node_board is not None:
            m._node_board = _FailingBoard(tmp_path, clock)
            m._node_board.down = True
    await _rounds(members, clock)(4)
    assert writers.status()["node_rules_mode"] == "safe"
    assert writers.status()["node_board_errors_total"] >= 4
    assert writers.status()["redis_up"]
    await writers.close()
