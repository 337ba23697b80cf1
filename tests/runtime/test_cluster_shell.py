"""The cluster shell with a fake clock and an in-process blackboard: three members, each over a real
scheduler, exchange reports, apply their allowances, fall back to safe mode when the board is down (with
backoff), recover, and show it all in metrics and status. The Redis board: tests/e2e/test_cluster.py."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from s3lanes.clock import FakeClock
from s3lanes.config import ClusterConfig, Config
from s3lanes.core.cluster_budget import Mode
from s3lanes.core.scheduler import Scheduler
from s3lanes.metrics import Metrics
from s3lanes.runtime.cluster import ClusterMember, MemoryBoard
from s3lanes.runtime.wiring import scheduler_config

C = 40_000_000.0
MiB = 1024 * 1024
INTERVAL = 0.5


def samples(metrics: Metrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class Cluster:
    def __init__(self, backlogs: dict[str, int], readers: set[str], clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.board = MemoryBoard(self.clock)
        self.backlogs = backlogs
        self.members: dict[str, ClusterMember] = {}
        for node in sorted(backlogs):
            sched = Scheduler(
                replace(scheduler_config(Config(), C), burst_bytes=MiB),
                self.clock.monotonic(),
            )
            if node in readers:
                # A queued read keeps the node's reads active (never pulled here).
                sched.submit("dataset", MiB, self.clock.monotonic())
            cfg = ClusterConfig(redis_url="redis://unused", node_id=node, interval_s=INTERVAL)
            self.members[node] = ClusterMember(
                cfg, sched, self.clock, board=self.board, backlog_bytes=self._backlog_of(node)
            )

    def _backlog_of(self, node: str):
        return lambda lane: self.backlogs[node] if lane == "checkpoint" else 0

    async def rounds(self, n: int) -> None:
        for _ in range(n):
            for m in self.members.values():
                await m.step()
            self.clock.advance(INTERVAL)

    def limit(self, node: str) -> float | None:
        m = self.members[node]
        return m._scheduler.snapshot(self.clock.monotonic()).lane("checkpoint").external_limit_bps


async def test_members_apportion_the_budget_and_apply_it_to_their_schedulers() -> None:
    cl = Cluster({"n1": 10**10, "n2": 0, "n3": 0}, readers={"n3"})
    await cl.rounds(6)  # past the learning TTL
    limits = {n: cl.limit(n) for n in cl.members}
    assert all(m.lease.mode is Mode.NORMAL for m in cl.members.values())
    assert math.fsum(v for v in limits.values() if v is not None) == pytest.approx(0.30 * C)
    assert limits["n2"] == pytest.approx(0.02 * C)  # idle: its floor
    assert limits["n1"] == pytest.approx(0.30 * C - 2 * 0.02 * C)
    # n1 does not read, but its allowance is a share of n3's readers' cap: paced under it by the cap's
    # headroom, as its own cap would be while reads were active on n1.
    now = cl.clock.monotonic()
    n1 = cl.members["n1"]._scheduler.snapshot(now).lane("checkpoint")
    assert not cl.members["n1"]._scheduler.snapshot(now).reads_active
    headroom = cl.members["n1"]._scheduler.config.cap_headroom
    allowance = limits["n1"]
    assert headroom > 0 and allowance is not None
    assert n1.limit_bps == pytest.approx(allowance * (1.0 - headroom))
    metrics = Metrics()
    metrics.add_snapshot_collector(cl.members["n1"].collector())
    values = samples(metrics)
    assert values["s3lanes_cluster_redis_up"] == 1.0
    assert values["s3lanes_cluster_nodes"] == 3.0
    assert values["s3lanes_cluster_reads_active"] == 1.0
    assert values['s3lanes_cluster_budget_bytes_per_second{lane="checkpoint"}'] == pytest.approx(0.3 * C)
    assert values['s3lanes_cluster_allowance_bytes_per_second{lane="checkpoint"}'] == pytest.approx(
        limits["n1"]
    )
    assert values["s3lanes_cluster_redis_errors_total"] == 0.0
    status = cl.members["n1"].status()
    json.dumps(status)  # JSON-ready
    assert status["mode"] == "normal" and status["reads_active_on"] == ["n3"]
    assert [n["node_id"] for n in status["nodes"]] == ["n1", "n2", "n3"]


async def test_reads_stopping_everywhere_lifts_the_budget_to_the_whole_capacity() -> None:
    cl = Cluster({"n1": 10**10, "n2": 0}, readers=set())
    await cl.rounds(6)
    assert cl.limit("n1") == pytest.approx(C - 0.02 * C)


async def test_board_down_means_safe_mode_with_backoff_and_the_members_recover() -> None:
    cl = Cluster({"n1": 10**10, "n2": 0, "n3": 0}, readers={"n3"})
    await cl.rounds(6)
    n1 = cl.members["n1"]
    before = cl.limit("n1")
    cl.board.down = True
    await cl.rounds(1)
    assert not n1.redis_up and n1.lease.mode is Mode.SAFE and n1.redis_errors == 1
    await cl.rounds(12)
    # Backoff: far fewer attempts than rounds, and the allowance reached the safe share B/N.
    assert 2 <= n1.redis_errors <= 8
    safe = cl.limit("n1")
    assert safe == pytest.approx(0.30 * C / 3)
    assert before is not None and safe is not None and safe < before
    metrics = Metrics()
    metrics.add_snapshot_collector(n1.collector())
    values = samples(metrics)
    assert values["s3lanes_cluster_redis_up"] == 0.0 and values["s3lanes_cluster_safe_mode"] == 1.0
    assert values["s3lanes_cluster_redis_errors_total"] == n1.redis_errors
    assert n1.status()["last_error"].startswith("ConnectionError")

    cl.board.down = False
    await cl.rounds(12)  # the backoff runs out, then a TTL of learning
    assert n1.redis_up and n1.lease.mode is Mode.NORMAL
    assert cl.limit("n1") == pytest.approx(before)


async def test_a_second_gateway_with_the_same_node_id_is_reported() -> None:
    cl = Cluster({"n1": 0, "n2": 0}, readers=set())
    twin = ClusterMember(
        ClusterConfig(redis_url="redis://unused", node_id="n1", interval_s=INTERVAL),
        Scheduler(scheduler_config(Config(), C), cl.clock.monotonic()),
        cl.clock,
        board=cl.board,
    )
    n1 = cl.members["n1"]
    await cl.rounds(1)
    await twin.step()  # once: could be n1's restart
    assert not twin.node_id_conflict
    for _ in range(2):
        await n1.step()
        await twin.step()
    assert twin.node_id_conflict and n1.node_id_conflict
    assert twin.status()["node_id_conflict"]


async def test_a_restart_under_the_same_node_id_is_not_a_conflict() -> None:
    cl = Cluster({"n1": 0}, readers=set())
    await cl.rounds(2)
    reborn = ClusterMember(
        ClusterConfig(redis_url="redis://unused", node_id="n1", interval_s=INTERVAL),
        Scheduler(scheduler_config(Config(), C), cl.clock.monotonic()),
        cl.clock,
        board=cl.board,
    )
    for _ in range(3):
        await reborn.step()
        cl.clock.advance(INTERVAL)
    assert not reborn.node_id_conflict


async def test_garbage_on_the_board_is_counted_and_ignored() -> None:
    cl = Cluster({"n1": 0}, readers=set())
    await cl.board.exchange("intruder", b"{not json", 10.0, 0.0)
    await cl.rounds(1)
    m = cl.members["n1"]
    assert m.bad_reports == 1 and m.redis_up
    assert m.lease.mode is Mode.LEARNING


async def test_each_member_runs_a_round_every_interval_on_its_clock() -> None:
    clock = FakeClock(autojump=True)
    cl = Cluster({"n1": 10**10, "n2": 0}, readers=set(), clock=clock)
    rounds: dict[str, list[float]] = {n: [] for n in cl.members}
    for node, m in cl.members.items():
        real_step = m.step

        async def counted(node: str = node, real_step: Any = real_step) -> None:
            rounds[node].append(clock.monotonic())
            await real_step()

        m.step = counted  # type: ignore[method-assign]
    t0 = clock.monotonic()
    tasks = [asyncio.create_task(m.run()) for m in cl.members.values()]
    try:
        await clock.sleep(10 * INTERVAL + INTERVAL / 2)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for node in cl.members:
        assert rounds[node] == pytest.approx([t0 + i * INTERVAL for i in range(11)])
    assert cl.limit("n1") == pytest.approx(C - 0.02 * C)  # the rounds did their work
