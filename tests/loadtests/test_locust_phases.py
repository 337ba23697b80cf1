"""The load tests' phase statistics (loadtests/locust_phases.py): the burst clock, binning and classifying
requests into in-burst/outside-burst, worker -> master reports, and Locust's percentiles.

Everything here runs with explicit wall-clock times. Locust itself is only imported in a subprocess
(importing it monkey-patches the process with gevent).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest

from loadtests.locust_phases import (
    BURST_REQUEST_TYPE,
    PHASE_IN_BURST,
    PHASE_OUTSIDE,
    BurstSchedule,
    PhaseRow,
    PhaseTracker,
    bursts_csv,
    phases_csv,
)

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0  # a wall-clock time on a whole 10 s boundary
READ = ("GET", "GET dataset range")


def exact_us(latency_us: float) -> int:
    return round(latency_us)


def highest(hist: dict[int, int], count: int, fraction: float) -> int:
    return max(hist)


def tracker(slot_s: float = 0.1) -> PhaseTracker:
    t = PhaseTracker(slot_s=slot_s, bucket=exact_us)
    t.reset(T0)
    return t


def read(t: PhaseTracker, start: float, latency_s: float = 0.002, failed: bool = False) -> None:
    t.record(*READ, start, start + latency_s, failed)


def rows_by_phase(t: PhaseTracker, now: float) -> dict[str, PhaseRow]:
    return {r.phase: r for r in t.summary(now, percentile=highest) if r.name == READ[1]}


# -- the burst clock ---------------------------------------------------------------------------------


def test_bursts_start_on_wall_clock_multiples_of_the_period() -> None:
    s = BurstSchedule(period_s=10)
    assert s.next_burst(T0 + 3, test_start=T0, last_done=None) == (180_000_001, T0 + 10)
    assert s.start_of(s.number_at(T0 + 13)) == T0 + 10


def test_every_writer_computes_the_same_burst_whenever_it_asks() -> None:
    s = BurstSchedule(period_s=10, join_slack_s=1)
    answers = {s.next_burst(T0 + dt, test_start=T0 - 100, last_done=None) for dt in (1.1, 4.0, 9.99)}
    assert answers == {(180_000_001, T0 + 10)}


def test_a_writer_joins_a_burst_that_began_within_the_slack_only() -> None:
    s = BurstSchedule(period_s=10, join_slack_s=1)
    assert s.next_burst(T0 + 0.5, test_start=T0 - 100, last_done=None) == (180_000_000, T0)
    assert s.next_burst(T0 + 1.5, test_start=T0 - 100, last_done=None) == (180_000_001, T0 + 10)


def test_a_writer_never_repeats_a_burst_it_has_done() -> None:
    s = BurstSchedule(period_s=10, join_slack_s=1)
    assert s.next_burst(T0 + 0.5, test_start=T0 - 100, last_done=180_000_000) == (180_000_001, T0 + 10)


def test_no_burst_starts_during_the_warmup() -> None:
    s = BurstSchedule(period_s=10, warmup_s=15)
    assert s.next_burst(T0 + 1, test_start=T0, last_done=None) == (180_000_002, T0 + 20)


def test_the_offset_shifts_the_bursts() -> None:
    s = BurstSchedule(period_s=10, offset_s=3)
    assert s.next_burst(T0 + 1, test_start=T0, last_done=None)[1] == T0 + 3


@pytest.mark.parametrize("kwargs", [{"period_s": 0}, {"period_s": 1, "warmup_s": -1}])
def test_a_schedule_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BurstSchedule(**kwargs)


# -- classification ----------------------------------------------------------------------------------


def test_reads_during_a_burst_and_outside_it_are_reported_apart() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 2)
    t.burst_ended(1, "w0", T0 + 4, size_bytes=100, ok=True)
    for i in range(10):
        read(t, T0 + 0.5 + i * 0.1, latency_s=0.001)  # 0.5 .. 1.4: before the burst
        read(t, T0 + 2.5 + i * 0.1, latency_s=0.050)  # 2.5 .. 3.4: during it
        read(t, T0 + 5.0 + i * 0.1, latency_s=0.001)  # after it
    rows = rows_by_phase(t, T0 + 10)
    assert rows[PHASE_OUTSIDE].count == 20 and rows[PHASE_IN_BURST].count == 10
    assert rows[PHASE_OUTSIDE].max_ms == pytest.approx(1.0)
    assert rows[PHASE_IN_BURST].min_ms == pytest.approx(50.0)


def test_a_read_that_overlaps_the_start_of_a_burst_counts_as_in_burst() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 2)
    t.burst_ended(1, "w0", T0 + 3, size_bytes=1, ok=True)
    read(t, T0 + 1.5, latency_s=0.8)  # started before, ended during
    assert set(rows_by_phase(t, T0 + 10)) == {PHASE_IN_BURST}


def test_classification_errs_towards_the_burst_by_less_than_one_slot() -> None:
    t = tracker(slot_s=0.1)
    t.burst_started(1, "w0", T0 + 2.05)
    t.burst_ended(1, "w0", T0 + 2.95, size_bytes=1, ok=True)
    read(t, T0 + 2.00, latency_s=0.01)  # ended 40 ms before the burst, in the slot where it began: in
    read(t, T0 + 2.96, latency_s=0.01)  # started 10 ms after it, in the slot where it ended: in
    read(t, T0 + 1.93, latency_s=0.01)  # the slot before: out
    read(t, T0 + 3.01, latency_s=0.01)  # the slot after: out
    rows = rows_by_phase(t, T0 + 10)
    assert rows[PHASE_IN_BURST].count == 2 and rows[PHASE_OUTSIDE].count == 2


def test_a_burst_spans_its_writers_from_first_start_to_last_end() -> None:
    t = tracker()
    t.burst_started(7, "w0", T0 + 1)
    t.burst_started(7, "w1", T0 + 1.2)
    t.burst_ended(7, "w0", T0 + 2, size_bytes=10, ok=True)
    t.burst_ended(7, "w1", T0 + 5, size_bytes=10, ok=False)
    (w,) = t.windows(T0 + 10)
    assert (w.burst, w.start, w.end, w.writers, w.failed_writers, w.size_bytes, w.open) == (
        7,
        T0 + 1,
        T0 + 5,
        2,
        1,
        20,
        False,
    )
    read(t, T0 + 4)  # w0 is done, w1 is still writing: still in the burst
    assert set(rows_by_phase(t, T0 + 10)) == {PHASE_IN_BURST}


def test_an_open_burst_lasts_until_now_or_until_the_test_stopped() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 2)
    read(t, T0 + 6)
    assert t.windows(T0 + 8)[0].open and t.windows(T0 + 8)[0].end == T0 + 8
    assert set(rows_by_phase(t, T0 + 8)) == {PHASE_IN_BURST}
    t.stop(T0 + 5)
    assert t.windows(T0 + 8)[0].end == T0 + 5
    assert set(rows_by_phase(t, T0 + 8)) == {PHASE_OUTSIDE}


def test_phase_seconds_split_the_test_and_overlapping_bursts_count_once() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 2)
    t.burst_ended(1, "w0", T0 + 5, size_bytes=1, ok=True)
    t.burst_started(2, "w0", T0 + 4)  # overlaps burst 1 (a slow writer)
    t.burst_ended(2, "w0", T0 + 6, size_bytes=1, ok=True)
    read(t, T0 + 1)
    read(t, T0 + 3)
    t.stop(T0 + 10)
    rows = rows_by_phase(t, T0 + 99)
    assert rows[PHASE_IN_BURST].phase_s == pytest.approx(4.0)
    assert rows[PHASE_OUTSIDE].phase_s == pytest.approx(6.0)
    assert rows[PHASE_IN_BURST].rps == pytest.approx(1 / 4)


def test_failures_are_counted_in_their_phase_and_burst_pseudo_requests_are_not_phased() -> None:
    t = tracker()
    read(t, T0 + 1, failed=True)
    read(t, T0 + 2)
    t.record(BURST_REQUEST_TYPE, "checkpoint share (one writer)", T0 + 1, T0 + 3, False)
    rows = t.summary(T0 + 10, percentile=highest)
    assert [(r.phase, r.name, r.count, r.failures) for r in rows if r.count] == [
        (PHASE_OUTSIDE, READ[1], 2, 1),
        (PHASE_OUTSIDE, "Aggregated", 2, 1),
    ]


def test_both_phases_always_have_an_aggregated_row() -> None:
    rows = tracker().summary(T0 + 1, percentile=highest)
    assert [(r.phase, r.name, r.count) for r in rows] == [
        (PHASE_OUTSIDE, "Aggregated", 0),
        (PHASE_IN_BURST, "Aggregated", 0),
    ]


def test_percentiles_stay_within_the_observed_minimum_and_maximum() -> None:
    t = PhaseTracker(slot_s=0.1, bucket=lambda us: (int(us) // 1000 + 1) * 1000)  # rounds up to 1 ms
    t.reset(T0)
    read(t, T0 + 1, latency_s=0.0104)
    read(t, T0 + 2, latency_s=0.0106)
    (row,) = [r for r in t.summary(T0 + 3, percentile=highest) if r.name == READ[1]]
    assert row.percentiles_ms == pytest.approx((10.6,) * 5) and row.max_ms == pytest.approx(10.6)


def test_reset_samples_keeps_the_bursts_and_restarts_the_clock() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 1)
    read(t, T0 + 1.5)
    t.reset_samples(T0 + 2)
    assert t.windows(T0 + 3) and not [r for r in t.summary(T0 + 3, percentile=highest) if r.count]
    assert t.started_at == T0 + 2


# -- distributed: worker reports ---------------------------------------------------------------------


def _through_the_wire(report: dict[str, object]) -> dict[str, object]:
    """As Locust's RPC carries it (msgpack, non-str map keys allowed)."""
    out: dict[str, object] = msgpack.unpackb(msgpack.packb(report), raw=False, strict_map_key=False)
    return out


def test_a_master_merging_worker_reports_sees_what_one_tracker_would() -> None:
    single, master = tracker(), tracker()
    workers = [PhaseTracker(slot_s=0.1, bucket=exact_us), PhaseTracker(slot_s=0.1, bucket=exact_us)]
    events = [
        ("start", 0, 1, "w000-000", T0 + 2.0),
        ("read", 1, T0 + 1.0, 0.001),
        ("read", 0, T0 + 2.5, 0.040),
        ("end", 0, 1, "w000-000", T0 + 3.0),
        ("read", 1, T0 + 2.9, 0.030),
        ("read", 0, T0 + 4.0, 0.002),
    ]
    for i, ev in enumerate(events):
        if ev[0] == "read":
            _, w, start, latency = ev
            for t in (single, workers[int(w)]):
                read(t, float(start), float(latency))
        else:
            kind, w, burst, writer, now = ev
            for t in (single, workers[int(w)]):
                if kind == "start":
                    t.burst_started(int(burst), str(writer), float(now))
                else:
                    t.burst_ended(int(burst), str(writer), float(now), size_bytes=5, ok=True)
        if i % 2:  # reports interleave with the events: a burst's start and end arrive separately
            for worker in workers:
                master.merge_report(_through_the_wire(worker.take_report()))
    for worker in workers:
        master.merge_report(_through_the_wire(worker.take_report()))

    assert master.windows(T0 + 10) == single.windows(T0 + 10)
    assert master.summary(T0 + 10, percentile=highest) == single.summary(T0 + 10, percentile=highest)
    assert rows_by_phase(master, T0 + 10)[PHASE_IN_BURST].count == 2


def test_a_worker_report_drops_what_it_sent() -> None:
    w = PhaseTracker(slot_s=0.1, bucket=exact_us)
    read(w, T0 + 1)
    w.burst_started(1, "w0", T0 + 1)
    first = w.take_report()
    assert first["cells"] and first["bursts"]
    second = w.take_report()
    assert second["cells"] == [] and second["bursts"] == []


def test_a_master_refuses_reports_binned_differently() -> None:
    w = PhaseTracker(slot_s=0.5, bucket=exact_us)
    read(w, T0 + 1)
    with pytest.raises(ValueError, match="--phase-slot-s"):
        tracker(slot_s=0.1).merge_report(w.take_report())


# -- CSV -----------------------------------------------------------------------------------------------


def test_the_csvs_have_a_header_and_one_line_per_row_and_burst() -> None:
    t = tracker()
    t.burst_started(1, "w0", T0 + 2)
    t.burst_ended(1, "w0", T0 + 4, size_bytes=8_000_000, ok=True)
    read(t, T0 + 1)
    read(t, T0 + 3)
    phases = phases_csv(t.summary(T0 + 5, percentile=highest)).splitlines()
    assert phases[0].startswith("Phase,Type,Name,Request Count,Failure Count,Requests/s")
    assert phases[0].endswith(",50%,90%,95%,99%,99.9%,Phase Seconds")
    assert len(phases) == 1 + 2 + 2  # header, one read row per phase, Aggregated per phase
    bursts = bursts_csv(t.windows(T0 + 5)).splitlines()
    assert bursts[1].split(",") == [
        "1",
        f"{T0 + 2:.3f}",
        f"{T0 + 4:.3f}",
        "2.000",
        "1",
        "0",
        "8000000",
        "4.0",
        "0",
    ]


# -- with Locust's own histogram functions (in a subprocess) -------------------------------------------


def test_percentiles_come_from_locusts_histogram_and_the_shapes_plan_user_counts() -> None:
    script = textwrap.dedent(
        """
        import json
        from loadtests.locust_phases import PhaseTracker, locust_bucket_us, locust_percentile
        from loadtests.locust_shapes import StepPlan, TrainingPlan

        t = PhaseTracker(slot_s=0.25, bucket=locust_bucket_us)
        t.reset(1000.0)
        for i in range(1, 1001):  # 0.01 ms .. 10 ms in 10 us steps
            t.record("GET", "r", 1000.0 + i / 1000, 1000.0 + i / 1000 + i * 1e-5, False)
        t.record("GET", "r", 1002.0, 1002.25, False)  # one 250 ms outlier
        row = [r for r in t.summary(1010.0, percentile=locust_percentile) if r.name == "r"][0]
        training = TrainingPlan(readers=8, writers=2, listers=1, spawn_rate=5, run_time_s=60)
        step = StepPlan(fixed=2, step_users=4, step_time_s=10, max_users=12, spawn_rate=5, run_time_s=None)
        print(json.dumps({
            "count": row.count,
            "percentiles": row.percentiles_ms,
            "max": row.max_ms,
            "buckets": [locust_bucket_us(v) for v in (7.0, 432.0, 4321.0, 54321.0, 250_400.0)],
            "training": [training.tick(s) for s in (0, 59.9, 60)],
            "step": [step.tick(s) for s in (0, 9.9, 10, 25, 39, 40)],
        }))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    out = json.loads(done.stdout)
    assert out["count"] == 1001
    p50, p90, _p95, p99, p999 = out["percentiles"]
    assert p50 == pytest.approx(5.0, rel=0.03) and p90 == pytest.approx(9.0, rel=0.03)
    assert p99 == pytest.approx(9.9, rel=0.03) and p999 == pytest.approx(10.0, rel=0.03)
    assert out["max"] == pytest.approx(250.0)
    # microsecond keys with about two significant digits below 100 ms, Locust's millisecond keys above
    assert out["buckets"] == [7, 430, 4300, 54000, 250_000]
    assert out["training"] == [[11, 5], [11, 5], None]
    assert out["step"] == [[6, 5], [6, 5], [10, 5], [12, 5], [12, 5], None]
