"""``bench_proxy --phases`` and the small-object phase's summary: req/s and CPU per request, both sides."""

from __future__ import annotations

import pytest

from loadtests.bench_objects import object_sets, report, rounds_of, summary
from loadtests.bench_proxy import PHASES, parse_args
from loadtests.harness.stats import Round


def test_phases_are_parsed_and_checked() -> None:
    assert parse_args([]).phases == frozenset(PHASES)
    assert parse_args(["--phases", "objects"]).phases == frozenset({"objects"})
    assert parse_args(["--phases", "large, objects"]).phases == frozenset({"large", "objects"})
    with pytest.raises(SystemExit):
        parse_args(["--phases", "objects,nonsense"])
    with pytest.raises(SystemExit):
        parse_args(["--phases", ","])


def _round(phase: str, side: str, i: int, seconds: float, gateway_s: float, store_s: float) -> Round:
    cpu = {"gateway": gateway_s, "seaweedfs": store_s, "client": 0.5, "other": 0.1}
    return Round(phase, side, i, 1000 * 16384, seconds, cpu, requests=1000)


def test_summary_gives_medians_ratios_and_cpu_per_request_of_each_process() -> None:
    s = object_sets(64)[0]
    rounds = [
        _round(s.phase, "direct", 0, 0.5, 0.0, 0.3),  # 2000 req/s, store 300 us
        _round(s.phase, "gateway", 0, 1.0, 0.4, 0.35),  # 1000 req/s, gateway 400 us, store 350 us
        _round(s.phase, "gateway", 1, 1.25, 0.5, 0.4),
        _round(s.phase, "direct", 1, 0.4, 0.0, 0.28),
        _round(s.phase, "direct", 2, 0.5, 0.0, 0.3),
        _round(s.phase, "gateway", 2, 1.0, 0.4, 0.35),
    ]
    (row,) = summary(rounds, 64)
    assert row["objects"] == "16 KiB" and row["concurrency"] == 64
    assert row["direct_rps"] == pytest.approx(2000)
    assert row["gateway_rps"] == pytest.approx(1000)
    assert row["ratio"] == pytest.approx(0.5)
    assert row["pair_ratios"] == [0.5, 0.32, 0.5]
    assert row["gateway_cpu_us"] == pytest.approx(400)
    assert row["store_cpu_us"] == {"direct": pytest.approx(300), "gateway": pytest.approx(350)}
    text = report([row], 3)
    assert "| 16 KiB | 64 | 2,000 | 1,000 | 0.50 (0.50, 0.32, 0.50) | 400 us | 300 / 350 us |" in text


def test_three_sides_alternate_order_and_the_compared_tree_is_summarised() -> None:
    sides = ("direct", "gateway", "compare")
    assert rounds_of(2, sides) == [
        (0, "direct"), (0, "gateway"), (0, "compare"), (1, "compare"), (1, "gateway"), (1, "direct"),
    ]  # fmt: skip
    assert rounds_of(2, sides[:2]) == [(0, "direct"), (0, "gateway"), (1, "gateway"), (1, "direct")]
    s = object_sets(64)[0]
    rounds = [
        _round(s.phase, "direct", 0, 0.5, 0.0, 0.3),
        _round(s.phase, "gateway", 0, 1.0, 0.4, 0.35),
        _round(s.phase, "compare", 0, 2.0, 0.5, 0.45),  # 500 req/s, 500 us of gateway CPU
    ]
    (row,) = summary(rounds, 64)
    assert row["compare"]["rps"] == pytest.approx(500)
    assert row["compare"]["ratio"] == pytest.approx(0.25)
    assert row["compare"]["gateway_cpu_pairs"] == [0.8]
    assert "| 16 KiB | 64 | 500 (0.25) | 1,000 (0.50) | 500 / 400 us | 0.80 | 450 / 350 us |" in report(
        [row], 1
    )
    assert summary(rounds[:2], 64)[0]["compare"] is None


def test_paced_direct_rounds_give_the_stores_cost_at_the_gateways_rate() -> None:
    s = object_sets(64)[0]
    rounds = [
        _round(s.phase, "direct", 0, 0.5, 0.0, 0.3),
        _round(s.phase, "gateway", 0, 1.0, 0.4, 0.6),
        _round(s.phase, "direct-paced", 0, 1.0, 0.0, 0.58),
    ]
    (row,) = summary(rounds, 64)
    assert row["paced"] == {"rps": pytest.approx(1000), "store_cpu_us": pytest.approx(580)}
    assert "| 16 KiB | 64 | 1,000 | 300 / 580 / 600 us |" in report([row], 1)


def test_mixed_rounds_compare_both_gateways_over_the_same_seconds() -> None:
    s = object_sets(64)[0]
    mixed = Round(s.phase, "mixed", 0, 1000 * 16384, 1.0, {"gateway": 0.45, "compare": 0.5, "seaweedfs": 0.6})
    mixed.requests = 1000
    rounds = [
        _round(s.phase, "direct", 0, 0.5, 0.0, 0.3),
        _round(s.phase, "gateway", 0, 1.0, 0.4, 0.35),
        _round(s.phase, "compare", 0, 2.0, 0.5, 0.45),
        mixed,
    ]
    (row,) = summary(rounds, 64)
    assert row["compare"]["mixed_cpu_us"] == {"gateway": pytest.approx(450), "compare": pytest.approx(500)}
    assert row["compare"]["mixed_pairs"] == [0.9]
    assert "| 16 KiB | 64 | 500 / 450 us | 0.90 |" in report([row], 1)
