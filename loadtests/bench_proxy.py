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
:func:`gateway.core.sigv4.sign_headers` (no botocore on the hot path).

Everything is bounded: each phase has a request count and a time limit (``--phase-timeout-s``), and the
processes are stopped (SIGTERM, then SIGKILL) and the state directory removed on success, failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar, cast

import aiohttp
import uvloop
from yarl import URL

import gateway
from gateway import __version__ as GATEWAY_VERSION
from gateway.core.sigv4 import UNSIGNED_PAYLOAD, sign_headers
from gateway.seaweed.command import find_weed_binary
from gateway.seaweed.options import SeaweedIdentity, SeaweedOptions
from gateway.seaweed.process import SeaweedProcess

# The directory holding the gateway package under test (a checkout, or an exported tree run from its
# directory with PYTHONPATH pointing at this one's loadtests/).
GATEWAY_SOURCE = Path(gateway.__file__).resolve().parent.parent

MIB = 1024 * 1024
MB = 1_000_000
GB = 1_000_000_000

BUCKET = "bench"
REGION = "us-east-1"
ACCESS_KEY = "BENCHACCESSKEY000001"
SECRET_KEY = "bench-secret-key-not-a-real-one-0000000"

SMALL_OBJECT_BYTES = 64 * 1024
# Object data: one random block, read from a seed-dependent offset and wrapped around, sent as views
# (no copies). Random so that nothing on the way can compress it; 8 MiB so that it stays in cache.
BLOCK_BYTES = 8 * MIB
UPLOAD_PIECE_BYTES = 1 * MIB
# The client's receive buffer: one recv_into() per event, up to this much. uvloop reads 256 KiB at most
# per event anyway; a larger buffer just means fewer partial fills.
RECV_BUFFER_BYTES = 1 * MIB
WRITE_HIGH_WATER_BYTES = 4 * MIB
MAX_HEAD_BYTES = 64 * 1024
RSS_SAMPLE_INTERVAL_S = 0.05
GATEWAY_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
SETUP_UPLOAD_CONCURRENCY = 4
WARMUP_SMALL_GETS = 50
MEMORY_MAX_GET_REPEATS = 16

T = TypeVar("T")

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """A request got an unexpected answer, or a process misbehaved: the run is void."""


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
    p = argparse.ArgumentParser(
        prog="python -m loadtests.bench_proxy",
        description="s3lanes vs direct to SeaweedFS: throughput, latency, RSS and CPU, side by side.",
    )
    p.add_argument("--quick", action="store_true", help="a small sanity run (about a minute)")
    p.add_argument("--large-mib", type=int, help="size of each large object (default 256; quick 32)")
    p.add_argument("--streams", type=int, help="concurrent large GETs (default 8)")
    p.add_argument("--put-streams", type=int, help="concurrent large PUTs (default 4)")
    p.add_argument("--small-count", type=int, help="small GETs per round and side (default 2000; quick 200)")
    p.add_argument("--rounds", type=int, help="large-GET and small-GET rounds per side (default 5; quick 2)")
    p.add_argument("--put-rounds", type=int, help="PUT rounds per side and payload mode (default 3; quick 1)")
    p.add_argument("--rss-mib", type=int, help="object size in the memory phase (default 1024; quick 64)")
    p.add_argument("--rss-streams", type=int, help="uploads, and as many downloads, in the memory phase (4)")
    p.add_argument(
        "--client", choices=("raw", "aiohttp"), default="raw", help="benchmark client (default raw)"
    )
    p.add_argument("--json", type=Path, dest="json_path", help="also write every round's numbers here")
    p.add_argument("--tmp-dir", type=Path, help="parent of the temporary state directory (default: $TMPDIR)")
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
        help="objects phase: also run a gateway from this directory (holding another version's gateway/ "
        "package, e.g. a `git archive` of a base commit) as a third side, in the same interleaved rounds",
    )
    a = p.parse_args(argv)
    q = a.quick
    if a.compare_tree is not None and not (a.compare_tree / "gateway" / "__main__.py").is_file():
        p.error(f"--compare-tree: {a.compare_tree} holds no gateway/__main__.py")
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

    def pick(value: int | None, full: int, quick: int) -> int:
        chosen = value if value is not None else (quick if q else full)
        if chosen <= 0:
            p.error("sizes, counts and rounds must be positive")
        return chosen

    return Options(
        quick=q,
        large_mib=pick(a.large_mib, 256, 32),
        streams=pick(a.streams, 8, 8),
        put_streams=pick(a.put_streams, 4, 4),
        small_count=pick(a.small_count, 2000, 200),
        rounds=pick(a.rounds, 5, 2),
        put_rounds=pick(a.put_rounds, 3, 1),
        rss_mib=pick(a.rss_mib, 1024, 64),
        rss_streams=pick(a.rss_streams, 4, 4),
        client=a.client,
        json_path=a.json_path,
        tmp_dir=a.tmp_dir,
        phase_timeout_s=a.phase_timeout_s,
        py_spy_dir=a.py_spy_dir,
        gateway_toml=a.gateway_toml,
        gateway_cpus=gateway_cpus,
        phases=phases,
        compare_tree=a.compare_tree,
    )


# --------------------------------------------------------------------------------------------------------
# Processes: CPU and memory from /proc


def pin_process(pid: int, cpus: frozenset[int]) -> int:
    """Pin every thread of a process to ``cpus`` (threads it starts later inherit it); the thread count."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)
    return len(tids)


def cpu_user_sys_seconds(pid: int) -> tuple[float, float]:
    """(user, sys) CPU seconds of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        rest = fh.read().rsplit(b")", 1)[1].split()
    # After "pid (comm)": field 3 is rest[0], so utime (14) and stime (15) are rest[11] and rest[12].
    return int(rest[11]) / CLK_TCK, int(rest[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """user+sys CPU seconds of a process (all its threads)."""
    return sum(cpu_user_sys_seconds(pid))


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def memory_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (``clear_refs`` 5, Linux >= 4.0). False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent not idle since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat", "rb") as fh:
        f = fh.readline().split()
    return sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8)) / CLK_TCK


@dataclass(slots=True)
class CpuMeter:
    """CPU seconds spent by the gateway, SeaweedFS and this client between ``start()`` and ``stop()``, and
    by everything else on the machine ("other": a shared machine's background load skews a round)."""

    pids: dict[str, int]
    _start: dict[str, float] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        out["client"] = self_cpu_seconds()
        out["machine"] = machine_busy_seconds()
        return out

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        out = {name: round(end[name] - self._start[name], 3) for name in end}
        machine = out.pop("machine")
        out["other"] = round(max(0.0, machine - sum(out.values())), 3)
        return out


# --------------------------------------------------------------------------------------------------------
# Object data


_BLOCK = os.urandom(BLOCK_BYTES)
_BLOCK_VIEW = memoryview(_BLOCK)


def payload_pieces(size_bytes: int, seed: int) -> Iterator[memoryview]:
    """The bytes of object ``seed`` of ``size_bytes``: views into one random block, no copies."""
    offset = (seed * 1_048_573) % BLOCK_BYTES
    sent = 0
    while sent < size_bytes:
        n = min(UPLOAD_PIECE_BYTES, size_bytes - sent, BLOCK_BYTES - offset)
        yield _BLOCK_VIEW[offset : offset + n]
        sent += n
        offset = (offset + n) % BLOCK_BYTES


_SHA256_CACHE: dict[tuple[int, int], str] = {}


def payload_sha256(size_bytes: int, seed: int) -> str:
    key = (size_bytes, seed)
    if key not in _SHA256_CACHE:
        h = hashlib.sha256()
        for piece in payload_pieces(size_bytes, seed):
            h.update(piece)
        _SHA256_CACHE[key] = h.hexdigest()
    return _SHA256_CACHE[key]


# --------------------------------------------------------------------------------------------------------
# The lean HTTP/1.1 client


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        u = URL(url)
        assert u.host is not None and u.port is not None, url
        return cls(u.host, u.port)

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body_bytes: int
    body: bytes  # kept only for errors and when asked for


def signed_head(
    ep: Endpoint, method: str, raw_path: str, payload_hash: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    headers = {"host": ep.netloc, **(extra or {})}
    headers.update(
        sign_headers(
            method,
            raw_path,
            "",
            headers,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            payload_hash=payload_hash,
            now_wall=time.time(),
        )
    )
    return headers


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection. Body bytes land in one reused buffer and are counted, not kept."""

    def __init__(self) -> None:
        self._buf = bytearray(RECV_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._waiter: asyncio.Future[Reply] | None = None
        self._write_ok: asyncio.Event = asyncio.Event()
        self._write_ok.set()
        self._head = bytearray()
        self._in_body = False
        self._status = 0
        self._remaining = 0  # -1: until the connection closes
        self._count = 0
        self._keep = False
        self._kept = bytearray()
        self._want_body = False
        self._method = "GET"

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            return
        if self._in_body:
            self._take_body(self._view[:nbytes])
            return
        self._head += self._view[:nbytes]
        self._parse_head()

    def pause_writing(self) -> None:
        self._write_ok.clear()

    def resume_writing(self) -> None:
        self._write_ok.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._write_ok.set()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._in_body and self._remaining == -1:
                self._finish()
            else:
                waiter.set_exception(ConnectionError(f"connection closed mid-response: {exc!r}"))

    # parsing
    def _parse_head(self) -> None:
        while True:
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    self._fail(BenchError("response head too large"))
                return
            lines = bytes(self._head[:end]).split(b"\r\n")
            rest = bytes(self._head[end + 4 :])
            self._head = bytearray()
            parts = lines[0].split(b" ", 2)
            status = int(parts[1])
            if status == 100:
                self._head = bytearray(rest)
                continue
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if headers.get(b"connection", b"").lower() == b"close":
                self.reusable = False
            self._status = status
            self._keep = self._want_body or not 200 <= status < 300
            if b"content-length" in headers:
                self._remaining = int(headers[b"content-length"])
            elif b"transfer-encoding" in headers:
                self._fail(BenchError(f"status {status}: chunked responses are not supported by this client"))
                return
            elif self._method == "HEAD" or status in (204, 304):
                self._remaining = 0
            else:
                self._remaining = -1
                self.reusable = False
            if self._method == "HEAD":
                self._remaining = 0
            self._in_body = True
            if self._remaining == 0:
                self._finish()
            elif rest:
                self._take_body(memoryview(rest))
            return

    def _take_body(self, data: memoryview) -> None:
        n = len(data)
        if self._keep:
            self._kept += data
        self._count += n
        if self._remaining >= 0:
            self._remaining -= n
            if self._remaining <= 0:
                if self._remaining < 0:
                    self.reusable = False
                self._finish()

    def _finish(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self._status, self._count, bytes(self._kept)))

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    # the request
    async def request(
        self,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: Iterator[memoryview] | None = None,
        *,
        want_body: bool = False,
    ) -> Reply:
        assert self.transport is not None and self.reusable
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Reply] = loop.create_future()
        self._waiter = waiter
        self._method = method
        self._head = bytearray()
        self._in_body = False
        self._count = 0
        self._kept = bytearray()
        self._want_body = want_body
        head = [f"{method} {raw_path} HTTP/1.1"]
        head.extend(f"{k}: {v}" for k, v in headers.items())
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if body is not None:
            for piece in body:
                if waiter.done() or self.closed:
                    self.reusable = False  # answered before the body was complete
                    break
                self.transport.write(piece)
                if not self._write_ok.is_set():
                    await self._write_ok.wait()
        try:
            return await waiter
        except BaseException:
            self.reusable = False
            raise
        finally:
            self._waiter = None


class Client(Protocol):
    """What the phases need from a client; both implementations sign every request themselves."""

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply: ...

    async def put(
        self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool
    ) -> Reply: ...

    async def close(self) -> None: ...


class RawHttp:
    """The lean client: a pool of :class:`_Conn` per endpoint."""

    def __init__(self) -> None:
        self._idle: dict[Endpoint, list[_Conn]] = {}
        self._closed = False

    async def _acquire(self, ep: Endpoint) -> _Conn:
        idle = self._idle.setdefault(ep, [])
        while idle:
            conn = idle.pop()
            if conn.reusable and not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, ep.host, ep.port)
        return conn

    def _release(self, ep: Endpoint, conn: _Conn) -> None:
        if conn.reusable and not conn.closed and not self._closed:
            self._idle.setdefault(ep, []).append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    async def call(
        self,
        ep: Endpoint,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: Iterator[memoryview] | None = None,
        *,
        want_body: bool = False,
    ) -> Reply:
        conn = await self._acquire(ep)
        try:
            return await conn.request(method, raw_path, headers, body, want_body=want_body)
        finally:
            self._release(ep, conn)

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply:
        path = f"/{BUCKET}/{key}"
        return await self.call(
            ep, "GET", path, signed_head(ep, "GET", path, UNSIGNED_PAYLOAD), want_body=want_body
        )

    async def put(self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool) -> Reply:
        path = f"/{BUCKET}/{key}"
        payload_hash = payload_sha256(size_bytes, seed) if signed_payload else UNSIGNED_PAYLOAD
        headers = signed_head(ep, "PUT", path, payload_hash)
        headers["content-length"] = str(size_bytes)
        return await self.call(ep, "PUT", path, headers, payload_pieces(size_bytes, seed))

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


class AiohttpClient:
    """The cross-check client: aiohttp's own, configured for throughput (big read buffer, no extras)."""

    def __init__(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, enable_cleanup_closed=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=60),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            read_bufsize=RECV_BUFFER_BYTES,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply:
        path = f"/{BUCKET}/{key}"
        headers = signed_head(ep, "GET", path, UNSIGNED_PAYLOAD)
        url = URL(f"http://{ep.netloc}{path}", encoded=True)
        async with self._session.get(url, headers=headers, allow_redirects=False) as resp:
            n = 0
            kept: list[bytes] = []
            keep = want_body or resp.status >= 300
            async for chunk in resp.content.iter_any():
                n += len(chunk)
                if keep:
                    kept.append(chunk)
            return Reply(resp.status, n, b"".join(kept))

    async def put(self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool) -> Reply:
        path = f"/{BUCKET}/{key}"
        payload_hash = payload_sha256(size_bytes, seed) if signed_payload else UNSIGNED_PAYLOAD
        headers = signed_head(ep, "PUT", path, payload_hash)
        headers["content-length"] = str(size_bytes)
        url = URL(f"http://{ep.netloc}{path}", encoded=True)

        async def body() -> AsyncIterator[memoryview]:
            for piece in payload_pieces(size_bytes, seed):
                yield piece

        async with self._session.put(url, data=body(), headers=headers, allow_redirects=False) as resp:
            text = await resp.read()
            return Reply(resp.status, len(text), text)

    async def close(self) -> None:
        await self._session.close()


def expect(reply: Reply, status: int, what: str, body_bytes: int | None = None) -> None:
    if reply.status != status or (body_bytes is not None and reply.body_bytes != body_bytes):
        raise BenchError(
            f"{what}: expected {status}"
            + (f" with {body_bytes} bytes" if body_bytes is not None else "")
            + f", got {reply.status} with {reply.body_bytes} bytes: {reply.body[:600]!r}"
        )


# --------------------------------------------------------------------------------------------------------
# The processes under test


@dataclass(slots=True)
class Stack:
    """SeaweedFS and the gateway in front of it, and where to reach them."""

    tmp: Path
    weed: SeaweedProcess
    gateway: subprocess.Popen[bytes] | None = None
    gateway_pid: int = 0
    gateway_log: Path | None = None
    direct: Endpoint = Endpoint("127.0.0.1", 0)
    via_gateway: Endpoint = Endpoint("127.0.0.1", 0)

    def endpoint(self, side: str) -> Endpoint:
        return self.direct if side == "direct" else self.via_gateway


def new_weed(tmp: Path) -> SeaweedProcess:
    return SeaweedProcess(
        SeaweedOptions(
            state_dir=tmp / "seaweedfs",
            identities=(SeaweedIdentity("bench", ACCESS_KEY, SECRET_KEY),),
            buckets=(BUCKET,),
        )
    )


def start_gateway(stack: Stack, extra_toml: str = "") -> None:
    d = stack.tmp / "gateway"
    d.mkdir()
    cfg = d / "s3lanes.toml"
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{d / "state"}"
log_level = "WARNING"
shutdown_grace_s = 5
drain_on_shutdown_s = 0

[backend]
endpoint = "{stack.weed.endpoint_url}"
region = "{REGION}"

# The proxy path is what this benchmark measures: uploads are streamed through, not spooled
# (the spool has its own benchmark, loadtests/bench_spool.py).
[spool]
enabled = false

[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
"""
        + extra_toml
    )
    ready = d / "ready.json"
    stack.gateway_log = d / "gateway.log"
    with open(stack.gateway_log, "wb") as log_fh:
        stack.gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--ready-file", str(ready)],
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the benchmark only; it stops the gateway in order
            cwd=GATEWAY_SOURCE,  # `-m gateway` runs the very code this benchmark imported
        )
    deadline = time.monotonic() + GATEWAY_START_TIMEOUT_S
    while not ready.exists():
        if stack.gateway.poll() is not None or time.monotonic() > deadline:
            raise BenchError("the gateway did not start:\n" + tail(stack.gateway_log))
        time.sleep(0.05)
    doc = json.loads(ready.read_text())
    stack.gateway_pid = int(doc["pid"])
    stack.via_gateway = Endpoint.from_url(next(u for u in doc["endpoints"] if u.startswith("http://")))


def stop_gateway(stack: Stack) -> int | None:
    proc = stack.gateway
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def tail(path: Path | None, n_bytes: int = 4000) -> str:
    if path is None or not path.exists():
        return "(no log)"
    return path.read_bytes()[-n_bytes:].decode(errors="replace")


# --------------------------------------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class Round:
    phase: str
    side: str  # "direct" or "gateway"
    index: int
    bytes_moved: int
    seconds: float
    cpu_s: dict[str, float]
    latencies_ms: list[float] = field(default_factory=list)
    requests: int = 0

    @property
    def mbps(self) -> float:
        return self.bytes_moved / self.seconds / MB

    def percentile_ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_ms), q)

    @property
    def other_cores(self) -> float:
        """How many cores other processes kept busy during the round, on average."""
        return self.cpu_s.get("other", 0.0) / self.seconds

    def cpu_per_gb(self, who: str) -> float:
        return self.cpu_s[who] / (self.bytes_moved / GB) if self.bytes_moved else float("nan")

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "side": self.side,
            "round": self.index,
            "bytes": self.bytes_moved,
            "seconds": round(self.seconds, 4),
            "MBps": round(self.mbps, 1),
            "cpu_s": self.cpu_s,
            "other_cores": round(self.other_cores, 3),
            "requests": self.requests,
        }
        if self.latencies_ms:
            out["p50_ms"] = round(self.percentile_ms(50), 4)
            out["p99_ms"] = round(self.percentile_ms(99), 4)
            out["mean_ms"] = round(statistics.fmean(self.latencies_ms), 4)
            out["max_ms"] = round(max(self.latencies_ms), 4)
        return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


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


async def run_all(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; on the first failure cancel the others, wait for them, and raise that failure."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


def abba(rounds: int) -> Iterator[tuple[int, str]]:
    """direct, gateway, gateway, direct, direct, gateway, ...: interleaved, and balanced against drift."""
    for i in range(rounds):
        first, second = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        yield i, first
        yield i, second


class Bench:
    def __init__(self, opts: Options, stack: Stack, client: Client, results: Results) -> None:
        self.opts = opts
        self.stack = stack
        self.client = client
        self.results = results
        self.meter = CpuMeter({"gateway": stack.gateway_pid, "seaweedfs": stack.weed.pid or 0})

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    async def bounded(self, what: str, aw: Awaitable[Any]) -> Any:
        async def inner() -> Any:  # awaiting the gather here retrieves its result, even a cancellation
            return await aw

        try:
            return await asyncio.wait_for(inner(), self.opts.phase_timeout_s)
        except TimeoutError:
            raise BenchError(
                f"{what} took longer than --phase-timeout-s={self.opts.phase_timeout_s}"
            ) from None

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


def python_speed_ns() -> float:
    """Nanoseconds per iteration of a fixed pure-Python loop, best of 5: this VM's per-core speed moves
    with its host's load (we saw 57 and 127 ns on the same machine an hour apart), and every CPU-time
    number in the report moves with it. Compare runs only when this probe agrees."""
    best = float("inf")
    n = 300_000
    for _ in range(5):
        t0 = time.perf_counter()
        x = 0
        for i in range(n):
            x += i
        best = min(best, (time.perf_counter() - t0) / n * 1e9)
    return best


def machine_facts() -> dict[str, str]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    cpu_model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in read("/proc/cpuinfo").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem_kib = next(
        (int(ln.split()[1]) for ln in read("/proc/meminfo").splitlines() if ln.startswith("MemTotal")), 0
    )
    try:
        weed_version = (
            subprocess.run(
                [find_weed_binary(), "version"], capture_output=True, text=True, timeout=30, check=False
            )
            .stdout.splitlines()[0]
            .strip()
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        weed_version = "?"
    source = GATEWAY_SOURCE
    git = ["git", "-C", str(source)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", "gateway"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        where = f"commit {commit.strip()}" + (", gateway/ modified" if dirty else "") if commit else "no git"
    except OSError:
        where = "no git"
    commit = f"{source / 'gateway'} ({where})"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))}) x {cpu_model}",
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "uvloop": importlib.metadata.version("uvloop"),
        "seaweedfs": weed_version,
        "s3lanes": f"{GATEWAY_VERSION} from {commit}",
    }


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
        start_gateway(stack, opts.gateway_toml.read_text() if opts.gateway_toml else "")
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
        results.gateway_exit_code = stop_gateway(stack)
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
