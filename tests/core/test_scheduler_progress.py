"""Progress within a lane and floors set at run time, with explicit times (no event loop).

Every stream of a lane waits with one ticket at a time and the lane serves its tickets first in, first out;
the progress floor keeps one round of the queue within ``progress_interval_s`` however hard the latency
guard cuts; ``set_floor`` (the spool's durability deadline) raises the floor within the lane's cap."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.scheduler import (
    DEFAULT_CAP_HEADROOM,
    PROGRESS_HEADROOM,
    Grant,
    Scheduler,
    SchedulerConfig,
    WaitUntil,
    saturation_scale,
)
from s3lanes.runtime.wiring import scheduler_config

KiB = 1024
MiB = 1024 * 1024
C = 40_000_000.0  # a 40 MB/s store
T0 = 1000.0
PIECE = 192 * KiB  # Scheduler.piece_bytes for the checkpoint lane at 40 MB/s
CAP = 0.30 * (1.0 - DEFAULT_CAP_HEADROOM)  # the checkpoint lane's cap while reads are active, less headroom


def config(**kw: object) -> SchedulerConfig:
    cfg = replace(scheduler_config(Config(), C), burst_bytes=MiB)
    return replace(cfg, **kw)  # type: ignore[arg-type]


def cut_guard(s: Scheduler, now: float) -> None:
    """Reads missing their latency target badly, window after window: the guard cuts the paced lanes to
    its minimum (1/32), so the checkpoint lane sits at its floor."""
    for i in range(8):
        t = now + i * 0.1
        g = s.submit("dataset", 2_000_000, t)
        d = s.pull(t)
        assert isinstance(d, Grant) and d.ticket == g
        s.complete(g, t)
        s.observe_read("dataset", 0.0, 0.001, t)  # the idle baseline: 1 ms to first byte
        s.observe_read("dataset", 0.020, 0.001, t)  # waited 20 ms: a miss
    assert s.snapshot(now + 0.8 + 1e-6).guard_multiplier < 0.1


def slow_reads(s: Scheduler, now: float) -> None:
    """The store keeps missing the read target (50 ms to first byte over a 1 ms baseline)."""
    s.observe_read("dataset", 0.0, 0.001, now)
    s.observe_read("dataset", 0.0, 0.050, now)


def run_writers(s: Scheduler, *, writers: int, seconds: float, now: float = T0) -> dict[int, float]:
    """Saturating reads (four 1 MiB tickets always queued, re-reading a slow store: the guard stays cut)
    against ``writers`` streams of the checkpoint lane, each holding one ticket of :data:`PIECE` at a
    time and asking for the next once its piece is granted. Returns each writer's longest gap between
    two of its grants."""
    stream_of: dict[int, int] = {}
    last: dict[int, float] = {}
    gap: dict[int, float] = {}
    for _ in range(4):
        s.submit("dataset", MiB, now)
    for w in range(writers):
        stream_of[s.submit("checkpoint", PIECE, now)] = w
        last[w] = now
        gap[w] = 0.0
    end = now + seconds
    next_miss = now
    while now < end:
        if now >= next_miss:
            slow_reads(s, now)
            next_miss = now + 0.05
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "dataset":
                s.submit("dataset", MiB, now)
            else:
                w = stream_of.pop(d.ticket)
                gap[w] = max(gap[w], now - last[w])
                last[w] = now
                stream_of[s.submit("checkpoint", PIECE, now)] = w
        elif isinstance(d, WaitUntil):
            now = min(d.at, next_miss) if next_miss > now else d.at
        else:
            raise AssertionError(f"Idle with backlogged lanes at {now}")
    for w in gap:
        gap[w] = max(gap[w], end - last[w])  # a writer never served again counts to the end
    return gap


def test_every_writer_gets_a_piece_within_the_progress_interval_while_the_guard_cuts() -> None:
    s = Scheduler(config(), T0)
    cut_guard(s, T0)
    gaps = run_writers(s, writers=16, seconds=30.0, now=T0 + 4.0)
    assert s.snapshot(T0 + 34.0).guard_multiplier < 0.1  # the guard really cut
    assert max(gaps.values()) <= 2.0
    assert min(gaps.values()) > 1.0  # the lane is not simply given more than that


def test_without_the_progress_floor_the_writers_wait_one_round_at_the_floor() -> None:
    # 16 pieces of 192 KiB at 2 % of 40 MB/s: ~3.9 s between two pieces of one writer.
    s = Scheduler(config(progress_interval_s=None), T0)
    cut_guard(s, T0)
    gaps = run_writers(s, writers=16, seconds=30.0, now=T0 + 4.0)
    assert max(gaps.values()) > 3.5


def test_the_progress_floor_follows_the_queue_and_stays_within_the_cap() -> None:
    s = Scheduler(config(), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    for _ in range(4):
        s.submit("dataset", MiB, now)
    tickets = [s.submit("checkpoint", PIECE, now) for _ in range(16)]
    snap = s.snapshot(now + 0.11)  # rates follow at the next window
    want = 16 * PIECE * PROGRESS_HEADROOM / 2.0 / C
    assert snap.lane("checkpoint").floor_fraction == pytest.approx(want, rel=0.01)
    assert snap.lane("checkpoint").limit_bps == pytest.approx(want * C, rel=0.01)
    # Many more streams: the floor stops at the lane's cap while reads are active.
    tickets += [s.submit("checkpoint", PIECE, now + 0.11) for _ in range(400)]
    snap = s.snapshot(now + 0.22)
    assert snap.lane("checkpoint").floor_fraction == pytest.approx(CAP)
    # Queue gone: back to the configured floor.
    for t in tickets:
        s.cancel(t, now + 0.22)
    assert s.snapshot(now + 0.33).lane("checkpoint").floor_fraction == pytest.approx(0.02)


def test_set_floor_raises_the_ceiling_and_the_guarantee_within_the_cap() -> None:
    s = Scheduler(config(progress_interval_s=None), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    s.submit("dataset", MiB, now)
    snap = s.snapshot(now)
    assert snap.reads_active
    assert snap.lane("checkpoint").limit_bps == pytest.approx(0.02 * C)
    s.set_floor("checkpoint", 0.2, now)
    snap = s.snapshot(now)
    ck = snap.lane("checkpoint")
    assert ck.floor_fraction == pytest.approx(0.2)
    assert ck.limit_bps == pytest.approx(0.2 * C)  # the guard paces it no lower
    assert ck.reservation_bps == pytest.approx(0.2 * C)
    assert sum(ln.reservation_bps for ln in snap.lanes) <= C * (1 + 1e-9)
    s.set_floor("checkpoint", 0.9, now)
    ck = s.snapshot(now).lane("checkpoint")
    assert ck.floor_fraction == pytest.approx(CAP)  # never above the cap (less headroom) with reads active
    # Its guarantee rises with it, as far as the other guarantees leave room: 1 - 0.70 (dataset) - 0.02
    # (metadata).
    assert ck.reservation_bps == pytest.approx(min(CAP, 0.28) * C)
    assert sum(ln.reservation_bps for ln in s.snapshot(now).lanes) == pytest.approx(C - (0.28 - CAP) * C)
    s.set_floor("checkpoint", 0.0, now)
    ck = s.snapshot(now).lane("checkpoint")
    assert ck.floor_fraction == pytest.approx(0.02)
    assert ck.limit_bps == pytest.approx(0.02 * C)


def test_a_set_floor_is_served_against_saturating_reads() -> None:
    s = Scheduler(config(progress_interval_s=None), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    s.set_floor("checkpoint", 0.25, now)
    granted = {"dataset": 0, "checkpoint": 0}
    for _ in range(4):
        s.submit("dataset", MiB, now)
        s.submit("checkpoint", PIECE, now)
    start, end = now + 1.0, now + 11.0
    next_miss = now
    while now < end:
        if now >= next_miss:
            slow_reads(s, now)
            next_miss = now + 0.05
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if now >= start:
                granted[d.lane] += d.cost_bytes
            s.submit(d.lane, MiB if d.lane == "dataset" else PIECE, now)
        elif isinstance(d, WaitUntil):
            now = min(d.at, next_miss) if next_miss > now else d.at
    total = granted["dataset"] + granted["checkpoint"]
    assert granted["checkpoint"] / total == pytest.approx(0.25, abs=0.02)
    assert granted["dataset"] / total >= 0.70


def test_a_drain_that_stalls_never_catches_up_in_a_lump_over_its_cap() -> None:
    # The deadline holds the checkpoint lane at its cap (30 %) against saturating reads; 8 streams, whose
    # pieces reach the store 0.1 s after their grant, except that every 3 s the store's queue holds them
    # for a second. The lane banks credit meanwhile; with the ceiling bucket as deep as the burst (here 1
    # MiB; the gateway's default is 4), the second after a stall carried 0.30 x C plus that much. Sized by
    # time, no second goes over the cap (less its headroom).
    s = Scheduler(config(progress_interval_s=None), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    s.set_floor("checkpoint", 0.30, now)
    for _ in range(4):
        s.submit("dataset", MiB, now)
    for _ in range(8):
        s.submit("checkpoint", PIECE, now)
    start, end = now + 1.0, now + 31.0
    arrivals: list[float] = []  # when each checkpoint piece was granted
    landing: list[float] = []  # when the next piece of a stream whose piece is at the store is asked for
    next_miss = now
    while now < end:
        if now >= next_miss:
            slow_reads(s, now)
            next_miss = now + 0.05
        while landing and min(landing) <= now:
            landing.remove(min(landing))
            s.submit("checkpoint", PIECE, now)
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "dataset":
                s.submit("dataset", MiB, now)
                continue
            if now >= start:
                arrivals.append(now)
            phase = (now - start) % 3.0
            landing.append(now + (1.0 - phase + 0.1 if phase < 1.0 else 0.1))  # stalled: back after it
        else:
            at = d.at if isinstance(d, WaitUntil) else math.inf
            now = min(at, next_miss, min(landing, default=math.inf))
    per_s = [
        sum(PIECE for t in arrivals if a <= t < a + 1.0)
        for a in (start + i * 0.05 for i in range(int((end - start - 1.0) / 0.05)))
    ]
    assert max(per_s) <= CAP * C, max(per_s) / C
    assert len(arrivals) * PIECE / (end - start) > 0.6 * CAP * C  # it still drains


def test_set_floor_checks_its_arguments() -> None:
    s = Scheduler(config(), T0)
    with pytest.raises(KeyError):
        s.set_floor("nope", 0.1, T0)
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            s.set_floor("checkpoint", bad, T0)
    with pytest.raises(ValueError):
        config(progress_interval_s=0.0)


def test_a_cluster_allowance_bounds_the_raised_floor_but_not_the_configured_one() -> None:
    s = Scheduler(config(progress_interval_s=None), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    s.submit("dataset", MiB, now)
    s.set_external_limit("checkpoint", 0.10 * C, now)
    s.set_floor("checkpoint", 0.25, now)
    assert s.snapshot(now).lane("checkpoint").floor_fraction == pytest.approx(0.10)
    s.set_external_limit("checkpoint", 0.0, now)  # no allowance at all: the configured floor still holds
    assert s.snapshot(now).lane("checkpoint").floor_fraction == pytest.approx(0.02)
    s.set_external_limit("checkpoint", None, now)
    assert s.snapshot(now).lane("checkpoint").floor_fraction == pytest.approx(0.25)


def drain_streams(
    s: Scheduler, *, streams: int, seconds: float, now: float, floor: float, readers: int = 0
) -> int:
    """``streams`` drains of the checkpoint lane, each holding one ticket of ``PIECE`` and asking for the
    next the moment its piece is granted (a store that takes it at once), against ``readers`` streams of
    1 MiB reads doing the same, while ``set_floor`` is refreshed every 0.5 s as the deadline keeper does.
    Returns the bytes granted to the drains over ``seconds``."""
    for _ in range(streams):
        s.submit("checkpoint", PIECE, now)
    for _ in range(readers):
        s.submit("dataset", MiB, now)
    granted, end, next_floor = 0, now + seconds, now
    while now < end:
        if now >= next_floor:
            s.set_floor("checkpoint", floor, now)
            next_floor = now + 0.5
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "dataset":
                s.submit("dataset", MiB, now)
            else:
                granted += d.cost_bytes
                s.submit("checkpoint", PIECE, now)
        elif isinstance(d, WaitUntil):
            now = min(d.at, next_floor)
        else:
            raise AssertionError(f"Idle with a backlogged lane at {now}")
    return granted


@pytest.mark.parametrize("floor", [0.0, 0.3, 1.0])
def test_a_raised_floor_never_drains_faster_than_the_configured_bandwidth(floor: float) -> None:
    # A floor is a share of the configured bandwidth, never more: with the store to itself the lane moves
    # C plus the buckets' credit (its own guarantee's and the server's, one burst each), whatever the
    # floor; while reads are active, its cap (30 %) plus that credit.
    seconds = 10.0
    s = Scheduler(config(), T0)
    granted = drain_streams(s, streams=2, seconds=seconds, now=T0, floor=floor)
    assert granted <= C * seconds + 2 * MiB
    assert granted >= 0.98 * C * seconds  # work-conserving: the whole store when nothing else runs
    s = Scheduler(config(), T0)
    cut_guard(s, T0)
    now = T0 + 4.0
    granted = drain_streams(s, streams=16, seconds=seconds, now=now, floor=floor, readers=2)
    assert s.snapshot(now + seconds).reads_active
    assert granted <= 0.30 * C * seconds + 2 * MiB


def test_the_saturation_scale_follows_a_store_carrying_93_percent_or_more_and_is_continuous() -> None:
    assert saturation_scale(0.5) == 1.0
    assert saturation_scale(0.9) == 1.0
    assert saturation_scale(0.915) == pytest.approx(0.965)
    assert saturation_scale(0.93) == pytest.approx(0.93)
    assert saturation_scale(0.94) == pytest.approx(0.94)
    assert saturation_scale(1.0) == 1.0 and saturation_scale(1.3) == 1.0
    xs = [0.70 + i * 0.001 for i in range(301)]
    assert all(abs(saturation_scale(b) - saturation_scale(a)) <= 0.0025 for a, b in itertools.pairwise(xs))


def deliver(s: Scheduler, rate_bps: float, seconds: float, now: float) -> float:
    """Reads active and missing their latency target, the store carrying ``rate_bps`` (70 % reads, 30 %
    checkpoint) for ``seconds``."""
    cut_guard(s, now)
    t = now + 1.0
    while t < now + 1.0 + seconds:
        slow_reads(s, t)
        s.submit("dataset", MiB, t)
        s.observe_delivered("dataset", int(0.7 * rate_bps * 0.1), t)
        s.observe_delivered("checkpoint", int(0.3 * rate_bps * 0.1), t)
        t += 0.1
    return t


def test_the_caps_while_reads_are_active_follow_a_saturated_store_that_carries_less_than_configured() -> None:
    s = Scheduler(config(progress_interval_s=None), T0)
    now = deliver(s, 0.94 * C, 2.0, T0)  # 37.6 of the configured 40 MB/s
    snap = s.snapshot(now)
    assert snap.reads_active
    assert snap.cap_scale == pytest.approx(0.94, abs=0.01)
    s.set_floor("checkpoint", 1.0, now)  # a deadline floor at the cap: the cap of what the store carries
    assert s.snapshot(now).lane("checkpoint").floor_fraction == pytest.approx(CAP * 0.94, abs=0.005)
    # Not saturated (half the configured capacity): the caps are shares of the configured capacity.
    s2 = Scheduler(config(progress_interval_s=None), T0)
    now = deliver(s2, 0.5 * C, 2.0, T0)
    s2.set_floor("checkpoint", 1.0, now)
    snap = s2.snapshot(now)
    assert snap.cap_scale == 1.0
    assert snap.lane("checkpoint").floor_fraction == pytest.approx(CAP)
    # Readers with idle gaps (each read done at once, none waiting most of the time): a store carrying
    # 94 % of its configured capacity is then not taken for saturated.
    s4 = Scheduler(config(progress_interval_s=None), T0)
    t = T0
    while t < T0 + 2.0:
        s4.submit("dataset", MiB, t)
        d = s4.pull(t)
        assert isinstance(d, Grant)
        s4.complete(d.ticket, t + 0.01)
        s4.observe_delivered("dataset", int(0.94 * C * 0.1), t + 0.01)
        t += 0.1
    snap = s4.snapshot(t)
    assert snap.reads_active
    assert snap.cap_scale == 1.0
    assert snap.lane("checkpoint").limit_bps == pytest.approx(0.30 * C)
    # The configured floor is not scaled.
    s.set_floor("checkpoint", 0.0, now)
    assert s.snapshot(now).lane("checkpoint").floor_fraction == pytest.approx(0.02)
