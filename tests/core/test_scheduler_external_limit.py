"""Scheduler.set_external_limit: a cluster allowance caps a lane whatever the local read activity, above its
floor, alongside the lane's own caps; and it shows in the snapshot."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.scheduler import DEFAULT_CAP_HEADROOM, Grant, Scheduler, WaitUntil
from s3lanes.runtime.wiring import scheduler_config

MiB = 1024 * 1024
C = 100_000_000.0
T0 = 1000.0


def scheduler() -> Scheduler:
    return Scheduler(replace(scheduler_config(Config(), C), burst_bytes=MiB), T0)


def rate_of(
    s: Scheduler, lane: str, *, seconds: float, now: float, reads: bool = False
) -> tuple[float, float]:
    """Keep ``lane`` (and, with ``reads``, the dataset lane) backlogged for ``seconds``; complete grants at
    once. Returns ``lane``'s granted bytes/s over the second half (after the buckets settle) and the end."""
    cost = 256 * 1024
    lanes = [lane, "dataset"] if reads else [lane]
    for name in lanes:
        for _ in range(2):
            s.submit(name, cost, now)
    got: Counter[str] = Counter()
    start, end = now + seconds / 2, now + seconds
    while now < end:
        d = s.pull(now)
        if isinstance(d, Grant):
            if now >= start:
                got[d.lane] += d.cost_bytes
            s.complete(d.ticket, now)
            s.submit(d.lane, cost, now)
        elif isinstance(d, WaitUntil):
            assert d.at > now
            now = d.at
        else:
            raise AssertionError("Idle with backlogged lanes")
    return got[lane] / (seconds / 2), now


def test_an_external_limit_caps_a_lane_without_local_reads() -> None:
    s = scheduler()
    alone, now = rate_of(s, "checkpoint", seconds=2.0, now=T0)
    assert alone >= 0.95 * C  # no reads here: the whole capacity
    s.set_external_limit("checkpoint", 10_000_000.0, now)
    capped, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert capped == pytest.approx(10_000_000.0, rel=0.05)
    s.set_external_limit("checkpoint", None, now)
    lifted, _ = rate_of(s, "checkpoint", seconds=2.0, now=now)
    assert lifted >= 0.95 * C


def test_the_floor_still_holds_under_an_external_limit() -> None:
    s = scheduler()
    s.set_external_limit("checkpoint", 0.0, T0)
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=T0)
    assert got == pytest.approx(0.02 * C, rel=0.05)
    snap = s.snapshot(now).lane("checkpoint")
    assert snap.external_limit_bps == 0.0
    assert snap.limit_bps == pytest.approx(0.02 * C)


def test_the_tighter_of_the_external_limit_and_the_local_read_cap_wins() -> None:
    s = scheduler()
    s.set_external_limit("checkpoint", 50_000_000.0, T0)  # looser than 0.30 x C
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=T0, reads=True)
    assert s.snapshot(now).reads_active
    # At the cap less its headroom, paced 1 / 1.05 under it (a second that starts with a full bucket).
    assert got == pytest.approx(0.30 * (1.0 - DEFAULT_CAP_HEADROOM) / 1.05 * C, rel=0.05)
    s.set_external_limit("checkpoint", 10_000_000.0, now)  # tighter
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=now, reads=True)
    assert got == pytest.approx(10_000_000.0, rel=0.05)
    assert s.snapshot(now).lane("checkpoint").limit_bps == pytest.approx(10_000_000.0)


def test_no_external_limit_by_default_and_other_lanes_are_untouched() -> None:
    s = scheduler()
    s.set_external_limit("checkpoint", 5_000_000.0, T0)
    snap = s.snapshot(T0)
    assert snap.lane("checkpoint").external_limit_bps == 5_000_000.0
    assert snap.lane("restore").external_limit_bps is None
    assert snap.lane("restore").limit_bps is None


def test_set_external_limit_refuses_nonsense() -> None:
    s = scheduler()
    with pytest.raises(KeyError):
        s.set_external_limit("nope", 1.0, T0)
    with pytest.raises(ValueError):
        s.set_external_limit("checkpoint", -1.0, T0)
    with pytest.raises(ValueError):
        s.set_external_limit("checkpoint", float("nan"), T0)


def test_an_allowance_of_the_reads_cap_is_paced_with_the_caps_headroom_without_local_reads() -> None:
    # The readers are on another node: no reads here, yet the allowance is a share of their cap, and the
    # store's queue releases the cluster's writes as unevenly as one node's.
    s = scheduler()
    s.set_external_limit("checkpoint", 10_000_000.0, T0, for_reads=True)
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=T0)
    assert not s.snapshot(now).reads_active
    assert s.snapshot(now).lane("checkpoint").external_for_reads
    assert got == pytest.approx(10_000_000.0 * (1.0 - DEFAULT_CAP_HEADROOM) / 1.05, rel=0.03)
    # The same allowance, once nobody reads anywhere (the cluster's work-conserving budget): at the limit.
    s.set_external_limit("checkpoint", 10_000_000.0, now)
    assert not s.snapshot(now).lane("checkpoint").external_for_reads
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=now)
    assert got == pytest.approx(10_000_000.0, rel=0.03)


def test_a_raised_floor_stays_under_an_allowance_of_the_reads_cap_less_its_headroom() -> None:
    s = scheduler()
    s.set_external_limit("checkpoint", 10_000_000.0, T0, for_reads=True)
    s.set_floor("checkpoint", 0.25, T0)  # the durability deadline asks for more than the allowance
    got, now = rate_of(s, "checkpoint", seconds=4.0, now=T0, reads=True)
    assert got == pytest.approx(10_000_000.0 * (1.0 - DEFAULT_CAP_HEADROOM) / 1.05, rel=0.03)
    assert s.snapshot(now).lane("checkpoint").limit_bps == pytest.approx(
        10_000_000.0 * (1.0 - DEFAULT_CAP_HEADROOM)
    )


def test_an_allowance_of_the_reads_cap_never_paces_a_lane_under_its_configured_floor() -> None:
    s = scheduler()
    s.set_external_limit("checkpoint", 0.01 * C, T0, for_reads=True)  # under the 2 % floor
    got, _ = rate_of(s, "checkpoint", seconds=4.0, now=T0)
    assert got == pytest.approx(0.02 * C, rel=0.05)


def test_capped_for_reads_says_when_a_lanes_bodies_must_leave_as_granted() -> None:
    s = scheduler()
    assert not s.capped_for_reads("checkpoint")  # no reads: not capped for them
    _, now = rate_of(s, "checkpoint", seconds=2.0, now=T0, reads=True)
    assert s.snapshot(now).reads_active
    assert s.capped_for_reads("checkpoint")  # limit_while_reads_active in force
    assert not s.capped_for_reads("dataset")  # the reads themselves
    quiet = scheduler()
    quiet.set_external_limit("checkpoint", 10_000_000.0, T0)
    assert not quiet.capped_for_reads("checkpoint")  # a plain limit: no reads to protect
    quiet.set_external_limit("checkpoint", 10_000_000.0, T0, for_reads=True)
    assert quiet.capped_for_reads("checkpoint")  # another node's readers
    conserving = Scheduler(
        replace(scheduler_config(Config(), C), burst_bytes=MiB, write_cap_mode="work_conserving"), T0
    )
    _, now = rate_of(conserving, "checkpoint", seconds=2.0, now=T0, reads=True)
    assert conserving.snapshot(now).reads_active and not conserving.capped_for_reads("checkpoint")
    with pytest.raises(KeyError):
        s.capped_for_reads("nope")
