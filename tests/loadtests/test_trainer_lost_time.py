"""The contention trainer's account of time lost to storage: the warm-up is kept apart, the rest counted."""

from __future__ import annotations

import pytest

from loadtests.contention.report import lost_after_warmup
from loadtests.contention.workload import STALL_EVENT_S, LostTime


def test_waits_in_the_warm_up_are_kept_apart_and_the_fraction_counts_what_follows() -> None:
    lost = LostTime(t0=100.0, warmup_s=1.0)
    lost.stalled(100.0, 0.050)  # the first step waits for connections and the first samples
    lost.stalled(100.9, 0.010)  # still inside the first second
    lost.stalled(105.0, 0.002)  # steady state: short waits are summed, not listed
    lost.stalled(120.0, 0.030)
    lost.saved(0.160)
    out = lost.summary(end=133.0)
    assert out["wall_s"] == pytest.approx(33.0)
    assert out["warmup_stall_s"] == pytest.approx(0.060)
    assert out["stall_s"] == pytest.approx(0.032)
    assert out["save_s"] == pytest.approx(0.160)
    assert out["lost_s"] == pytest.approx(0.192)
    assert out["lost_fraction"] == pytest.approx(0.192 / 32.0)
    assert out["lost_fraction_with_warmup"] == pytest.approx(0.252 / 33.0)
    assert [at for at, _ in lost.stall_events] == [100.0, 100.9, 120.0]
    assert all(s >= STALL_EVENT_S for _, s in lost.stall_events)


def test_a_wait_that_begins_after_the_warm_up_counts_in_full() -> None:
    lost = LostTime(t0=0.0, warmup_s=1.0)
    lost.stalled(1.0, 0.5)  # begins exactly when the warm-up ends
    out = lost.summary(end=11.0)
    assert out["warmup_stall_s"] == 0.0
    assert out["lost_fraction"] == pytest.approx(0.5 / 10.0)
    assert out["lost_fraction_with_warmup"] == pytest.approx(0.5 / 11.0)


def test_without_a_warm_up_both_fractions_are_the_old_definition() -> None:
    lost = LostTime(t0=0.0, warmup_s=0.0)
    lost.stalled(0.0, 0.05)
    lost.saved(2.0)
    out = lost.summary(end=33.0)
    assert out["lost_fraction"] == pytest.approx(2.05 / 33.0)
    assert out["lost_fraction_with_warmup"] == out["lost_fraction"]


def test_a_run_that_ends_inside_its_warm_up_reports_no_fraction() -> None:
    lost = LostTime(t0=0.0, warmup_s=1.0)
    lost.stalled(0.0, 0.2)
    out = lost.summary(end=0.5)
    assert out["lost_fraction"] is None
    assert out["lost_fraction_with_warmup"] == pytest.approx(0.2 / 0.5)


def test_the_report_recounts_an_old_trainer_record_on_the_new_definition() -> None:
    old = {  # a trainer record from before the warm-up was kept apart
        "t0": 50.0,
        "wall_s": 33.0,
        "stall_s": 0.070,
        "save_s": 0.160,
        "lost_fraction": 0.230 / 33.0,
        "stall_events": [[50.0, 0.055], [70.0, 0.010]],
    }
    out = lost_after_warmup(old)
    assert out["warmup_stall_s"] == pytest.approx(0.055)
    assert out["stall_s"] == pytest.approx(0.015)
    assert out["lost_fraction"] == pytest.approx(0.175 / 32.0)
    assert out["lost_fraction_with_warmup"] == old["lost_fraction"]


def test_the_report_takes_a_new_trainer_record_as_it_is() -> None:
    lost = LostTime(t0=0.0, warmup_s=1.0)
    lost.stalled(0.0, 0.05)
    lost.saved(0.2)
    rec = {"t0": 0.0, "stall_events": lost.stall_events, **lost.summary(end=21.0)}
    out = lost_after_warmup(rec)
    assert out == {
        k: rec[k] for k in ("lost_fraction", "stall_s", "warmup_stall_s", "lost_fraction_with_warmup")
    }
    assert out["lost_fraction"] == pytest.approx(0.2 / 20.0)
