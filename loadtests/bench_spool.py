"""The write spool, side by side in one run: local-disk ack throughput and latency, drain speed, save time.

Run it as ``python -m loadtests.bench_spool`` (``make bench-spool``); ``--help`` lists the knobs, ``--quick``
is a one-to-two-minute sanity run. Results and their interpretation live in ``docs/benchmarks.md``
("Write spool").

Theory of operation
-------------------
The benchmark starts its own SeaweedFS (a temporary state directory, removed at the end) and several
``s3lanes serve`` subprocesses in front of it, each with its own spool directory under the same temporary
directory (so on the same filesystem), and measures five things, every one side by side with its reference
in interleaved rounds (A/B/B/A, or A/B/C/C/B/A with three variants) so that slow drift hits all sides alike:

1. **Disk baseline.** Objects sized like the PUTs below written into the spool directory in 1 MiB
   ``os.write`` chunks, each followed by ``fsync``: once one object after the other (one stream), once by
   ``--clients`` threads at a time, each both through the page cache and with ``O_DIRECT`` from an aligned
   buffer (how the spool itself writes where the filesystem allows it). This is what the spool's own disk
   can do with the same durability; the acks are compared with the fastest of them and with each.
2. **Ack throughput.** ``--clients`` concurrent clients PUT objects (``--sizes-mib``) through a gateway with
   the spool on; throughput = bytes acknowledged / wall time, interleaved with the disk rounds of (1). The
   gateway has ``[backend] bandwidth = --trickle``, so its drain trickles at that rate instead of competing
   for the disk and the CPU while acks are measured (the spool has no pause switch, on purpose).
3. **1 MiB PUT latency.** Sequential 1 MiB PUTs, time to 200 OK: directly to SeaweedFS, through a gateway
   with ``x-s3lanes-write-through: true``, and into the spool of a gateway whose drain runs freely
   (uploading each object right after its ack) and of the trickling gateway of (2). The floor under them:
   the spool's durability recipe done by hand in its directory, without HTTP or MD5 (write 1 MiB, fsync,
   fsync the directory, append a journal record, fdatasync).
4. **Drain throughput, reads idle.** The spool is filled by a trickling gateway, which is then stopped; a
   gateway without a bandwidth setting is started on the same spool directory (recovery resumes the
   drains) and ``POST /_s3lanes/flush`` times how long until everything is on SeaweedFS. Interleaved with a
   direct upload of the same objects by as many parallel PUTs as the drain runs (``drain_concurrency``),
   and with a third variant where the drain runs while the clients still upload (time to ack, to durable).
5. **Trainer-visible checkpoint save time.** A token-bucket TCP relay (a subprocess of this script,
   loopback only) limits the store to ``--relay-rate``; a checkpoint (``--ckpt-objects`` x
   ``--ckpt-object-mib`` by ``--ckpt-writers`` writers) is saved directly through the relay and through a
   spooling gateway in front of the same relay: the time the trainer waits (all PUTs acknowledged) and the
   time until the data is durable on the store (flush).

Every measurement records the CPU seconds of each of our processes (``/proc/PID/stat``), of kernel threads
(writeback, the ext4 journal) and of everything else on the machine ("other processes"): on a small shared
machine those explain most ratios. While a gateway drains, its scheduler is sampled (capacity estimate,
queued checkpoint-lane tickets) to tell pacing by the gateway from a busy machine. The client is the lean
``BufferedProtocol`` client of ``loadtests.bench_proxy`` with ``UNSIGNED-PAYLOAD`` SigV4 signing over HTTP,
sending views of one random in-memory block (it costs ~0.25 s of CPU per GB sent).

Everything is bounded (``--phase-timeout-s``) and torn down (SIGTERM, then SIGKILL, by pid) on success,
failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import mmap
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote

import uvloop

from loadtests.harness.cli import bench_parser, from_namespace, parse_sized
from loadtests.harness.endpoint import Endpoint
from loadtests.harness.errors import BenchError
from loadtests.harness.gateway import (
    SPOOL_DRAIN_CONCURRENCY,
    GatewayProcess,
    SpoolGatewaySpec,
    spawn,
    start_spool_gateway,
    stop_gateway,
    tail,
    wait_ready,
)
from loadtests.harness.machine import CLK_TCK, CpuMeter, machine_facts, python_speed_ns
from loadtests.harness.phase import progress, time_limited
from loadtests.harness.rawclient import RawHttp, Reply, expect, signed_head
from loadtests.harness.stats import GB, MB, MIB, med, other_cores, percentile, rate_mbps, run_all, timed_json
from loadtests.harness.store import BUCKET, new_weed
from s3lanes.config import parse_rate
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD
from s3lanes.seaweed.process import SeaweedProcess

LOG_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")

# Where `python -m loadtests.bench_spool _relay` finds this package (the relay is a subprocess of it).
LOADTESTS_PARENT = Path(__file__).resolve().parent.parent

CHUNK_BYTES = 1 * MIB  # disk baseline writes and client body pieces
BLOCK_BYTES = 8 * MIB  # one random block; objects are views into it (nothing compressible, nothing on disk)
LATENCY_OBJECT_BYTES = 1 * MIB
LATENCY_WARMUP = 20
WRITE_THROUGH_HEADER = "x-s3lanes-write-through"
FLUSH_TIMEOUT_S = 1800.0
DRAIN_CONCURRENCY = SPOOL_DRAIN_CONCURRENCY
RELAY_READ_BYTES = 256 * 1024
RELAY_SOCKET_BUFFER_BYTES = 256 * 1024
RELAY_BURST_BYTES = 1 * MIB
RELAY_START_TIMEOUT_S = 15.0
SCHEDULER_SAMPLE_INTERVAL_S = 0.25
RECIPE_RECORD_BYTES = 200  # about one msgpack put record of the journal
DISK_RECIPE = "disk: write+fsync, dir fsync, journal fdatasync"


def disk_variants(clients: int, direct: bool) -> dict[str, str]:
    """The disk baselines of the ack phase, variant -> label (the O_DIRECT ones where the spool uses it)."""
    out = {
        "disk-1-stream": "1 stream, page cache",
        f"disk-{clients}-streams": f"{clients} streams, page cache",
    }
    if direct:
        out["disk-direct-1-stream"] = "1 stream, O_DIRECT"
        out[f"disk-direct-{clients}-streams"] = f"{clients} streams, O_DIRECT"
    return out


# --------------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class Options:
    quick: bool
    out_dir: Path | None
    tmp_dir: Path | None
    clients: int
    sizes_mib: tuple[int, ...]
    ack_mib: int
    rounds: int
    ack_rounds: int
    latency_count: int
    drain_mib: int
    drain_object_mib: int
    ckpt_objects: int
    ckpt_object_mib: int
    ckpt_writers: int
    relay_rate_bps: float
    trickle_bps: float
    phase_timeout_s: float
    only: frozenset[str]
    command: str
    from_json: Path | None = None
    content_md5: bool = False
    signed_payload: bool = False


PHASES = ("ack", "latency", "drain", "checkpoint")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = bench_parser(
        "bench_spool",
        "s3lanes write spool: ack throughput vs the disk, 1 MiB ack latency, drain speed and "
        "checkpoint save time, side by side with their references.",
        "small sizes, one round (about 1-2 minutes)",
    )
    p.add_argument("--out", type=Path, dest="out_dir", help="write results.json and report.md here")
    # Sizes, counts and rounds: default=(full run, --quick run), or one default for both (parse_sized).
    p.add_argument("--clients", default=8, help="concurrent PUT clients, and disk-baseline threads")
    p.add_argument("--sizes-mib", help="object sizes of the ack phase, comma-separated (64,16)")
    p.add_argument("--ack-mib", default=(2048, 512), help="MiB PUT per ack round and per disk round")
    p.add_argument("--rounds", default=(3, 1), help="rounds per variant in phases 3-5")
    p.add_argument("--ack-rounds", default=(5, 1), help="rounds per variant in phases 1-2")
    p.add_argument("--latency-count", default=(300, 100), help="1 MiB PUTs per variant, all rounds")
    p.add_argument("--drain-mib", default=(2048, 512), help="MiB spooled, then drained, per round")
    p.add_argument("--drain-object-mib", default=64, help="object size of the drain phase")
    p.add_argument("--ckpt-objects", default=(16, 8), help="objects per checkpoint")
    p.add_argument("--ckpt-object-mib", default=(64, 32), help="MiB per checkpoint object")
    p.add_argument("--ckpt-writers", default=8, help="parallel checkpoint writers")
    p.add_argument("--relay-rate", default="100MB/s", help="bandwidth of the limited store (100MB/s)")
    p.add_argument("--trickle", default="5MB/s", help="[backend] bandwidth of the trickling gateway (5MB/s)")
    p.add_argument("--phase-timeout-s", type=float, default=900.0, help="hard limit per measurement (900)")
    p.add_argument("--only", help=f"run only these phases, comma-separated ({','.join(PHASES)})")
    p.add_argument(
        "--content-md5",
        action="store_true",
        help="the ack phase's PUTs carry Content-MD5, as rclone and minio send it (the gateway verifies it; "
        "computed before each round's clock starts)",
    )
    p.add_argument(
        "--signed-payload",
        action="store_true",
        help="the ack phase's PUTs are signed with their body's SHA-256 and carry x-amz-checksum-crc32, as "
        "boto3, the aws cli and s3fs send them over plain HTTP (computed before each round's clock starts)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        help="print the report of an earlier run's results.json (from --out) and exit",
    )
    a = parse_sized(p, argv)
    sizes = tuple(int(s) for s in (a.sizes_mib or "64,16").split(",") if s.strip())
    if not sizes or min(sizes) <= 0:
        p.error("--sizes-mib needs positive sizes")
    only = frozenset(s.strip() for s in (a.only or ",".join(PHASES)).split(",") if s.strip())
    if not only <= set(PHASES):
        p.error(f"--only takes {', '.join(PHASES)}")
    try:
        relay_rate, trickle = parse_rate(a.relay_rate), parse_rate(a.trickle)
    except ValueError as exc:
        p.error(str(exc))
    cmd = shlex.join([Path(sys.executable).name, "-m", "loadtests.bench_spool", *(argv or sys.argv[1:])])
    return from_namespace(
        Options,
        a,
        sizes_mib=sizes,
        relay_rate_bps=relay_rate,
        trickle_bps=trickle,
        only=only,
        command=cmd,
    )


# --------------------------------------------------------------------------------------------------------
# Object data: views into one random block, exactly CHUNK_BYTES each (the last one shorter)

_BLOCK = memoryview(os.urandom(BLOCK_BYTES))


def chunks(size_bytes: int, seed: int) -> Iterator[memoryview]:
    slots = BLOCK_BYTES // CHUNK_BYTES
    sent = 0
    i = seed
    while sent < size_bytes:
        n = min(CHUNK_BYTES, size_bytes - sent)
        off = (i % slots) * CHUNK_BYTES
        yield _BLOCK[off : off + n]
        sent += n
        i += 1


@functools.lru_cache(maxsize=64)
def body_promises(size_bytes: int, seed: int, content_md5: bool, signed: bool) -> tuple[str, dict[str, str]]:
    """(payload hash, headers) promising what the body :func:`chunks` makes for (size, seed) is: its
    Content-MD5 (as rclone and minio send), and/or its signed SHA-256 with x-amz-checksum-crc32 (as boto3
    sends over plain HTTP). Bodies repeat, so it is cached."""
    md5 = hashlib.md5(usedforsecurity=False) if content_md5 else None
    sha = hashlib.sha256() if signed else None
    crc = 0
    for piece in chunks(size_bytes, seed):
        if md5 is not None:
            md5.update(piece)
        if sha is not None:
            sha.update(piece)
            crc = zlib.crc32(piece, crc)
    headers: dict[str, str] = {}
    if md5 is not None:
        headers["content-md5"] = base64.b64encode(md5.digest()).decode("ascii")
    if sha is None:
        return UNSIGNED_PAYLOAD, headers
    headers["x-amz-checksum-crc32"] = base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")
    headers["x-amz-sdk-checksum-algorithm"] = "CRC32"
    return sha.hexdigest(), headers


# --------------------------------------------------------------------------------------------------------
# The token-bucket relay (runs as `python -m loadtests.bench_spool _relay ...`)


class Pacer:
    """GCRA token bucket shared by every connection of one direction: grants in arrival order, at most
    ``burst_bytes`` ahead of the rate. Not thread-safe; one event loop."""

    def __init__(self, rate_bps: float, burst_bytes: int) -> None:
        self._rate_bps = rate_bps
        self._burst_s = burst_bytes / rate_bps
        self._tat = 0.0  # theoretical arrival time: when everything granted so far has "left"
        self.bytes = 0

    async def take(self, n: int) -> None:
        now = asyncio.get_running_loop().time()
        self._tat = max(self._tat, now) + n / self._rate_bps
        self.bytes += n
        delay = self._tat - self._burst_s - now
        if delay > 0:
            await asyncio.sleep(delay)


def _small_buffers(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # Small kernel buffers keep the pace on the wire: the relay's lead is bounded by them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RELAY_SOCKET_BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RELAY_SOCKET_BUFFER_BYTES)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pacer: Pacer) -> None:
    try:
        while data := await reader.read(RELAY_READ_BYTES):
            await pacer.take(len(data))
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def relay_serve(target: Endpoint, rate_bps: float, ready_file: Path) -> None:
    up, down = Pacer(rate_bps, RELAY_BURST_BYTES), Pacer(rate_bps, RELAY_BURST_BYTES)
    writers: set[asyncio.StreamWriter] = set()
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        writers.add(c_writer)
        try:
            try:
                b_reader, b_writer = await asyncio.open_connection(
                    target.host, target.port, limit=RELAY_READ_BYTES
                )
            except OSError:
                c_writer.close()
                return
            writers.add(b_writer)
            _small_buffers(c_writer)
            _small_buffers(b_writer)
            await asyncio.gather(_pipe(c_reader, b_writer, up), _pipe(b_reader, c_writer, down))
            writers.discard(b_writer)
        finally:
            writers.discard(c_writer)
            handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=RELAY_READ_BYTES)
    port = server.sockets[0].getsockname()[1]
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "port": port}))
    os.replace(tmp, ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    # Cut the connections still open (idle, kept alive): their pipes end on the error, not by cancellation.
    for w in list(writers):
        w.transport.abort()
    await asyncio.gather(*handlers, return_exceptions=True)
    print(f"relay: {up.bytes} bytes up, {down.bytes} bytes down", file=sys.stderr, flush=True)


def relay_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench_spool _relay")
    p.add_argument("--target", required=True, help="host:port of the store")
    p.add_argument("--rate-bps", type=float, required=True)
    p.add_argument("--ready-file", type=Path, required=True)
    a = p.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    uvloop.run(relay_serve(Endpoint(host, int(port)), a.rate_bps, a.ready_file))
    return 0


# --------------------------------------------------------------------------------------------------------
# Our processes


def role(name: str) -> str:
    """What a process is, for the CPU tables: the per-round gateways of one kind share a name there."""
    return name if name == "relay" else "gateway " + re.sub(r"-r\d+$", "", name)


def start_relay(root: Path, target: Endpoint, rate_bps: float) -> GatewayProcess:
    d = root / "relay"
    d.mkdir()
    ready = d / "ready.json"
    log = d / "relay.log"
    argv = [sys.executable, "-m", "loadtests.bench_spool", "_relay", "--target", target.netloc,
            "--rate-bps", str(rate_bps), "--ready-file", str(ready)]  # fmt: skip
    popen = spawn(argv, log, cwd=LOADTESTS_PARENT)
    doc = wait_ready(popen, ready, log, RELAY_START_TIMEOUT_S, "the relay")
    return GatewayProcess("relay", popen, int(doc["pid"]), Endpoint("127.0.0.1", int(doc["port"])), log)


# --------------------------------------------------------------------------------------------------------
# CPU accounting

PF_KTHREAD = 0x00200000


def kernel_threads_cpu_seconds() -> float:
    """user+sys CPU of all kernel threads alive now (kworker writeback, jbd2, ksoftirqd...): on this VM the
    page-cache writeback, ext4 journal commits and discards of our own files land there, not in our pids."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                rest = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # After "pid (comm)": flags (field 9) is rest[6]; utime and stime (14, 15) are rest[11] and rest[12].
        if int(rest[6]) & PF_KTHREAD:
            ticks += int(rest[11]) + int(rest[12])
    return ticks / CLK_TCK


@dataclass(slots=True)
class Meter:
    """:class:`CpuMeter` plus a "kernel threads" bucket taken out of "other" (processes not ours)."""

    cpu: CpuMeter
    _kernel_start: float = 0.0

    def start(self) -> None:
        self._kernel_start = kernel_threads_cpu_seconds()
        self.cpu.start()

    def stop(self) -> dict[str, float]:
        out = self.cpu.stop()
        kernel = max(0.0, kernel_threads_cpu_seconds() - self._kernel_start)
        out["kernel threads"] = round(kernel, 3)
        out["other"] = round(max(0.0, out["other"] - kernel), 3)
        return out


# --------------------------------------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class Sample:
    """One timed measurement of one variant in one round."""

    phase: str
    variant: str
    round: int
    bytes: int
    seconds: float
    cpu_s: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def mbps(self) -> float:
        return rate_mbps(self.bytes, self.seconds)

    @property
    def other_cores(self) -> float:
        return other_cores(self.cpu_s, self.seconds)

    def as_json(self) -> dict[str, Any]:
        label = ("variant", self.variant)
        out = {
            **timed_json(self.phase, label, self.round, self.bytes, self.seconds, self.cpu_s),
            **self.extra,
        }
        if self.latencies_ms:
            s = sorted(self.latencies_ms)
            out |= {f"p{q}_ms": round(percentile(s, q), 3) for q in (50, 90, 99)}
            out["latencies_ms"] = [round(x, 3) for x in self.latencies_ms]
        return out


@dataclass(slots=True)
class Results:
    opts: Options
    facts: dict[str, str]
    samples: list[Sample] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)
    log_problems: dict[str, str] = field(default_factory=dict)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    def of(self, phase: str, variant: str) -> list[Sample]:
        return [s for s in self.samples if s.phase == phase and s.variant == variant]


def interleaved(rounds: int, variants: Sequence[str]) -> Iterator[tuple[int, str]]:
    """A B C, C B A, A B C, ...: every variant sees the same drift on average."""
    for i in range(rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for v in order:
            yield i, v


def mount_of(path: Path) -> dict[str, str]:
    """The /proc/mounts line of the filesystem holding ``path`` (longest mount-point prefix)."""
    real = str(path.resolve())
    best: dict[str, str] = {}
    with open("/proc/mounts") as fh:
        for line in fh:
            dev, mnt, fstype, opts_, *_ = line.split()
            mnt = mnt.replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                best.get("mount", "")
            ):
                best = {"device": dev, "mount": mnt, "fstype": fstype, "options": opts_}
    return best


# --------------------------------------------------------------------------------------------------------
# The benchmark


class Bench:
    def __init__(self, opts: Options, tmp: Path, weed: SeaweedProcess, results: Results) -> None:
        self.opts = opts
        self.tmp = tmp
        self.weed = weed
        self.results = results
        self.direct = Endpoint.from_url(weed.endpoint_url)
        self.client = RawHttp()
        self.procs: dict[str, GatewayProcess] = {}
        self._disk_pool = ThreadPoolExecutor(max_workers=max(opts.clients, 1), thread_name_prefix="disk")

    # -- plumbing --------------------------------------------------------------------------------------------

    log = staticmethod(progress)

    async def bounded(self, what: str, aw: Awaitable[Any]) -> Any:
        return await time_limited(what, aw, self.opts.phase_timeout_s)

    def meter(self) -> Meter:
        """CPU of every process of ours that is alive now, the client, kernel threads, and the rest."""
        pids = {"seaweedfs": self.weed.pid or 0}
        pids |= {role(name): p.pid for name, p in self.procs.items() if p.popen.poll() is None}
        return Meter(CpuMeter(pids))

    async def start_gateway(
        self, name: str, spool_dir: Path, bandwidth_bps: float | None, backend_url: str | None = None
    ) -> GatewayProcess:
        url = backend_url or self.weed.endpoint_url
        spec = SpoolGatewaySpec(url, spool_dir, bandwidth_bps)
        gw = await asyncio.to_thread(start_spool_gateway, self.tmp, name, spec)
        self.procs[name] = gw
        self.results.configs[name] = gw.config_text
        self.log(f"gateway {name}: pid {gw.pid} at {gw.endpoint.netloc}, spool {spool_dir}")
        return gw

    async def stop(self, proc: GatewayProcess) -> None:
        code = await asyncio.to_thread(stop_gateway, proc)
        self.results.exit_codes[proc.name] = code
        self.procs.pop(proc.name, None)
        self.collect_log(proc)

    def collect_log(self, proc: GatewayProcess) -> None:
        text = tail(proc.log, 2_000_000)
        lines = text.splitlines()
        bad = [
            ln
            for ln in lines
            if " ERROR " in ln or " WARNING " in ln or "Traceback" in ln or LOG_EXCEPTION.match(ln)
        ]
        if bad:
            self.results.log_problems[proc.name] = f"{len(bad)} lines, the first ones:\n" + "\n".join(
                bad[:12]
            )

    async def close(self) -> None:
        for proc in list(self.procs.values()):
            await self.stop(proc)
        await self.client.close()
        self._disk_pool.shutdown(wait=True)

    # -- requests --------------------------------------------------------------------------------------------

    def _put_head(
        self, ep: Endpoint, key: str, size: int, extra: dict[str, str] | None, payload_hash: str
    ) -> tuple[str, dict[str, str]]:
        path = f"/{BUCKET}/{quote(key, safe='/')}"
        headers = signed_head(ep, "PUT", path, payload_hash, extra)
        headers["content-length"] = str(size)
        return path, headers

    async def put(
        self,
        ep: Endpoint,
        key: str,
        size: int,
        seed: int,
        extra: dict[str, str] | None = None,
        payload_hash: str = UNSIGNED_PAYLOAD,
    ) -> None:
        path, headers = self._put_head(ep, key, size, extra, payload_hash)
        reply = await self.client.call(ep, "PUT", path, headers, chunks(size, seed))
        expect(reply, 200, f"PUT {key} via {ep.netloc}")

    async def put_all(
        self,
        ep: Endpoint,
        prefix: str,
        n_objects: int,
        size: int,
        writers: int,
        promises: list[tuple[str, dict[str, str]]] | None = None,
    ) -> None:
        """``n_objects`` of ``size`` under ``prefix`` by ``writers`` concurrent clients, each sequential;
        ``promises``: each object's payload hash and headers (:func:`body_promises`)."""
        keys = [f"{prefix}/obj-{j:05d}" for j in range(n_objects)]

        async def writer(w: int) -> None:
            for j in range(w, n_objects, writers):
                if promises is None:
                    await self.put(ep, keys[j], size, j)
                else:
                    payload_hash, extra = promises[j]
                    await self.put(ep, keys[j], size, j, extra, payload_hash)

        await run_all(writer(w) for w in range(min(writers, n_objects)))

    async def admin(self, gw: GatewayProcess, method: str, path: str) -> tuple[int, dict[str, Any]]:
        headers = {"host": gw.endpoint.netloc, "content-length": "0"}
        reply: Reply = await self.client.call(gw.endpoint, method, path, headers, want_body=True)
        try:
            doc = json.loads(reply.body) if reply.body else {}
        except ValueError:
            raise BenchError(f"{method} {path}: {reply.status} {reply.body[:300]!r}") from None
        return reply.status, doc

    async def spool_status(self, gw: GatewayProcess) -> dict[str, Any]:
        status, doc = await self.admin(gw, "GET", "/_s3lanes/status")
        if status != 200:
            raise BenchError(f"status of {gw.name}: {status} {doc}")
        spool: dict[str, Any] = doc["spool"]
        return spool

    @contextlib.asynccontextmanager
    async def watch_scheduler(self, gw: GatewayProcess, into: dict[str, Any]) -> AsyncIterator[None]:
        """Sample the gateway's scheduler while the block runs: was the checkpoint lane (the drain) held back
        by the gateway's pacing (queued tickets, capacity estimate), or by the machine?"""
        samples: list[dict[str, Any]] = []
        stop = asyncio.Event()

        async def sampler() -> None:
            while not stop.is_set():
                status, doc = await self.admin(gw, "GET", "/_s3lanes/status")
                if status == 200:
                    sch = doc["scheduler"]
                    lane = next(ln for ln in sch["lanes"] if ln["name"] == "checkpoint")
                    samples.append(
                        {
                            "capacity_bps": sch["capacity_bps"],
                            "queued": lane["queued_tickets"],
                            "inflight_bytes": sch["inflight_bytes"],
                            "limit_bps": lane["limit_bps"],
                        }
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SCHEDULER_SAMPLE_INTERVAL_S)

        task = asyncio.create_task(sampler())
        try:
            yield
        finally:
            stop.set()
            await task
            if samples:
                into["scheduler_samples"] = len(samples)
                into["capacity_MBps_median"] = round(med([x["capacity_bps"] for x in samples]) / MB, 1)
                into["capacity_MBps_min"] = round(min(x["capacity_bps"] for x in samples) / MB, 1)
                into["checkpoint_lane_queued_fraction"] = round(
                    sum(1 for x in samples if x["queued"]) / len(samples), 3
                )
                into["inflight_MB_median"] = round(med([x["inflight_bytes"] for x in samples]) / MB, 1)

    async def flush(self, gw: GatewayProcess, prefix: str) -> dict[str, Any]:
        q = f"bucket={BUCKET}&prefix={quote(prefix, safe='')}&timeout={FLUSH_TIMEOUT_S:g}"
        status, doc = await self.admin(gw, "POST", f"/_s3lanes/flush?{q}")
        if status != 200 or not doc.get("durable"):
            raise BenchError(f"flush of {gw.name} {prefix!r}: {status} {doc}")
        return doc

    # -- set-up ----------------------------------------------------------------------------------------------

    async def sanity(self, gw: GatewayProcess, *, spooled: bool) -> None:
        """A PUT through the gateway lands where expected and reads back byte for byte."""
        key = f"sanity/{gw.name}"
        before = (await self.spool_status(gw))["acked_bytes_total"]
        await self.put(gw.endpoint, key, LATENCY_OBJECT_BYTES, 3)
        after = (await self.spool_status(gw))["acked_bytes_total"]
        if (after - before == LATENCY_OBJECT_BYTES) != spooled:
            raise BenchError(f"gateway {gw.name}: spooled {after - before} bytes, expected spooled={spooled}")
        path = f"/{BUCKET}/{key}"
        reply = await self.client.call(
            gw.endpoint, "GET", path, signed_head(gw.endpoint, "GET", path, UNSIGNED_PAYLOAD), want_body=True
        )
        expect(reply, 200, f"GET {key}", LATENCY_OBJECT_BYTES)
        if reply.body != b"".join(chunks(LATENCY_OBJECT_BYTES, 3)):
            raise BenchError(f"GET {key} via {gw.name} returned different bytes")

    # -- 1 and 2: disk baseline and ack throughput -----------------------------------------------------------

    def _write_objects(self, paths: list[Path], size: int, direct: bool) -> None:
        """Objects written in 1 MiB chunks and fsynced; with ``direct``, by O_DIRECT from an aligned buffer
        (the chunk is copied into it first, as the spool copies a body into its piece buffers)."""
        # Freed when the last view of it goes (an explicit close() would refuse while views exist).
        aligned = memoryview(mmap.mmap(-1, CHUNK_BYTES)) if direct else None
        for n, path in enumerate(paths):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
            fd = os.open(path, flags, 0o600)
            try:
                for piece in chunks(size, n):
                    view = piece
                    if aligned is not None:
                        aligned[: len(piece)] = piece
                        view = aligned[: len(piece)]
                    while view:
                        view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)

    async def ack_phase(self, gw: GatewayProcess) -> None:
        o = self.opts
        assert gw.spool_dir is not None
        total = o.ack_mib * MIB
        direct_ok = bool((await self.spool_status(gw)).get("direct_io"))
        self.results.facts["spool data files"] = "O_DIRECT" if direct_ok else "page cache"
        if o.content_md5 or o.signed_payload:
            what = [
                w
                for w, on in (("Content-MD5", o.content_md5), ("signed SHA-256 + CRC32", o.signed_payload))
                if on
            ]
            self.results.facts["ack phase PUTs"] = (
                f"with {' and '.join(what)} (verified by the gateway before the ack)"
            )
        variants = (*disk_variants(o.clients, direct_ok), "spool-ack")
        for size_mib in o.sizes_mib:
            size = size_mib * MIB
            n = max(1, total // size)
            phase = f"ack-{size_mib}MiB"
            for i, variant in interleaved(o.ack_rounds, variants):
                meter = self.meter()
                # Timed part only; the unlinks of the disk rounds happen after the clock stops.
                if variant == "spool-ack":
                    promises = (
                        [body_promises(size, j, o.content_md5, o.signed_payload) for j in range(n)]
                        if o.content_md5 or o.signed_payload
                        else None
                    )
                    before = (await self.spool_status(gw))["acked_bytes_total"]
                    meter.start()
                    t0 = time.perf_counter()
                    await self.bounded(
                        phase, self.put_all(gw.endpoint, f"{phase}/r{i}", n, size, o.clients, promises)
                    )
                    seconds = time.perf_counter() - t0
                    cpu = meter.stop()
                    spool = await self.spool_status(gw)
                    if spool["acked_bytes_total"] - before != n * size:
                        raise BenchError(
                            f"{phase}: the gateway spooled {spool['acked_bytes_total'] - before}"
                        )
                    extra = {"spool_pending_bytes_after": spool["pending_bytes"]}
                else:
                    threads = 1 if variant.endswith("-1-stream") else o.clients
                    direct = variant.startswith("disk-direct-")
                    paths = [gw.spool_dir / f"bench-disk-baseline-{j:05d}" for j in range(n)]
                    shares = [paths[w::threads] for w in range(threads)]
                    loop = asyncio.get_running_loop()
                    meter.start()
                    t0 = time.perf_counter()
                    try:
                        await self.bounded(
                            phase,
                            asyncio.gather(
                                *(
                                    loop.run_in_executor(
                                        self._disk_pool, self._write_objects, s, size, direct
                                    )
                                    for s in shares
                                    if s
                                )
                            ),
                        )
                        seconds = time.perf_counter() - t0
                        cpu = meter.stop()
                    finally:
                        await loop.run_in_executor(self._disk_pool, _unlink_all, paths)
                    extra = {"threads": threads, "direct": direct}
                s = Sample(phase, variant, i, n * size, seconds, cpu, extra)
                self.results.samples.append(s)
                self.log(f"{phase} {variant:16s} round {i}: {s.mbps:7.1f} MB/s in {seconds:.2f} s  cpu {cpu}")

    # -- 3: 1 MiB ack latency --------------------------------------------------------------------------------

    def _recipe_latencies(self, d: Path, count: int) -> list[float]:
        """The spool's durability recipe by hand, without HTTP or MD5: write 1 MiB to a new file, fsync it,
        fsync the directory, append a small record to a journal and fdatasync it. The floor under (3)."""
        d.mkdir()
        journal = os.open(d / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        record = os.urandom(RECIPE_RECORD_BYTES)
        out: list[float] = []
        try:
            for j in range(count):
                t0 = time.perf_counter_ns()
                fd = os.open(d / f"{j:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    for piece in chunks(LATENCY_OBJECT_BYTES, j):
                        view = piece
                        while view:
                            view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
                os.write(journal, record)
                os.fdatasync(journal)
                out.append((time.perf_counter_ns() - t0) / 1e6)
        finally:
            os.close(journal)
            shutil.rmtree(d, ignore_errors=True)
        return out

    async def latency_phase(self, trickle: GatewayProcess, live: GatewayProcess) -> None:
        o = self.opts
        size = LATENCY_OBJECT_BYTES
        assert trickle.spool_dir is not None
        targets: dict[str, tuple[Endpoint, dict[str, str] | None, GatewayProcess | None]] = {
            "direct": (self.direct, None, None),
            "write-through": (live.endpoint, {WRITE_THROUGH_HEADER: "true"}, None),
            "spool, drain running": (live.endpoint, None, live),
            "spool, drain trickling": (trickle.endpoint, None, None),
        }
        for variant, (ep, extra, _) in targets.items():  # warm-up: connections, bucket checks, caches
            for j in range(LATENCY_WARMUP):
                await self.put(ep, f"lat-warmup/{variant.replace(' ', '_')}/{j}", size, j, extra)
        await self.flush(live, "lat-warmup/")
        per_round = max(1, o.latency_count // o.rounds)
        loop = asyncio.get_running_loop()
        for i, variant in interleaved(o.rounds, [*targets, DISK_RECIPE]):
            lat: list[float] = []
            meter = self.meter()
            meter.start()
            t_start = time.perf_counter()
            if variant == DISK_RECIPE:
                d = trickle.spool_dir / f"bench-recipe-r{i}"
                lat = await loop.run_in_executor(self._disk_pool, self._recipe_latencies, d, per_round)
                flush_gw = None
            else:
                ep, extra, flush_gw = targets[variant]
                prefix = f"lat/{variant.replace(' ', '_').replace(',', '')}/r{i}"
                for j in range(per_round):
                    path, headers = self._put_head(ep, f"{prefix}/{j:05d}", size, extra, UNSIGNED_PAYLOAD)
                    body = chunks(size, j)
                    t0 = time.perf_counter_ns()
                    reply = await self.client.call(ep, "PUT", path, headers, body)
                    t1 = time.perf_counter_ns()
                    expect(reply, 200, f"PUT {path}")
                    lat.append((t1 - t0) / 1e6)
            seconds = time.perf_counter() - t_start
            cpu = meter.stop()
            s = Sample("latency-1MiB", variant, i, per_round * size, seconds, cpu, {"count": per_round}, lat)
            self.results.samples.append(s)
            srt = sorted(lat)
            self.log(
                f"1 MiB PUT {variant:22s} round {i}: p50 {percentile(srt, 50):6.2f} ms  "
                f"p90 {percentile(srt, 90):6.2f}  p99 {percentile(srt, 99):6.2f}  cpu {cpu}"
            )
            if flush_gw is not None:  # outside the clock: the next variant starts with an empty spool
                await self.bounded("flush", self.flush(flush_gw, prefix + "/"))

    # -- 4: drain throughput ---------------------------------------------------------------------------------

    async def drain_phase(self, live: GatewayProcess) -> None:
        o = self.opts
        size = o.drain_object_mib * MIB
        n = max(1, o.drain_mib * MIB // size)
        k = DRAIN_CONCURRENCY
        for i, variant in interleaved(o.rounds, ("drain after restart", "direct", "spool, drain running")):
            prefix = f"drain/{variant.replace(' ', '_').replace(',', '')}/r{i}"
            if variant == "direct":
                meter = self.meter()
                meter.start()
                t0 = time.perf_counter()
                await self.bounded("direct upload", self.put_all(self.direct, prefix, n, size, k))
                seconds = time.perf_counter() - t0
                s = Sample("drain", variant, i, n * size, seconds, meter.stop(), {"parallel_puts": k})
            elif variant == "spool, drain running":
                meter = self.meter()
                extra: dict[str, Any] = {}
                meter.start()
                t0 = time.perf_counter()
                async with self.watch_scheduler(live, extra):
                    await self.bounded("spooled upload", self.put_all(live.endpoint, prefix, n, size, k))
                    t_ack = time.perf_counter() - t0
                    await self.bounded("flush", self.flush(live, prefix + "/"))
                seconds = time.perf_counter() - t0
                s = Sample(
                    "drain", variant, i, n * size, seconds, meter.stop(), extra | {"ack_seconds": t_ack}
                )
            else:
                s = await self._drain_after_restart(i, prefix, n, size, k)
            self.results.samples.append(s)
            more = f" (acked in {s.extra['ack_seconds']:.2f} s)" if "ack_seconds" in s.extra else ""
            self.log(
                f"drain {variant:22s} round {i}: {s.mbps:7.1f} MB/s in {s.seconds:.2f} s{more}  cpu {s.cpu_s}"
            )

    async def _drain_after_restart(self, i: int, prefix: str, n: int, size: int, k: int) -> Sample:
        spool_dir = self.tmp / f"spool-drain-r{i}"
        fill = await self.start_gateway(f"drain-fill-r{i}", spool_dir, self.opts.trickle_bps)
        t0 = time.perf_counter()
        await self.bounded("filling the spool", self.put_all(fill.endpoint, prefix, n, size, k))
        fill_s = time.perf_counter() - t0
        await self.stop(fill)
        gw = await self.start_gateway(f"drain-r{i}", spool_dir, None)
        meter = self.meter()
        meter.start()
        t0 = time.perf_counter()  # recovery resumed the drains a few ms before the listener opened
        spool = await self.spool_status(gw)
        extra: dict[str, Any] = {}
        async with self.watch_scheduler(gw, extra):
            await self.bounded("drain", self.flush(gw, prefix + "/"))
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
        await self.stop(gw)
        extra |= {
            "fill_seconds": fill_s,
            "spooled_bytes": n * size,
            "pending_at_start_objects": spool["pending_objects"],
            "drain_concurrency": k,
        }
        return Sample("drain", "drain after restart", i, int(spool["pending_bytes"]), seconds, cpu, extra)

    # -- 5: trainer-visible save time ------------------------------------------------------------------------

    async def checkpoint_phase(self) -> None:
        o = self.opts
        relay = await asyncio.to_thread(start_relay, self.tmp, self.direct, o.relay_rate_bps)
        self.procs["relay"] = relay
        self.log(
            f"relay pid {relay.pid} at {relay.endpoint.netloc}, {o.relay_rate_bps / MB:.0f} MB/s each way"
        )
        gw = await self.start_gateway(
            "limited", self.tmp / "spool-limited", None, f"http://{relay.endpoint.netloc}"
        )
        await self.sanity(gw, spooled=True)
        await self.flush(gw, "sanity/")
        size = o.ckpt_object_mib * MIB
        n = o.ckpt_objects
        for j in range(2):  # warm-up: connections through the relay on both paths
            await self.put(relay.endpoint, f"ckpt-warmup/direct-{j}", LATENCY_OBJECT_BYTES, j)
        for i, variant in interleaved(o.rounds, ("direct, limited store", "spool, limited store")):
            prefix = f"ckpt/{'direct' if variant.startswith('direct') else 'spool'}/r{i}/step_{1000 + i}"
            ep = relay.endpoint if variant.startswith("direct") else gw.endpoint
            meter = self.meter()
            extra: dict[str, Any] = {}
            meter.start()
            t0 = time.perf_counter()
            watch = self.watch_scheduler(gw, extra) if ep is gw.endpoint else contextlib.nullcontext()
            async with watch:
                await self.bounded("checkpoint save", self.put_all(ep, prefix, n, size, o.ckpt_writers))
                t_ack = time.perf_counter() - t0
                if variant.startswith("spool"):
                    await self.bounded("flush", self.flush(gw, prefix + "/"))
                seconds = time.perf_counter() - t0
            cpu = meter.stop()
            extra["trainer_wait_seconds"] = t_ack
            s = Sample("checkpoint", variant, i, n * size, seconds, cpu, extra)
            self.results.samples.append(s)
            self.log(
                f"checkpoint {variant:22s} round {i}: trainer waits {t_ack:6.2f} s, durable after "
                f"{seconds:6.2f} s  cpu {cpu}"
            )
        await self.stop(gw)
        await self.stop(relay)

    # -- all -------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        o = self.opts
        trickle = live = None
        if o.only & {"ack", "latency"}:
            trickle = await self.start_gateway("trickle", self.tmp / "spool-trickle", o.trickle_bps)
            await self.sanity(trickle, spooled=True)
        if o.only & {"latency", "drain"}:
            live = await self.start_gateway("unlimited", self.tmp / "spool-unlimited", None)
            await self.sanity(live, spooled=True)
            await self.flush(live, "sanity/")
        if "ack" in o.only and trickle is not None:
            await self.ack_phase(trickle)
        if "latency" in o.only and trickle is not None and live is not None:
            await self.latency_phase(trickle, live)
        if trickle is not None:
            spool = await self.spool_status(trickle)
            self.results.facts["trickling gateway at its stop"] = (
                f"{spool['pending_objects']} objects ({spool['pending_bytes'] / GB:.2f} GB) still spooled, "
                f"{spool['drained_bytes_total'] / MB:.0f} MB drained"
            )
            await self.stop(trickle)
        if "drain" in o.only and live is not None:
            await self.drain_phase(live)
        if live is not None:
            await self.stop(live)
        if "checkpoint" in o.only:
            await self.checkpoint_phase()


def _unlink_all(paths: list[Path]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


async def run_bench(opts: Options, tmp: Path, weed: SeaweedProcess, results: Results) -> None:
    bench = Bench(opts, tmp, weed, results)
    try:
        await bench.run()
    finally:
        await bench.close()


# --------------------------------------------------------------------------------------------------------
# Summary and report


def pooled(samples: Sequence[Sample]) -> list[float]:
    return sorted(x for s in samples for x in s.latencies_ms)


def cpu_per_gb(samples: Sequence[Sample]) -> dict[str, float]:
    """Median over rounds of each process's CPU seconds per GB moved ("other" stays in cores)."""
    names = sorted({n for s in samples for n in s.cpu_s if n != "other"})
    out = {n: med([s.cpu_s.get(n, 0.0) / (s.bytes / GB) for s in samples if s.bytes]) for n in names}
    out["other_cores"] = med([s.other_cores for s in samples])
    return out


def ours_per_gb(samples: Sequence[Sample]) -> float:
    """Median over rounds of the CPU seconds per GB of all our user processes (not kernel threads, whose
    time may be someone else's I/O, and not other processes)."""
    return med(
        [
            sum(v for n, v in s.cpu_s.items() if n not in ("other", "kernel threads")) / (s.bytes / GB)
            for s in samples
            if s.bytes
        ]
    )


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summary(res: Results) -> dict[str, Any]:
    o = res.opts
    out: dict[str, Any] = {}
    for size_mib in o.sizes_mib:
        phase = f"ack-{size_mib}MiB"
        ack = res.of(phase, "spool-ack")
        if not ack:
            continue
        ma = med([s.mbps for s in ack])
        baselines: dict[str, Any] = {}
        for variant in disk_variants(o.clients, direct=True):
            xs = res.of(phase, variant)
            if not xs:
                continue
            m = med([s.mbps for s in xs])
            rr = [ratio(a.mbps, b.mbps) for a, b in zip(ack, xs, strict=True)]
            baselines[variant] = {
                "MBps": m,
                "ratio": ratio(ma, m),
                "round_ratios": [round(x, 3) for x in rr],
                "median_round_ratio": med(rr),
            }
        fastest = max(baselines, key=lambda v: baselines[v]["MBps"])
        out[phase] = {
            "spool_ack_MBps": ma,
            "baselines": baselines,
            "fastest_baseline": fastest,
            "ratio_vs_fastest": baselines[fastest]["ratio"],
            "other_cores_per_round": {
                v: [round(s.other_cores, 2) for s in res.of(phase, v)] for v in (*baselines, "spool-ack")
            },
            "rounds_MBps": {
                v: [round(s.mbps, 1) for s in res.of(phase, v)] for v in (*baselines, "spool-ack")
            },
            # If the spool's acks are CPU-bound (the gateway, the client and the drain's trickle on every
            # core), this is as fast as they can go on this machine, whatever the disk does.
            "cpu_bound_ceiling_MBps": (res.cores / ours_per_gb(ack)) * GB / MB,
            "cpu_s_per_GB": {v: cpu_per_gb(res.of(phase, v)) for v in (*baselines, "spool-ack")},
        }
    lat: dict[str, Any] = {}
    for variant in ("direct", "write-through", "spool, drain running", "spool, drain trickling", DISK_RECIPE):
        xs = res.of("latency-1MiB", variant)
        if xs:
            p = pooled(xs)
            lat[variant] = {
                "count": len(p),
                **{f"p{q}_ms": percentile(p, q) for q in (50, 90, 99)},
                "max_ms": p[-1],
                "round_p50_ms": [round(percentile(sorted(s.latencies_ms), 50), 3) for s in xs],
                "cpu_s_per_GB": cpu_per_gb(xs),
            }
    if lat:
        out["latency-1MiB"] = lat
    drain = {v: res.of("drain", v) for v in ("drain after restart", "direct", "spool, drain running")}
    if drain["direct"]:
        md, mx, ml = (med([s.mbps for s in drain[v]]) for v in drain)
        out["drain"] = {
            "drain_after_restart_MBps": md,
            "direct_MBps": mx,
            "ratio": ratio(md, mx),
            "round_ratios": [
                round(ratio(a.mbps, b.mbps), 3)
                for a, b in zip(drain["drain after restart"], drain["direct"], strict=True)
            ],
            # Drain and direct upload are both CPU-bound here (SeaweedFS); with the same CPU available to
            # both, their ratio would be the inverse ratio of their CPU per GB.
            "cpu_bound_prediction": ratio(
                ours_per_gb(drain["direct"]), ours_per_gb(drain["drain after restart"])
            ),
            "drain_running_durable_MBps": ml,
            "drain_running_ack_MBps": med(
                [s.bytes / s.extra["ack_seconds"] / MB for s in drain["spool, drain running"]]
            ),
            "rounds": {v: [x.as_json() for x in xs] for v, xs in drain.items()},
            "cpu_s_per_GB": {v: cpu_per_gb(xs) for v, xs in drain.items()},
        }
    ck = {v: res.of("checkpoint", v) for v in ("direct, limited store", "spool, limited store")}
    if ck["direct, limited store"]:
        d, s_ = ck["direct, limited store"], ck["spool, limited store"]
        out["checkpoint"] = {
            "bytes": d[0].bytes,
            "direct_wait_s": med([x.extra["trainer_wait_seconds"] for x in d]),
            "direct_durable_s": med([x.seconds for x in d]),
            "spool_wait_s": med([x.extra["trainer_wait_seconds"] for x in s_]),
            "spool_durable_s": med([x.seconds for x in s_]),
            "rounds": {
                v: [
                    {"wait_s": round(x.extra["trainer_wait_seconds"], 3), "durable_s": round(x.seconds, 3)}
                    for x in xs
                ]
                for v, xs in ck.items()
            },
            "cpu_s_per_GB": {v: cpu_per_gb(xs) for v, xs in ck.items()},
        }
    out["other_cores_median"] = med([s.other_cores for s in res.samples])
    out["other_cores_max"] = max((s.other_cores for s in res.samples), default=0.0)
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _cpu_text(c: dict[str, float]) -> str:
    parts = [f"{n} {v:.2f}" for n, v in c.items() if n != "other_cores" and v >= 0.005]
    return ", ".join(parts) + f"; other processes {c['other_cores']:.2f} cores"


def row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def report(res: Results, s: dict[str, Any]) -> str:
    o = res.opts
    k = o.clients
    nan = float("nan")
    relay_mbps = o.relay_rate_bps / MB
    lines = [
        f"## s3lanes write spool benchmark ({'quick' if o.quick else 'full'} run)",
        "",
        f"Command: `{o.command}`",
        "",
        "| machine | |",
        "|---|---|",
        *[row(key, value) for key, value in res.facts.items()],
        "",
        f"Sizes: ack rounds of {o.ack_mib} MiB ({', '.join(f'{m} MiB' for m in o.sizes_mib)} objects, "
        f"{k} clients); {o.latency_count} x 1 MiB per latency variant; drain {o.drain_mib} MiB of "
        f"{o.drain_object_mib} MiB objects, {DRAIN_CONCURRENCY} parallel; checkpoint {o.ckpt_objects} x "
        f"{o.ckpt_object_mib} MiB by {o.ckpt_writers} writers through a {relay_mbps:.0f} MB/s relay; "
        f"trickling gateway `[backend] bandwidth` {o.trickle_bps / MB:g} MB/s. {o.ack_rounds} round(s) per "
        f"variant in the ack phase, {o.rounds} in the others, interleaved; values are medians over rounds "
        "(latency percentiles over all PUTs of a variant). MB/s = 10^6 bytes/s.",
        "",
        row("measurement", "reference", "spool", "ratio / result", "target", "verdict"),
        "|---|---|---|---|---|---|",
    ]
    for size_mib in o.sizes_mib:
        a = s.get(f"ack-{size_mib}MiB")
        if a is None:
            continue
        what = f"ack throughput, {k} clients x {size_mib} MiB PUTs vs disk write+fsync"
        for variant, b in a["baselines"].items():
            fastest = " (the fastest)" if variant == a["fastest_baseline"] else ""
            lines.append(
                row(
                    f"{what}, {disk_variants(k, direct=True)[variant]}{fastest}, MB/s",
                    f"{b['MBps']:.0f}",
                    f"{a['spool_ack_MBps']:.0f}",
                    f"{b['ratio']:.2f}x (per round: median {b['median_round_ratio']:.2f}x; CPU-bound ceiling "
                    f"of the acks here {a['cpu_bound_ceiling_MBps']:.0f} MB/s)",
                    ">= 0.80x",
                    verdict(b["ratio"] >= 0.8),
                )
            )
    lat = s.get("latency-1MiB")
    if lat:

        def pcts(x: dict[str, Any]) -> str:
            return " / ".join(f"{x.get(f'p{q}_ms', nan):.2f}" for q in (50, 90, 99))

        d = lat.get("direct", {})
        w = lat.get("write-through", {})
        for variant in ("spool, drain running", "spool, drain trickling"):
            x = lat.get(variant)
            if x is None:
                continue
            lines.append(
                row(
                    f"1 MiB PUT p50 / p90 / p99 ms, {variant} (reference: direct to SeaweedFS; "
                    f"write-through via the gateway {pcts(w)})",
                    pcts(d),
                    pcts(x),
                    f"p50 {ratio(x['p50_ms'], d.get('p50_ms', nan)):.2f}x direct",
                    "p50 <= 5 ms",
                    verdict(x["p50_ms"] <= 5.0),
                )
            )
        r = lat.get(DISK_RECIPE)
        if r is not None:
            lines.append(
                row(
                    f"1 MiB {DISK_RECIPE} in the spool directory (the floor under the spool's ack, no HTTP)",
                    "",
                    pcts(r),
                    "",
                    "",
                    "",
                )
            )
    dr = s.get("drain")
    if dr:
        lines += [
            row(
                f"drain after restart, reads idle, vs direct upload by {DRAIN_CONCURRENCY} parallel PUTs, "
                "MB/s",
                f"{dr['direct_MBps']:.0f}",
                f"{dr['drain_after_restart_MBps']:.0f}",
                f"{dr['ratio']:.2f}x (per round: {', '.join(f'{x:.2f}' for x in dr['round_ratios'])}; "
                f"CPU-bound prediction {dr['cpu_bound_prediction']:.2f}x)",
                ">= 0.90x",
                verdict(dr["ratio"] >= 0.9),
            ),
            row(
                "drain running while the clients upload: ack MB/s, durable MB/s",
                f"{dr['direct_MBps']:.0f}",
                f"{dr['drain_running_ack_MBps']:.0f}, {dr['drain_running_durable_MBps']:.0f}",
                f"{ratio(dr['drain_running_durable_MBps'], dr['direct_MBps']):.2f}x (durable)",
                "none",
                "",
            ),
        ]
    ck = s.get("checkpoint")
    if ck:
        what = f"checkpoint save {ck['bytes'] / MIB:.0f} MiB, store limited to {relay_mbps:.0f} MB/s"
        lines += [
            row(
                f"{what}: trainer waits, s",
                f"{ck['direct_wait_s']:.2f}",
                f"{ck['spool_wait_s']:.2f}",
                f"{ratio(ck['direct_wait_s'], ck['spool_wait_s']):.1f}x shorter",
                "report",
                "",
            ),
            row(
                f"{what}: durable on the store after, s",
                f"{ck['direct_durable_s']:.2f}",
                f"{ck['spool_durable_s']:.2f}",
                f"{ratio(ck['spool_durable_s'], ck['direct_durable_s']):.2f}x",
                "report",
                "",
            ),
        ]
    lines += ["", "CPU, seconds per GB moved (median over rounds), by process:", ""]
    lines += ["| phase | variant | CPU s/GB |", "|---|---|---|"]
    for phase, x in s.items():
        if isinstance(x, dict) and "cpu_s_per_GB" in x:
            for variant, c in x["cpu_s_per_GB"].items():
                lines.append(f"| {phase} | {variant} | {_cpu_text(c)} |")
        elif phase == "latency-1MiB":
            for variant, v in x.items():
                lines.append(f"| {phase} | {variant} | {_cpu_text(v['cpu_s_per_GB'])} |")
    rounds_text = []
    for size_mib in o.sizes_mib:
        a = s.get(f"ack-{size_mib}MiB")
        if a:
            rounds_text.append(f"ack {size_mib} MiB {a['rounds_MBps']}")
    if dr:
        rounds_text.append(
            "drain MB/s " + str({v: [x["MBps"] for x in xs] for v, xs in dr["rounds"].items()})
        )
    if ck:
        rounds_text.append(f"checkpoint {ck['rounds']}")
    lines += ["", "Per round: " + "; ".join(rounds_text)]
    others = {
        f"{x.phase} {x.variant}": [round(y.other_cores, 2) for y in res.of(x.phase, x.variant)]
        for x in res.samples
    }
    lines += ["", "Other processes (not ours, not kernel threads), cores busy per round: " + str(others)]
    if lat:
        lines += ["", "1 MiB PUT p50 per round, ms: " + str({v: x["round_p50_ms"] for v, x in lat.items()})]
    lines += [
        "",
        f"Other processes kept {s['other_cores_median']:.2f} cores busy on average during a measurement "
        f"(max {s['other_cores_max']:.2f}).",
        "",
        f"Gateway exit codes: {res.exit_codes}.",
    ]
    if res.log_problems:
        lines += ["", "**Logged problems:**", "", "```"]
        for name, text in res.log_problems.items():
            lines += [f"[{name}]", text]
        lines += ["```"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# main


_SAMPLE_KEYS = frozenset(
    {"phase", "variant", "round", "bytes", "seconds", "MBps", "cpu_s", "other_cores", "latencies_ms"}
    | {f"p{q}_ms" for q in (50, 90, 99)}
)


def results_from_json(doc: dict[str, Any]) -> Results:
    """A run's ``results.json`` back into :class:`Results`, to render its report with this version's
    summary (``--from-json``)."""
    raw = dict(doc["options"])
    raw.setdefault("ack_rounds", raw["rounds"])  # runs before --ack-rounds existed used --rounds for all
    for name in ("out_dir", "tmp_dir"):
        raw[name] = Path(raw[name]) if raw.get(name) not in (None, "None") else None
    raw["sizes_mib"] = tuple(raw["sizes_mib"])
    raw["only"] = frozenset(raw["only"])
    raw["from_json"] = None
    res = Results(Options(**raw), dict(doc["machine"]))
    for x in doc["samples"]:
        res.samples.append(
            Sample(
                x["phase"],
                x["variant"],
                x["round"],
                x["bytes"],
                x["seconds"],
                x["cpu_s"],
                {k: v for k, v in x.items() if k not in _SAMPLE_KEYS},
                x.get("latencies_ms") or [],
            )
        )
    res.configs = doc.get("gateway_configs", {})
    res.log_problems = doc.get("log_problems", {})
    res.exit_codes = doc.get("exit_codes", {})
    return res


def md5_ms() -> float:
    """What the gateway's MD5 (the ETag) costs per MiB on this machine, in one thread."""
    data = bytes(_BLOCK[:LATENCY_OBJECT_BYTES])
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        hashlib.md5(data, usedforsecurity=False).hexdigest()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["_relay"]:
        return relay_main(args[1:])
    opts = parse_args(args)
    if opts.from_json is not None:
        earlier = results_from_json(json.loads(opts.from_json.read_text()))
        print(report(earlier, summary(earlier)))
        return 0
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed benchmark still tears down
    tmp = Path(tempfile.mkdtemp(prefix="s3lanes-bench-spool-", dir=opts.tmp_dir))
    facts = machine_facts()
    facts["nproc"] = str(len(os.sched_getaffinity(0)))
    facts["MD5 of 1 MiB (best of 20)"] = f"{md5_ms():.2f} ms"
    facts["spool filesystem"] = json.dumps(mount_of(tmp))
    results = Results(opts, facts)
    speed_before = python_speed_ns()
    weed = new_weed(tmp)
    ok = False
    t_start = time.monotonic()
    try:
        print(f"state in {tmp}; starting SeaweedFS ...", file=sys.stderr, flush=True)
        weed.start()
        uvloop.run(run_bench(opts, tmp, weed, results))
        ok = True
    except KeyboardInterrupt:
        print("interrupted; tearing down", file=sys.stderr, flush=True)
        return 130
    except BaseException:
        print("--- SeaweedFS log tail ---\n" + weed.log_tail(), file=sys.stderr)
        for path in sorted(tmp.glob("*/*.log")):
            print(f"--- {path} ---\n" + tail(path), file=sys.stderr)
        raise
    finally:
        weed.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    results.facts["python speed probe"] = (
        f"{speed_before:.0f} ns per loop iteration before the run, {python_speed_ns():.0f} after "
        "(lower is faster)"
    )
    results.facts["run time"] = f"{time.monotonic() - t_start:.0f} s"
    s = summary(results)
    text = report(results, s)
    print(text)
    if ok and opts.out_dir is not None:
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": opts.command,
            "options": {
                k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, frozenset) else v)
                for k, v in dataclasses.asdict(opts).items()
            },
            "machine": results.facts,
            "gateway_configs": results.configs,
            "summary": s,
            "samples": [x.as_json() for x in results.samples],
            "log_problems": results.log_problems,
            "exit_codes": results.exit_codes,
            "report_markdown": text,
        }
        (opts.out_dir / "results.json").write_text(json.dumps(doc, indent=2, default=str))
        (opts.out_dir / "report.md").write_text(text + "\n")
        print(f"\n(wrote {opts.out_dir}/results.json and report.md)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
