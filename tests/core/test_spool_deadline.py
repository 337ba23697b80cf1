"""The spool's durability deadline: the drain lane's floor as the deadline nears, and the learnt cadence."""

from __future__ import annotations

import pytest

from s3lanes.core.spool_deadline import (
    BURST_WINDOW,
    DEADLINE_AIM,
    DEFAULT_MAX_AGE_S,
    CheckpointCadence,
    plan,
)

MiB = 1024 * 1024
C = 40_000_000.0
CKPT = 256 * MiB  # 4 ranks x 64 MiB


def p(backlog: int, age: float, deadline: float = 32.0) -> object:
    return plan(
        backlog_bytes=backlog,
        oldest_age_s=age,
        deadline_s=deadline,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.30,
    )


def test_an_empty_spool_keeps_the_configured_floor() -> None:
    r = plan(
        backlog_bytes=0,
        oldest_age_s=0.0,
        deadline_s=32.0,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.3,
    )
    assert r.floor_fraction == 0.02
    assert not r.at_risk
    assert r.projected_s == 0.0


def test_a_small_backlog_far_from_its_deadline_keeps_the_configured_floor() -> None:
    r = plan(
        backlog_bytes=8 * MiB,
        oldest_age_s=1.0,
        deadline_s=3600.0,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.3,
    )
    assert r.floor_fraction == 0.02
    assert not r.at_risk


def test_the_floor_is_what_drains_the_backlog_by_the_aim_and_rises_as_the_deadline_nears() -> None:
    floors = []
    for age in (0.0, 5.0, 10.0, 15.0, 20.0, 24.0):
        r = plan(
            backlog_bytes=CKPT,
            oldest_age_s=age,
            deadline_s=60.0,
            capacity_bps=C,
            min_fraction=0.02,
            cap_fraction=0.3,
        )
        want = CKPT / (DEADLINE_AIM * 60.0 - age) / C
        assert r.floor_fraction == pytest.approx(min(0.30, max(0.02, want)))
        floors.append(r.floor_fraction)
    assert floors == sorted(floors)
    assert floors[0] < 0.15 < floors[-1]


def test_at_the_aim_the_floor_is_the_cap_and_the_plan_says_when_even_the_cap_is_too_late() -> None:
    # 256 MiB at the 30 % cap of 40 MB/s: 22.4 s. Oldest byte 5 s old with a 32 s deadline: 27 s left.
    r = plan(
        backlog_bytes=CKPT,
        oldest_age_s=5.0,
        deadline_s=32.0,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.3,
    )
    assert r.floor_fraction == pytest.approx(0.30)
    assert r.best_case_s == pytest.approx(CKPT / (0.3 * C))
    assert r.time_left_s == pytest.approx(27.0)
    assert not r.at_risk
    # Two checkpoints pending, the older one 20 s old: 44.7 s at the cap, 12 s left.
    r = plan(
        backlog_bytes=2 * CKPT,
        oldest_age_s=20.0,
        deadline_s=32.0,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.3,
    )
    assert r.at_risk
    assert r.floor_fraction == pytest.approx(0.30)
    assert r.projected_s == pytest.approx(2 * CKPT / (0.3 * C))
    # Overdue already: still the cap, still at risk.
    r = plan(
        backlog_bytes=MiB,
        oldest_age_s=40.0,
        deadline_s=32.0,
        capacity_bps=C,
        min_fraction=0.02,
        cap_fraction=0.3,
    )
    assert r.floor_fraction == pytest.approx(0.30)
    assert r.at_risk
    assert r.time_left_s == pytest.approx(-8.0)


def test_plan_checks_its_arguments() -> None:
    with pytest.raises(ValueError):
        plan(
            backlog_bytes=1, oldest_age_s=0, deadline_s=0, capacity_bps=C, min_fraction=0.02, cap_fraction=0.3
        )
    with pytest.raises(ValueError):
        plan(
            backlog_bytes=1, oldest_age_s=0, deadline_s=1, capacity_bps=0, min_fraction=0.02, cap_fraction=0.3
        )
    with pytest.raises(ValueError):
        plan(
            backlog_bytes=1, oldest_age_s=0, deadline_s=1, capacity_bps=C, min_fraction=0.4, cap_fraction=0.3
        )


def test_the_cadence_is_the_median_interval_between_bursts() -> None:
    c = CheckpointCadence()
    assert c.interval_s is None
    assert c.deadline_s(None) == 3600.0
    t = 100.0
    for start in (0.0, 32.0, 64.0, 97.0, 128.0):
        for i in range(8):  # a burst: 8 acknowledgements within 1.5 s
            c.observe_ack(t + start + i * 0.2)
    assert c.bursts_seen == 5
    assert c.interval_s == pytest.approx(32.0)
    assert c.deadline_s(None) == pytest.approx(32.0)  # max_age_s unset: the cadence
    assert c.deadline_s(20.0) == 20.0  # max_age_s set: it is the deadline, shorter ...
    assert c.deadline_s(90.0) == 90.0  # ... or longer than the cadence (the backlog may span checkpoints)


def test_without_max_age_s_the_deadline_is_an_hour_until_a_cadence_is_known_and_at_most_an_hour() -> None:
    c = CheckpointCadence()
    assert c.deadline_s(None) == DEFAULT_MAX_AGE_S == 3600.0
    c.observe_ack(0.0, 256 * MiB)
    assert c.deadline_s(None) == 3600.0
    c.observe_ack(7200.0, 256 * MiB)  # checkpoints two hours apart
    assert c.interval_s == pytest.approx(7200.0)
    assert c.deadline_s(None) == 3600.0


def test_small_writes_between_checkpoints_are_no_bursts() -> None:
    # 4 x 64 MiB every 32 s; the commit marker (4 KiB) 6 s after its shards, and a 1 MiB log written 15 s
    # into each interval. Counting every acknowledgement, bursts start every 6-11 s and the median interval
    # (the deadline) would be ~9 s instead of 32.
    c = CheckpointCadence()
    for k in range(6):
        t = 100.0 + 32.0 * k
        for i in range(4):
            c.observe_ack(t + 0.3 * i, 64 * MiB)
        c.observe_ack(t + 6.0, 4096)
        c.observe_ack(t + 15.0, MiB)
    assert c.interval_s == pytest.approx(32.0)
    assert c.bursts_seen == 6
    # Reported several at a tick, as the keeper does: the same.
    c2 = CheckpointCadence()
    for k in range(6):
        t = 100.0 + 32.0 * k
        c2.observe_ack(t, 256 * MiB)
        c2.observe_ack(t + 6.0, 4096)
    assert c2.interval_s == pytest.approx(32.0)


def test_checkpoints_that_shrink_for_good_are_checkpoints_again_once_the_large_ones_are_old() -> None:
    c = CheckpointCadence()
    t = 0.0
    for _ in range(3):
        c.observe_ack(t, 1024 * MiB)
        t += 60.0
    for _ in range(BURST_WINDOW + 3):  # 64 MiB every 20 s from now on: under a quarter of 1 GiB
        c.observe_ack(t, 64 * MiB)
        t += 20.0
    assert c.interval_s == pytest.approx(20.0)


def test_a_steady_writer_is_no_cadence() -> None:
    c = CheckpointCadence()
    for i in range(100):
        c.observe_ack(float(i))  # one ack a second: a single long burst
    assert c.bursts_seen == 1
    assert c.interval_s is None
    c2 = CheckpointCadence()
    for i in range(10):
        c2.observe_ack(i * 4.5)  # bursts every 4.5 s: under MIN_CADENCE_S
    assert c2.interval_s is None


def test_the_cadence_tolerates_a_clock_that_steps_back() -> None:
    c = CheckpointCadence()
    c.observe_ack(100.0)
    c.observe_ack(90.0)  # taken as 100
    c.observe_ack(140.0)
    assert c.interval_s == pytest.approx(40.0)
