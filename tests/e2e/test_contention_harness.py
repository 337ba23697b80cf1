"""The contention benchmark harness works end to end (issue 6): no speed assertions, only well-formed output.

Runs ``python -m loadtests.contention --quick --testbed model`` (no root: SeaweedFS behind the asyncio FIFO
relay, two gateways, the whole a/b/c matrix once) into a temporary directory and checks that the report, the
plots and the JSON are there and hold numbers for every scenario. What the numbers say is for
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
}


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
    for prefix in ROW_PREFIXES.values():
        rows = [ln for ln in text.splitlines() if ln.startswith(prefix)]
        assert len(rows) == 2, f"{prefix!r}: one row in the latency table and one in the trainer table"
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert all(cells), row
            assert any(ch.isdigit() for ch in "".join(cells[1:])), row
    assert "### Targets (issue 6)" in text
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
    assert set(scenarios) == {"a", "b", "c"}
    for key, x in scenarios.items():
        for group in ("outside", "during"):
            lat = x["latency"][group]
            assert lat["n"] > 0, (key, group)
            for q in ("p50_ms", "p99_ms", "p999_ms"):
                assert _number(lat[q]) and lat[q] > 0, (key, group, q)
        for name in ("save_s_median", "durable_s_median", "lost_fraction_median", "read_share_wire_during"):
            assert _number(x[name]), (key, name, x[name])
        assert x["durable_s_median"] >= x["save_s_median"], key
        assert x["checkpoint_errors"] == [], key
        assert x["probe_errors"] == {"outside": 0, "during": 0}, key
    # Through a gateway, the lanes' byte counters were sampled; the spool's checkpoint became durable.
    for key in ("b", "c"):
        assert _number(scenarios[key]["read_share_gateway_during"]), key
    targets = doc["summary"]["targets"]
    assert len(targets) == 5
    assert all(_number(t["measured"]) and isinstance(t["met"], bool) for t in targets)


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_quick_model_run_keeps_raw_records_and_gateway_logs(quick_run: Path) -> None:
    raw = quick_run / "raw"
    for seg in ("r0-a", "r0-b", "r0-c"):
        for name in ("probe.json", "trainer.json", "segment.json"):
            assert (raw / seg / name).is_file(), f"{seg}/{name}"
    assert (raw / "gateway-b.log").is_file() and (raw / "gateway-c.log").is_file()
