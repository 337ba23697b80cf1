"""The spool's durability deadline: the drain lane's floor as the deadline nears, and the learnt cadence."""

from __future__ import annotations

import pytest

from gateway.core.spool_deadline import DEADLINE_AIM, CheckpointCadence, plan

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
    assert c.deadline_s(3600.0) == 3600.0
    t = 100.0
    for start in (0.0, 32.0, 64.0, 97.0, 128.0):
        for i in range(8):  # a burst: 8 acknowledgements within 1.5 s
            c.observe_ack(t + start + i * 0.2)
    assert c.bursts_seen == 5
    assert c.interval_s == pytest.approx(32.0)
    assert c.deadline_s(3600.0) == pytest.approx(32.0)
    assert c.deadline_s(20.0) == 20.0  # max_age_s smaller: it wins


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
