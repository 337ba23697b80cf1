"""The contention benchmark's results: the summary (pure), the Markdown report and the PNG plots.

Theory of operation
-------------------
:func:`summarize_segment` and :func:`summarize` are pure: they take the raw records of the workload processes
and the orchestrator's samples and compute every number the report shows, with no I/O, so they can be
re-run on a kept ``results.json``/``raw/`` and tested on made-up data.

Definitions (the same for every scenario):

- **Burst window** of a checkpoint: from the start of its save until it is durable on the store. For (a)
  and (b) that is the save itself (acknowledged = on the store); for (c) it runs until the flush API
  answers, because the spool's drain is when the store sees the checkpoint's bytes. A probe read belongs
  to the window its *scheduled* start falls in.
- **Outside**: reads scheduled outside every burst window and outside the ``settle_s`` after one (the FIFO
  empties then), after the first ``WARMUP_S`` of the probe (connections being opened).
- **Read share**: of the bytes that crossed the bottleneck during burst windows, the share that went
  store -> client (read data); the client -> store direction carries the checkpoint. Through a gateway,
  also the dataset lane's share of the bytes the gateway's scheduler saw delivered (``/_s3lanes/status``).
- **Trainer time lost**: (time waiting for samples + time blocked in saves) / trainer wall time.

Percentiles pool the samples of all rounds (p99.9 needs them); per-round figures (trainer time lost,
save times) are reported as medians over rounds or checkpoints, with every value in ``results.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MB = 1_000_000
WARMUP_S = 1.0
SCENARIO_LABELS = {
    "a": "(a) direct to the store",
    "b": "(b) s3lanes, lanes only",
    "c": "(c) s3lanes, lanes + spool",
}
LANE_COLORS = {
    "dataset": "#1f77b4",
    "checkpoint": "#d62728",
    "restore": "#9467bd",
    "metadata": "#7f7f7f",
}

# Targets of issue 6.
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


def merge_windows(windows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


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
    return merge_windows(out)


def summarize_segment(seg: dict[str, Any], settle_s: float) -> dict[str, Any]:
    probe, trainer = seg["probe"], seg["trainer"]
    windows = burst_windows(trainer)
    settles = [(b, b + settle_s) for _, b in windows]
    first_sample = probe["samples"][0][0] if probe["samples"] else 0.0
    warm_until = first_sample + WARMUP_S
    lat: dict[str, list[float]] = {"outside": [], "during": []}
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

    t_start, t_end = float(trainer["t0"]), float(trainer["end"])
    burst_s = sum(b - a for a, b in windows)
    quiet_s = max(0.0, (t_end - t_start) - burst_s)
    up = [(float(w["at"]), float(w["up_bytes"])) for w in seg["wire"]]
    down = [(float(w["at"]), float(w["down_bytes"])) for w in seg["wire"]]
    up_during, down_during = in_windows(up, windows), in_windows(down, windows)
    down_all = in_windows(down, [(t_start, t_end)])
    backlog = [(float(w["at"]), float(w["backlog_bytes"])) for w in seg["wire"]]
    backlog_during = [v for t, v in backlog if any(a <= t <= b for a, b in windows)]
    backlog_outside = [
        v for t, v in backlog if t_start <= t <= t_end and not any(a <= t <= b for a, b in windows)
    ]
    wire = {
        "read_share_during": ratio(down_during, up_during + down_during),
        "read_MBps_during": down_during / burst_s / MB if burst_s else None,
        "write_MBps_during": up_during / burst_s / MB if burst_s else None,
        "read_MBps_outside": (down_all - down_during) / quiet_s / MB if quiet_s else None,
        "backlog_max_MB_during": max(backlog_during) / MB if backlog_during else None,
        "backlog_max_MB_outside": max(backlog_outside) / MB if backlog_outside else None,
        "drops": (seg["wire"][-1]["drops"] - seg["wire"][0]["drops"]) if seg["wire"] else 0,
    }
    gateway: dict[str, Any] | None = None
    samples = trainer.get("status_samples") or []
    if samples:
        lanes = sorted({name for s in samples for name in s["lanes"]})
        per_lane = {
            name: in_windows(
                [(s["at"], float(s["lanes"].get(name, {}).get("delivered", 0))) for s in samples], windows
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
    return {
        "name": seg["name"],
        "round": seg["round"],
        "scenario": seg["scenario"],
        "latency": {k: latency_stats(v) for k, v in lat.items()},
        "latencies_ms": lat,
        "probe_errors": errors,
        "burst_windows_s": [[a - t_start, b - t_start] for a, b in windows],
        "save_s": [c["save_s"] for c in ckpts],
        "durable_s": [c["durable_s"] for c in ckpts],
        "checkpoint_errors": [c["error"] for c in ckpts if c["error"]],
        "lost_fraction": trainer["lost_fraction"],
        "stall_s": trainer["stall_s"],
        "saves_total_s": trainer["save_s"],
        "wall_s": trainer["wall_s"],
        "steps": trainer["steps"],
        "overhead_s": trainer["overhead_s"],
        "loader_errors": trainer["loader_errors"],
        "retries": trainer["counters"].get("retries", 0),
        "late_start_s": max(probe.get("late_start_s", 0.0), trainer.get("late_start_s", 0.0)),
        "wire": wire,
        "gateway": gateway,
        "cpu": seg.get("cpu", {}),
    }


def summarize_scenario(segs: list[dict[str, Any]]) -> dict[str, Any]:
    pooled = {g: [x for s in segs for x in s["latencies_ms"][g]] for g in ("outside", "during")}
    lat = {g: latency_stats(v) for g, v in pooled.items()}
    saves = [x for s in segs for x in s["save_s"]]
    durables = [x for s in segs for x in s["durable_s"]]
    gw = [s["gateway"] for s in segs if s["gateway"]]
    return {
        "segments": [s["name"] for s in segs],
        "latency": lat,
        "p99_ratio": ratio(lat["during"]["p99_ms"], lat["outside"]["p99_ms"]),
        "p99_ratio_per_round": [
            ratio(s["latency"]["during"]["p99_ms"], s["latency"]["outside"]["p99_ms"]) for s in segs
        ],
        "p99_outside_per_round_ms": [s["latency"]["outside"]["p99_ms"] for s in segs],
        "p99_during_per_round_ms": [s["latency"]["during"]["p99_ms"] for s in segs],
        "probe_errors": {g: sum(s["probe_errors"][g] for s in segs) for g in ("outside", "during")},
        "save_s_median": median(saves),
        "save_s_all": saves,
        "durable_s_median": median(durables),
        "durable_s_all": durables,
        "checkpoint_errors": [e for s in segs for e in s["checkpoint_errors"]],
        "lost_fraction_median": median([s["lost_fraction"] for s in segs]),
        "lost_fraction_per_round": [s["lost_fraction"] for s in segs],
        "stall_s_median": median([s["stall_s"] for s in segs]),
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
        "guard_multiplier_min": min((g["guard_multiplier_min"] for g in gw), default=None),
        "loader_errors": sum(s["loader_errors"] for s in segs),
        "retries": sum(s["retries"] for s in segs),
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


def summarize(segments: list[dict[str, Any]], settle_s: float) -> dict[str, Any]:
    per_seg = [summarize_segment(s, settle_s) for s in segments]
    scenarios: dict[str, dict[str, Any]] = {}
    for key in ("a", "b", "c"):
        mine = [s for s in per_seg if s["scenario"] == key]
        if mine:
            scenarios[key] = summarize_scenario(mine)
    return {"scenarios": scenarios, "targets": targets(scenarios), "segments": per_seg}


# --------------------------------------------------------------------------------------------------------
# Markdown


def _f(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


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
        "(b) `[spool] enabled = false`, (c) spool on the local disk |",
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
        "Burst = from a checkpoint's save start until it is durable on the store (for (c): until the flush "
        "API answers, i.e. while the spool drains). Percentiles pool all rounds.",
        "",
        "| scenario | outside p50 | outside p99 | outside p99.9 | during p50 | during p99 | during p99.9 "
        "| p99 during / outside | reads outside / during | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, x in sc.items():
        out, dur = x["latency"]["outside"], x["latency"]["during"]
        lines.append(
            f"| {SCENARIO_LABELS[key]} | {_f(out['p50_ms'])} | {_f(out['p99_ms'])} | {_f(out['p999_ms'])} "
            f"| {_f(dur['p50_ms'])} | {_f(dur['p99_ms'])} | {_f(dur['p999_ms'])} "
            f"| {_f(x['p99_ratio'], '.2f', 'x')} "
            f"| {out['n']} / {dur['n']} | {x['probe_errors']['outside'] + x['probe_errors']['during']} |"
        )
    lines += [
        "",
        "### Checkpoints, reads and the trainer",
        "",
        "| scenario | save time seen by the trainer, s | until durable on the store, s "
        "| read share during bursts: wire / gateway lanes | read MB/s during / outside bursts "
        "| FIFO backlog max during bursts, MB "
        "| trainer time lost | of which data stalls / saves, s per segment |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, x in sc.items():
        saves = ", ".join(f"{v:.1f}" for v in x["save_s_all"])
        lines.append(
            f"| {SCENARIO_LABELS[key]} | {_f(x['save_s_median'], '.2f')} ({saves}) "
            f"| {_f(x['durable_s_median'], '.2f')} | {_pct(x['read_share_wire_during'], 0)} / "
            f"{_pct(x['read_share_gateway_during'], 0)} "
            f"| {_f(x['read_MBps_during'])} / {_f(x['read_MBps_outside'])} "
            f"| {_f(x['backlog_max_MB_during'])} | {_pct(x['lost_fraction_median'], 2)} "
            f"({', '.join(_pct(v, 1) for v in x['lost_fraction_per_round'])}) "
            f"| {_f(x['stall_s_median'], '.2f')} / {_f(x['saves_total_s_median'], '.2f')} |"
        )
    lines += [
        "",
        "Save and durable times: median over all checkpoints (every save in brackets); trainer time lost: "
        "median over rounds (per round in brackets), of a trainer wall time of "
        f"{_f(median([x['wall_s_median'] for x in sc.values()]), '.0f')} s per segment.",
        "",
        "### Targets (issue 6)",
        "",
        "| target | measured | limit | verdict |",
        "|---|---|---|---|",
    ]
    for t in s["targets"]:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "**not met**")
        lines.append(
            f"| {t['target']} | {_f(t['measured'], '.4g')} | {t['op']} {t['limit']:.3g} | {verdict} |"
        )
    lines += ["", "### Run", ""]
    noise = {k: x["other_cores_median"] for k, x in sc.items()}
    lines.append(
        "Other processes on the machine kept "
        + ", ".join(f"{_f(v, '.2f')} ({k})" for k, v in noise.items())
        + " cores busy (median over segments; includes the kernel's softirq work for the testbed's links)."
    )
    errors = {k: (x["checkpoint_errors"], x["loader_errors"], x["retries"]) for k, x in sc.items()}
    for k, (ck, ld, rt) in errors.items():
        if ck or ld or rt:
            lines.append(f"- ({k}): checkpoint errors {len(ck)}, loader errors {ld}, write retries {rt}")
    for k, x in sc.items():
        if x["fifo_drops"]:
            lines.append(f"- ({k}): the FIFO dropped {x['fifo_drops']} packets (tail drop at its depth)")
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
    scen = [k for k in ("a", "b", "c") if any(s["scenario"] == k for s in segments)]
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


def plot_throughput(segments: list[dict[str, Any]], rate_MBps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen, rounds = _grid(segments)
    fig, axes = plt.subplots(
        len(scen), len(rounds), figsize=(6.5 * len(rounds), 2.8 * len(scen)), squeeze=False, sharey=True
    )
    for seg in segments:
        ax = axes[scen.index(seg["scenario"])][rounds.index(int(seg["round"]))]
        t0 = seg["trainer"]["t0"]
        _shade(ax, seg)
        wire = seg["wire"]
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
            title = "gateway lanes (bytes delivered to/from the store)"
        else:
            xs_d, down = _rates([(w["at"], float(w["down_bytes"])) for w in wire], t0)
            _, up = _rates([(w["at"], float(w["up_bytes"])) for w in wire], t0)
            n = min(len(down), len(up))
            if n:
                ax.stackplot(xs_d[:n], down[:n], up[:n], labels=["dataset reads (wire, down)",
                             "checkpoint writes (wire, up)"], colors=[LANE_COLORS["dataset"],
                             LANE_COLORS["checkpoint"]], alpha=0.8)  # fmt: skip
            title = "no gateway: bottleneck bytes by direction"
        xw, tot = _rates([(w["at"], float(w["up_bytes"] + w["down_bytes"])) for w in wire], t0)
        ax.plot(xw, tot, color="black", lw=0.8, label="bottleneck total (wire)")
        ax.axhline(rate_MBps, color="black", ls=":", lw=0.8)
        ax.axhline(0.3 * rate_MBps, color="#d62728", ls="--", lw=0.8, label="30% write cap")
        ax.set_title(
            f"{SCENARIO_LABELS[seg['scenario']]}, round {int(seg['round']) + 1}: {title}", fontsize=8
        )
        ax.set_xlabel("s since the trainer started", fontsize=8)
        ax.set_ylabel("MB/s", fontsize=8)
        ax.set_ylim(0, rate_MBps * 1.25)
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
