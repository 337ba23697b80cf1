"""Gateway vs direct, side by side in one run: throughput, small-object latency, memory and CPU of s3lanes.

Run it as ``python -m loadtests.bench_proxy`` (``make bench``); ``--help`` lists the knobs, ``--quick`` is a
one-minute sanity run. Results and their interpretation live in ``docs/benchmarks.md``.

Theory of operation
-------------------
The benchmark starts its own SeaweedFS (a temporary state directory, removed at the end) and one
``s3lanes serve`` subprocess in front of it, then drives both the gateway and SeaweedFS *directly* with the
same client, so that every gateway number has a direct twin measured minutes apart on the same machine:

1. set-up: the objects are uploaded directly (random data generated on the fly, nothing on disk);
2. large GETs: ``--streams`` concurrent GETs of ``--large-mib`` objects, aggregate throughput;
3. small GETs: ``--small-count`` sequential GETs of one 64 KiB object, p50 and p99 latency;
4. PUTs: ``--put-streams`` concurrent uploads of ``--large-mib`` each, once with ``UNSIGNED-PAYLOAD`` and
   once with a signed payload (``x-amz-content-sha256`` = the body's SHA-256, which both the gateway and
   SeaweedFS then verify);
5. memory: through the gateway only, ``--rss-streams`` uploads and as many downloads of ``--rss-mib``
   objects at once while the gateway's RSS is sampled (its VmHWM is reset first with ``clear_refs``).

Phases 2-4 run in rounds ordered A/B/B/A (direct, gateway, gateway, direct, ...), so slow drift of the
machine (page cache, SeaweedFS compaction, a noisy neighbour) hits both sides alike; the summary is the
median over rounds. Every round also records the CPU time (user+sys from ``/proc/PID/stat``) the gateway,
SeaweedFS and the client spent, which is what a throughput ratio on a 2-core machine really measures.

The client is deliberately lean (:class:`RawHttp`: one ``asyncio.BufferedProtocol`` per connection that
parses the response head and counts body bytes into one reused buffer), because on a small machine a heavy
client competes with the gateway for the same cores. ``--client aiohttp`` runs the same phases with an
aiohttp client instead, as a cross-check. Requests are signed with the project's own
:func:`s3lanes.core.sigv4.sign_headers` (no botocore on the hot path).

Everything is bounded: each phase has a request count and a time limit (``--phase-timeout-s``), and the
processes are stopped (SIGTERM, then SIGKILL) and the state directory removed on success, failure and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

from loadtests.harness.cli import bench_parser, from_namespace, parse_sized
from loadtests.harness.endpoint import Endpoint
from loadtests.harness.errors import BenchError
from loadtests.harness.gateway import is_gateway_tree, tail
from loadtests.harness.machine import (
    CpuMeter,
    machine_facts,
    memory_bytes,
    pin_process,
    python_speed_ns,
    reset_peak_rss,
)
from loadtests.harness.payload import payload_pieces, payload_sha256
from loadtests.harness.phase import progress, time_limited
from loadtests.harness.rawclient import AiohttpClient, Client, RawHttp, expect, signed_head
from loadtests.harness.stack import Stack, start_proxy_gateway, stop_proxy_gateway
from loadtests.harness.stats import GB, MB, MIB, Round, abba, med, run_all
from loadtests.harness.store import BUCKET, new_weed
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD

SMALL_OBJECT_BYTES = 64 * 1024
RSS_SAMPLE_INTERVAL_S = 0.05
SETUP_UPLOAD_CONCURRENCY = 4
WARMUP_SMALL_GETS = 50
MEMORY_MAX_GET_REPEATS = 16


# --------------------------------------------------------------------------------------------------------
# Options


# The phases, in the order they run; --phases picks some.
PHASES = ("large", "small", "put", "memory", "objects")


@dataclass(frozen=True, slots=True)
class Options:
    quick: bool
    large_mib: int
    streams: int
    put_streams: int
    small_count: int
    rounds: int
    put_rounds: int
    rss_mib: int
    rss_streams: int
    client: str
    json_path: Path | None
    tmp_dir: Path | None
    phase_timeout_s: float
    py_spy_dir: Path | None
    gateway_toml: Path | None
    gateway_cpus: frozenset[int] | None = None
    phases: frozenset[str] = frozenset(PHASES)
    compare_tree: Path | None = None


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = bench_parser(
        "bench_proxy",
        "s3lanes vs direct to SeaweedFS: throughput, latency, RSS and CPU, side by side.",
        "a small sanity run (about a minute)",
    )
    # Sizes, counts and rounds: default=(full run, --quick run), or one default for both (parse_sized).
    p.add_argument("--large-mib", default=(256, 32), help="size of each large object")
    p.add_argument("--streams", default=8, help="concurrent large GETs")
    p.add_argument("--put-streams", default=4, help="concurrent large PUTs")
    p.add_argument("--small-count", default=(2000, 200), help="small GETs per round and side")
    p.add_argument("--rounds", default=(5, 2), help="large-GET and small-GET rounds per side")
    p.add_argument("--put-rounds", default=(3, 1), help="PUT rounds per side and payload mode")
    p.add_argument("--rss-mib", default=(1024, 64), help="object size in the memory phase")
    p.add_argument("--rss-streams", default=4, help="uploads, and as many downloads, in the memory phase")
    p.add_argument("--client", choices=("raw", "aiohttp"), default="raw", help="HTTP client (default raw)")
    p.add_argument("--json", type=Path, dest="json_path", help="also write every round's numbers here")
    p.add_argument("--phase-timeout-s", type=float, default=600.0, help="hard limit per phase (default 600)")
    p.add_argument(
        "--py-spy-dir",
        type=Path,
        help="record a py-spy profile of the gateway during each gateway phase into this directory "
        "(needs py-spy; the profiler costs CPU, so do not compare such a run's numbers)",
    )
    p.add_argument(
        "--gateway-toml",
        type=Path,
        help="TOML appended to the gateway's generated config (e.g. a [scheduler] or [lanes] section); "
        "the generated one sets [server], [backend] endpoint and region, and one [[credentials]]",
    )
    p.add_argument(
        "--gateway-cpus",
        help="give the gateway CPUs of its own, e.g. '1': the gateway's threads run on these CPUs, "
        "SeaweedFS and the benchmark client on the others, on both sides alike (models a node where the "
        "store's CPU is not the gateway's; default: everything shares every CPU)",
    )
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, of {','.join(PHASES)} (default all); 'objects' is the "
        "small-object phase (loadtests/bench_objects.py: concurrent GETs of 16 KiB, 110 KiB, 1 MiB and one "
        "large object, req/s and CPU per request, against a gateway with the spool on)",
    )
    p.add_argument(
        "--compare-tree",
        type=Path,
        help="objects phase: also run a gateway from this directory (a checkout or a `git archive` of "
        "another commit, holding gateway/s3lanes/) as a third side, in the same interleaved rounds",
    )
    a = parse_sized(p, argv)
    if a.compare_tree is not None and not is_gateway_tree(a.compare_tree):
        p.error(
            f"--compare-tree: {a.compare_tree} holds no gateway (gateway/s3lanes/__main__.py, or "
            "gateway/__main__.py in the layout before the package rename)"
        )
    phases = frozenset(x.strip() for x in a.phases.split(",") if x.strip())
    if not phases or not phases <= set(PHASES):
        p.error(f"--phases: some of {','.join(PHASES)}, not {a.phases!r}")
    gateway_cpus: frozenset[int] | None = None
    if a.gateway_cpus is not None:
        try:
            gateway_cpus = frozenset(int(c) for c in a.gateway_cpus.split(",") if c.strip())
        except ValueError:
            p.error(f"--gateway-cpus: a comma-separated list of CPU numbers, not {a.gateway_cpus!r}")
        usable = os.sched_getaffinity(0)
        if not gateway_cpus or not gateway_cpus < usable:
            p.error(
                f"--gateway-cpus: must name some, not all, of the usable CPUs {sorted(usable)}, "
                f"got {sorted(gateway_cpus)}"
            )

    return from_namespace(Options, a, gateway_cpus=gateway_cpus, phases=phases)


# --------------------------------------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class MemoryPhase:
    uploads: int
    downloads: int
    object_bytes: int
    seconds: float
    cpu_s: dict[str, float]
    rss_before_bytes: int
    rss_max_sampled_bytes: int
    hwm_bytes: int
    hwm_reset: bool
    samples: int

    @property
    def bytes_moved(self) -> int:
        return (self.uploads + self.downloads) * self.object_bytes


@dataclass(slots=True)
class Results:
    opts: Options
    facts: dict[str, str]
    rounds: list[Round] = field(default_factory=list)
    object_rounds: list[Round] = field(default_factory=list)  # the objects phase (its own gateway)
    memory: MemoryPhase | None = None
    setup_seconds: float = 0.0
    gateway_lifetime_hwm_bytes: int = 0
    gateway_exit_code: int | None = None
    gateway_log_problems: str = ""

    def of(self, phase: str, side: str) -> list[Round]:
        return [r for r in self.rounds if r.phase == phase and r.side == side]


# --------------------------------------------------------------------------------------------------------
# Phases


class Bench:
    def __init__(self, opts: Options, stack: Stack, client: Client, results: Results) -> None:
        self.opts = opts
        self.stack = stack
        self.client = client
        self.results = results
        self.meter = CpuMeter({"gateway": stack.gateway_pid, "seaweedfs": stack.weed.pid or 0})

    log = staticmethod(progress)

    async def bounded(self, what: str, aw: Awaitable[Any]) -> Any:
        return await time_limited(what, aw, self.opts.phase_timeout_s)

    @contextlib.asynccontextmanager
    async def profiled(self, name: str, side: str, pid: int | None = None) -> AsyncIterator[None]:
        """With --py-spy-dir: py-spy records the gateway (``pid``, default the main one) while a gateway
        round runs."""
        if self.opts.py_spy_dir is None or side != "gateway":
            yield
            return
        self.opts.py_spy_dir.mkdir(parents=True, exist_ok=True)
        out = self.opts.py_spy_dir / f"{name}.speedscope.json"
        exe = shutil.which("py-spy", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
        if exe is None:
            raise BenchError("--py-spy-dir given but py-spy is not installed (pip install py-spy)")
        proc = await asyncio.create_subprocess_exec(
            exe, "record", "--pid", str(pid or self.stack.gateway_pid), "--format", "speedscope",
            "--rate", "200", "--output", str(out), "--nonblocking",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(0.5)  # let it attach
        try:
            yield
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            self.log(f"py-spy profile: {out}")

    # -- set-up ---------------------------------------------------------------------------------------------

    async def setup(self) -> None:
        o = self.opts
        t0 = time.perf_counter()
        direct = self.stack.direct
        jobs: list[tuple[str, int, int]] = [("small-64k", SMALL_OBJECT_BYTES, 0)]
        jobs += [(f"large-{i}", o.large_mib * MIB, 100 + i) for i in range(o.streams)]
        jobs += [(f"rss-down-{i}", o.rss_mib * MIB, 200 + i) for i in range(o.rss_streams)]
        total = sum(size for _, size, _ in jobs)
        self.log(f"set-up: uploading {len(jobs)} objects ({total / MIB:.0f} MiB) directly to SeaweedFS")
        sem = asyncio.Semaphore(SETUP_UPLOAD_CONCURRENCY)

        async def one(key: str, size: int, seed: int) -> None:
            async with sem:
                expect(
                    await self.client.put(direct, key, size, seed, signed_payload=False), 200, f"PUT {key}"
                )

        await self.bounded("set-up", run_all(one(*job) for job in jobs))
        # Read the small object back through both sides: credentials, routing and content all agree.
        for side in ("direct", "gateway"):
            reply = await self.client.get(self.stack.endpoint(side), "small-64k", want_body=True)
            expect(reply, 200, f"GET small-64k ({side})", SMALL_OBJECT_BYTES)
            if reply.body != b"".join(payload_pieces(SMALL_OBJECT_BYTES, 0)):
                raise BenchError(f"GET small-64k ({side}) returned different bytes")
        self.results.setup_seconds = time.perf_counter() - t0
        self.log(f"set-up done in {self.results.setup_seconds:.1f} s")

    # -- large GETs -----------------------------------------------------------------------------------------

    async def large_gets(self) -> None:
        o = self.opts
        size = o.large_mib * MIB
        for side in ("direct", "gateway"):  # warm-up: connections, the gateway's pool, caches
            await self.bounded("warm-up", self._get_all(self.stack.endpoint(side), ["large-0"], size))
        for i, side in abba(o.rounds):
            ep = self.stack.endpoint(side)
            keys = [f"large-{j}" for j in range(o.streams)]
            async with self.profiled(f"get-large-r{i}", side):
                self.meter.start()
                t0 = time.perf_counter()
                await self.bounded("large GETs", self._get_all(ep, keys, size))
                seconds = time.perf_counter() - t0
                cpu = self.meter.stop()
            r = Round("get_large", side, i, size * len(keys), seconds, cpu, requests=len(keys))
            self.results.rounds.append(r)
            self.log(f"GET {o.streams}x{o.large_mib} MiB  {side:7s} round {i}: {r.mbps:7.1f} MB/s  cpu {cpu}")

    async def _get_all(self, ep: Endpoint, keys: list[str], size: int) -> None:
        async def one(key: str) -> None:
            expect(await self.client.get(ep, key), 200, f"GET {key}", size)

        await run_all(one(k) for k in keys)

    # -- small GETs -----------------------------------------------------------------------------------------

    async def small_gets(self) -> None:
        o = self.opts
        for side in ("direct", "gateway"):
            ep = self.stack.endpoint(side)
            for _ in range(WARMUP_SMALL_GETS):
                expect(await self.client.get(ep, "small-64k"), 200, "GET small-64k", SMALL_OBJECT_BYTES)
        for i, side in abba(o.rounds):
            ep = self.stack.endpoint(side)
            async with self.profiled(f"get-small-r{i}", side):
                self.meter.start()
                t0 = time.perf_counter()
                lat = await self.bounded("small GETs", self._small_loop(ep, o.small_count))
                seconds = time.perf_counter() - t0
                cpu = self.meter.stop()
            r = Round(
                "get_small", side, i, SMALL_OBJECT_BYTES * o.small_count, seconds, cpu, lat, o.small_count
            )
            self.results.rounds.append(r)
            self.log(
                f"GET 64 KiB x{o.small_count} {side:7s} round {i}: p50 {r.percentile_ms(50):.3f} ms  "
                f"p99 {r.percentile_ms(99):.3f} ms  cpu {cpu}"
            )

    async def _small_loop(self, ep: Endpoint, count: int) -> list[float]:
        client = self.client
        out: list[float] = []
        path = f"/{BUCKET}/small-64k"
        raw = client if isinstance(client, RawHttp) else None
        for _ in range(count):
            if raw is not None:
                # Signing happens before the clock starts: it costs the same on both sides.
                headers = signed_head(ep, "GET", path, UNSIGNED_PAYLOAD)
                t0 = time.perf_counter_ns()
                reply = await raw.call(ep, "GET", path, headers)
                t1 = time.perf_counter_ns()
            else:
                t0 = time.perf_counter_ns()
                reply = await client.get(ep, "small-64k")
                t1 = time.perf_counter_ns()
            expect(reply, 200, "GET small-64k", SMALL_OBJECT_BYTES)
            out.append((t1 - t0) / 1e6)
        return out

    # -- PUTs -----------------------------------------------------------------------------------------------

    async def puts(self, signed_payload: bool) -> None:
        o = self.opts
        size = o.large_mib * MIB
        phase = "put_signed" if signed_payload else "put_unsigned"
        if signed_payload:  # hashing is the client's preparation, not part of the measurement
            for j in range(o.put_streams):
                payload_sha256(size, 300 + j)
        for i, side in abba(o.put_rounds):
            ep = self.stack.endpoint(side)
            keys = [f"{phase}-{side}-r{i}-{j}" for j in range(o.put_streams)]  # fresh keys: no overwrites

            async def one(key: str, seed: int, ep: Endpoint = ep) -> None:
                reply = await self.client.put(ep, key, size, seed, signed_payload=signed_payload)
                expect(reply, 200, f"PUT {key}")

            async with self.profiled(f"{phase}-r{i}", side):
                self.meter.start()
                t0 = time.perf_counter()
                await self.bounded("PUTs", run_all(one(k, 300 + j) for j, k in enumerate(keys)))
                seconds = time.perf_counter() - t0
                cpu = self.meter.stop()
            r = Round(phase, side, i, size * len(keys), seconds, cpu, requests=len(keys))
            self.results.rounds.append(r)
            self.log(
                f"PUT {o.put_streams}x{o.large_mib} MiB {phase} {side:7s} round {i}: "
                f"{r.mbps:7.1f} MB/s  cpu {cpu}"
            )

    # -- memory -------------------------------------------------------------------------------------------

    async def memory(self) -> None:
        o = self.opts
        size = o.rss_mib * MIB
        pid = self.stack.gateway_pid
        ep = self.stack.via_gateway
        rss_before, _ = memory_bytes(pid)
        hwm_reset = reset_peak_rss(pid)
        samples: list[int] = []
        stop = asyncio.Event()

        async def sampler() -> None:
            while not stop.is_set():
                samples.append(memory_bytes(pid)[0])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RSS_SAMPLE_INTERVAL_S)

        uploads_done = asyncio.Event()
        downloads = 0

        async def up(j: int) -> None:
            reply = await self.client.put(ep, f"rss-up-{j}", size, 400 + j, signed_payload=False)
            expect(reply, 200, f"PUT rss-up-{j}")

        async def ups() -> None:
            try:
                await run_all(up(j) for j in range(o.rss_streams))
            finally:
                uploads_done.set()

        async def down(j: int) -> None:
            # GETs finish first; repeating them keeps all streams busy until the PUTs are done (bounded).
            nonlocal downloads
            for _ in range(MEMORY_MAX_GET_REPEATS):
                expect(await self.client.get(ep, f"rss-down-{j}"), 200, f"GET rss-down-{j}", size)
                downloads += 1
                if uploads_done.is_set():
                    break

        self.log(
            f"memory: {o.rss_streams} uploads + {o.rss_streams} download loops of {o.rss_mib} MiB "
            "via the gateway"
        )
        task = asyncio.create_task(sampler())
        try:
            async with self.profiled("memory", "gateway"):
                self.meter.start()
                t0 = time.perf_counter()
                jobs = [ups(), *(down(j) for j in range(o.rss_streams))]
                await self.bounded("memory phase", run_all(jobs))
                seconds = time.perf_counter() - t0
                cpu = self.meter.stop()
        finally:
            stop.set()
            await task
        _, hwm = memory_bytes(pid)
        self.results.memory = MemoryPhase(
            uploads=o.rss_streams,
            downloads=downloads,
            object_bytes=size,
            seconds=seconds,
            cpu_s=cpu,
            rss_before_bytes=rss_before,
            rss_max_sampled_bytes=max(samples, default=0),
            hwm_bytes=hwm,
            hwm_reset=hwm_reset,
            samples=len(samples),
        )
        self.log(
            f"memory: {seconds:.1f} s, gateway VmHWM {hwm / MIB:.1f} MiB, max sampled VmRSS "
            f"{max(samples, default=0) / MIB:.1f} MiB over {len(samples)} samples, cpu {cpu}"
        )


async def run_phases(opts: Options, stack: Stack, results: Results) -> None:
    client: Client = RawHttp() if opts.client == "raw" else AiohttpClient()
    bench = Bench(opts, stack, client, results)
    ph = opts.phases
    try:
        if ph & {"large", "small", "put", "memory"}:
            await bench.setup()
        if "large" in ph:
            await bench.large_gets()
        if "small" in ph:
            await bench.small_gets()
        if "put" in ph:
            await bench.puts(signed_payload=False)
            await bench.puts(signed_payload=True)
        if "memory" in ph:
            await bench.memory()
        if "objects" in ph:
            from loadtests.bench_objects import object_phase

            await object_phase(bench)
    finally:
        await client.close()


# --------------------------------------------------------------------------------------------------------
# Machine facts and the report


def summary(res: Results) -> dict[str, Any]:
    """The headline numbers: medians over rounds, ratios and verdicts."""
    o = res.opts
    out: dict[str, Any] = {}

    def thr(phase: str) -> dict[str, Any]:
        d, g = res.of(phase, "direct"), res.of(phase, "gateway")
        md, mg = med([r.mbps for r in d]), med([r.mbps for r in g])
        x: dict[str, Any] = {
            "direct_MBps": md,
            "gateway_MBps": mg,
            "ratio": mg / md if md else float("nan"),
            "direct_rounds_MBps": [round(r.mbps, 1) for r in d],
            "gateway_rounds_MBps": [round(r.mbps, 1) for r in g],
            "cpu_s_per_GB": {
                side: {
                    who: med([r.cpu_per_gb(who) for r in rs]) for who in ("gateway", "seaweedfs", "client")
                }
                for side, rs in (("direct", d), ("gateway", g))
            },
            "other_cores": {
                side: med([r.other_cores for r in rs]) for side, rs in (("direct", d), ("gateway", g))
            },
        }
        cd, cg = x["cpu_s_per_GB"]["direct"], x["cpu_s_per_GB"]["gateway"]
        direct_total = cd["client"] + cd["seaweedfs"]
        gateway_total = cg["client"] + cg["seaweedfs"] + cg["gateway"]
        x["cpu_bound_ratio"] = direct_total / gateway_total if gateway_total else float("nan")
        return x

    out["get_large"] = thr("get_large")
    out["put_unsigned"] = thr("put_unsigned")
    out["put_signed"] = thr("put_signed")
    d, g = res.of("get_small", "direct"), res.of("get_small", "gateway")
    small: dict[str, Any] = {}
    for q in (50, 99):
        md = med([r.percentile_ms(q) for r in d])
        mg = med([r.percentile_ms(q) for r in g])
        small[f"p{q}"] = {"direct_ms": md, "gateway_ms": mg, "added_ms": mg - md}
    small["gateway_cpu_us_per_request"] = med([r.cpu_s["gateway"] / r.requests * 1e6 for r in g])
    small["seaweedfs_cpu_us_per_request"] = {
        side: med([r.cpu_s["seaweedfs"] / r.requests * 1e6 for r in rs])
        for side, rs in (("direct", d), ("gateway", g))
    }
    small["other_cores"] = {
        side: med([r.other_cores for r in rs]) for side, rs in (("direct", d), ("gateway", g))
    }
    small["requests_per_round"] = o.small_count
    out["get_small"] = small
    if res.memory is not None:
        m = res.memory
        out["memory"] = {
            "uploads": m.uploads,
            "downloads": m.downloads,
            "object_MiB": m.object_bytes / MIB,
            "seconds": m.seconds,
            "MBps": m.bytes_moved / m.seconds / MB,
            "rss_before_MiB": m.rss_before_bytes / MIB,
            "rss_max_sampled_MiB": m.rss_max_sampled_bytes / MIB,
            "hwm_MiB": m.hwm_bytes / MIB,
            "hwm_reset": m.hwm_reset,
            "samples": m.samples,
            "gateway_cpu_s_per_GB": m.cpu_s["gateway"] / (m.bytes_moved / GB),
        }
    out["gateway_lifetime_hwm_MiB"] = res.gateway_lifetime_hwm_bytes / MIB
    timed = res.rounds
    out["other_cores_max"] = max((r.other_cores for r in timed), default=0.0)
    out["other_cores_median"] = med([r.other_cores for r in timed])
    # One CPU-per-GB figure over every byte the gateway moved in the throughput phases.
    moved = [r for r in res.rounds if r.side == "gateway" and r.phase != "get_small"]
    gw_cpu = sum(r.cpu_s["gateway"] for r in moved) + (res.memory.cpu_s["gateway"] if res.memory else 0.0)
    gw_bytes = sum(r.bytes_moved for r in moved) + (res.memory.bytes_moved if res.memory else 0)
    out["gateway_cpu_s_per_GB_all"] = gw_cpu / (gw_bytes / GB) if gw_bytes else float("nan")
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def report(res: Results, s: dict[str, Any]) -> str:
    o = res.opts
    gl, pu, ps, sm = s["get_large"], s["put_unsigned"], s["put_signed"], s["get_small"]
    client = "raw (lean BufferedProtocol client)" if o.client == "raw" else o.client
    lines = [
        f"## s3lanes benchmark: gateway vs direct to SeaweedFS ({'quick' if o.quick else 'full'} run)",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in res.facts.items()],
        f"| client | {client} |",
        "",
        f"Rounds: {o.rounds} per side for GETs, {o.put_rounds} per side and payload mode for PUTs, in "
        "A/B/B/A order; values are medians over rounds. MB/s = 10^6 bytes/s; GB = 10^9 bytes.",
        "",
        "| measurement | direct | gateway | gateway vs direct | target | verdict |",
        "|---|---|---|---|---|---|",
        f"| GET {o.streams} x {o.large_mib} MiB concurrent, MB/s | {gl['direct_MBps']:.0f} "
        f"| {gl['gateway_MBps']:.0f} | {gl['ratio']:.2f}x | >= 0.90x | {verdict(gl['ratio'] >= 0.9)} |",
    ]
    for name, limit_ms in (("p50", 1.0), ("p99", 3.0)):
        x = sm[name]
        lines.append(
            f"| GET 64 KiB sequential, {name} ms | {x['direct_ms']:.3f} | {x['gateway_ms']:.3f} "
            f"| +{x['added_ms']:.3f} ms | <= +{limit_ms:.0f} ms | {verdict(x['added_ms'] <= limit_ms)} |"
        )
    for label, x in (("UNSIGNED-PAYLOAD", pu), ("signed payload (SHA-256)", ps)):
        lines.append(
            f"| PUT {o.put_streams} x {o.large_mib} MiB, {label}, MB/s | {x['direct_MBps']:.0f} "
            f"| {x['gateway_MBps']:.0f} | {x['ratio']:.2f}x | none | |"
        )
    if "memory" in s:
        m = s["memory"]
        lines.append(
            f"| gateway peak RSS, {m['uploads']} PUT + {o.rss_streams} GET streams "
            f"x {m['object_MiB']:.0f} MiB at once ({m['downloads']} GETs in all) | | {m['hwm_MiB']:.1f} MiB "
            f"| VmHWM; max sampled VmRSS {m['rss_max_sampled_MiB']:.1f} MiB "
            f"| <= 200 MiB | {verdict(m['hwm_MiB'] <= 200)} |"
        )
    per_gb = [("GET", gl), ("PUT unsigned", pu), ("PUT signed", ps)]
    cpu_text = ", ".join(f"{label} {x['cpu_s_per_GB']['gateway']['gateway']:.2f}" for label, x in per_gb)
    if "memory" in s:
        cpu_text += f", mixed PUT+GET {s['memory']['gateway_cpu_s_per_GB']:.2f}"
    lines += [
        f"| gateway CPU, s per GB moved | | {s['gateway_cpu_s_per_GB_all']:.2f} (all bytes) | {cpu_text} "
        "| baseline | |",
        f"| gateway CPU per small GET | | {sm['gateway_cpu_us_per_request']:.0f} us | | baseline | |",
        "",
        "Where the CPU goes, s per GB (median over rounds; "
        + (res.facts.get("CPU pinning") or f"{os.cpu_count()} cores for all")
        + "):",
        "",
        "| phase | side | client | SeaweedFS | gateway | total | other processes, cores busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, x in per_gb:
        for side in ("direct", "gateway"):
            c = x["cpu_s_per_GB"][side]
            gw = c["gateway"] if side == "gateway" else 0.0
            lines.append(
                f"| {label} | {side} | {c['client']:.2f} | {c['seaweedfs']:.2f} | "
                f"{gw:.2f} | {c['client'] + c['seaweedfs'] + gw:.2f} | {x['other_cores'][side]:.2f} |"
            )
    lines += [
        "",
        f"If large GETs were purely CPU-bound, gateway/direct would be the inverse ratio of the totals: "
        f"{gl['cpu_bound_ratio']:.2f}x (measured {gl['ratio']:.2f}x).",
        "",
        f"Small GETs, CPU per request: gateway {sm['gateway_cpu_us_per_request']:.0f} us; SeaweedFS "
        f"{sm['seaweedfs_cpu_us_per_request']['direct']:.0f} us direct, "
        f"{sm['seaweedfs_cpu_us_per_request']['gateway']:.0f} us behind the gateway; other processes "
        f"kept {sm['other_cores']['direct']:.2f} / {sm['other_cores']['gateway']:.2f} cores busy "
        "(direct / gateway).",
    ]
    if s["other_cores_max"] > 0.25:
        lines += [
            "",
            f"**Background load:** other processes kept up to {s['other_cores_max']:.2f} cores busy during "
            f"a round (median {s['other_cores_median']:.2f}); numbers are noisier than on an idle machine.",
        ]
    lines += [
        "",
        "Per-round MB/s, direct | gateway: "
        + "; ".join(f"{label} {x['direct_rounds_MBps']} | {x['gateway_rounds_MBps']}" for label, x in per_gb),
        "",
        f"Gateway lifetime VmHWM (all phases): {s['gateway_lifetime_hwm_MiB']:.1f} MiB; "
        f"set-up uploads took {res.setup_seconds:.0f} s; gateway exit code {res.gateway_exit_code}.",
    ]
    if res.gateway_log_problems:
        lines += ["", "**The gateway logged problems:**", "", "```", res.gateway_log_problems, "```"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# main


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed benchmark still tears down
    tmp = Path(tempfile.mkdtemp(prefix="s3lanes-bench-", dir=opts.tmp_dir))
    results = Results(opts, machine_facts())
    if opts.gateway_toml is not None:
        extra = " ".join(opts.gateway_toml.read_text().split())
        results.facts["extra gateway TOML"] = f"`{extra}`"
    speed_before = python_speed_ns()
    stack = Stack(tmp=tmp, weed=new_weed(tmp))
    ok = False
    try:
        print(f"state in {tmp}; starting SeaweedFS ...", file=sys.stderr, flush=True)
        stack.weed.start()
        stack.direct = Endpoint.from_url(stack.weed.endpoint_url)
        start_proxy_gateway(stack, opts.gateway_toml.read_text() if opts.gateway_toml else "")
        if opts.gateway_cpus is not None:
            rest = frozenset(os.sched_getaffinity(0)) - opts.gateway_cpus
            pin_process(stack.gateway_pid, opts.gateway_cpus)
            pin_process(stack.weed.pid or 0, rest)
            pin_process(os.getpid(), rest)
            results.facts["CPU pinning"] = (
                f"gateway on CPUs {sorted(opts.gateway_cpus)}; SeaweedFS and the benchmark client on "
                f"{sorted(rest)} (both sides)"
            )
        print(
            f"SeaweedFS pid {stack.weed.pid} at {stack.weed.endpoint_url}; gateway pid {stack.gateway_pid} "
            f"at http://{stack.via_gateway.netloc}",
            file=sys.stderr,
            flush=True,
        )
        t0 = time.monotonic()
        uvloop.run(run_phases(opts, stack, results))
        results.gateway_lifetime_hwm_bytes = memory_bytes(stack.gateway_pid)[1]
        print(f"phases took {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        ok = True
    except KeyboardInterrupt:
        print("interrupted; tearing down", file=sys.stderr, flush=True)
        return 130
    except BaseException:
        print("--- gateway log tail ---\n" + tail(stack.gateway_log), file=sys.stderr)
        print("--- SeaweedFS log tail ---\n" + stack.weed.log_tail(), file=sys.stderr)
        raise
    finally:
        results.gateway_exit_code = stop_proxy_gateway(stack)
        if stack.gateway_log is not None:
            text = tail(stack.gateway_log, 1_000_000)
            bad = [ln for ln in text.splitlines() if "Traceback" in ln or " ERROR " in ln]
            results.gateway_log_problems = "\n".join(bad[:20])
        stack.weed.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if ok:
            results.facts["python speed probe"] = (
                f"{speed_before:.0f} ns per loop iteration before the run, {python_speed_ns():.0f} after "
                "(lower is faster; measured with nothing of ours running)"
            )
            s = summary(results)
            text = report(results, s)
            if "objects" in opts.phases:
                from loadtests import bench_objects

                s["objects"] = bench_objects.summary(results.object_rounds, opts.large_mib)
                objects_text = bench_objects.report(s["objects"], opts.rounds)
                text = objects_text if opts.phases == {"objects"} else text + "\n\n" + objects_text
            print(text)
            if opts.json_path is not None:
                doc = {
                    "options": {
                        k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(opts).items()
                    },
                    "machine": results.facts,
                    "summary": s,
                    "rounds": [r.as_json() for r in results.rounds + results.object_rounds],
                    "memory": dataclasses.asdict(results.memory) if results.memory else None,
                    "report_markdown": text,
                }
                opts.json_path.write_text(json.dumps(doc, indent=2, default=str))
                print(f"\n(wrote {opts.json_path})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
