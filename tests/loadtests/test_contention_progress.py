"""The saturating-reader report of the contention benchmark: read share per second, backlog, durability."""

from __future__ import annotations

from typing import Any

import pytest

from loadtests.contention.report import (
    MB,
    progress_and_backlog,
    progress_markdown,
    read_shares_1s,
    writers_summary,
)
from loadtests.contention.workload import TimedBody


def wire(seconds: int, read_Bps: float, write_Bps: float) -> list[dict[str, Any]]:
    return [
        {
            "at": 100.0 + t,
            "down_bytes": read_Bps * t,
            "up_bytes": write_Bps * t,
            "backlog_bytes": 0,
            "drops": 0,
        }
        for t in range(seconds + 1)
    ]


def test_the_read_share_is_taken_per_whole_second() -> None:
    seg = {"wire": wire(10, 30e6, 10e6)}
    shares = read_shares_1s(seg, 100.0, 110.0)
    assert len(shares) == 10
    assert all(s == pytest.approx(0.75) for s in shares)
    assert read_shares_1s({"wire": []}, 100.0, 110.0) == []


def test_backlog_before_each_checkpoint_time_to_durable_and_deadline_are_reported() -> None:
    seg = {"wire": wire(80, 30e6, 10e6)}
    trainer = {
        "t0": 100.0,
        "end": 180.0,
        "wall_s": 75.0,  # reads stop at 175
        "checkpoints": [
            {"save_start": 110.0, "durable_at": 135.0, "durable_s": 25.0},
            {"save_start": 142.0, "durable_at": 170.0, "durable_s": 28.0},
        ],
    }
    samples = [
        {
            "at": 100.0 + t,
            "spool_pending_bytes": (256e6 if 111 <= 100 + t < 135 or 143 <= 100 + t < 170 else 0.0),
            "spool_deadline": {"deadline_s": 32.0, "floor_fraction": 0.26, "at_risk": t == 60},
        }
        for t in range(81)
    ]
    p = progress_and_backlog(seg, trainer, samples)
    assert p["read_share_1s_min"] == pytest.approx(0.75)
    assert p["read_share_1s_windows"] == 60  # first save to last durable
    cut = progress_and_backlog(seg, {**trainer, "wall_s": 50.0}, samples)
    assert cut["read_share_1s_windows"] == 40  # ... or to the end of the trainer's reads
    assert p["read_share_1s_below_070"] == 0
    assert p["backlog_max_MB"] == pytest.approx(256e6 / MB)
    assert p["backlog_before_ckpt_MB"] == [0.0, 0.0]
    assert p["durable_s"] == [25.0, 28.0]
    assert p["deadline_s_last"] == 32.0
    assert p["deadline_floor_max"] == pytest.approx(0.26)
    assert p["deadline_at_risk_s"] == pytest.approx(1.0)
    p["probe_p50_ms"], p["probe_p99_ms"] = 2.0, 3.0
    seg_summary = {"name": "c1", "progress": p}
    text = "\n".join(progress_markdown({"segments": [seg_summary]}))
    assert "| c1 | 0.75 | 0.75 | 0 of 60 | 256 | 0, 0 | 25, 28 | 32 | 26% | 1 | 2.0 / 3.0 |" in text


def test_a_timed_body_measures_the_pause_of_the_pass_that_is_sent() -> None:
    body = TimedBody(b"x" * 100)
    body.read()  # the signature's hashing pass
    body.seek(0)
    body.reads = [10.0, 10.1, 12.6, 12.7]  # the pass that is sent: a 2.5 s pause between two blocks
    assert body.max_gap_s() == pytest.approx(2.5)
    body.seek(0)
    assert body.reads == [] and body.max_gap_s() == 0.0
    assert body.read(10) == b"x" * 10 and len(body.reads) == 1


def test_the_writers_summary_counts_client_errors_and_the_longest_pause() -> None:
    trainer = {
        "ckpt_client": {
            "client": "botocore",
            "errors": [[5.0, "part 3 of k", "ReadTimeoutError: Read timeout on endpoint URL"]],
            "parts": [[1.0, 0.2, 0.1, 8e6], [2.0, 3.5, 0.4, 8e6], [3.0, 0.1, 9.0, 8e6]],
            "max_answer_wait_s": 9.0,
        }
    }
    w = writers_summary(trainer)
    assert (w["client"], w["client_errors"], w["parts"]) == ("botocore", 1, 3)
    assert w["body_pause_max_s"] == pytest.approx(3.5)
    assert w["answer_wait_max_s"] == pytest.approx(9.0)
    assert "ReadTimeoutError" in w["client_error_texts"][0]
    assert writers_summary({})["client"] == "aiohttp"
    assert writers_summary({})["client_errors"] == 0
