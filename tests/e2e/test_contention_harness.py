"""The contention benchmark harness works end to end (issues 6 and 9): no speed assertions, only well-formed
output.

Runs ``python -m loadtests.contention --quick --testbed model`` (no root: two SeaweedFS behind asyncio FIFO
relays, three gateways, the whole a-e matrix once, (d) and (e) with the checkpoint bucket on the second
store) into a temporary directory and checks that the report, the plots and the JSON are there and hold
numbers for every scenario. What the numbers say is for
``docs/benchmarks.md``; on a shared CI machine they mean nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 170.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROW_PREFIXES = {
    "a": "| (a) direct to the store |",
    "b": "| (b) s3lanes, lanes only |",
    "c": "| (c) s3lanes, lanes + spool |",
    "d": "| (d) separate pools, s3lanes (lanes + spool) |",
    "e": "| (e) separate pools, direct |",
}
# Rows per scenario: the latency table, the trainer table, and (all but (b)) the issue-9 table.
ROWS = {"a": 3, "b": 2, "c": 3, "d": 3, "e": 3}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contention") / "out"
    cmd = [sys.executable, "-m", "loadtests.contention", "--quick", "--testbed", "model", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return out


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_quick_model_run_writes_a_report_with_a_row_per_scenario(quick_run: Path) -> None:
    text = (quick_run / "report.md").read_text()
    for key, prefix in ROW_PREFIXES.items():
        rows = [ln for ln in text.splitlines() if ln.startswith(prefix)]
        assert len(rows) == ROWS[key], f"{prefix!r}: one row in each table it belongs in"
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert all(cells), row
            assert any(ch.isdigit() for ch in "".join(cells[1:])), row
    assert "### Targets" in text
    assert "### Separate pools" in text
    assert "(d) dataset read p99 during bursts / outside:" in text
    assert "model testbed" in text


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_quick_model_run_draws_both_plots(quick_run: Path) -> None:
    for name in ("read_latency.png", "lane_throughput.png"):
        data = (quick_run / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 10_000, f"{name} is {len(data)} bytes: an empty figure?"


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_quick_model_run_records_numbers_for_every_scenario(quick_run: Path) -> None:
    doc = json.loads((quick_run / "results.json").read_text())
    assert doc["testbed"]["testbed"] == "model"
    assert _number(doc["testbed"]["rate_MBps"]) and _number(doc["testbed"]["fifo_depth_MiB"])
    assert doc["command"].startswith("python -m loadtests.contention")
    scenarios = doc["summary"]["scenarios"]
    assert set(scenarios) == set(ROW_PREFIXES)
    assert doc["testbed"]["stores"] == 2
    for key, x in scenarios.items():
        for group in ("outside", "during"):
            lat = x["latency"][group]
            assert lat["n"] > 0, (key, group)
            for q in ("p50_ms", "p99_ms", "p999_ms"):
                assert _number(lat[q]) and lat[q] > 0, (key, group, q)
        for name in (
            "save_s_median",
            "durable_s_median",
            "lost_fraction_median",
            "lost_fraction_with_warmup_median",
            "read_share_wire_during",
        ):
            assert _number(x[name]), (key, name, x[name])
        assert x["durable_s_median"] >= x["save_s_median"], key
        assert x["checkpoint_errors"] == [], key
        assert x["probe_errors"] == {"outside": 0, "during": 0}, key
    # Through a gateway, the lanes' byte counters were sampled; the spool's checkpoint became durable.
    for key in ("b", "c", "d"):
        assert _number(scenarios[key]["read_share_gateway_during"]), key
    # With separate pools the checkpoint went through the second store's FIFO; with one store it did not.
    for key in ("d", "e"):
        assert scenarios[key]["separate_pools"], key
        assert (
            _number(scenarios[key]["ckpt_fifo_MBps_during"]) and scenarios[key]["ckpt_fifo_MBps_during"] > 0
        )
    for key in ("a", "b", "c"):
        assert not scenarios[key]["separate_pools"], key
    targets = doc["summary"]["targets"]
    assert len(targets) == 5
    assert all(_number(t["measured"]) and isinstance(t["met"], bool) for t in targets)
    # The separate pools' verdict: (d)'s ratio against its quiet-window band (windows as long as its burst,
    # outside bursts); the round-to-round spread needs two rounds.
    pools = doc["summary"]["pools"]
    assert _number(pools["measured"]) and _number(pools["quiet_band"]) and isinstance(pools["met"], bool)
    assert pools["outside_round_spread"] is None
    assert scenarios["d"]["quiet_windows_per_round"][0] > 0


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_quick_model_run_keeps_raw_records_and_gateway_logs(quick_run: Path) -> None:
    raw = quick_run / "raw"
    for key in ROW_PREFIXES:
        for name in ("probe.json", "trainer.json", "segment.json"):
            assert (raw / f"r0-{key}" / name).is_file(), f"r0-{key}/{name}"
    for key in ("b", "c", "d"):
        assert (raw / f"gateway-{key}.log").is_file(), key
    # (d)'s gateway was configured with the second store as a named backend and a route to it.
    doc = json.loads((quick_run / "results.json").read_text())
    config = doc["gateways"]["d"]["config"]
    assert "[backends.ckpt]" in config and "[[routes]]" in config
    # (d)'s trainer saw both pools' schedulers in /_s3lanes/status.
    trainer = json.loads((raw / "r0-d" / "trainer.json").read_text())
    assert {"default", "ckpt"} <= set(trainer["status_samples"][-1]["pools"])


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_rebuild_report_recomputes_the_same_summary_from_raw_records(quick_run: Path) -> None:
    before = json.loads((quick_run / "results.json").read_text())
    cmd = [sys.executable, "-m", "loadtests.contention", "--rebuild-report", str(quick_run)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    after = json.loads((quick_run / "results.json").read_text())
    assert after["summary"] == before["summary"]
    assert after["command"] == before["command"]
