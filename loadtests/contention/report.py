"""The contention benchmark's results: the summary (pure), the Markdown report and the PNG plots.

Theory of operation
-------------------
:func:`summarize_segment` and :func:`summarize` are pure: they take the raw records of the workload processes
and the orchestrator's samples and compute every number the report shows, with no I/O, so they can be
re-run on a kept ``results.json``/``raw/`` and tested on made-up data.

Definitions (the same for every scenario):

- **Burst window** of a checkpoint: from the start of its save until it is durable on the store. For (a),
  (b) and (e) that is the save itself (acknowledged = on the store); for (c) and (d) it runs until the flush
  API answers, because the spool's drain is when the store sees the checkpoint's bytes. A probe read belongs
  to the window its *scheduled* start falls in.
- **Outside**: reads scheduled outside every burst window and outside the ``settle_s`` after one (the FIFO
  empties then), after the first ``WARMUP_S`` of the probe (connections being opened).
- **Read share**: of the bytes that crossed the dataset store's bottleneck during burst windows, the share
  that went store -> client (read data); with one store the client -> store direction carries the
  checkpoint. Through a gateway, also the dataset lane's share of the bytes delivered by the scheduler of the
  dataset's pool (``/_s3lanes/status``). Write MB/s counts client -> store bytes on every bottleneck.
- **Separate pools** ((d), (e)): the checkpoint bucket lives on a second store behind its own
  bottleneck. Its FIFO is reported apart (``wire_ckpt``). "Unaffected" is judged against noise measured in
  the same segments: the **quiet-window band** of a scenario is the 95th percentile of the same statistic
  (pooled p99 / outside p99) computed on *quiet windows*: in each round one window of the burst's length
  placed anywhere in the outside time (sliding in 0.25 s steps), drawn ``BOOTSTRAP_RESAMPLES`` times. A
  burst lasting 2 s holds only ~40 probe reads, whose "p99" is nearly their maximum, and the loader's reads
  come in batches that collide with the probe in stretches; the band answers "how high does this ratio get
  in a window as long as the burst with no checkpoint anywhere". (d) is **unaffected** if its ratio is
  within its band. Also reported: the round-to-round spread of the outside p99 (max / min over rounds) and
  a 90% bootstrap interval of each ratio (resampling reads as if independent: it understates the noise of
  reads that queue behind each other).
- **Trainer time lost**: (time waiting for samples + time blocked in saves) / trainer wall time, both
  counted after the trainer's first ``WARMUP_S``, as for the probe: the loader's first samples wait for
  connections to open and its queue to fill, a one-off cost of starting a job, not of its checkpoints, and
  identical in every scenario. The warm-up's wait and the fraction with it counted in are reported too
  (``warmup_stall_s``, ``lost_fraction_with_warmup``); runs before this definition (2026-12-05) counted it.

Percentiles pool the samples of all rounds (p99.9 needs them); per-round figures (trainer time lost,
save times) are reported as medians over rounds or checkpoints, with every value in ``results.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.harness.stats import merge_intervals

MB = 1_000_000
WARMUP_S = 1.0
SCENARIO_LABELS = {
    "a": "(a) direct to the store",
    "b": "(b) s3lanes, lanes only",
    "c": "(c) s3lanes, lanes + spool",
    "d": "(d) separate pools, s3lanes (lanes + spool)",
    "e": "(e) separate pools, direct",
}
BOOTSTRAP_RESAMPLES = 400
BOOTSTRAP_SEED = 9
QUIET_WINDOW_STEP_S = 0.25
LANE_COLORS = {
    "dataset": "#1f77b4",
    "checkpoint": "#d62728",
    "restore": "#9467bd",
    "metadata": "#7f7f7f",
}

# The benchmark's targets.
TARGET_DIRECT_RATIO_MIN = 5.0
TARGET_LANES_RATIO_MAX = 1.5
TARGET_LOST_VS_DIRECT_MAX = 0.1
TARGET_LOST_ABS_MAX = 0.02
TARGET_SAVE_VS_DIRECT_MAX = 1 / 3


# --------------------------------------------------------------------------------------------------------
# Small pure helpers


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None without values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def at_time(series: Sequence[tuple[float, float]], t: float) -> float:
    """A cumulative counter, sampled as (time, value), linearly interpolated at ``t`` (clamped)."""
    if not series:
        return 0.0
    if t <= series[0][0]:
        return series[0][1]
    if t >= series[-1][0]:
        return series[-1][1]
    lo, hi = 0, len(series) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if series[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, v0), (t1, v1) = series[lo], series[hi]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def in_windows(series: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]) -> float:
    return sum(at_time(series, b) - at_time(series, a) for a, b in windows)


def bootstrap_ratio(
    num: Sequence[float], den: Sequence[float], q: float, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float] | None:
    """90% bootstrap interval of percentile ``q`` of ``num`` over that of ``den`` (each resampled with
    replacement, ``BOOTSTRAP_RESAMPLES`` times, from a seeded RNG: the same data give the same interval)."""
    if len(num) < 2 or len(den) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        r = ratio(percentile(rng.choices(num, k=len(num)), q), percentile(rng.choices(den, k=len(den)), q))
        if r is not None:
            ratios.append(r)
    lo, hi = percentile(ratios, 5), percentile(ratios, 95)
    return None if lo is None or hi is None else (lo, hi)


def latency_stats(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "p999_ms": percentile(values, 99.9),
        "max_ms": max(values) if values else None,
    }


# --------------------------------------------------------------------------------------------------------
# Summaries


def burst_windows(trainer: dict[str, Any]) -> list[tuple[float, float]]:
    out = []
    for c in trainer["checkpoints"]:
        end = c["durable_at"] if c["durable_at"] is not None else c["save_end"]
        out.append((float(c["save_start"]), float(end)))
    return merge_intervals(out)


def quiet_windows(
    outside: Sequence[tuple[float, float]], excluded: Sequence[tuple[float, float]], length_s: float
) -> list[list[float]]:
    """Latencies of the ``outside`` reads (scheduled at, latency) in each window of ``length_s`` that lies
    within them and overlaps no ``excluded`` span, one window every ``QUIET_WINDOW_STEP_S``."""
    if not outside or length_s <= 0:
        return []
    out: list[list[float]] = []
    t, last = outside[0][0], outside[-1][0]
    while t + length_s <= last:
        end = t + length_s
        if not any(t <= b and a <= end for a, b in excluded):
            reads = [lat for at, lat in outside if t <= at <= end]
            if reads:
                out.append(reads)
        t += QUIET_WINDOW_STEP_S
    return out


def lost_after_warmup(trainer: dict[str, Any]) -> dict[str, Any]:
    """The trainer's time lost, after its warm-up and with it. A trainer record from before the warm-up was
    kept apart (no ``warmup_stall_s``) is re-counted from its listed waits (those of ``STALL_EVENT_S`` or
    more; shorter ones in the first second stay in), so ``--rebuild-report`` puts old runs on the same
    definition."""
    if "warmup_stall_s" in trainer:
        keys = ("lost_fraction", "stall_s", "warmup_stall_s", "lost_fraction_with_warmup")
        return {k: trainer[k] for k in keys}
    wall_s = float(trainer["wall_s"])
    warm_until = float(trainer["t0"]) + WARMUP_S
    warmup_stall = sum(s for at, s in trainer.get("stall_events", []) if at < warm_until)
    stall_s = float(trainer["stall_s"]) - warmup_stall
    measured_s = wall_s - WARMUP_S
    return {
        "lost_fraction": (stall_s + float(trainer["save_s"])) / measured_s if measured_s > 0 else None,
        "stall_s": stall_s,
        "warmup_stall_s": warmup_stall,
        "lost_fraction_with_warmup": trainer["lost_fraction"],
    }


def summarize_segment(seg: dict[str, Any], settle_s: float) -> dict[str, Any]:
    probe, trainer = seg["probe"], seg["trainer"]
    windows = burst_windows(trainer)
    settles = [(b, b + settle_s) for _, b in windows]
    first_sample = probe["samples"][0][0] if probe["samples"] else 0.0
    warm_until = first_sample + WARMUP_S
    lat: dict[str, list[float]] = {"outside": [], "during": []}
    outside_reads: list[tuple[float, float]] = []
    errors = {"outside": 0, "during": 0}
    for at, latency_ms, err in probe["samples"]:
        if at < warm_until:
            continue
        if any(a <= at <= b for a, b in windows):
            group = "during"
        elif any(a < at <= b for a, b in settles):
            continue
        else:
            group = "outside"
        if err is not None or latency_ms is None:
            errors[group] += 1
        else:
            lat[group].append(float(latency_ms))
            if group == "outside":
                outside_reads.append((float(at), float(latency_ms)))

    t_start, t_end = float(trainer["t0"]), float(trainer["end"])
    burst_s = sum(b - a for a, b in windows)
    quiet_s = max(0.0, (t_end - t_start) - burst_s)
    up = [(float(w["at"]), float(w["up_bytes"])) for w in seg["wire"]]
    down = [(float(w["at"]), float(w["down_bytes"])) for w in seg["wire"]]
    up_during, down_during = in_windows(up, windows), in_windows(down, windows)
    # The checkpoint store's FIFO, when the testbed has one (idle unless the scenario uses it).
    wire_ckpt = seg.get("wire_ckpt") or []
    ckpt_up = [(float(w["at"]), float(w["up_bytes"])) for w in wire_ckpt]
    ckpt_down = [(float(w["at"]), float(w["down_bytes"])) for w in wire_ckpt]
    ckpt_up_during = in_windows(ckpt_up, windows) if ckpt_up else 0.0
    ckpt_down_during = in_windows(ckpt_down, windows) if ckpt_down else 0.0
    ckpt_backlog_during = [
        float(w["backlog_bytes"]) for w in wire_ckpt if any(a <= w["at"] <= b for a, b in windows)
    ]
    down_all = in_windows(down, [(t_start, t_end)])
    backlog = [(float(w["at"]), float(w["backlog_bytes"])) for w in seg["wire"]]
    backlog_during = [v for t, v in backlog if any(a <= t <= b for a, b in windows)]
    backlog_outside = [
        v for t, v in backlog if t_start <= t <= t_end and not any(a <= t <= b for a, b in windows)
    ]
    wire = {
        "read_share_during": ratio(down_during, up_during + down_during),
        "read_MBps_during": down_during / burst_s / MB if burst_s else None,
        "write_MBps_during": (up_during + ckpt_up_during) / burst_s / MB if burst_s else None,
        "read_MBps_outside": (down_all - down_during) / quiet_s / MB if quiet_s else None,
        "backlog_max_MB_during": max(backlog_during) / MB if backlog_during else None,
        "backlog_max_MB_outside": max(backlog_outside) / MB if backlog_outside else None,
        "drops": (seg["wire"][-1]["drops"] - seg["wire"][0]["drops"]) if seg["wire"] else 0,
        "ckpt_fifo_MBps_during": (ckpt_up_during + ckpt_down_during) / burst_s / MB
        if burst_s and wire_ckpt
        else None,
        "ckpt_fifo_backlog_max_MB_during": max(ckpt_backlog_during) / MB if ckpt_backlog_during else None,
        "ckpt_fifo_drops": (wire_ckpt[-1]["drops"] - wire_ckpt[0]["drops"]) if wire_ckpt else 0,
    }
    gateway: dict[str, Any] | None = None
    samples = trainer.get("status_samples") or []
    if samples:
        # The read share is the dataset pool's ("default"): with separate pools, its scheduler alone decides
        # how reads and writes share the dataset store.
        def lanes_of(sample: dict[str, Any]) -> dict[str, Any]:
            pools = sample.get("pools") or {}
            return dict(pools["default"]["lanes"]) if "default" in pools else dict(sample["lanes"])

        lanes = sorted({name for s in samples for name in lanes_of(s)})
        per_lane = {
            name: in_windows(
                [(s["at"], float(lanes_of(s).get(name, {}).get("delivered", 0))) for s in samples], windows
            )
            for name in lanes
        }
        total = sum(per_lane.values())
        gateway = {
            "lane_bytes_during": per_lane,
            "read_share_during": ratio(per_lane.get("dataset", 0.0), total),
            "guard_multiplier_min": min((s["guard_multiplier"] or 1.0) for s in samples),
            "reads_active_fraction_during": ratio(
                sum(1 for s in samples if s["reads_active"] and any(a <= s["at"] <= b for a, b in windows)),
                sum(1 for s in samples if any(a <= s["at"] <= b for a, b in windows)),
            ),
        }
    ckpts = trainer["checkpoints"]
    progress = progress_and_backlog(seg, trainer, samples)
    every = lat["outside"] + lat["during"]
    progress["probe_p50_ms"], progress["probe_p99_ms"] = percentile(every, 50), percentile(every, 99)
    return {
        "progress": progress,
        "name": seg["name"],
        "round": seg["round"],
        "scenario": seg["scenario"],
        "separate_pools": bool(seg.get("separate_pools")),
        "latency": {k: latency_stats(v) for k, v in lat.items()},
        "latencies_ms": lat,
        "quiet_windows_ms": quiet_windows(
            outside_reads, [(a, b + settle_s) for a, b in windows], sum(b - a for a, b in windows)
        ),
        "probe_errors": errors,
        "burst_windows_s": [[a - t_start, b - t_start] for a, b in windows],
        "save_s": [c["save_s"] for c in ckpts],
        "save_request_ms": trainer.get("save_request_ms") or {},
        "gateway_request_durations": trainer.get("gateway_request_durations") or {},
        "durable_s": [c["durable_s"] for c in ckpts],
        "checkpoint_errors": [c["error"] for c in ckpts if c["error"]],
        **lost_after_warmup(trainer),
        "saves_total_s": trainer["save_s"],
        "wall_s": trainer["wall_s"],
        "steps": trainer["steps"],
        "overhead_s": trainer["overhead_s"],
        "loader_errors": trainer["loader_errors"],
        "retries": trainer["counters"].get("retries", 0),
        "writers": writers_summary(trainer),
        "late_start_s": max(probe.get("late_start_s", 0.0), trainer.get("late_start_s", 0.0)),
        "wire": wire,
        "gateway": gateway,
        "cpu": seg.get("cpu", {}),
    }


def writers_summary(trainer: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint writers' client, its errors and (botocore) how long a connection went without moving
    a byte of a part's body (the longest pause between two blocks read by http.client) and how long it then
    waited for the answer."""
    c = trainer.get("ckpt_client") or {"client": "aiohttp"}
    parts = c.get("parts") or []
    pauses = [float(p[1]) for p in parts]
    return {
        "client": c.get("client", "aiohttp"),
        "client_errors": len(c.get("errors") or []),
        "client_error_texts": [e[2] for e in (c.get("errors") or [])][:10],
        "parts": len(parts),
        "body_pause_p50_s": percentile(pauses, 50) if pauses else None,
        "body_pause_p99_s": percentile(pauses, 99) if pauses else None,
        "body_pause_max_s": max(pauses, default=None),
        "answer_wait_max_s": c.get("max_answer_wait_s"),
    }


def writers_markdown(summary: dict[str, Any]) -> list[str]:
    """One row per segment whose checkpoint writers were botocore clients (no retries)."""
    rows = [s for s in summary.get("segments", []) if (s.get("writers") or {}).get("client") == "botocore"]
    if not rows:
        return []
    out = [
        "",
        "## Writer connections (botocore, no retries)",
        "",
        "Client errors of the checkpoint writers (every failed request: botocore's timeouts, no retries); "
        "the longest pause between two blocks of a part's body that http.client sent (the time a connection "
        "moved no bytes), p50 / p99 / max over parts; the longest wait for an answer after a body's last "
        "block; each checkpoint's save (to acknowledged) and time to durable; the read share of the link per "
        "1 s window from the first checkpoint on.",
        "",
        "| segment | client errors | parts | body pause p50 / p99 / max s | answer wait max s | save s "
        "(each) | durable s (each) | read share 1 s min / median | windows < 0.70 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        w, p = s["writers"], s["progress"]
        saves = ", ".join(f"{x:.0f}" for x in s["save_s"])
        durable = ", ".join("-" if d is None else f"{d:.0f}" for d in s["durable_s"])
        out.append(
            f"| {s['name']} | {w['client_errors']} | {w['parts']}"
            f" | {_f(w['body_pause_p50_s'])} / {_f(w['body_pause_p99_s'])} / {_f(w['body_pause_max_s'])}"
            f" | {_f(w['answer_wait_max_s'])} | {saves} | {durable}"
            f" | {_f(p['read_share_1s_min'], '.2f')} / {_f(p['read_share_1s_median'], '.2f')}"
            f" | {p['read_share_1s_below_070']} of {p['read_share_1s_windows']} |"
        )
    for s in rows:
        for text in s["writers"]["client_error_texts"]:
            out.append(f"- {s['name']}: {text}")
    return out


def read_shares_1s(seg: dict[str, Any], t0: float, t1: float) -> list[float]:
    """The read share of the bytes on the shared link in every whole second of [t0, t1) (seconds with
    nothing on the link are left out)."""
    return [r / (r + w) for r, w in link_seconds(seg, t0, t1) if r + w > 0]


def link_seconds(seg: dict[str, Any], t0: float, t1: float) -> list[tuple[float, float]]:
    """(read bytes, write bytes) on the shared link in every whole second of [t0, t1)."""
    up = [(float(w["at"]), float(w["up_bytes"])) for w in seg["wire"]]
    down = [(float(w["at"]), float(w["down_bytes"])) for w in seg["wire"]]
    if not up:
        return []
    out = []
    t = t0
    while t + 1.0 <= t1:
        out.append((at_time(down, t + 1.0) - at_time(down, t), at_time(up, t + 1.0) - at_time(up, t)))
        t += 1.0
    return out


def saturated_shares(
    seconds: Sequence[tuple[float, float]],
    reference: Sequence[tuple[float, float]] | None = None,
    fraction: float = 0.9,
) -> list[float]:
    """The read share in the seconds where the link was full: at least ``fraction`` of the 95th percentile
    of the per-second totals of ``reference`` (default: ``seconds``; the whole segment, so that a window
    mostly spent with room on the link does not set the bar), what the link carries when full. The other
    seconds have room on the link, so a low read share there is the readers' own (a client or a gateway
    short of CPU), not the writes'."""
    totals = [r + w for r, w in (seconds if reference is None else reference)]
    if not totals:
        return []
    full = percentile(totals, 95) or 0.0
    return [r / (r + w) for r, w in seconds if r + w > 0 and r + w >= fraction * full]


def progress_and_backlog(
    seg: dict[str, Any], trainer: dict[str, Any], samples: list[dict[str, Any]]
) -> dict[str, Any]:
    """The saturating-reader case: the read share per 1 s window from the first checkpoint to the last one's
    durability (or the end of the trainer's reads, if that comes first), the spool backlog over time (and
    just before each checkpoint: bounded if it does not grow from one checkpoint to the next), time to
    durable per checkpoint, and the deadline as the gateway saw it."""
    ckpts = trainer["checkpoints"]
    t0 = float(trainer["t0"])
    start = min((float(c["save_start"]) for c in ckpts), default=t0)
    ends = [float(c["durable_at"]) for c in ckpts if c.get("durable_at") is not None]
    end = max(ends) if ends else float(trainer["end"])
    if trainer.get("wall_s") is not None:  # the loaders stop with the training loop
        end = min(end, t0 + float(trainer["wall_s"]))
    seconds = link_seconds(seg, start, end)
    shares = [r / (r + w) for r, w in seconds if r + w > 0]
    whole = link_seconds(seg, t0, t0 + float(trainer.get("wall_s") or float(trainer["end"]) - t0))
    full = saturated_shares(seconds, whole or None)
    backlog = [
        (float(s["at"]), float(s["spool_pending_bytes"]))
        for s in samples
        if s.get("spool_pending_bytes") is not None
    ]
    before = []
    for c in ckpts:
        prior = [v for t, v in backlog if t <= float(c["save_start"])]
        before.append(prior[-1] / MB if prior else None)
    risk = [s for s in samples if (s.get("spool_deadline") or {}).get("at_risk")]
    floors = [f for s in samples if (f := (s.get("spool_deadline") or {}).get("floor_fraction")) is not None]
    deadlines = [d for s in samples if (d := (s.get("spool_deadline") or {}).get("deadline_s")) is not None]
    return {
        "read_share_1s_min": min(shares) if shares else None,
        "read_share_1s_median": median(shares),
        "read_share_1s_p5": percentile(shares, 5) if shares else None,
        "read_share_1s_windows": len(shares),
        "read_share_1s_below_070": sum(1 for x in shares if x < 0.70),
        "read_share_1s_full_min": min(full) if full else None,
        "read_share_1s_full_median": median(full),
        "read_share_1s_full_windows": len(full),
        "read_share_1s_full_below_070": sum(1 for x in full if x < 0.70),
        "backlog_max_MB": max(v for _, v in backlog) / MB if backlog else None,
        "backlog_before_ckpt_MB": before,
        "backlog_series": [[t - t0, v] for t, v in backlog],
        "durable_s": [c["durable_s"] for c in ckpts],
        "deadline_s_last": deadlines[-1] if deadlines else None,
        "deadline_floor_max": max(floors) if floors else None,
        "deadline_at_risk_s": len(risk) * _status_interval(samples),
    }


def _status_interval(samples: list[dict[str, Any]]) -> float:
    if len(samples) < 2:
        return 0.0
    return (float(samples[-1]["at"]) - float(samples[0]["at"])) / (len(samples) - 1)


def progress_markdown(summary: dict[str, Any]) -> list[str]:
    """The saturating-reader table: one row per segment through a gateway with a spool."""
    rows = [
        s for s in summary.get("segments", []) if (s.get("progress") or {}).get("backlog_max_MB") is not None
    ]
    if not rows:
        return []
    out = [
        "",
        "## Saturating reader with periodic checkpoints",
        "",
        "Read share of the link per 1 s window, from the first checkpoint until the last one is durable (all "
        "windows, and those where the link was full: at least 90 % of the 95th percentile of its per-second "
        "totals over the segment; elsewhere a low share is the readers' own, not the writes'); the spool's "
        "backlog (pending bytes) just before each checkpoint (bounded: it does not grow from one checkpoint "
        "to the next); time from the start of each save until it is durable on the store.",
        "",
        "| segment | read share 1 s min | median | windows < 0.70 | link full: min / median; < 0.70 "
        "| backlog max MB | backlog before each checkpoint, MB | durable s (each) | deadline s | floor max "
        "| at risk s | probe p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        p = s["progress"]
        p50, p99 = p.get("probe_p50_ms"), p.get("probe_p99_ms")
        before = ", ".join("-" if b is None else f"{b:.0f}" for b in p["backlog_before_ckpt_MB"])
        durable = ", ".join("-" if d is None else f"{d:.0f}" for d in p["durable_s"])
        out.append(
            f"| {s['name']} | {_f(p['read_share_1s_min'], '.2f')} | {_f(p['read_share_1s_median'], '.2f')}"
            f" | {p['read_share_1s_below_070']} of {p['read_share_1s_windows']}"
            f" | {_f(p.get('read_share_1s_full_min'), '.2f')}"
            f" / {_f(p.get('read_share_1s_full_median'), '.2f')};"
            f" {p.get('read_share_1s_full_below_070', '-')} of {p.get('read_share_1s_full_windows', '-')}"
            f" | {_f(p['backlog_max_MB'], '.0f')} | {before} | {durable}"
            f" | {_f(p['deadline_s_last'], '.0f')} | {_pct(p['deadline_floor_max'], 0)}"
            f" | {_f(p['deadline_at_risk_s'], '.0f')} | {_f(p50)} / {_f(p99)} |"
        )
    return out


def quiet_band(segs: list[dict[str, Any]], seed: int = BOOTSTRAP_SEED) -> float | None:
    """95th percentile of pooled p99 / outside p99 over quiet windows, one per round per draw (None if a
    round has no window as long as its burst)."""
    per_round = [s["quiet_windows_ms"] for s in segs]
    if not per_round or not all(per_round):
        return None
    outside_p99 = percentile([x for s in segs for x in s["latencies_ms"]["outside"]], 99)
    rng = random.Random(seed)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        r = ratio(percentile([x for windows in per_round for x in rng.choice(windows)], 99), outside_p99)
        if r is not None:
            ratios.append(r)
    return percentile(ratios, 95)


def summarize_scenario(segs: list[dict[str, Any]]) -> dict[str, Any]:
    pooled = {g: [x for s in segs for x in s["latencies_ms"][g]] for g in ("outside", "during")}
    lat = {g: latency_stats(v) for g, v in pooled.items()}
    saves = [x for s in segs for x in s["save_s"]]
    durables = [x for s in segs for x in s["durable_s"]]
    gw = [s["gateway"] for s in segs if s["gateway"]]
    outside_p99s = [s["latency"]["outside"]["p99_ms"] for s in segs]
    outside_known = [v for v in outside_p99s if v]
    return {
        "segments": [s["name"] for s in segs],
        "separate_pools": any(s["separate_pools"] for s in segs),
        "latency": lat,
        "p99_ratio": ratio(lat["during"]["p99_ms"], lat["outside"]["p99_ms"]),
        "p99_ratio_ci90": bootstrap_ratio(pooled["during"], pooled["outside"], 99),
        "p99_ratio_quiet_band": quiet_band(segs),
        "quiet_windows_per_round": [len(s["quiet_windows_ms"]) for s in segs],
        # how far the quiet-time p99 moved between rounds (max / min): the run's round-to-round noise
        "p99_outside_round_spread": max(outside_known) / min(outside_known)
        if len(outside_known) >= 2
        else None,
        "p99_ratio_per_round": [
            ratio(s["latency"]["during"]["p99_ms"], s["latency"]["outside"]["p99_ms"]) for s in segs
        ],
        "p99_outside_per_round_ms": [s["latency"]["outside"]["p99_ms"] for s in segs],
        "p99_during_per_round_ms": [s["latency"]["during"]["p99_ms"] for s in segs],
        "probe_errors": {g: sum(s["probe_errors"][g] for s in segs) for g in ("outside", "during")},
        "save_s_median": median(saves),
        "save_s_all": saves,
        # cumulative in the gateway: the scenario's last segment has them all
        "gateway_mean_ms": {
            op: 1000.0 * v["sum"] / v["count"]
            for op, v in (segs[-1].get("gateway_request_durations") or {}).items()
            if v.get("count")
        },
        "save_request_p50_ms": {
            kind: median([x for s in segs for x in s.get("save_request_ms", {}).get(kind, [])])
            for kind in sorted({k for s in segs for k in s.get("save_request_ms", {})})
        },
        "durable_s_median": median(durables),
        "durable_s_all": durables,
        "checkpoint_errors": [e for s in segs for e in s["checkpoint_errors"]],
        "lost_fraction_median": median([s["lost_fraction"] for s in segs]),
        "lost_fraction_per_round": [s["lost_fraction"] for s in segs],
        "stall_s_median": median([s["stall_s"] for s in segs]),
        "warmup_stall_s_median": median([s["warmup_stall_s"] for s in segs]),
        "lost_fraction_with_warmup_median": median([s["lost_fraction_with_warmup"] for s in segs]),
        "saves_total_s_median": median([s["saves_total_s"] for s in segs]),
        "wall_s_median": median([s["wall_s"] for s in segs]),
        "read_share_wire_during": median([s["wire"]["read_share_during"] for s in segs]),
        "read_share_gateway_during": median([g["read_share_during"] for g in gw]) if gw else None,
        "read_MBps_during": median([s["wire"]["read_MBps_during"] for s in segs]),
        "read_MBps_outside": median([s["wire"]["read_MBps_outside"] for s in segs]),
        "write_MBps_during": median([s["wire"]["write_MBps_during"] for s in segs]),
        "backlog_max_MB_during": max((s["wire"]["backlog_max_MB_during"] or 0.0) for s in segs),
        "backlog_max_MB_outside": max((s["wire"]["backlog_max_MB_outside"] or 0.0) for s in segs),
        "fifo_drops": sum(s["wire"]["drops"] for s in segs),
        "ckpt_fifo_MBps_during": median([s["wire"]["ckpt_fifo_MBps_during"] for s in segs]),
        "ckpt_fifo_backlog_max_MB_during": max(
            (s["wire"]["ckpt_fifo_backlog_max_MB_during"] or 0.0 for s in segs), default=0.0
        ),
        "ckpt_fifo_drops": sum(s["wire"]["ckpt_fifo_drops"] for s in segs),
        "guard_multiplier_min": min((g["guard_multiplier_min"] for g in gw), default=None),
        "loader_errors": sum(s["loader_errors"] for s in segs),
        "retries": sum(s["retries"] for s in segs),
        "client_errors": sum(s["writers"]["client_errors"] for s in segs),
        "other_cores_median": median([s["cpu"].get("other") for s in segs]),
        "late_start_s_max": max(s["late_start_s"] for s in segs),
    }


def targets(sc: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, measured: float | None, op: str, limit: float, text: str) -> None:
        met = None if measured is None else (measured >= limit if op == ">=" else measured <= limit)
        out.append({"target": name, "measured": measured, "op": op, "limit": limit, "met": met, "text": text})

    a, c = sc.get("a"), sc.get("c")
    if a:
        add("direct: read p99 during bursts / outside", a["p99_ratio"], ">=", TARGET_DIRECT_RATIO_MIN,
            "the testbed shows the problem")  # fmt: skip
    if c:
        add("s3lanes (lanes + spool): read p99 during bursts / outside", c["p99_ratio"], "<=",
            TARGET_LANES_RATIO_MAX, "reads protected")  # fmt: skip
    if a and c:
        lost_ratio = ratio(c["lost_fraction_median"], a["lost_fraction_median"])
        add("trainer time lost, s3lanes / direct", lost_ratio, "<=", TARGET_LOST_VS_DIRECT_MAX,
            "at most 1/10 of direct")  # fmt: skip
    if c:
        add("trainer time lost through s3lanes (absolute)", c["lost_fraction_median"], "<=",
            TARGET_LOST_ABS_MAX, "at most 2%")  # fmt: skip
    if a and c:
        add("checkpoint save time seen by the trainer, s3lanes / direct",
            ratio(c["save_s_median"], a["save_s_median"]), "<=", TARGET_SAVE_VS_DIRECT_MAX,
            "at most 1/3 of direct")  # fmt: skip
    return out


def noise_band(sc: dict[str, dict[str, Any]]) -> float | None:
    """The largest round-to-round spread of an outside p99 in this run (None with one round)."""
    spreads = [x["p99_outside_round_spread"] for x in sc.values() if x["p99_outside_round_spread"]]
    return max(spreads) if spreads else None


def pools_verdict(sc: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Separate pools: dataset read p99 during bursts is unaffected by the checkpoint pool's load, in (d): the
    p99 during / outside ratio within (d)'s quiet-window band (see the module docstring)."""
    d = sc.get("d")
    if d is None:
        return None
    band = d["p99_ratio_quiet_band"]
    measured = d["p99_ratio"]
    met = None if band is None or measured is None else measured <= band
    return {
        "measured": measured,
        "quiet_band": band,
        "per_round": d["p99_ratio_per_round"],
        "ci90": d["p99_ratio_ci90"],
        "outside_round_spread": noise_band(sc),
        "met": met,
    }


def summarize(segments: list[dict[str, Any]], settle_s: float) -> dict[str, Any]:
    per_seg = [summarize_segment(s, settle_s) for s in segments]
    scenarios: dict[str, dict[str, Any]] = {}
    for key in SCENARIO_LABELS:
        mine = [s for s in per_seg if s["scenario"] == key]
        if mine:
            scenarios[key] = summarize_scenario(mine)
    return {
        "scenarios": scenarios,
        "targets": targets(scenarios),
        "pools": pools_verdict(scenarios),
        "noise_band": noise_band(scenarios),
        "segments": per_seg,
    }


# --------------------------------------------------------------------------------------------------------
# Markdown


def _f(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def _drain_knob(o: dict[str, Any]) -> str:
    n = o.get("drain_concurrency")
    return "" if n is None else f" with `drain_concurrency = {n}`"


def _ckpt_pool(o: dict[str, Any]) -> str:
    mbs = o.get("ckpt_pool_mbs")
    return "same bandwidth" if mbs is None else f"`bandwidth` = {mbs:g} MB/s"


def markdown(doc: dict[str, Any]) -> str:
    o, tb, s = doc["options"], doc["testbed"], doc["summary"]
    sc = s["scenarios"]
    rounds, per = o["rounds"], o["checkpoints"]
    sample_rate = o["steps_per_s"] * o["samples_per_step"]
    lines = [
        f"## s3lanes contention benchmark ({'quick' if o['quick'] else 'full'} run, {tb['testbed']} testbed)",
        "",
        f"Command: `{doc['command']}`",
        "",
        "| testbed | |",
        "|---|---|",
        f"| topology | {tb['topology']} |",
        f"| bottleneck | one FIFO, {tb['rate_MBps']:g} MB/s, {tb['fifo_depth_MiB']:g} MiB deep "
        f"({tb['fifo_depth_ms']:g} ms at the rate), burst {tb['tbf_burst_KiB']:g} KiB |",
        f"| TCP | {tb['tcp_congestion_control']} |",
        f"| store | {tb['store']} |",
        f"| gateways | `[backend] bandwidth` = {tb['rate_MBps']:g} MB/s, default lanes and scheduler; "
        "(b) `[spool] enabled = false`, (c) spool on the local disk"
        + _drain_knob(o)
        + ", (d) as (c) + `[backends.ckpt]` (the second store, "
        + _ckpt_pool(o)
        + ") + `[[routes]]` for the checkpoint bucket |",
        "",
        "| workload | |",
        "|---|---|",
        f"| probe | {o['probe_rate']:g} range GETs/s of {o['range_kib']} KiB, open loop (latency from the "
        "scheduled start) |",
        f"| trainer | {o['steps_per_s']:g} steps/s x {o['samples_per_step']} samples of "
        f"{o['sample_kib']} KiB "
        f"({sample_rate * o['sample_kib'] * 1024 / MB:.1f} MB/s) from {o['workers']} loader workers, "
        f"prefetch {o['prefetch']} samples |",
        f"| checkpoints | {o['ckpt_mib']} MiB every {o['interval_s']:g} s (first after {o['lead_s']:g} s): "
        f"{o['ckpt_shards']} multipart objects ({o['part_mib']} MiB parts) by {o['ckpt_writers']} writers, "
        f"then `.metadata`; the trainer blocks until all are acknowledged |",
        f"| matrix | {rounds} round(s) of {', '.join(sorted(sc))} (order reversed every other round), "
        f"{per} checkpoint(s) per segment |",
        "",
        "### Read latency (probe), ms",
        "",
        "Burst = from a checkpoint's save start until it is durable on the store (for (c) and (d): until the "
        "flush API answers, i.e. while the spool drains). Percentiles pool all rounds; 90% CI: bootstrap "
        "interval of the pooled ratio.",
        "",
        "| scenario | outside p50 | outside p99 | outside p99.9 | during p50 | during p99 | during p99.9 "
        "| p99 during / outside (per round; 90% CI) | reads outside / during | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, x in sc.items():
        out, dur = x["latency"]["outside"], x["latency"]["during"]
        per_round = ", ".join(_f(v, ".2f", "x") for v in x["p99_ratio_per_round"])
        lines.append(
            f"| {SCENARIO_LABELS[key]} | {_f(out['p50_ms'])} | {_f(out['p99_ms'])} | {_f(out['p999_ms'])} "
            f"| {_f(dur['p50_ms'])} | {_f(dur['p99_ms'])} | {_f(dur['p999_ms'])} "
            f"| {_f(x['p99_ratio'], '.2f', 'x')} ({per_round}; {_ci(x['p99_ratio_ci90'])}) "
            f"| {out['n']} / {dur['n']} | {x['probe_errors']['outside'] + x['probe_errors']['during']} |"
        )
    lines += [
        "",
        "### Checkpoints, reads and the trainer",
        "",
        "| scenario | save time seen by the trainer, s | until durable on the store, s "
        "| read share during bursts: dataset FIFO / its pool's lanes | read MB/s during / outside bursts "
        "| FIFO backlog max during bursts, MB (separate pools: dataset / checkpoint FIFO) "
        "| trainer time lost (with the warm-up) | of which data stalls / saves, s per segment "
        "(warm-up wait) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, x in sc.items():
        saves = ", ".join(f"{v:.1f}" for v in x["save_s_all"])
        lines.append(
            f"| {SCENARIO_LABELS[key]} | {_f(x['save_s_median'], '.2f')} ({saves}) "
            f"| {_f(x['durable_s_median'], '.2f')} | {_pct(x['read_share_wire_during'], 0)} / "
            f"{_pct(x['read_share_gateway_during'], 0)} "
            f"| {_f(x['read_MBps_during'])} / {_f(x['read_MBps_outside'])} "
            f"| {_backlog(x)} | {_pct(x['lost_fraction_median'], 2)} "
            f"({', '.join(_pct(v, 1) for v in x['lost_fraction_per_round'])}; "
            f"{_pct(x['lost_fraction_with_warmup_median'], 2)}) "
            f"| {_f(x['stall_s_median'], '.2f')} / {_f(x['saves_total_s_median'], '.2f')} "
            f"({_f(x['warmup_stall_s_median'], '.2f')}) |"
        )
    lines += [
        "",
        "Save and durable times: median over all checkpoints (every save in brackets); trainer time lost: "
        "median over rounds (per round in brackets), of a trainer wall time of "
        f"{_f(median([x['wall_s_median'] for x in sc.values()]), '.0f')} s per segment, counted after its "
        f"first {WARMUP_S:g} s (the loader's warm-up, the same in every scenario; the fraction with it "
        "counted in follows the per-round values, its wait is in brackets in the last column).",
        "",
        "Where a save's time goes, p50 of its requests in ms (create, part, complete, marker PUT): "
        + "; ".join(
            f"{SCENARIO_LABELS[key]} "
            + " / ".join(
                _f(x["save_request_p50_ms"].get(k), ".1f") for k in ("create", "part", "complete", "PUT")
            )
            for key, x in sc.items()
            if x.get("save_request_p50_ms")
        )
        + ".",
        "",
        "The gateway's own account (mean of `s3lanes_request_duration_seconds`, checkpoint lane, "
        "all rounds), ms: "
        + "; ".join(
            f"{SCENARIO_LABELS[key]} "
            + ", ".join(f"{op} {ms:.1f}" for op, ms in sorted(x["gateway_mean_ms"].items()))
            for key, x in sc.items()
            if x.get("gateway_mean_ms")
        )
        + ".",
        "",
        "### Targets",
        "",
        "| target | measured | limit | verdict |",
        "|---|---|---|---|",
    ]
    for t in s["targets"]:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "**not met**")
        lines.append(
            f"| {t['target']} | {_f(t['measured'], '.4g')} | {t['op']} {t['limit']:.3g} | {verdict} |"
        )
    a, c = sc.get("a"), sc.get("c")
    if a and c:
        with_warmup = ratio(c["lost_fraction_with_warmup_median"], a["lost_fraction_with_warmup_median"])
        lines += [
            "",
            f"Trainer time lost is counted after the trainer's first {WARMUP_S:g} s (its loader's warm-up, "
            "the same in every scenario); with the warm-up counted in, as runs before 2026-12-05 did, "
            f"s3lanes / direct = {_f(with_warmup, '.4g')}.",
        ]
    lines += pools_markdown(s)
    lines += progress_markdown(s)
    lines += writers_markdown(s)
    lines += ["", "### Run", ""]
    noise = {k: x["other_cores_median"] for k, x in sc.items()}
    lines.append(
        "Other processes on the machine kept "
        + ", ".join(f"{_f(v, '.2f')} ({k})" for k, v in noise.items())
        + " cores busy (median over segments; includes the kernel's softirq work for the testbed's links)."
    )
    errors = {
        k: (x["checkpoint_errors"], x["loader_errors"], x["retries"], x["client_errors"])
        for k, x in sc.items()
    }
    for k, (ck, ld, rt, ce) in errors.items():
        if ck or ld or rt or ce:
            lines.append(
                f"- ({k}): checkpoint errors {len(ck)}, loader errors {ld}, write retries {rt}, "
                f"writer client errors {ce}"
            )
    for k, x in sc.items():
        if x["fifo_drops"]:
            lines.append(f"- ({k}): the FIFO dropped {x['fifo_drops']} packets (tail drop at its depth)")
        if x["separate_pools"] and x["ckpt_fifo_drops"]:
            lines.append(f"- ({k}): the checkpoint store's FIFO dropped {x['ckpt_fifo_drops']} packets")
        if x["guard_multiplier_min"] is not None and x["guard_multiplier_min"] < 1.0:
            lines.append(
                f"- ({k}): the gateway's latency guard cut the paced lanes to "
                f"{x['guard_multiplier_min']:.3g} of their rate at its lowest"
            )
    for k, g in doc.get("gateways", {}).items():
        if g.get("log_problem_lines"):
            lines.append(f"- gateway ({k}) logged {g['log_problem_lines']} warning/error lines; first ones:")
            lines += ["", "```", *g["log_problems"][:8], "```", ""]
    lines.append(f"Set-up (SeaweedFS, dataset, gateways) took {doc['setup_s']:.0f} s.")
    lines += ["", "| machine | |", "|---|---|", *[f"| {k} | {v} |" for k, v in doc["machine"].items()]]
    return "\n".join(lines) + "\n"


def _ci(ci: Sequence[float] | None) -> str:
    return "CI n/a" if ci is None else f"{ci[0]:.2f}-{ci[1]:.2f}x"


def _backlog(x: dict[str, Any]) -> str:
    if x["separate_pools"]:
        return f"{_f(x['backlog_max_MB_during'])} / {_f(x['ckpt_fifo_backlog_max_MB_during'])}"
    return _f(x["backlog_max_MB_during"])


def pools_markdown(s: dict[str, Any]) -> list[str]:
    """The separate-pools section: shared vs separate pools side by side, and the verdict for (d)."""
    sc, verdict = s["scenarios"], s["pools"]
    if not any(x["separate_pools"] for x in sc.values()):
        return []
    lines = [
        "",
        "### Separate pools",
        "",
        "(d)/(e): the checkpoint bucket on a second store behind its own FIFO (same rate and depth); the "
        "dataset on the first. Shared-pool rows for comparison.",
        "",
        "| scenario | read p50 outside / during, ms | read p99 outside / during, ms "
        "| p99 during / outside (per round; 90% CI) | quiet-window band | checkpoint store's FIFO during "
        "bursts, MB/s | until durable, s | trainer time lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, x in sc.items():
        if key == "b":
            continue
        out, dur = x["latency"]["outside"], x["latency"]["during"]
        per_round = ", ".join(_f(v, ".2f", "x") for v in x["p99_ratio_per_round"])
        fifo = _f(x["ckpt_fifo_MBps_during"]) if x["separate_pools"] else "- (one shared FIFO)"
        lines.append(
            f"| {SCENARIO_LABELS[key]} | {_f(out['p50_ms'])} / {_f(dur['p50_ms'])} "
            f"| {_f(out['p99_ms'])} / {_f(dur['p99_ms'])} "
            f"| {_f(x['p99_ratio'], '.2f', 'x')} ({per_round}; {_ci(x['p99_ratio_ci90'])}) "
            f"| {_f(x['p99_ratio_quiet_band'], '.2f', 'x')} | {fifo} "
            f"| {_f(x['durable_s_median'], '.2f')} | {_pct(x['lost_fraction_median'], 2)} |"
        )
    spread = s["noise_band"]
    lines += [
        "",
        "Quiet-window band: the 95th percentile of the same ratio over windows as long as the bursts, one "
        "per round, placed outside bursts (n/a where no such window fits). Round-to-round spread of the "
        "outside p99 (largest max/min of one scenario): "
        + ("n/a (needs 2 rounds)" if spread is None else f"{spread:.2f}x")
        + ".",
        "",
    ]
    if verdict is not None:
        text = (
            "n/a"
            if verdict["met"] is None
            else (
                "**unaffected** (within its quiet-window band)"
                if verdict["met"]
                else "**affected** (beyond its quiet-window band)"
            )
        )
        lines.append(
            f"(d) dataset read p99 during bursts / outside: {_f(verdict['measured'], '.2f', 'x')} "
            f"(quiet-window band {_f(verdict['quiet_band'], '.2f', 'x')}): {text}."
        )
    return lines


# --------------------------------------------------------------------------------------------------------
# Plots


def _shade(ax: Any, seg: dict[str, Any]) -> None:
    t0 = seg["trainer"]["t0"]
    for c in seg["trainer"]["checkpoints"]:
        a, b = c["save_start"] - t0, c["save_end"] - t0
        ax.axvspan(a, b, color="#d62728", alpha=0.25, lw=0)
        if c["durable_at"] is not None and c["durable_at"] > c["save_end"] + 0.05:
            ax.axvspan(b, c["durable_at"] - t0, color="#ff7f0e", alpha=0.15, lw=0)


def _grid(segments: list[dict[str, Any]]) -> tuple[list[str], list[int]]:
    scen = [k for k in SCENARIO_LABELS if any(s["scenario"] == k for s in segments)]
    rounds = sorted({int(s["round"]) for s in segments})
    return scen, rounds


def plot_latency(segments: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scen, rounds = _grid(segments)
    fig, axes = plt.subplots(
        len(scen), len(rounds), figsize=(6.5 * len(rounds), 2.8 * len(scen)), squeeze=False, sharey=True
    )
    for seg in segments:
        ax = axes[scen.index(seg["scenario"])][rounds.index(int(seg["round"]))]
        t0 = seg["trainer"]["t0"]
        ok = [(at - t0, lat) for at, lat, err in seg["probe"]["samples"] if lat is not None]
        bad = [at - t0 for at, lat, err in seg["probe"]["samples"] if lat is None]
        _shade(ax, seg)
        if ok:
            ax.scatter([x for x, _ in ok], [y for _, y in ok], s=4, color="#1f77b4", label="probe read")
        if bad:
            top = max((y for _, y in ok), default=1000.0)
            ax.scatter(bad, [top] * len(bad), s=12, marker="x", color="black", label="failed read")
        ax.set_yscale("log")
        ax.set_xlim(left=-1)
        ax.set_title(f"{SCENARIO_LABELS[seg['scenario']]}, round {int(seg['round']) + 1}", fontsize=9)
        ax.set_xlabel("s since the trainer started", fontsize=8)
        ax.set_ylabel("read latency, ms", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    handles = [
        Patch(color="#d62728", alpha=0.25, label="checkpoint save (trainer blocked)"),
        Patch(color="#ff7f0e", alpha=0.15, label="spool draining (until durable)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle("Probe read latency (range GETs, open loop); bursts shaded", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rates(series: list[tuple[float, float]], t0: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for (ta, va), (tb, vb) in itertools.pairwise(series):
        if tb > ta:
            xs.append((ta + tb) / 2 - t0)
            ys.append(max(0.0, (vb - va) / (tb - ta) / MB))
    return xs, ys


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    return at_time(list(zip(xs, ys, strict=True)), x) if xs else 0.0


def plot_throughput(segments: list[dict[str, Any]], rate_MBps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen, rounds = _grid(segments)
    fig, axes = plt.subplots(
        len(scen), len(rounds), figsize=(6.5 * len(rounds), 2.8 * len(scen)), squeeze=False
    )
    for seg in segments:
        ax = axes[scen.index(seg["scenario"])][rounds.index(int(seg["round"]))]
        t0 = seg["trainer"]["t0"]
        _shade(ax, seg)
        wire = seg["wire"]
        separate = bool(seg.get("separate_pools")) and bool(seg.get("wire_ckpt"))
        # the checkpoint writes' wire: the second store's FIFO with separate pools, else the shared one
        up_wire = seg["wire_ckpt"] if separate else wire
        samples = seg["trainer"].get("status_samples") or []
        if samples:
            lanes = [n for n in LANE_COLORS if any(n in s["lanes"] for s in samples)]
            stacks = []
            xs: list[float] = []
            for name in lanes:
                xs, ys = _rates(
                    [(s["at"], float(s["lanes"].get(name, {}).get("delivered", 0))) for s in samples], t0
                )
                stacks.append(ys)
            if xs:
                ax.stackplot(xs, *stacks, labels=lanes, colors=[LANE_COLORS[n] for n in lanes], alpha=0.8)
            title = (
                "gateway lanes of both pools (bytes to/from the stores)"
                if separate
                else "gateway lanes (bytes delivered to/from the store)"
            )
        else:
            xs_d, down = _rates([(w["at"], float(w["down_bytes"])) for w in wire], t0)
            xs_u, up = _rates([(w["at"], float(w["up_bytes"])) for w in up_wire], t0)
            if separate:  # two FIFOs sampled at the same ticks: align on the dataset FIFO's times
                up = [float(_interp(xs_u, up, x)) for x in xs_d]
            n = min(len(down), len(up))
            if n:
                ax.stackplot(xs_d[:n], down[:n], up[:n], labels=["dataset reads (wire, down)",
                             "checkpoint writes (wire, up)"], colors=[LANE_COLORS["dataset"],
                             LANE_COLORS["checkpoint"]], alpha=0.8)  # fmt: skip
            title = "no gateway: " + (
                "dataset FIFO down, checkpoint FIFO up" if separate else "bottleneck bytes by direction"
            )
        xw, tot = _rates([(w["at"], float(w["up_bytes"] + w["down_bytes"])) for w in wire], t0)
        ax.plot(xw, tot, color="black", lw=0.8, label="dataset FIFO total" if separate else
                "bottleneck total (wire)")  # fmt: skip
        if separate:
            xc, totc = _rates(
                [(w["at"], float(w["up_bytes"] + w["down_bytes"])) for w in seg["wire_ckpt"]], t0
            )
            ax.plot(xc, totc, color="#7f7f7f", lw=0.8, label="checkpoint FIFO total")
        ax.axhline(rate_MBps, color="black", ls=":", lw=0.8)
        if not separate:
            ax.axhline(0.3 * rate_MBps, color="#d62728", ls="--", lw=0.8, label="30% write cap")
        ax.set_title(
            f"{SCENARIO_LABELS[seg['scenario']]}, round {int(seg['round']) + 1}: {title}", fontsize=8
        )
        ax.set_xlabel("s since the trainer started", fontsize=8)
        ax.set_ylabel("MB/s", fontsize=8)
        ax.set_ylim(0, rate_MBps * (1.6 if separate else 1.25))  # two FIFOs: the sum may exceed one rate
        ax.set_xlim(left=-1)
        ax.legend(fontsize=6, loc="upper left")
        ax.grid(True, alpha=0.3)
    fig.suptitle("Backend throughput per lane, stacked (0.5 s bins); bursts shaded", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------------
# Putting it together


def build(
    *,
    command: str,
    options: dict[str, Any],
    testbed: dict[str, Any],
    machine: dict[str, str],
    segments: list[dict[str, Any]],
    gateways: dict[str, Any],
    setup_s: float,
) -> dict[str, Any]:
    summary = summarize(segments, float(options["settle_s"]))
    for seg in summary["segments"]:
        seg.pop("latencies_ms")  # in raw/, not in the summary
        seg.pop("quiet_windows_ms")
    doc: dict[str, Any] = {
        "command": command,
        "options": options,
        "testbed": testbed,
        "machine": machine,
        "gateways": gateways,
        "setup_s": setup_s,
        "summary": summary,
    }
    doc["markdown"] = markdown(doc)
    return doc


def write_all(doc: dict[str, Any], segments: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "report.md").write_text(doc["markdown"])
    if segments:
        plot_latency(segments, out / "read_latency.png")
        plot_throughput(segments, float(doc["testbed"]["rate_MBps"]), out / "lane_throughput.png")
