"""The soak script (loadtests/soak.py) works end to end, in its short CI form.

``python -m loadtests.soak --quick`` starts its own SeaweedFS and a spooling gateway, runs the Locust
training mix for 75 s while sampling the gateway, then checks durability and leaks with its quick-mode
tolerances. This test asserts that it passes its own checks and writes well-formed results; it asserts no
speed or memory figure of its own: 75 s is too short for a memory growth figure (the quick mode reports
RSS growth without judging it), and on a shared CI machine speeds mean nothing. The 30-minute run and its
figures are in docs/reliability.md ("Long runs").
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtests.soak import QUICK_WORKLOAD, Growth, fd_tolerance, growth_of, parse_duration, slope_per_hour

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 420.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TARGETS = {
    "locust_failures",
    "locust_ran_the_whole_duration",
    "deliberate_errors_as_expected",
    "rss_growth_pct",
    "fd_growth",
    "idle_fds_back_to_start",
    "thread_growth",
    "event_loop_task_growth",
    "idle_tasks_back_to_start",
    "checkpoint_flush_durable",
    "checkpoints_went_through_the_spool",
    "checkpoints_byte_exact_on_backend",
    "aborted_puts_invisible",
    "spool_empty_after_flush",
    "gateway_log_tracebacks",
    "gateway_clean_exit",
}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# -- the pure parts -----------------------------------------------------------------------------------------


def test_durations_parse_with_units() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("1.5h") == 5400
    with pytest.raises(ValueError):
        parse_duration("30 minutes")


def test_slope_is_per_hour_and_needs_three_points() -> None:
    assert slope_per_hour([(0.0, 1.0), (60.0, 2.0)]) is None
    line = [(t, 100.0 + t / 360.0) for t in (0.0, 600.0, 1200.0, 1800.0)]  # +10 per hour
    slope = slope_per_hour(line)
    assert slope is not None and slope == pytest.approx(10.0)


def test_growth_compares_window_medians_after_the_warmup() -> None:
    # a burst spike inside each window does not move the medians; the warm-up is ignored
    values = {0: 50, 10: 90, 20: 100, 30: 300, 40: 100, 50: 104, 60: 400, 70: 104}
    samples = [{"t_s": float(t), "rss_kib": v} for t, v in values.items()]
    g = growth_of(samples, "rss_kib", warmup_s=20, window_s=20, end_s=70)
    assert g == Growth(
        at_warmup_end=100,
        at_end=104,
        warmup_median=100,
        end_median=104,
        max_after_warmup=400,
        min_after_warmup=100,
    )
    assert g.growth_pct == pytest.approx(4.0)


def test_fd_tolerance_is_one_bursts_worth_of_connections() -> None:
    w = QUICK_WORKLOAD
    assert fd_tolerance(w) == w.ckpt_writers * w.ckpt_part_concurrency + 8


# -- the quick run ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("soak") / "out"
    cmd = [sys.executable, "-m", "loadtests.soak", "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    assert "## Soak (quick) OK" in proc.stdout
    return out


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_quick_soak_meets_its_targets_and_writes_a_well_formed_summary(quick_run: Path) -> None:
    s = json.loads((quick_run / "summary.json").read_text())
    assert s["ok"] is True and s["quick"] is True
    assert set(s["targets"]) == TARGETS
    assert all(t["ok"] for t in s["targets"].values()), s["targets"]
    assert "report only" in s["targets"]["rss_growth_pct"]["limit"]

    loc = s["locust"]
    assert loc["failures_total"] == 0 and loc["failures"] == []
    for name in (
        "GET GET dataset range",
        "GET LIST dataset page",
        "HEAD HEAD dataset object",
        "POST POST create multipart",
        "PUT PUT part",
        "POST POST complete multipart",
    ):
        assert loc["by_type"][name]["requests"] > 0, name
    assert loc["bursts"]["count"] >= 2
    assert min(s["deliberate_errors"]["sent"].values()) > 0 and s["deliberate_errors"]["unexpected"] == []

    for key in ("at_warmup_end", "at_end", "warmup_window_median", "end_window_median", "max_after_warmup"):
        assert _number(s["rss_mib"][key]) and s["rss_mib"][key] > 10, key
    assert _number(s["rss_mib"]["growth_pct"]) and _number(s["rss_mib"]["slope_mib_per_h"])
    assert s["fds"]["warmup_median"] > 0 and s["threads"]["warmup_median"] > 0
    # the gateway's own tasks (server, drainer, timers) are always there: a count of 0 would mean none read
    assert s["event_loop_tasks"]["warmup_median"] > 0
    assert s["idle"]["before"]["event_loop_tasks"] > 0 and s["idle"]["after"]["event_loop_tasks"] > 0

    ledger = s["checks"]["ledger"]
    assert ledger["acknowledged"] >= 2 and ledger["on_backend_byte_exact"] == ledger["acknowledged"]
    assert s["checks"]["flush"]["durable"] is True
    assert s["gateway_log"]["tracebacks"] == 0 and s["gateway_exit"] == 0


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_quick_soak_writes_samples_plot_ledger_and_locust_csvs(quick_run: Path) -> None:
    with open(quick_run / "samples.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    phases = [r["phase"] for r in rows]
    assert phases[0] == "idle_before" and phases[-2:] == ["after_flush", "idle_after"]
    run_rows = [r for r in rows if r["phase"] == "run"]
    assert len(run_rows) >= 20
    for r in run_rows:
        assert int(r["rss_kib"]) > 0 and int(r["fds"]) > 0 and int(r["threads"]) > 0
        assert int(r["event_loop_tasks"]) > 0
        assert r["spool_pending_bytes"] != "" and r["drain_in_flight"] != ""
    assert [float(r["t_s"]) for r in run_rows] == sorted(float(r["t_s"]) for r in run_rows)

    assert (quick_run / "soak.png").read_bytes()[:8] == PNG_MAGIC
    entries = [json.loads(ln) for ln in (quick_run / "ledger.jsonl").read_text().splitlines()]
    assert entries and all(e["etag_returned"] == e["etag_expected"] for e in entries)
    for name in ("locust_stats.csv", "locust_failures.csv", "locust_bursts.csv", "gateway.log", "summary.md"):
        assert (quick_run / name).is_file(), name
