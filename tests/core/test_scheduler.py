"""The lane scheduler core with explicit times, no event loop: tags, gates, caps, guard, SlowDown, cancel."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3lanes.config import Config
from s3lanes.core.lanes_config import default_lanes
from s3lanes.core.sched_alloc import LaneDemand, allocate
from s3lanes.core.sched_control import (
    ESTIMATOR_MIN_BPS,
    GUARD_M_MIN,
    CapacityEstimator,
    GuardVerdict,
    LatencyGuard,
    TokenBucket,
)
from s3lanes.core.scheduler import (
    CEILING_DEPTH_S,
    DEFAULT_CAP_HEADROOM,
    SHARE_WINDOW_S,
    Grant,
    Idle,
    LaneSpec,
    Scheduler,
    SchedulerConfig,
    WaitUntil,
)
from s3lanes.runtime.wiring import scheduler_config
from tests.budget import examples

MiB = 1024 * 1024
C = 100_000_000.0  # 100 MB/s: one MiB every ~10.5 ms
# While reads are active a capped lane paces a little under its ceiling: a second that starts with its
# (time-sized) bucket full still keeps to the ceiling ...
PACED_AT_CAP = SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)
# ... and, by default, with cap_headroom under it (room for the store's queue).
PACED = PACED_AT_CAP * (1.0 - DEFAULT_CAP_HEADROOM)
T0 = 1000.0


def lane(name: str, **kw: object) -> LaneSpec:
    base: dict[str, object] = {
        "reservation": 0.0,
        "weight": 1.0,
        "limit": None,
        "limit_while_reads_active": None,
        "paced_by_guard": False,
    }
    base.update(kw)
    return LaneSpec(name, **base)  # type: ignore[arg-type]


def config(lanes: tuple[LaneSpec, ...] | None = None, **kw: object) -> SchedulerConfig:
    cfg = scheduler_config(Config(), C)
    return replace(cfg, **{"lanes": lanes or cfg.lanes, "burst_bytes": MiB, **kw})  # type: ignore[arg-type]


def drive(
    s: Scheduler, lanes: list[str], *, grants: int, cost: int = 256 * 1024, now: float = T0, warmup: int = 0
) -> tuple[Counter[str], float, float]:
    """Keep every lane in ``lanes`` backlogged (two tickets queued each), complete grants at once, follow
    WaitUntil. Returns bytes granted per lane after ``warmup`` grants, and the start and end times."""
    for name in lanes:
        for _ in range(2):
            s.submit(name, cost, now)
    got: Counter[str] = Counter()
    n = 0
    start = now
    while n < grants + warmup:
        d = s.pull(now)
        if isinstance(d, Grant):
            n += 1
            if n == warmup:
                start = now
            if n > warmup:
                got[d.lane] += d.cost_bytes
            s.complete(d.ticket, now)
            s.submit(d.lane, cost, now)
        elif isinstance(d, WaitUntil):
            assert d.at > now
            now = d.at
        else:
            raise AssertionError(f"Idle with backlogged lanes at {now}")
    return got, start, now


def fractions(got: Counter[str]) -> dict[str, float]:
    total = sum(got.values())
    return {k: v / total for k, v in got.items()}


# -- configuration ----------------------------------------------------------------------------------------


def test_the_gateway_schedules_the_lanes_it_ships() -> None:
    # One table: what a gateway without a [lanes] table runs is what these tests and tests/sim check.
    cfg = scheduler_config(Config(), C)
    assert cfg.lanes == tuple(default_lanes().values())
    assert [x.name for x in cfg.lanes if x.read_protected] == ["dataset"]
    assert [x.name for x in cfg.lanes if x.paced_by_guard] == ["checkpoint", "restore"]
    assert sum(x.guaranteed for x in cfg.lanes) == pytest.approx(0.74)


@pytest.mark.parametrize(
    "bad",
    [
        {"reservation": 1.5},
        {"weight": 0.0},
        {"limit": 0.0},
        {"max_concurrency": 0},
    ],
)
def test_lane_spec_rejects_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        lane("x", **bad)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"limit": 0.5, "reservation": 0.6}, "reservation 0.6 is above limit 0.5"),
        ({"limit_while_reads_active": 0.3, "floor": 0.4}, "floor 0.4 is above limit_while_reads_active 0.3"),
        ({"read_protected": True, "paced_by_guard": True}, "cannot be paced by the guard that protects it"),
    ],
)
def test_a_lane_whose_values_do_not_fit_together_is_refused_by_the_config(
    bad: dict[str, object], problem: str
) -> None:
    spec = lane("x", **bad)  # each value is fine on its own
    assert any(problem in p for p in spec.problems())
    with pytest.raises(ValueError, match=problem):
        config((spec,))


def test_config_rejects_overcommitted_reservations_and_duplicate_names() -> None:
    with pytest.raises(ValueError, match="sum to at most 1"):
        config((lane("a", reservation=0.7), lane("b", reservation=0.2, floor=0.4)))
    with pytest.raises(ValueError, match="unique"):
        config((lane("a"), lane("a")))
    with pytest.raises(ValueError):
        config(capacity_bps=0.0)


def test_unknown_lane_raises_key_error_everywhere() -> None:
    s = Scheduler(config(), T0)
    with pytest.raises(KeyError):
        s.submit("nope", MiB, T0)
    with pytest.raises(KeyError):
        s.observe_read("nope", 0.0, 0.001, T0)
    with pytest.raises(KeyError):
        s.observe_backend("nope", 503, T0)
    with pytest.raises(KeyError):
        s.observe_delivered("nope", 1, T0)
    with pytest.raises(ValueError):
        s.submit("dataset", -1, T0)


# -- grants and WaitUntil ---------------------------------------------------------------------------------


def test_an_idle_scheduler_grants_at_once_then_answers_idle() -> None:
    s = Scheduler(config(), T0)
    assert isinstance(s.pull(T0), Idle)
    t = s.submit("checkpoint", MiB, T0)
    assert s.pull(T0) == Grant(ticket=t, lane="checkpoint", cost_bytes=MiB)
    assert isinstance(s.pull(T0), Idle)
    snap = s.snapshot(T0).lane("checkpoint")
    assert (snap.inflight_tickets, snap.inflight_bytes, snap.granted_bytes_total) == (1, MiB, MiB)


def test_wait_until_is_exactly_when_the_capacity_bucket_refills() -> None:
    s = Scheduler(config((lane("a"),)), T0)
    ids = [s.submit("a", MiB, T0) for _ in range(3)]
    # Bucket depth 1 MiB, debt allowed: a full bucket pays for one grant and a level of 0 for one more.
    assert [g.ticket for g in (s.pull(T0), s.pull(T0)) if isinstance(g, Grant)] == ids[:2]
    d = s.pull(T0)
    assert isinstance(d, WaitUntil)
    assert d.at == pytest.approx(T0 + MiB / C)  # the debt of one MiB, paid at C
    assert isinstance(s.pull(d.at - 1e-4), WaitUntil)
    assert s.pull(d.at) == Grant(ticket=ids[2], lane="a", cost_bytes=MiB)


def test_a_clock_that_steps_back_is_held() -> None:
    s = Scheduler(config((lane("a"),)), T0)
    for _ in range(3):
        s.submit("a", MiB, T0)
    s.pull(T0), s.pull(T0)
    d = s.pull(T0 - 5.0)  # treated as T0
    assert isinstance(d, WaitUntil) and d.at == pytest.approx(T0 + MiB / C)


def test_weight_phase_serves_backlogged_lanes_in_proportion_to_weight() -> None:
    s = Scheduler(config((lane("a", weight=3.0), lane("b", weight=1.0))), T0)
    got, _, _ = drive(s, ["a", "b"], grants=400)
    f = fractions(got)
    assert f["a"] == pytest.approx(0.75, abs=0.01)


def test_reservation_is_a_floor_under_the_weighted_share() -> None:
    # b's weight alone would give it 1/101; its reservation guarantees 40%.
    s = Scheduler(config((lane("a", weight=100.0), lane("b", reservation=0.4))), T0)
    got, t0, t1 = drive(s, ["a", "b"], grants=2000, warmup=100)
    assert fractions(got)["b"] == pytest.approx(0.40, abs=0.01)
    assert sum(got.values()) / (t1 - t0) == pytest.approx(C, rel=0.01)  # work conserving at C


def test_a_limit_holds_even_when_nobody_else_wants_the_capacity() -> None:
    s = Scheduler(config((lane("a", limit=0.25),)), T0)
    got, t0, t1 = drive(s, ["a"], grants=400, warmup=20)
    assert got["a"] / (t1 - t0) == pytest.approx(0.25 * C, rel=0.02)


def test_a_lane_back_from_idle_does_not_jump_ahead_on_stale_tags() -> None:
    s = Scheduler(config((lane("a"), lane("b"))), T0)
    _got, _, now = drive(s, ["a"], grants=300)  # a alone: its virtual time runs far ahead of b's
    for _ in range(2):
        s.submit("b", 256 * 1024, now)
    order: list[str] = []
    while len(order) < 40:
        d = s.pull(now)
        if isinstance(d, Grant):
            order.append(d.lane)
            s.complete(d.ticket, now)
            s.submit(d.lane, 256 * 1024, now)
        elif isinstance(d, WaitUntil):
            now = d.at
    # SFQ start tags: b starts at the virtual time of the backlogged lanes and alternates with a, instead of
    # taking 300 grants in a row to "catch up".
    assert order.count("b") == pytest.approx(20, abs=2)
    assert max(len(run) for run in "".join(x[0] for x in order).split("a")) <= 2


def test_reservation_phase_orders_by_earliest_reservation_tag() -> None:
    lanes = (lane("a", reservation=0.5), lane("b", reservation=0.25), lane("c", weight=50.0))
    s = Scheduler(config(lanes), T0)
    got, _, _ = drive(s, ["a", "b", "c"], grants=4000, warmup=200)
    f = fractions(got)
    assert f["a"] == pytest.approx(0.50, abs=0.01)
    assert f["b"] == pytest.approx(0.25, abs=0.01)


# -- caps, read activity and hysteresis ---------------------------------------------------------------------


def test_checkpoint_cap_applies_while_reads_are_active_and_lifts_after_read_idle() -> None:
    s = Scheduler(config(), T0)
    assert s.snapshot(T0).lane("checkpoint").limit_bps is None
    # 1% of C over 1 s is 1 MB: a 100 KB read does not make reads "active" ...
    t = s.submit("dataset", 100_000, T0)
    assert not s.snapshot(T0).reads_active
    s.pull(T0)
    s.complete(t, T0 + 0.01)
    # ... 2 MB of reads does.
    t = s.submit("dataset", 2_000_000, T0 + 0.02)
    snap = s.snapshot(T0 + 0.02)
    assert snap.reads_active
    assert snap.lane("checkpoint").limit_bps == pytest.approx(0.30 * C)
    assert snap.lane("restore").limit_bps == pytest.approx(0.30 * C)
    assert snap.lane("dataset").limit_bps is None
    s.pull(T0 + 0.02)
    s.complete(t, T0 + 0.5)  # in flight until then: still active
    assert s.snapshot(T0 + 2.4).reads_active  # 1.9 s after the last read
    assert not s.snapshot(T0 + 2.51).reads_active  # read_idle_s = 2 s after it
    assert s.snapshot(T0 + 2.51).lane("checkpoint").limit_bps is None


@pytest.mark.parametrize(
    ("cap_headroom", "paced"), [(None, PACED), (0.0, PACED_AT_CAP), (0.2, PACED_AT_CAP * 0.8)]
)
def test_strict_cap_limits_a_backlogged_checkpoint_lane_to_30_percent_while_reads_trickle(
    cap_headroom: float | None, paced: float
) -> None:
    # Paced under the cap by cap_headroom (default 10 %): room for the store's queue releasing evenly
    # sent bytes unevenly, so the cap holds on the wire too.
    s = Scheduler(config() if cap_headroom is None else config(cap_headroom=cap_headroom), T0)
    now = T0
    got: Counter[str] = Counter()
    ck = [s.submit("checkpoint", 256 * 1024, now) for _ in range(2)]
    assert ck
    next_read = now
    end = now + 3.0
    while now < end:
        if now >= next_read:
            s.submit("dataset", 256 * 1024, now)  # reads at ~10% of C: active, far from their share
            next_read += 256 * 1024 / (0.1 * C)
        d = s.pull(now)
        if isinstance(d, Grant):
            if now > T0 + 0.5:
                got[d.lane] += d.cost_bytes
            s.complete(d.ticket, now)
            if d.lane == "checkpoint":
                s.submit("checkpoint", 256 * 1024, now)
        else:
            now = min(d.at, next_read) if isinstance(d, WaitUntil) else next_read
    rate = got["checkpoint"] / (end - T0 - 0.5)
    assert rate == pytest.approx(0.30 * C * paced, rel=0.03)


def test_the_headroom_never_paces_a_lane_under_its_configured_floor() -> None:
    # A checkpoint lane whose floor is its whole cap while reads are active: the headroom (and the 1 / 1.05
    # for its bucket) would pace it at 0.257; the configured floor is a guarantee and holds.
    cfg = config()
    lanes = tuple(replace(ln, floor=0.28) if ln.name == "checkpoint" else ln for ln in cfg.lanes)
    s = Scheduler(replace(cfg, lanes=lanes), T0)
    now, got, next_read, end = T0, 0, T0, T0 + 3.0
    for _ in range(2):
        s.submit("checkpoint", 256 * 1024, now)
    while now < end:
        if now >= next_read:
            s.submit("dataset", 256 * 1024, now)  # reads at ~10% of C: active, far from their share
            next_read += 256 * 1024 / (0.1 * C)
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "checkpoint":
                got += d.cost_bytes if now > T0 + 0.5 else 0
                s.submit("checkpoint", 256 * 1024, now)
        else:
            now = min(d.at, next_read) if isinstance(d, WaitUntil) else next_read
    assert s.snapshot(now).reads_active
    assert got / (end - T0 - 0.5) == pytest.approx(0.28 * C, rel=0.03)


@pytest.mark.parametrize("cap_headroom", [-0.1, 1.0, math.nan])
def test_cap_headroom_must_be_a_fraction_under_one(cap_headroom: float) -> None:
    with pytest.raises(ValueError, match="cap_headroom"):
        config(cap_headroom=cap_headroom)


def _checkpoint_grant_times(s: Scheduler, start: float, n: int, *, reads_until: float) -> list[float]:
    """Reads at 10% of C until ``reads_until``; ``n`` checkpoint tickets of 1 MiB submitted at ``start``
    (the lane idle before). Returns when each checkpoint ticket was granted (completed at once)."""
    now = T0
    next_read = T0
    times: list[float] = []
    submitted = False
    while len(times) < n:
        if now >= next_read and now < reads_until:
            s.submit("dataset", 256 * 1024, now)
            next_read += 256 * 1024 / (0.1 * C)
        if not submitted and now >= start:
            for _ in range(n):
                s.submit("checkpoint", MiB, now)
            submitted = True
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "checkpoint":
                times.append(now)
            continue
        at = d.at if isinstance(d, WaitUntil) else math.inf
        later = [t for t in (next_read if next_read < reads_until else math.inf, start) if t > now]
        now = min([at, *later])
        assert math.isfinite(now), "nothing left to wait for"
    return times


def test_a_capped_lane_back_from_idle_starts_at_its_rate_while_reads_are_active() -> None:
    # A checkpoint lane idle for seconds while reads flow must not bank a whole burst_bytes of credit and
    # put it into the backend's queue at once, in front of the reads: it starts at its ceiling rate.
    s = Scheduler(config(burst_bytes=4 * MiB), T0)
    start = T0 + 5.0
    times = _checkpoint_grant_times(s, start, 8, reads_until=math.inf)
    assert s.snapshot(times[-1]).reads_active
    at_once = sum(1 for t in times if t <= start + 1e-6)
    assert at_once == 1, times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    rate = 0.30 * C * PACED
    # The first wait is shorter by the credit banked while idle: what the rate delivers in the 5 ms target.
    assert gaps[0] == pytest.approx((MiB - rate * 0.005) / rate, rel=0.01), gaps
    assert all(g == pytest.approx(MiB / rate, rel=0.01) for g in gaps[1:]), gaps


def test_a_busy_lane_spends_no_credit_from_before_the_reads_came() -> None:
    # Writes alone take all of C; when reads arrive, the checkpoint lane is capped at once: the full bucket
    # it held at an unlimited rate is not spent in front of the first reads.
    s = Scheduler(config(burst_bytes=4 * MiB), T0)
    now = T0
    for _ in range(2):
        s.submit("checkpoint", MiB, now)
    reads_from = T0 + 1.0
    next_read = reads_from
    granted: list[tuple[float, int]] = []
    active_at = math.inf
    while now < reads_from + 1.0:
        if active_at == math.inf and s.snapshot(now).reads_active:
            active_at = now
        if now >= next_read:
            s.submit("dataset", 256 * 1024, now)  # 10% of C: reads become active once 1 MB has come
            next_read += 256 * 1024 / (0.1 * C)
        d = s.pull(now)
        if isinstance(d, Grant):
            s.complete(d.ticket, now)
            if d.lane == "checkpoint":
                granted.append((now, d.cost_bytes))
                s.submit("checkpoint", MiB, now)
            continue
        now = min(d.at, next_read) if isinstance(d, WaitUntil) else next_read
    assert reads_from < active_at < reads_from + 0.2
    rate = 0.30 * C
    first = sum(c for t, c in granted if active_at <= t < active_at + 0.1)
    # At the cap from the start: 0.1 s of its rate, the credit of one latency target and one head ticket.
    assert first <= rate * 0.1 + rate * 0.005 + MiB, first
    later = sum(c for t, c in granted if active_at + 0.2 <= t < active_at + 0.8)
    assert later == pytest.approx(rate * PACED * 0.6, rel=0.1)


@pytest.mark.parametrize(
    ("capacity_bps", "piece"),
    [
        (40_000_000.0, 192 * 1024),  # 200 KB in 5 ms, in 64 KiB steps
        (100_000_000.0, 448 * 1024),  # 500 KB
        (1e9, MiB),  # 5 MB fits: whole chunks
        (1_000_000.0, 64 * 1024),  # 5 KB: never below one step
    ],
)
def test_pieces_of_paced_lanes_fit_the_read_latency_target(capacity_bps: float, piece: int) -> None:
    s = Scheduler(config(capacity_bps=capacity_bps), T0)
    assert s.piece_bytes("checkpoint", MiB) == piece
    assert s.piece_bytes("restore", MiB) == piece
    assert s.piece_bytes("dataset", MiB) == MiB  # the protected lane keeps whole chunks
    assert s.piece_bytes("checkpoint", 128 * 1024) == min(128 * 1024, piece)
    with pytest.raises(KeyError):
        s.piece_bytes("nope", MiB)


def test_with_reads_idle_a_lane_back_from_idle_still_gets_its_burst() -> None:
    s = Scheduler(config(burst_bytes=4 * MiB), T0)
    start = T0 + 5.0
    times = _checkpoint_grant_times(s, start, 8, reads_until=T0 + 1.0)  # reads idle long before the burst
    assert not s.snapshot(start).reads_active
    assert sum(1 for t in times if t <= start + 1e-6) >= 4  # uncapped: limited by the capacity bucket only


def test_work_conserving_mode_does_not_cap_writes_while_the_guard_is_content() -> None:
    s = Scheduler(config(write_cap_mode="work_conserving"), T0)
    s.submit("dataset", 2_000_000, T0)
    snap = s.snapshot(T0)
    assert snap.reads_active and snap.lane("checkpoint").limit_bps is None


# -- the latency guard --------------------------------------------------------------------------------------


def _reads_flowing(s: Scheduler, now: float) -> None:
    t = s.submit("dataset", 2_000_000, now)
    d = s.pull(now)
    assert isinstance(d, Grant) and d.ticket == t
    s.complete(t, now)


def test_guard_halves_paced_lanes_on_a_miss_down_to_m_min_and_never_below_the_floor() -> None:
    s = Scheduler(config(), T0)
    now = T0
    expected = 1.0
    for _ in range(8):
        _reads_flowing(s, now)
        s.observe_read("dataset", 0.0, 0.001, now)  # baseline sample
        s.observe_read("dataset", 0.020, 0.001, now)  # waited 20 ms: a miss
        now += 0.1
        expected = max(expected / 2, GUARD_M_MIN)
        snap = s.snapshot(now + 1e-6)
        assert snap.guard_multiplier == pytest.approx(expected)
        ck = snap.lane("checkpoint")
        assert ck.guard_multiplier == pytest.approx(expected)
        assert ck.limit_bps == pytest.approx(max(0.30 * expected, 0.02) * C)  # floor 0.02
        assert snap.lane("dataset").guard_multiplier == 1.0  # never paces the protected lane
    assert expected == GUARD_M_MIN


def test_guard_grows_back_by_a_sixteenth_every_two_windows_when_p99_is_well_under_target() -> None:
    s = Scheduler(config(), T0)
    now = T0
    _reads_flowing(s, now)
    s.observe_read("dataset", 0.020, 0.001, now)
    now += 0.1
    assert s.snapshot(now + 1e-6).guard_multiplier == 0.5
    seen = []
    for _ in range(8):
        _reads_flowing(s, now)
        for _ in range(5):
            s.observe_read("dataset", 0.0, 0.001, now)  # no extra latency
        now += 0.1
        seen.append(s.snapshot(now + 1e-6).guard_multiplier)
    assert seen == [0.5, 0.5625, 0.5625, 0.625, 0.625, 0.6875, 0.6875, 0.75]


def test_guard_ignores_noise_below_target_and_resets_after_five_seconds_without_reads() -> None:
    s = Scheduler(config(), T0)
    _reads_flowing(s, T0)
    s.observe_read("dataset", 0.004, 0.001, T0)  # 4 ms: under the 5 ms target
    assert s.snapshot(T0 + 0.1 + 1e-6).guard_multiplier == 1.0
    s.observe_read("dataset", 0.050, 0.001, T0 + 0.15)
    assert s.snapshot(T0 + 0.2 + 1e-6).guard_multiplier == 0.5
    assert s.snapshot(T0 + 5.3).guard_multiplier == 1.0


def test_guard_measures_ttfb_against_the_learned_baseline() -> None:
    s = Scheduler(config(), T0)
    now = T0
    for _ in range(3):  # quiet windows: the baseline TTFB is ~10 ms
        _reads_flowing(s, now)
        for _ in range(10):
            s.observe_read("dataset", 0.0, 0.010, now)
        now += 0.1
    snap = s.snapshot(now + 1e-6)
    assert snap.read_baseline_ttfb_s == pytest.approx(0.010)
    assert snap.guard_multiplier == 1.0  # 10 ms TTFB is the baseline, not extra latency
    _reads_flowing(s, now)
    s.observe_read("dataset", 0.0, 0.017, now)  # 7 ms over the baseline
    assert s.snapshot(now + 0.1 + 1e-6).guard_multiplier == 0.5


# -- SlowDown ------------------------------------------------------------------------------------------------


def test_slowdown_cuts_the_lane_by_30_percent_once_per_window_then_recovers() -> None:
    s = Scheduler(config(), T0)
    s.submit("dataset", 2_000_000, T0)  # reads active: checkpoint ceiling 0.30
    s.observe_backend("checkpoint", 503, T0)
    ck = s.snapshot(T0).lane("checkpoint")
    assert ck.limit_bps == pytest.approx(0.21 * C)
    s.observe_backend("checkpoint", 503, T0 + 0.05)  # same window: ignored
    assert s.snapshot(T0 + 0.05).lane("checkpoint").limit_bps == pytest.approx(0.21 * C, rel=0.01)
    before = s.snapshot(T0 + 0.1).lane("checkpoint").limit_bps
    assert before is not None and 0.21 * C < before < 0.30 * C  # CUBIC: concave regrowth, fast at first
    s.observe_backend("checkpoint", 503, T0 + 0.1)
    assert s.snapshot(T0 + 0.1).lane("checkpoint").limit_bps == pytest.approx(0.7 * before)
    assert s.snapshot(T0 + 0.1).lane("dataset").limit_bps is None
    # CUBIC: back to the pre-cut rate 2 s after the cut, then the cut is forgotten.
    s.submit("dataset", 2_000_000, T0 + 1.5)
    assert s.snapshot(T0 + 2.1).lane("checkpoint").limit_bps == pytest.approx(before, rel=0.02)
    assert s.snapshot(T0 + 4.5).lane("checkpoint").limit_bps == pytest.approx(0.30 * C)
    assert s.snapshot(T0 + 4.5).lane("checkpoint").slowdown_fraction is None


def test_slowdown_never_cuts_below_the_floor() -> None:
    s = Scheduler(config(), T0)
    s.submit("dataset", 2_000_000, T0)
    for i in range(30):
        s.observe_backend("checkpoint", 503, T0 + 0.1 * i)
    assert s.snapshot(T0 + 3.0).lane("checkpoint").limit_bps == pytest.approx(0.02 * C, rel=0.05)


# -- cancel, complete, windows ---------------------------------------------------------------------------


def test_cancel_of_a_waiting_ticket_removes_it() -> None:
    s = Scheduler(config((lane("a"),)), T0)
    a = [s.submit("a", MiB, T0) for _ in range(4)]
    s.cancel(a[0], T0)
    s.cancel(a[0], T0)  # twice: no-op
    s.cancel(12345, T0)  # unknown: no-op
    snap = s.snapshot(T0).lane("a")
    assert (snap.queued_tickets, snap.queued_bytes) == (3, 3 * MiB)
    assert s.pull(T0) == Grant(ticket=a[1], lane="a", cost_bytes=MiB)
    for t in a[2:]:
        s.cancel(t, T0)
    assert isinstance(s.pull(T0), Idle)
    assert s.snapshot(T0).lane("a").queued_tickets == 0


def test_cancel_of_a_granted_ticket_releases_everything_and_refunds_its_budget() -> None:
    s = Scheduler(config((lane("a"),), inflight_bytes_max=2 * MiB), T0)
    t1 = s.submit("a", MiB, T0)
    t2 = s.submit("a", MiB, T0)
    t3 = s.submit("a", MiB, T0)
    assert [d.ticket for d in (s.pull(T0), s.pull(T0)) if isinstance(d, Grant)] == [t1, t2]
    assert not isinstance(s.pull(T0), Grant)  # window full (2 MiB), capacity bucket in debt
    s.cancel(t1, T0)
    # The window has room again, and the MiB t1 never used went back to the capacity bucket: t3 is granted
    # at once instead of waiting for the debt.
    assert s.pull(T0) == Grant(ticket=t3, lane="a", cost_bytes=MiB)
    s.complete(t2, T0)
    s.complete(t3, T0, bytes_done=MiB // 2)
    snap = s.snapshot(T0)
    assert (snap.inflight_bytes, snap.inflight_tickets) == (0, 0)
    ln = snap.lane("a")
    assert (ln.granted_bytes_total, ln.done_bytes_total) == (3 * MiB, MiB + MiB // 2)
    s.complete(t3, T0)  # finished: no-op
    s.cancel(t3, T0)


def test_completing_a_ticket_that_was_never_granted_is_a_bug() -> None:
    s = Scheduler(config((lane("a"), lane("b"))), T0)
    s.submit("a", MiB, T0)
    s.submit("a", MiB, T0)
    t = s.submit("a", MiB, T0)
    with pytest.raises(RuntimeError, match="never granted"):
        s.complete(t, T0)


def test_the_window_winner_is_not_overtaken_by_smaller_tickets() -> None:
    lanes = (lane("big", weight=10.0), lane("small"))
    s = Scheduler(config(lanes, inflight_bytes_max=MiB + 64 * 1024, inflight_requests_max=8), T0)
    t = s.submit("big", MiB, T0)
    assert isinstance(s.pull(T0), Grant)
    s.submit("big", MiB, T0)
    s.submit("small", 64 * 1024, T0)
    s.submit("small", 64 * 1024, T0)
    # "small" (64 KiB) would fit in the window; "big" is next by its tags (a tie on start tags, and it comes
    # first), so it waits for room and nobody squeezes in ahead of it.
    assert isinstance(s.pull(T0), Idle)
    assert s.snapshot(T0).lane("small").queued_tickets == 2
    s.complete(t, T0)
    d = s.pull(T0)
    assert isinstance(d, Grant) and d.lane == "big"


def test_max_concurrency_makes_a_lane_ineligible_until_a_completion() -> None:
    s = Scheduler(config((lane("a", max_concurrency=2), lane("b"))), T0 + 10)
    ts = [s.submit("a", 1000, T0 + 10) for _ in range(3)]
    assert [d.ticket for d in (s.pull(T0 + 10), s.pull(T0 + 10)) if isinstance(d, Grant)] == ts[:2]
    assert not isinstance(s.pull(T0 + 10), Grant)  # held: at most a timed re-check, never a grant
    s.complete(ts[0], T0 + 10)
    assert s.pull(T0 + 10) == Grant(ticket=ts[2], lane="a", cost_bytes=1000)


def test_paced_lanes_get_only_their_ceiling_share_of_the_window_while_reads_are_active() -> None:
    s = Scheduler(config(inflight_bytes_max=10 * MiB), T0)
    for _ in range(8):
        s.submit("checkpoint", MiB, T0)
    granted = 0
    while isinstance(s.pull(T0), Grant):
        granted += 1
    assert granted >= 2  # reads idle: only the buckets limit it
    s2 = Scheduler(config(inflight_bytes_max=10 * MiB), T0)
    s2.submit("dataset", 2 * MiB, T0)  # reads active
    for _ in range(8):
        s2.submit("checkpoint", MiB, T0)
    lanes = []
    now = T0
    for _ in range(50):
        d = s2.pull(now)
        if isinstance(d, Grant):
            lanes.append(d.lane)
        elif isinstance(d, WaitUntil):
            now = d.at
        else:
            break
    # 30% of a 10 MiB window is 3 MiB: three checkpoint MiB in flight at most, however long we wait.
    assert lanes.count("checkpoint") == 3
    assert s2.snapshot(now).lane("checkpoint").inflight_bytes == 3 * MiB


def test_a_burst_of_reads_borrows_one_bucket_depth_and_reservations_never_wait_for_capacity() -> None:
    s = Scheduler(config(), T0)
    for _ in range(6):
        s.submit("dataset", MiB, T0)
    got = []
    while isinstance(d := s.pull(T0), Grant):
        got.append(d.lane)
    # Reservation bucket (1 MiB), capacity bucket (1 MiB) and one more bucket depth borrowed: three reads
    # at once; the fourth waits until the capacity bucket is back above -1 MiB.
    assert got == ["dataset"] * 3
    assert isinstance(d, WaitUntil) and d.at == pytest.approx(T0 + MiB / C)
    s.submit("checkpoint", MiB, T0)
    d = s.pull(T0)
    # The checkpoint lane's reservation bucket pays for a chunk now, although the capacity bucket is in debt.
    assert isinstance(d, Grant) and d.lane == "checkpoint"


def test_backlogged_reads_and_writes_split_by_weight_when_the_guard_is_content() -> None:
    # dataset R 0.70 W 7, checkpoint W 3 capped at 0.30 (paced a little under it, so that no second
    # goes over it): both phases agree on about 70/30.
    s = Scheduler(config(latency_target_s=60.0), T0)
    s.submit("dataset", 2 * MiB, T0)  # reads active
    got, _, _ = drive(s, ["dataset", "checkpoint"], grants=2000, warmup=100)
    assert fractions(got)["checkpoint"] == pytest.approx(0.30 * PACED, abs=0.01)


def test_snapshot_reports_configuration_and_counters() -> None:
    s = Scheduler(config(), T0)
    t = s.submit("checkpoint", MiB, T0)
    s.pull(T0)
    s.observe_delivered("checkpoint", MiB, T0 + 0.01)
    s.complete(t, T0 + 0.01)
    snap = s.snapshot(T0 + 0.15)
    assert snap.capacity_bps == C and snap.capacity_configured
    assert snap.write_cap_mode == "strict"
    r = snap.lane("checkpoint")  # reservation 0, floor 0.02
    assert (r.granted_tickets_total, r.granted_bytes_total, r.delivered_bytes_total) == (1, MiB, MiB)
    assert r.reservation_bps == pytest.approx(0.02 * C)  # its floor, as a guarantee
    assert r.achieved_share == 1.0
    with pytest.raises(KeyError):
        snap.lane("nope")


def test_a_long_silence_is_fast_forwarded() -> None:
    s = Scheduler(config(), T0)
    s.submit("checkpoint", MiB, T0)
    assert isinstance(s.pull(T0 + 86400.0), Grant)
    assert s.snapshot(T0 + 86400.0).lane("checkpoint").granted_rate_bps == 0.0


# -- the estimator and the buckets -----------------------------------------------------------------------


def test_capacity_estimator_ladder_coasts_then_steps_by_iocost_percentages() -> None:
    est = CapacityEstimator(1000.0 * 1e6, 0.1)
    kw: dict[str, Any] = {"errors": 0, "requests": 100, "guard_missed": False}
    est.tick(0.1, delivered_bytes=1e6, window_wait_s=0.0, throttled_s=0.0, **kw)  # coast: nobody throttled
    assert est.capacity_bps == 1e9 and est.busy_level == 0
    values = []
    for i in range(6):
        est.tick(0.2 + 0.1 * i, delivered_bytes=0.0, window_wait_s=0.0, throttled_s=0.05, **kw)
        values.append(est.capacity_bps)
    assert est.busy_level == -6
    assert values == pytest.approx([1e9, 1e9, 1e9, 1.01e9, 1.01e9 * 1.01, 1.01e9 * 1.01**2])
    for i in range(5):  # busy: the window was full; the backend delivered 500 MB/s meanwhile
        est.tick(1.0 + 0.1 * i, delivered_bytes=50e6, window_wait_s=0.09, throttled_s=0.0, **kw)
    assert est.busy_level == 5
    # Decreasing, but never below what was delivered while saturated (that is a measurement) ...
    assert 500e6 <= est.capacity_bps < 1.03e9
    for i in range(60):
        est.tick(2.0 + 0.1 * i, delivered_bytes=50e6, window_wait_s=0.09, throttled_s=0.0, **kw)
    assert est.capacity_bps == pytest.approx(500e6, rel=1e-6)
    assert est.busy_level <= 5  # ... and pinned there, the ladder does not run away


@pytest.mark.parametrize(
    ("status", "busy"), [(500, True), (502, True), (503, True), (504, True), (501, False), (505, False)]
)
def test_only_the_answers_of_a_struggling_store_lower_an_estimated_capacity(status: int, busy: bool) -> None:
    s = Scheduler(config(capacity_bps=None, initial_capacity_bps=C), T0)
    now = T0
    for i in range(20):  # two seconds: one such answer in every window, among ten requests
        for _ in range(10):
            t = s.submit("metadata", 0, now)
            assert isinstance(s.pull(now), Grant)
            s.complete(t, now)
        s.observe_backend("metadata", status, now)
        now = T0 + 0.1 * (i + 1)
    cap = s.snapshot(now).capacity_bps
    if busy:
        assert cap < 0.9 * C
    else:
        assert cap == C


def _read_window(s: Scheduler, now: float, nbytes: int, waited_s: float, ttfb_s: float = 0.001) -> None:
    """One 0.1 s window of reads: ``nbytes`` granted (WaitUntil followed), delivered and completed, and one
    read sample that waited ``waited_s`` in the gateway and ``ttfb_s`` for the backend's first byte. Grants
    of other lanes are completed at once."""
    end = now + 0.1
    ticket = s.submit("dataset", nbytes, now)
    while True:
        d = s.pull(now)
        if isinstance(d, Grant):
            s.observe_delivered(d.lane, d.cost_bytes, now)
            s.complete(d.ticket, now)
            if d.ticket == ticket:
                break
        elif isinstance(d, WaitUntil):
            assert d.at < end, "the read was not granted within its window"
            now = d.at
        else:
            raise AssertionError("idle with a read queued")
    s.observe_read("dataset", waited_s, ttfb_s, now)


@pytest.mark.parametrize(
    ("writes", "slow", "lowered"),
    [
        (False, "gateway", False),
        (False, "backend", False),
        (True, "gateway", False),
        (True, "backend", True),
    ],
)
def test_only_the_backends_own_latency_with_writes_waiting_lowers_an_estimated_capacity(
    writes: bool, slow: str, lowered: bool
) -> None:
    """With an estimated capacity, a read-latency miss is capacity evidence only while a paced lane has work
    (reads queueing behind reads, with nobody to hold back, must not throttle themselves), and only when
    the backend itself answers late. Time a read waits in the gateway is the gateway's doing: lowering the
    estimate for it makes reads wait longer still, which lowered it further (fuzz runs with hostile and
    valid requests mixed sank from 1 GB/s to 1 MiB/s and crawled)."""
    s = Scheduler(config(capacity_bps=None, inflight_bytes_max=None, inflight_requests_max=None), T0)
    c0 = s.snapshot(T0).capacity_bps
    now = T0
    if writes:
        for _ in range(4):
            s.submit("checkpoint", 64 * MiB, now)  # backlogged writes, held at their floor by the guard
    lowest_multiplier = 1.0
    for _ in range(60):
        # 50 ms in the gateway, or 50 ms more than the 1 ms baseline at the backend: a miss either way
        _read_window(s, now, 2 * MiB, waited_s=0.050 if slow == "gateway" else 0.0)
        if slow == "backend":
            s.observe_read("dataset", 0.0, 0.051, now + 0.05)
        now += 0.1
        lowest_multiplier = min(lowest_multiplier, s.snapshot(now + 1e-6).guard_multiplier)
    assert lowest_multiplier == GUARD_M_MIN  # the guard had nothing left to cut, in every case
    snap = s.snapshot(now + 1e-6)
    if lowered:
        assert snap.capacity_bps < 0.5 * c0
    else:
        assert snap.capacity_bps >= c0 and snap.capacity_busy_level <= 0


def test_a_busy_window_that_carried_a_trickle_does_not_clamp_the_estimate() -> None:
    """Only a window whose in-flight window was full measures the backend. The fuzzer's collapse: one window
    busy for a slow read (or an error), 24 KB delivered, took a 1 GB/s estimate to 2 x 240 KB/s at once."""
    kw: dict[str, Any] = {"window_wait_s": 0.0, "throttled_s": 0.0, "requests": 40}
    for cause in ("guard", "errors"):
        est = CapacityEstimator(1e9, 0.1)
        est.tick(
            0.1, delivered_bytes=24_000, errors=int(cause == "errors"), guard_missed=cause == "guard", **kw
        )
        assert est.capacity_bps == 1e9 and est.busy_level == 1
        for i in range(3):  # the ladder's first three steps are 0 %, then 1 %: a slow descent, not a cliff
            est.tick(
                0.2 + 0.1 * i,
                delivered_bytes=24_000,
                errors=int(cause == "errors"),
                guard_missed=cause == "guard",
                **kw,
            )
        assert 0.98e9 < est.capacity_bps < 1e9
    # A saturated window is a measurement, and the clamp to twice it holds.
    est = CapacityEstimator(1e9, 0.1)
    est.tick(
        0.1,
        delivered_bytes=24_000,
        window_wait_s=0.09,
        throttled_s=0.0,
        errors=0,
        requests=40,
        guard_missed=False,
    )
    assert est.capacity_bps == pytest.approx(max(2 * 240_000, ESTIMATOR_MIN_BPS))


def test_token_bucket_allows_debt_and_refills_at_its_rate() -> None:
    b = TokenBucket(100.0, 50.0, 0.0)
    assert b.ready_at(0.0, 0.0) == 0.0
    b.take(120.0, 0.0)
    assert b.ready_at(0.0, 0.0) == pytest.approx(0.7)
    b.set_rate(200.0, 0.2)  # 20 refilled at the old rate
    assert b.ready_at(0.0, 0.2) == pytest.approx(0.2 + 50.0 / 200.0)
    b.give(1000.0, 0.2)
    assert b.level_bytes == 50.0
    unlimited = TokenBucket(math.inf, 10.0, 0.0)
    unlimited.take(1e12, 0.0)
    assert unlimited.ready_at(0.0, 0.0) == 0.0


# -- properties ---------------------------------------------------------------------------------------------

lane_params = st.tuples(
    st.floats(0.0, 0.3),  # reservation
    st.floats(0.1, 10.0),  # weight
    st.one_of(st.none(), st.floats(0.3, 1.0)),  # limit
)


@given(
    capacity=st.floats(1e6, 1e10),
    lanes=st.lists(
        st.tuples(
            st.floats(0.0, 0.5),
            st.floats(0.01, 100.0),
            st.one_of(st.just(math.inf), st.floats(0.0, 1.0)),
            st.one_of(st.just(math.inf), st.floats(0.0, 1.5)),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_allocation_respects_reservations_limits_and_capacity(
    capacity: float, lanes: list[tuple[float, float, float, float]]
) -> None:
    total_r = sum(r for r, *_ in lanes)
    demands = [
        LaneDemand(
            reservation_bps=(r / max(1.0, total_r)) * capacity,
            weight=w,
            limit_bps=lim * capacity,
            demand_bps=d * capacity,
        )
        for r, w, lim, d in lanes
    ]
    alloc = allocate(capacity, demands)
    eps = 1e-6 * capacity
    assert sum(alloc) <= capacity + eps
    for a, x in zip(alloc, demands, strict=True):
        assert a >= min(x.demand_bps, x.reservation_bps, x.limit_bps) - eps
        assert a <= min(x.limit_bps, x.demand_bps) + eps
    # Work conserving: either capacity is used up or every lane has what it can take.
    if sum(alloc) < capacity - eps:
        assert all(a >= min(x.limit_bps, x.demand_bps) - eps for a, x in zip(alloc, demands, strict=True))
    # Weighted fairness: a lane strictly inside its bounds has the largest weight-normalised share among
    # the lanes that could still grow.
    for a, x in zip(alloc, demands, strict=True):
        if x.reservation_bps + eps < a < min(x.limit_bps, x.demand_bps) - eps:
            for b, y in zip(alloc, demands, strict=True):
                if b < min(y.limit_bps, y.demand_bps) - eps:
                    assert b / y.weight >= a / x.weight - 1e-6 * capacity


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.lists(lane_params, min_size=2, max_size=5), cost_kib=st.sampled_from([64, 256, 1024]))
def test_discrete_scheduler_realises_the_fluid_allocation_for_backlogged_lanes(
    params: list[tuple[float, float, float | None]], cost_kib: int
) -> None:
    total_r = sum(r for r, _, _ in params)
    specs = tuple(
        lane(f"l{i}", reservation=r / max(1.0, total_r), weight=w, limit=lim)
        for i, (r, w, lim) in enumerate(params)
    )
    s = Scheduler(config(specs), T0)
    names = [x.name for x in specs]
    cost = cost_kib * 1024
    # ~0.3 s of warm-up (the buckets start full), then ~2 s of capacity measured.
    got, t0, t1 = drive(s, names, grants=int(2.0 * C / cost), cost=cost, warmup=int(0.3 * C / cost))
    elapsed = t1 - t0
    expected = allocate(
        C,
        [LaneDemand(x.reservation * C, x.weight, (x.limit or math.inf) * C, math.inf) for x in specs],
    )
    # Each lane within a few chunks plus the bucket depths of its fluid share over the run; never below its
    # reservation, never above its limit, and the total never above C (beyond the burst tolerance: every
    # lane's reservation bucket plus the capacity bucket, one depth each).
    slack = (4 * cost + (len(specs) + 1) * MiB) / elapsed
    for x, e in zip(specs, expected, strict=True):
        rate = got[x.name] / elapsed
        assert rate == pytest.approx(e, abs=slack + 0.01 * C)
        assert rate >= x.reservation * C - slack
        if x.limit is not None:
            assert rate <= x.limit * C + slack
    assert sum(got.values()) / elapsed <= C + slack


def test_guard_ignores_the_wait_of_reads_that_already_get_their_guarantee_but_not_ttfb_inflation() -> None:
    # Saturating readers queue behind each other; that wait is not the writers' doing and must not push
    # the checkpoint lane below its 30% share. Backend latency inflation still counts.
    s = Scheduler(config(), T0)
    now = T0
    for i in range(20):  # reads granted at 80% of C: above their 70% guarantee once a second has passed
        t = s.submit("dataset", int(0.08 * C), now)
        d = s.pull(now)
        assert isinstance(d, Grant) and d.ticket == t
        s.complete(t, now)
        for _ in range(10):
            # 50 ms in the queue, backend at baseline (the first second only builds the baseline)
            s.observe_read("dataset", 0.050 if i >= 10 else 0.0, 0.001, now)
        now += 0.1
    assert s.snapshot(now + 1e-6).guard_multiplier == 1.0
    t = s.submit("dataset", int(0.08 * C), now)
    d = s.pull(now)
    assert isinstance(d, Grant)
    s.complete(t, now)
    for _ in range(10):
        s.observe_read("dataset", 0.0, 0.040, now)  # the backend itself got 39 ms slower
    now += 0.1
    assert s.snapshot(now + 1e-6).guard_multiplier == 0.5


# -- latency guard: reads that queue behind reads ------------------------------------------------------------


def _guard_window(guard: LatencyGuard, t: float, extra_s: float, *, quiet: bool, n: int = 50) -> GuardVerdict:
    for i in range(n):
        guard.observe(wait_s=extra_s * (0.5 + i / (2 * n)), ttfb_s=0.001, now=t)
    return guard.tick(t + 0.1, quiet=quiet, read_share=0.9, can_cut=True)


def test_guard_does_not_blame_paced_lanes_for_latency_reads_cause_themselves() -> None:
    """On a slow link a loader's batch of reads queues behind itself (30 ms p99 with nothing else running).
    The guard learns that from quiet windows and then cuts paced lanes only for latency they add on top."""
    guard = LatencyGuard(target_s=0.005, window_s=0.1, now=0.0)
    t = 0.0
    for _ in range(20):  # reads alone: quiet windows, 30 ms
        t += 0.1
        _guard_window(guard, t, 0.030, quiet=True)
    assert guard.self_p99_s == pytest.approx(0.030, rel=0.1)
    assert guard.multiplier == 1.0  # learning it already did not throttle anything for long
    for _ in range(10):  # writes running, reads no worse than alone
        t += 0.1
        verdict = _guard_window(guard, t, 0.030, quiet=False)
    assert verdict.multiplier == 1.0
    t += 0.1
    verdict = _guard_window(guard, t, 0.120, quiet=False)  # writes now add 90 ms: cut
    assert verdict.missed and verdict.multiplier < 1.0


def test_guard_keeps_its_target_when_reads_alone_meet_it() -> None:
    guard = LatencyGuard(target_s=0.005, window_s=0.1, now=0.0)
    t = 0.0
    for _ in range(20):
        t += 0.1
        _guard_window(guard, t, 0.002, quiet=True)
    assert guard.self_p99_s == 0.0
    t += 0.1
    verdict = _guard_window(guard, t, 0.008, quiet=False)  # 8 ms > 5 ms target: cut
    assert verdict.missed and verdict.multiplier < 1.0
