"""The deadline keeper: spool state in, the drain lane's floor, status, metrics and a warning out.

A stand-in for the spool (what the keeper asks of it: entries, their sizes, the oldest
acknowledgement, the acknowledged byte counter), a real scheduler, a fake clock."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from s3lanes.clock import FakeClock
from s3lanes.config import Config
from s3lanes.core.scheduler import DEFAULT_CAP_HEADROOM, Scheduler
from s3lanes.core.spool_deadline import DeadlinePlan
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.spool_deadline import TICK_S, WARNING_INTERVAL_S, DeadlineKeeper
from s3lanes.runtime.wiring import scheduler_config

MiB = 1024 * 1024
C = 40_000_000.0
# The checkpoint lane's cap while reads are active (30 %), less the scheduler's headroom: what the floor may
# reach and what the plan counts on.
CAP = 0.30 * (1.0 - DEFAULT_CAP_HEADROOM)


@dataclass
class _E:
    size: int


@dataclass
class _State:
    entries: dict[int, _E] = field(default_factory=dict)
    acked_at: dict[int, float] = field(default_factory=dict)

    def oldest_acked_at(self) -> float | None:
        return min(self.acked_at.values()) if self.acked_at else None


@dataclass
class _Spool:
    state: _State = field(default_factory=_State)
    acked_bytes: int = 0
    drained_bytes: int = 0
    seq: int = 0

    def ack(self, size: int, wall: float) -> None:
        self.seq += 1
        self.state.entries[self.seq] = _E(size)
        self.state.acked_at[self.seq] = wall
        self.acked_bytes += size

    def entries(self) -> list[_E]:
        return list(self.state.entries.values())

    def oldest_acked_at(self) -> float | None:
        return self.state.oldest_acked_at()

    def drain_all(self) -> None:
        self.drained_bytes += sum(e.size for e in self.state.entries.values())
        self.state.entries.clear()
        self.state.acked_at.clear()


def setup(max_age_s: float | None = None) -> tuple[FakeClock, _Spool, Scheduler, DeadlineKeeper]:
    clock = FakeClock()
    sched = Scheduler(scheduler_config(Config(), C), clock.monotonic())
    spool = _Spool()
    keeper = DeadlineKeeper(spool, [LaneDispatcher(sched, clock)], ("checkpoint",), max_age_s, clock)
    return clock, spool, sched, keeper


def tick(clock: FakeClock, sched: Scheduler, keeper: DeadlineKeeper, *, reads: bool = True) -> None:
    """A keeper tick while dataset reads are active (they asked for 1 MiB just now)."""
    if reads:
        sched.submit("dataset", MiB, clock.monotonic())
    keeper.tick()


def checkpoint(clock: FakeClock, spool: _Spool, sched: Scheduler, keeper: DeadlineKeeper) -> None:
    """4 ranks x 64 MiB acknowledged within a second."""
    for _ in range(4):
        spool.ack(64 * MiB, clock.wall())
        tick(clock, sched, keeper)
        clock.advance(0.25)


async def test_the_floor_rises_toward_the_cap_as_the_learnt_deadline_nears() -> None:
    clock, spool, sched, keeper = setup()
    tick(clock, sched, keeper)
    assert keeper.status()["status"] == "ok: nothing pending"
    # First checkpoint: no cadence yet, max_age_s unset: the deadline is an hour, the configured floor.
    checkpoint(clock, spool, sched, keeper)
    assert keeper.status()["deadline_s"] == 3600.0
    assert sched.snapshot(clock.monotonic()).lane("checkpoint").floor_fraction == pytest.approx(0.02)
    spool.drain_all()
    clock.advance(31.0)
    checkpoint(clock, spool, sched, keeper)  # 32 s later: the cadence is learnt, the deadline is 32 s
    assert keeper.status()["deadline_s"] == pytest.approx(32.0)
    assert keeper.status()["checkpoint_interval_s"] == pytest.approx(32.0)
    floors, risk = [], []
    for _ in range(6):  # nothing drains (the stand-in spool keeps its entries)
        tick(clock, sched, keeper)
        floors.append(sched.snapshot(clock.monotonic()).lane("checkpoint").floor_fraction)
        risk.append(keeper.status()["at_risk"])
        clock.advance(3.0)
    assert floors == sorted(floors)
    assert 0.25 <= floors[0] <= CAP  # 256 MiB by 25.6 s on 40 MB/s: 26 %
    assert floors[-1] == pytest.approx(CAP)  # never above the cap (less its headroom)
    # 24.9 s at the cap less its headroom: in time until less than that is left, then at risk.
    assert risk == [False, False, False, True, True, True]
    # Drained: back to the configured floor.
    spool.drain_all()
    tick(clock, sched, keeper)
    assert sched.snapshot(clock.monotonic()).lane("checkpoint").floor_fraction == pytest.approx(0.02)


async def test_a_deadline_that_cannot_be_met_is_reported_and_warned_about_at_a_limited_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, spool, sched, keeper = setup(max_age_s=20.0)
    caplog.set_level(logging.WARNING, logger="s3lanes.spool")
    for _ in range(4):  # 1 GiB at once: 99 s at the 30 % cap less its headroom, 20 s deadline
        spool.ack(256 * MiB, clock.wall())
    tick(clock, sched, keeper)
    st = keeper.status()
    assert st["at_risk"] is True
    assert str(st["status"]).startswith("AT RISK")
    assert st["best_case_durable_s"] == pytest.approx(4 * 256 * MiB / (CAP * C))
    metrics = {m.name: m.samples[0].value for m in keeper.collector()()}
    assert metrics["s3lanes_spool_deadline_at_risk"] == 1.0
    assert metrics["s3lanes_spool_deadline_seconds"] == 20.0
    assert metrics["s3lanes_spool_deadline_floor"] == pytest.approx(CAP)
    assert metrics["s3lanes_spool_projected_durable_seconds"] == pytest.approx(4 * 256 * MiB / (CAP * C))
    assert sched.snapshot(clock.monotonic()).lane("checkpoint").floor_fraction == pytest.approx(CAP)
    for _ in range(10):
        clock.advance(1.0)
        tick(clock, sched, keeper)
    assert keeper.warnings == 1
    warned = [r.getMessage() for r in caplog.records if "deadline at risk" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("spool: durability deadline at risk: 1073741824 bytes still to upload")
    clock.advance(WARNING_INTERVAL_S)
    tick(clock, sched, keeper)
    assert keeper.warnings == 2


async def test_a_backlog_that_fits_is_not_at_risk() -> None:
    clock, spool, sched, keeper = setup(max_age_s=60.0)
    spool.ack(64 * MiB, clock.wall())
    tick(clock, sched, keeper)
    metrics = {m.name: m.samples[0].value for m in keeper.collector()()}
    assert metrics["s3lanes_spool_deadline_at_risk"] == 0.0
    assert keeper.warnings == 0
    assert str(keeper.status()["status"]).startswith("ok: ")


async def test_without_reads_the_lane_is_not_capped_and_neither_is_the_plan() -> None:
    # 256 MiB, 20 s deadline, 19 s left: 7 s at the whole store while nobody reads (the lane is not
    # capped), 25 s at the 30 % cap less its headroom once readers arrive.
    clock, spool, sched, keeper = setup(max_age_s=20.0)
    spool.ack(256 * MiB, clock.wall())
    clock.advance(1.0)
    tick(clock, sched, keeper, reads=False)
    assert not keeper.status()["at_risk"]
    assert keeper.status()["best_case_durable_s"] == pytest.approx(256 * MiB / C)
    tick(clock, sched, keeper)  # readers arrive: the cap is in force
    assert keeper.status()["best_case_durable_s"] == pytest.approx(256 * MiB / (CAP * C))
    assert keeper.status()["at_risk"]


async def test_what_the_drains_already_sent_of_objects_still_uploading_is_not_work_left() -> None:
    clock, spool, sched, keeper = setup(max_age_s=40.0)
    spool.ack(64 * MiB, clock.wall())
    sched.observe_delivered("checkpoint", 8 * MiB, clock.monotonic())  # an earlier object, now drained
    spool.drain_all()
    tick(clock, sched, keeper)  # empty: the offset is taken
    checkpoint(clock, spool, sched, keeper)
    full = keeper.last
    assert full is not None and keeper.remaining_bytes == 256 * MiB
    sched.observe_delivered("checkpoint", 192 * MiB, clock.monotonic())  # three quarters sent, none complete
    tick(clock, sched, keeper)
    assert keeper.status()["backlog_bytes"] == 256 * MiB
    assert keeper.remaining_bytes == 64 * MiB
    part = keeper.last
    assert part is not None and part.floor_fraction < full.floor_fraction
    # More delivered than pending (a write that bypassed the spool): never below nothing left.
    sched.observe_delivered("checkpoint", 512 * MiB, clock.monotonic())
    tick(clock, sched, keeper)
    assert keeper.remaining_bytes == 0


async def test_the_keeper_runs_a_tick_every_tick_s_on_its_clock() -> None:
    clock = FakeClock(autojump=True)
    sched = Scheduler(scheduler_config(Config(), C), clock.monotonic())
    keeper = DeadlineKeeper(_Spool(), [LaneDispatcher(sched, clock)], ("checkpoint",), 3600.0, clock)
    ticked_at: list[float] = []
    real_tick = keeper.tick

    def counted() -> DeadlinePlan | None:
        ticked_at.append(clock.monotonic())
        return real_tick()

    keeper.tick = counted  # type: ignore[method-assign]
    t0 = clock.monotonic()
    task = asyncio.create_task(keeper.run())
    try:
        await clock.sleep(10 * TICK_S + TICK_S / 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert ticked_at == pytest.approx([t0 + i * TICK_S for i in range(11)])
