"""The contention benchmark's orchestration: the matrix (a) direct, (b) lanes only, (c) lanes + spool, and
with storage pools: (d) separate pools through s3lanes, (e) separate pools direct.

Run it as ``python -m loadtests.contention`` (``make bench-contention``); ``--help`` lists the knobs,
``--quick`` is a small run of under a minute (CI runs it with ``--testbed model``). Results go to
``--out`` (default ``results/contention-<UTC timestamp>/``): ``report.md``, ``results.json``,
``read_latency.png``, ``lane_throughput.png``, and ``raw/`` with every process's own numbers and logs.

Theory of operation
-------------------
1. The testbed (:mod:`.testbed`) builds the shared bottleneck and starts SeaweedFS behind it; with (d) or
   (e) in the matrix, also a second SeaweedFS behind a second bottleneck of the same rate and depth (the
   checkpoint pool). The dataset is loaded at full speed first; then the bottlenecks go into the path.
2. The gateways start on the client side (it is the node-local gateway), each with ``[backend] bandwidth``
   = the testbed's rate and the default lanes: (b) with ``[spool] enabled = false``, (c) with the spool in a
   directory on the local disk, (d) as (c) plus ``[backends.ckpt]`` (the second store, same bandwidth) and a
   ``[[routes]]`` entry sending the checkpoint bucket there. They stay up for the whole run; only one is used
   at a time. (e) sends the trainer's checkpoints straight to the second store, its reads to the first.
3. The matrix runs in ``--rounds`` rounds, each one *segment* per scenario, in the order a, b, c, d, e and
   then e, d, c, b, a (so slow drift of a shared machine hits every scenario alike). A segment starts a
   probe and a trainer (:mod:`.workload`) against the scenario's endpoint at the same instant, lets the
   trainer run ``--lead-s`` and then ``--checkpoints`` checkpoint intervals, waits until its last
   checkpoint is durable, keeps probing ``--tail-s`` longer, and stops. Meanwhile this process samples
   each bottleneck's counters (bytes per direction, FIFO backlog) and the CPU of every process of ours and
   of the machine every ``SAMPLE_INTERVAL_S``, and shows a progress bar.
4. :mod:`.report` turns the raw segments into the summary (pure), the Markdown table and the plots.

Everything runs under one ``try/finally``: gateways, probes, trainers, the relay and SeaweedFS are stopped
by pid, and the namespaces deleted, on success, on error, on Ctrl-C and on SIGTERM/SIGHUP (``atexit`` as a
last resort). The workload processes run the same seeds in every scenario of a round, so all scenarios see
the same reads and the same checkpoint bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from loadtests.contention import report
from loadtests.contention.testbed import (
    ACCESS_KEY,
    CHECKPOINT_BUCKET,
    DATASET_BUCKET,
    LINK_CKPT,
    LINK_DATA,
    MB,
    MIB,
    REGION,
    SECRET_KEY,
    BottleneckSpec,
    Child,
    Testbed,
    TestbedError,
    log_tail,
    make_testbed,
    spawn,
    wait_ready_file,
)
from loadtests.harness.gateway import GATEWAY_SOURCE, server_toml
from loadtests.harness.machine import cpu_seconds, machine_busy_seconds, machine_facts

KIB = 1024
SAMPLE_INTERVAL_S = 0.5
START_MARGIN_S = 2.5  # between spawning a segment's probe and trainer and their common start
QUICK_START_MARGIN_S = 1.5  # --quick: five segments in under a minute (the processes start in < 1 s)
GATEWAY_START_TIMEOUT_S = 60.0
SETUP_TIMEOUT_S = 300.0
PROBE_STOP_TIMEOUT_S = 45.0
SETTLE_BACKLOG_BYTES = 64 * KIB
SETTLE_MAX_S = 20.0
SETTLE_MIN_S = 1.5
QUICK_SETTLE_MIN_S = 0.5

SCENARIOS: dict[str, str] = {
    "a": "direct to the store",
    "b": "s3lanes, lanes only (spool off)",
    "c": "s3lanes, lanes + spool",
    "d": "separate pools: s3lanes (lanes + spool), checkpoint bucket routed to a second store",
    "e": "separate pools, direct: dataset on the first store, checkpoints on the second",
}
# Scenario -> whether its gateway spools (the scenarios without one go direct to the store).
GATEWAY_SPOOL = {"b": False, "c": True, "d": True}
# Scenarios with the checkpoint bucket on a second store behind its own bottleneck (storage pools).
SEPARATE_POOLS = frozenset("de")
CKPT_BACKEND = "ckpt"  # the [backends.<name>] of (d)


class BenchError(RuntimeError):
    """The run is void: a process failed, a segment timed out."""


# --------------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class Options:
    quick: bool
    saturating: bool
    testbed: str
    out: Path
    scenarios: tuple[str, ...]
    rate_mbs: float
    fifo_mib: float
    rounds: int
    checkpoints: int
    lead_s: float
    interval_s: float
    tail_s: float
    settle_s: float
    ckpt_mib: int
    ckpt_shards: int
    part_mib: int
    ckpt_writers: int
    ckpt_client: str
    boto_connect_timeout_s: float
    boto_read_timeout_s: float
    probe_rate: float
    range_kib: int
    steps_per_s: float
    samples_per_step: int
    sample_kib: int
    workers: int
    prefetch: int
    dataset_objects: int
    dataset_mib: int
    segment_timeout_s: float
    gateway_toml: Path | None
    ckpt_pool_mbs: float | None  # (d)'s [backends.ckpt] bandwidth; None: the testbed's rate
    drain_concurrency: int | None  # [spool] drain_concurrency of (c) and (d); None: the gateway's default
    keep_tmp: bool
    progress: bool | None
    rebuild_report: Path | None

    def as_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.contention",
        description="Dataset reads against checkpoint bursts on a shared bottleneck: direct, through s3lanes "
        "with lanes only, and with lanes + spool, side by side.",
    )
    p.add_argument("--quick", action="store_true", help="a small run (under a minute): harness check only")
    p.add_argument(
        "--saturating",
        action="store_true",
        help="the saturating-reader case: the loader reads as fast as the link allows (1000 steps/s, 16 "
        "workers, 1 MiB samples) while checkpoints of 4 x 64 MiB come every 32 s, 10 of them, one round "
        "(each default can still be set)",
    )
    p.add_argument(
        "--testbed",
        choices=("netns", "model"),
        default="netns",
        help="netns (root: namespaces + tbf FIFO, default) or model (no root: asyncio FIFO relay)",
    )
    p.add_argument("--out", type=Path, help="results directory (default results/contention-<UTC timestamp>)")
    p.add_argument(
        "--scenarios",
        default="".join(SCENARIOS),
        help="which of a-e to run (default abcde): (a) direct, (b) lanes only, (c) lanes + spool, "
        "(d) separate pools through s3lanes, (e) separate pools direct",
    )
    p.add_argument("--rate-mbs", type=float, default=40.0, help="bottleneck rate, MB/s (default 40)")
    p.add_argument(
        "--fifo-mib", type=float, default=16.0, help="FIFO depth, MiB (default 16 = 0.42 s at 40 MB/s)"
    )
    p.add_argument("--rounds", type=int, help="rounds of the matrix (default 2; quick 1)")
    p.add_argument("--checkpoints", type=int, help="checkpoints per segment (default 1; quick 1)")
    p.add_argument(
        "--lead-s", type=float, help="trainer time before the first checkpoint (default 8; quick 2)"
    )
    p.add_argument("--interval-s", type=float, help="checkpoint interval, s (default 25; quick 4)")
    p.add_argument("--tail-s", type=float, help="probe time after the trainer ends (default 3; quick 0.5)")
    p.add_argument(
        "--settle-s",
        type=float,
        default=1.0,
        help="after a checkpoint is durable, this long counts neither as burst nor outside (1)",
    )
    p.add_argument("--ckpt-mib", type=int, help="checkpoint size, MiB (default 64; quick 8)")
    p.add_argument("--ckpt-shards", type=int, help="objects per checkpoint (default 4; quick 2)")
    p.add_argument("--part-mib", type=int, default=8, help="multipart part size, MiB (default 8)")
    p.add_argument("--ckpt-writers", type=int, help="concurrent checkpoint writers (default 4; quick 2)")
    p.add_argument(
        "--ckpt-client",
        choices=("aiohttp", "botocore"),
        default="aiohttp",
        help="the checkpoint writers' client: aiohttp (retries 5xx and transport errors, default) or "
        "botocore (one client per writer thread, no retries: every failed request is a client error, "
        "reported with the longest pause in any part's body)",
    )
    p.add_argument(
        "--boto-connect-timeout-s",
        type=float,
        default=60.0,
        help="botocore writers: connect_timeout (botocore's default 60; it also bounds each socket send)",
    )
    p.add_argument(
        "--boto-read-timeout-s", type=float, default=60.0, help="botocore writers: read_timeout (default 60)"
    )
    p.add_argument("--probe-rate", type=float, default=20.0, help="probe range GETs per second (default 20)")
    p.add_argument("--range-kib", type=int, default=256, help="probe range size, KiB (default 256)")
    p.add_argument("--steps-per-s", type=float, help="trainer steps per second (default 10; saturating 1000)")
    p.add_argument("--samples-per-step", type=int, help="samples per trainer step (default 4; quick 2)")
    p.add_argument("--sample-kib", type=int, help="sample size, KiB (default 256; saturating 1024)")
    p.add_argument("--workers", type=int, help="data loader workers (concurrent GETs; default 8; quick 4)")
    p.add_argument("--prefetch", type=int, help="samples the loader may hold ready (default 16; quick 8)")
    p.add_argument("--dataset-objects", type=int, help="dataset objects (default 8; quick 2)")
    p.add_argument("--dataset-mib", type=int, help="size of each dataset object, MiB (default 32; quick 8)")
    p.add_argument("--segment-timeout-s", type=float, default=600.0, help="hard limit per segment (600)")
    p.add_argument(
        "--gateway-toml",
        type=Path,
        help="TOML appended to every gateway's generated config (experiments: [scheduler], [lanes])",
    )
    p.add_argument(
        "--ckpt-pool-mbs",
        type=float,
        help="(d): `[backends.ckpt] bandwidth`, MB/s: the checkpoint pool's drain rate (default: --rate-mbs)",
    )
    p.add_argument(
        "--drain-concurrency",
        type=int,
        help="(c), (d): `[spool] drain_concurrency` (default: the gateway's default)",
    )
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary state (SeaweedFS data, spool)")
    p.add_argument(
        "--rebuild-report",
        type=Path,
        metavar="DIR",
        help="run nothing: recompute the report, JSON and plots of the finished run in DIR from raw/",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")  # fmt: skip
    a = p.parse_args(argv)
    q = a.quick
    sat = a.saturating and not q

    def pick(value: Any, full: Any, quick: Any, saturating: Any = None) -> Any:
        if sat and saturating is not None and value is None:
            value = saturating
        chosen = value if value is not None else (quick if q else full)
        if chosen <= 0:
            p.error("sizes, counts, rates and times must be positive")
        return chosen

    scenarios = tuple(s for s in SCENARIOS if s in a.scenarios)
    if not scenarios or set(a.scenarios) - set(SCENARIOS):
        p.error(f"--scenarios takes letters from {''.join(SCENARIOS)}")
    out = a.out or Path("results") / f"contention-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"
    return Options(
        quick=q,
        saturating=a.saturating,
        testbed=a.testbed,
        out=out,
        scenarios=scenarios,
        rate_mbs=pick(a.rate_mbs, 40.0, 40.0),
        fifo_mib=pick(a.fifo_mib, 16.0, 16.0),
        rounds=pick(a.rounds, 2, 1, 1),
        checkpoints=pick(a.checkpoints, 1, 1, 10),
        lead_s=pick(a.lead_s, 8.0, 2.0),
        interval_s=pick(a.interval_s, 25.0, 4.0, 32.0),
        tail_s=pick(a.tail_s, 3.0, 0.5),
        settle_s=a.settle_s,
        ckpt_mib=pick(a.ckpt_mib, 64, 8, 256),
        ckpt_shards=pick(a.ckpt_shards, 4, 2),
        part_mib=pick(a.part_mib, 8, 8),
        ckpt_writers=pick(a.ckpt_writers, 4, 2),
        ckpt_client=a.ckpt_client,
        boto_connect_timeout_s=pick(a.boto_connect_timeout_s, 60.0, 60.0),
        boto_read_timeout_s=pick(a.boto_read_timeout_s, 60.0, 60.0),
        probe_rate=pick(a.probe_rate, 20.0, 20.0),
        range_kib=pick(a.range_kib, 256, 256),
        steps_per_s=pick(a.steps_per_s, 10.0, 10.0, 1000.0),
        samples_per_step=pick(a.samples_per_step, 4, 2),
        sample_kib=pick(a.sample_kib, 256, 256, 1024),
        workers=pick(a.workers, 8, 4, 16),
        prefetch=pick(a.prefetch, 16, 8, 32),
        dataset_objects=pick(a.dataset_objects, 8, 2),
        dataset_mib=pick(a.dataset_mib, 32, 8),
        segment_timeout_s=pick(a.segment_timeout_s, 600.0, 600.0),
        gateway_toml=a.gateway_toml,
        ckpt_pool_mbs=None if a.ckpt_pool_mbs is None else pick(a.ckpt_pool_mbs, 0, 0),
        drain_concurrency=None if a.drain_concurrency is None else pick(a.drain_concurrency, 0, 0),
        keep_tmp=a.keep_tmp,
        progress=a.progress,
        rebuild_report=a.rebuild_report,
    )


# --------------------------------------------------------------------------------------------------------
# Gateways


@dataclass(slots=True)
class Gateway:
    scenario: str
    child: Child
    url: str  # set once it serves
    config_text: str
    ready: Path


def gateway_toml(
    d: Path,
    backend_url: str,
    rate_bps: float,
    spool: bool,
    extra: str,
    ckpt_url: str | None = None,
    *,
    ckpt_rate_bps: float | None = None,
    drain_concurrency: int | None = None,
) -> str:
    """The generated config; with ``ckpt_url``, the checkpoint bucket is routed to a second backend there
    (its own pool and scheduler, at ``ckpt_rate_bps``, by default the same bandwidth)."""
    spool_section = f'enabled = true\ndir = "{d / "spool"}"' if spool else "enabled = false"
    if spool and drain_concurrency is not None:
        spool_section += f"\ndrain_concurrency = {drain_concurrency}"
    pools = ""
    if ckpt_url is not None:
        pools = f"""
[backends.{CKPT_BACKEND}]  # the checkpoint pool: the second store, behind its own bottleneck
endpoint = "{ckpt_url}"
region = "{REGION}"
bandwidth = {ckpt_rate_bps or rate_bps:.0f}

[[routes]]
bucket = "{CHECKPOINT_BUCKET}"
backend = "{CKPT_BACKEND}"
"""
    return f"""{server_toml(d / "state")}
[backend]
endpoint = "{backend_url}"
region = "{REGION}"
bandwidth = {rate_bps:.0f}  # bytes/s: the testbed's rate
{pools}
[spool]
{spool_section}

[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
{extra}"""


def start_gateways(
    tb: Testbed, work: Path, scenarios: Sequence[str], extra: str, opts: Options
) -> dict[str, Gateway]:
    """Start the scenarios' gateways together (each takes a second or two), then wait until each serves."""
    started = [spawn_gateway(tb, work, scenario, extra, opts) for scenario in scenarios]
    return {gw.scenario: wait_gateway(gw) for gw in started}


def spawn_gateway(tb: Testbed, work: Path, scenario: str, extra: str, opts: Options) -> Gateway:
    d = work / f"gateway-{scenario}"
    d.mkdir(parents=True)
    ckpt_url = tb.ckpt_store_url if scenario in SEPARATE_POOLS else None
    text = gateway_toml(
        d,
        tb.store_url,
        tb.spec.rate_bps,
        GATEWAY_SPOOL[scenario],
        extra,
        ckpt_url,
        ckpt_rate_bps=None if opts.ckpt_pool_mbs is None else opts.ckpt_pool_mbs * MB,
        drain_concurrency=opts.drain_concurrency,
    )
    cfg = d / "s3lanes.toml"
    cfg.write_text(text)
    ready = d / "ready.json"
    argv = tb.client_argv(
        [sys.executable, "-m", "s3lanes", "serve", "--config", str(cfg), "--ready-file", str(ready)]
    )
    child = spawn(f"gateway-{scenario}", argv, d / "gateway.log", cwd=GATEWAY_SOURCE)
    tb.children.append(child)  # the testbed's teardown stops it too, should we fail before we do
    return Gateway(scenario, child, "", text, ready)


def wait_gateway(gw: Gateway) -> Gateway:
    try:
        doc = wait_ready_file(gw.child, gw.ready, GATEWAY_START_TIMEOUT_S, f"gateway ({gw.scenario})")
    except TestbedError as exc:
        raise BenchError(str(exc)) from None
    gw.url = next(u for u in doc["endpoints"] if u.startswith("http://")).rstrip("/")
    return gw


# --------------------------------------------------------------------------------------------------------
# Sampling


@dataclass(slots=True)
class Sampler:
    """Bottleneck counters and CPU seconds of our processes and of the machine, every SAMPLE_INTERVAL_S.
    ``wire``: the dataset store's FIFO (the only one without a second store); ``wire_ckpt``: the checkpoint
    store's, if the testbed has one (sampled in every scenario: idle in (a)-(c))."""

    tb: Testbed
    wire: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    wire_ckpt: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    cpu: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def tick(self, extra_pids: dict[str, int]) -> None:
        links = self.tb.sample()
        self.wire.append(dataclasses.asdict(links[LINK_DATA]))
        if LINK_CKPT in links:
            self.wire_ckpt.append(dataclasses.asdict(links[LINK_CKPT]))
        pids = {**self.tb.pids(), **extra_pids}
        row: dict[str, Any] = {"at": time.monotonic(), "machine": machine_busy_seconds()}
        t = os.times()
        row["orchestrator"] = t.user + t.system
        for name, pid in pids.items():
            with contextlib.suppress(OSError, ValueError, IndexError):
                row[name] = cpu_seconds(pid)
        self.cpu.append(row)


def cpu_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Cores busy on average between the first and last sample: ours by process, the machine's, the rest."""
    if len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    span = last["at"] - first["at"]
    out: dict[str, float] = {}
    ours = 0.0
    names = {k for r in rows for k in r} - {"at", "machine"}
    for name in sorted(names):
        seen = [r[name] for r in rows if name in r]
        # A process started after the first sample (probe, trainer) used all its CPU within the span.
        used = max(0.0, seen[-1] - seen[0]) if name in first else max(0.0, seen[-1])
        out[name] = round(used / span, 3)
        ours += used
    machine = last["machine"] - first["machine"]
    out["machine"] = round(machine / span, 3)
    out["other"] = round(max(0.0, machine - ours) / span, 3)
    return out


# --------------------------------------------------------------------------------------------------------
# The run


class Progress:
    """A time-based tqdm bar over the planned seconds of the run (stderr)."""

    def __init__(self, total_s: float, enabled: bool | None) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=round(total_s),
            unit="s",
            disable=None if enabled is None else not enabled,  # None: only on a terminal
            file=sys.stderr,
            bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s planned "
            "[{elapsed}<{remaining}]",
        )
        self._total = float(round(total_s))
        self._done = 0.0
        self._last = time.monotonic()

    def describe(self, text: str) -> None:
        self._bar.set_description_str(text)

    def replan(self, remaining_s: float) -> None:
        """The plan changed (a segment took longer or shorter than planned): done + ``remaining_s``."""
        self._total = float(round(self._done + remaining_s + 1))
        self._bar.total = self._total
        self._bar.refresh()

    def advance(self) -> None:
        now = time.monotonic()
        step = min(now - self._last, max(0.0, self._total - 1 - self._done))  # never 100% before the end
        self._done += step
        self._bar.update(step)
        self._last = now

    def write(self, text: str) -> None:
        self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.update(max(0.0, self._total - self._done))
        self._bar.close()


class Run:
    def __init__(self, opts: Options, work: Path, tb: Testbed) -> None:
        self.opts = opts
        self.work = work
        self.tb = tb
        self.raw_dir = opts.out / "raw"
        self.gateways: dict[str, Gateway] = {}
        self.dataset: list[list[Any]] = []
        self.segments: list[dict[str, Any]] = []
        self.setup_s = 0.0
        self.start_margin_s = QUICK_START_MARGIN_S if opts.quick else START_MARGIN_S
        self.settle_min_s = QUICK_SETTLE_MIN_S if opts.quick else SETTLE_MIN_S
        self.progress = Progress(self.planned_s(), opts.progress)

    def segment_planned_s(self) -> float:
        o = self.opts
        return (
            self.start_margin_s + o.lead_s + o.checkpoints * o.interval_s + o.tail_s + self.settle_min_s + 3.0
        )

    def planned_s(self) -> float:
        return 25.0 + len(self.opts.scenarios) * self.opts.rounds * self.segment_planned_s()

    def log(self, text: str) -> None:
        self.progress.write(text)

    # -- set-up ----------------------------------------------------------------------------------------

    def run_workload(self, role: str, spec: dict[str, Any], d: Path) -> Child:
        d.mkdir(parents=True, exist_ok=True)
        spec_path = d / f"{role}-spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        argv = self.tb.client_argv(
            [sys.executable, "-m", "loadtests.contention.workload", role, "--spec", str(spec_path),
             "--out", str(d / f"{role}.json")]
        )  # fmt: skip
        child = spawn(role, argv, d / f"{role}.log")
        self.tb.children.append(child)
        return child

    def finish(self, child: Child, d: Path, role: str) -> dict[str, Any]:
        if child in self.tb.children:
            self.tb.children.remove(child)
        if child.popen.returncode != 0:
            raise BenchError(f"{role} exited with code {child.popen.returncode}:\n{log_tail(child.log_path)}")
        doc: dict[str, Any] = json.loads((d / f"{role}.json").read_text())
        return doc

    def setup(self) -> None:
        o = self.opts
        self.progress.describe("starting SeaweedFS" + (" x 2" if self.tb.ckpt_store else ""))
        t0 = time.monotonic()
        self.tb.up()
        self.tb.start_store()
        self.progress.advance()
        self.progress.describe("loading the dataset")
        d = self.raw_dir / "setup"
        spec = {
            "endpoint": self.tb.setup_url,
            "bucket": DATASET_BUCKET,
            "count": o.dataset_objects,
            "size_bytes": o.dataset_mib * MIB,
        }
        child = self.run_workload("setup", spec, d)
        try:
            child.popen.wait(SETUP_TIMEOUT_S)
        except Exception:
            child.stop()
            raise
        self.dataset = self.finish(child, d, "setup")["objects"]
        self.tb.shape()
        self.progress.advance()
        self.progress.describe("starting the gateways")
        extra = o.gateway_toml.read_text() if o.gateway_toml else ""
        wanted = [scenario for scenario in GATEWAY_SPOOL if scenario in o.scenarios]
        self.gateways = start_gateways(self.tb, self.work, wanted, extra, o)
        self.setup_s = time.monotonic() - t0
        self.progress.advance()

    # -- segments --------------------------------------------------------------------------------------

    def order(self) -> Iterator[tuple[int, str]]:
        for r in range(self.opts.rounds):
            seq = self.opts.scenarios if r % 2 == 0 else tuple(reversed(self.opts.scenarios))
            for s in seq:
                yield r, s

    def settle(self, sampler: Sampler) -> None:
        """Until the FIFOs are (nearly) empty, and at least ``settle_min_s``."""
        t0 = time.monotonic()
        while True:
            sampler.tick({})
            self.progress.advance()
            last = [sampler.wire[-1], *sampler.wire_ckpt[-1:]]
            quiet = all(w["backlog_bytes"] <= SETTLE_BACKLOG_BYTES for w in last)
            waited = time.monotonic() - t0
            if (quiet and waited >= self.settle_min_s) or waited >= SETTLE_MAX_S:
                return
            time.sleep(SAMPLE_INTERVAL_S)

    def segment(self, rnd: int, scenario: str) -> dict[str, Any]:
        o = self.opts
        name = f"r{rnd}-{scenario}"
        d = self.raw_dir / name
        gw = self.gateways.get(scenario)
        endpoint = gw.url if gw else self.tb.store_url
        sampler = Sampler(self.tb)
        self.settle(sampler)
        # (e): the trainer writes its checkpoints straight to the second store; (d) through the gateway,
        # which routes the checkpoint bucket there.
        ckpt_endpoint = self.tb.ckpt_store_url if scenario == "e" else endpoint
        start_at = time.monotonic() + self.start_margin_s
        common = {
            "endpoint": endpoint,
            "bucket": DATASET_BUCKET,
            "objects": self.dataset,
            "start_at": start_at,
        }
        probe_spec = {
            **common,
            "rate_per_s": o.probe_rate,
            "range_bytes": o.range_kib * KIB,
            "seed": 11 + rnd,
        }
        trainer_spec = {
            **common,
            "seed": 101 + rnd,
            "sample_bytes": o.sample_kib * KIB,
            "steps_per_s": o.steps_per_s,
            "samples_per_step": o.samples_per_step,
            "workers": o.workers,
            "prefetch": o.prefetch,
            "ckpt_endpoint": ckpt_endpoint,
            "ckpt_bucket": CHECKPOINT_BUCKET,
            "ckpt_prefix": f"run-{name}",
            "ckpt_first_at_s": o.lead_s,
            "ckpt_interval_s": o.interval_s,
            "ckpt_count": o.checkpoints,
            "ckpt_shards": o.ckpt_shards,
            "ckpt_shard_bytes": o.ckpt_mib * MIB // o.ckpt_shards,
            "ckpt_part_bytes": o.part_mib * MIB,
            "ckpt_writers": o.ckpt_writers,
            "ckpt_client": o.ckpt_client,
            "boto_connect_timeout_s": o.boto_connect_timeout_s,
            "boto_read_timeout_s": o.boto_read_timeout_s,
            "gateway_url": gw.url if gw else None,
            "flush": bool(gw) and GATEWAY_SPOOL[scenario],
            "status_interval_s": SAMPLE_INTERVAL_S,
            "warmup_s": report.WARMUP_S,
        }
        self.progress.describe(f"round {rnd + 1}/{o.rounds}: ({scenario}) {SCENARIOS[scenario]}")
        probe = self.run_workload("probe", probe_spec, d)
        trainer = self.run_workload("trainer", trainer_spec, d)
        deadline = time.monotonic() + o.segment_timeout_s
        tail_until: float | None = None
        try:
            while True:
                sampler.tick({"probe": probe.pid, "trainer": trainer.pid})
                self.progress.advance()
                now = time.monotonic()
                if tail_until is None and not trainer.alive():
                    tail_until = now + o.tail_s
                if tail_until is not None and now >= tail_until:
                    break
                if not probe.alive():
                    raise BenchError(f"the probe died:\n{log_tail(probe.log_path)}")
                if now > deadline:
                    raise BenchError(
                        f"segment {name} took longer than --segment-timeout-s={o.segment_timeout_s}"
                    )
                time.sleep(SAMPLE_INTERVAL_S)
            probe.stop(PROBE_STOP_TIMEOUT_S)
        except BaseException:
            for child in (trainer, probe):
                child.stop(5.0)
            raise
        probe_doc = self.finish(probe, d, "probe")
        trainer_doc = self.finish(trainer, d, "trainer")
        seg = {
            "name": name,
            "round": rnd,
            "scenario": scenario,
            "endpoint": endpoint,
            "ckpt_endpoint": ckpt_endpoint,
            "separate_pools": scenario in SEPARATE_POOLS,
            "probe": probe_doc,
            "trainer": trainer_doc,
            "wire": sampler.wire,
            "wire_ckpt": sampler.wire_ckpt,
            "cpu": cpu_summary(sampler.cpu),
        }
        (d / "segment.json").write_text(
            json.dumps({k: v for k, v in seg.items() if k not in ("probe", "trainer")})
        )
        ckpts = trainer_doc["checkpoints"]
        errors = [c["error"] for c in ckpts if c["error"]]
        client = trainer_doc.get("ckpt_client") or {}
        if client.get("client") == "botocore":
            self.log(
                f"({scenario}) round {rnd + 1}: botocore writers: {len(client['errors'])} client errors, "
                f"{client['parts_sent']} parts, longest pause in a body "
                f"{client['max_body_pause_s'] or 0:.1f} s, longest wait for an answer "
                f"{client['max_answer_wait_s'] or 0:.1f} s"
            )
        saves = ", ".join(f"{c['save_s']:.1f}" for c in ckpts)
        durables = ", ".join("-" if c["durable_s"] is None else f"{c['durable_s']:.1f}" for c in ckpts)
        line = (
            f"({scenario}) round {rnd + 1}: saves {saves} s, durable {durables} s, "
            f"trainer lost {100 * (trainer_doc['lost_fraction'] or 0):.1f}%"
        )
        self.log(line + (f"; checkpoint errors: {errors}" if errors else ""))
        return seg

    def run(self) -> None:
        self.setup()
        plan = list(self.order())
        took: dict[str, float] = {}
        for i, (rnd, scenario) in enumerate(plan):
            t0 = time.monotonic()
            self.segments.append(self.segment(rnd, scenario))
            took[scenario] = time.monotonic() - t0
            # The rest of the plan at the pace each scenario showed (a drain may take far longer than planned)
            self.progress.replan(sum(took.get(s, self.segment_planned_s()) for _, s in plan[i + 1 :]))

    def stop_gateways(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for gw in self.gateways.values():  # all at once: each takes its shutdown grace
            gw.child.signal_stop()
        for scenario, gw in self.gateways.items():
            code = gw.child.stop()
            problems = [
                ln for ln in log_tail(gw.child.log_path, 2_000_000).splitlines()
                if " ERROR " in ln or " WARNING " in ln or "Traceback" in ln
            ]  # fmt: skip
            out[scenario] = {
                "exit_code": code,
                "log_problems": problems[:20],
                "log_problem_lines": len(problems),
            }
        return out


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def load_segments(out: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """The raw segments of a finished run, as :meth:`Run.segment` returned them."""
    segments = []
    for name in names:
        d = out / "raw" / name
        seg: dict[str, Any] = json.loads((d / "segment.json").read_text())
        seg["probe"] = json.loads((d / "probe.json").read_text())
        seg["trainer"] = json.loads((d / "trainer.json").read_text())
        segments.append(seg)
    return segments


def rebuild_report(out: Path) -> int:
    """Recompute a finished run's summary from its raw records (after a change to :mod:`.report`)."""
    old: dict[str, Any] = json.loads((out / "results.json").read_text())
    segments = load_segments(out, [s["name"] for s in old["summary"]["segments"]])
    doc = report.build(
        command=old["command"],
        options=old["options"],
        testbed=old["testbed"],
        machine=old["machine"],
        segments=segments,
        gateways=old["gateways"],
        setup_s=old["setup_s"],
    )
    report.write_all(doc, segments, out)
    print(doc["markdown"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.rebuild_report is not None:
        return rebuild_report(opts.rebuild_report)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)  # a killed benchmark still tears down
    opts.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="s3lanes-contention-"))
    spec = BottleneckSpec(rate_bps=opts.rate_mbs * MB, depth_bytes=round(opts.fifo_mib * MIB))
    tb = make_testbed(opts.testbed, spec, work, ckpt_store=bool(SEPARATE_POOLS & set(opts.scenarios)))
    facts = machine_facts()
    command = "python -m loadtests.contention " + " ".join(sys.argv[1:] if argv is None else argv)
    run: Run | None = None
    ok = False
    gateways: dict[str, Any] = {}
    try:
        run = Run(opts, work, tb)
        run.run()
        ok = True
    except TestbedError as exc:
        print(f"\nerror: the {opts.testbed} testbed cannot run here:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; tearing down", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    finally:
        if run is not None:
            gateways = run.stop_gateways()
            run.progress.close()
        described = tb.describe()
        tb.down()
        for child_log in work.glob("gateway-*/gateway.log"):
            dest = opts.out / "raw" / f"{child_log.parent.name}.log"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(child_log, dest)
        if not opts.keep_tmp:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"temporary state kept in {work}", file=sys.stderr)
    assert run is not None and ok
    doc = report.build(
        command=command,
        options=opts.as_json(),
        testbed=described,
        machine=facts,
        segments=run.segments,
        gateways={s: {**gateways.get(s, {}), "config": g.config_text} for s, g in run.gateways.items()},
        setup_s=run.setup_s,
    )
    report.write_all(doc, run.segments, opts.out)
    print(doc["markdown"])
    print(f"\nresults in {opts.out}", file=sys.stderr)
    return 0
