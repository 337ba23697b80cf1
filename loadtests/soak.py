"""Soak test: the Locust training mix against one spooling gateway for a long time, watching for leaks.

::

    python -m loadtests.soak --duration 30m --out results/soak-<timestamp>    # make soak
    python -m loadtests.soak --quick --out /tmp/soak                          # about 90 s (the CI test)

Results and their interpretation live in ``docs/reliability.md`` ("Long runs").

Theory of operation
-------------------
The script starts its own SeaweedFS (temporary state directory, removed at the end) and one ``s3lanes serve``
subprocess in front of it with the write spool on and a real key pair, creates the dataset with
``loadtests.dataprep``'s code (through the gateway, write-through), and runs Locust headless as a
subprocess (importing Locust here would monkey-patch this process with gevent) with the project's users
and ``TrainingShape``: ``DatasetReader``\\s at a fixed rate, two ``CheckpointWriter``\\s bursting every
``--ckpt-period-s``, one ``Lister``. The rate is modest on purpose: the point is duration, not peak.

*The ledger.* Locust runs a small locustfile generated into the run directory: the training locustfile's
users and shape plus :func:`install_ledger`, which appends one JSON line per CompleteMultipartUpload the
gateway acknowledged: the key, and the MD5 and multipart ETag of the bytes the writer sent (computed from
the very part buffers it sent). Checkpoint keys are never reused (``--ckpt-keep 0``), so at the end every
ledger entry must be on SeaweedFS, read back directly and byte-exact (MD5). The writers reuse one random
buffer per part size, so this catches missing, short, stale or corrupt objects but not two equal-sized
parts swapped.

*Bursts end before the run does.* Locust kills its users when the run stops, which would leave a writer's
upload half-done. The burst schedule is anchored to the launch (``--ckpt-offset-s``) so that the run ends
three quarters of a period after the last burst started; uploads still open at the end (a slow burst) are
aborted through the gateway before the checks, and reported.

*Deliberate errors.* Besides Locust's users, the sampler itself sends requests that must fail, every
sample: a GET signed with a wrong secret (403), a GET of a missing key (404), and every third sample a
spooled PUT that announces 4 MiB, sends 1 MiB and hangs up. They exercise the error and cleanup paths
where leaks usually hide; they are counted apart from Locust's (which must have no failures at all), and
at the end no aborted PUT may be visible anywhere.

*Samples.* Every ``--interval-s`` (10 s): the gateway's RSS (``VmRSS``), its open fds (by kind), threads and
CPU seconds from ``/proc/<pid>``, and from ``/_s3lanes/status`` the spool (pending bytes and objects, open
uploads, drain tasks in flight, oldest pending age) and the dispatcher (requests waiting, in flight), plus
the spool's data files and journal size on disk, SeaweedFS's and Locust's RSS and the load average, and the
asyncio tasks alive on the gateway's event loop (``event_loop_tasks`` in the status).

*Figures.* After a warm-up (``--warmup``, default a sixth of the run) the median RSS of a window right after
the warm-up is compared with that of the last window (``--window``, two burst periods, so both hold the same
number of bursts): the growth must stay under 10 %. The slope of a least-squares line through every
post-warm-up RSS sample is reported in MiB/h. Fds, threads and event-loop tasks are compared the same way
(window medians); see :data:`THREAD_TOLERANCE` and :func:`fd_tolerance` for what counts as growth. Idle
before the load and idle after the flush, the fd and task counts must be back where they started.
``--quick`` is too short for a memory figure: there the RSS growth is reported only and the fd tolerance is
tripled.

Also checked: no Locust failure, Locust ran its whole duration, the flush of the checkpoint prefix reports
durable, the ledger matches SeaweedFS, no spool data file is left over after the flush, the gateway log has
no ``Traceback`` and the gateway exits 0 on SIGTERM. Writes ``samples.csv``, ``summary.json``, ``summary.md``,
``soak.png``, Locust's CSVs and log, the gateway's log and the ledger into ``--out``; exits 1 when a target is
missed, 2 when the run itself broke.

Run it under ``nice -n 19`` on a shared machine: every process it starts inherits the niceness, which
``summary.json`` records.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import hashlib
import http.client
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar
from urllib.parse import quote, unquote, urlsplit

from loadtests.dataprep import prepare
from loadtests.harness.cli import bench_parser
from loadtests.harness.gateway import server_toml, tail
from loadtests.harness.gateway import start_gateway as harness_start_gateway
from loadtests.harness.gateway import stop_process as harness_stop_process
from loadtests.harness.machine import machine_facts
from loadtests.harness.phase import progress
from loadtests.harness.store import seaweed
from s3lanes.config import parse_size
from s3lanes.core.sigv4 import EMPTY_SHA256, UNSIGNED_PAYLOAD, sign_headers
from s3lanes.seaweed.process import SeaweedProcess
from s3lanes_client import ClientConfig, GatewayClient

ROOT = Path(__file__).resolve().parent.parent
TRAINING_LOCUSTFILE = ROOT / "loadtests" / "locustfile_training.py"

BUCKET = "soak"
REGION = "us-east-1"
ACCESS_KEY = "SOAKACCESSKEY0000001"
SECRET_KEY = "soak-secret-key-not-a-real-one-00000000"
WRONG_SECRET = "soak-wrong-secret-for-the-403-probe-0000"
DATASET_PREFIX = "locust-dataset/"
CKPT_PREFIX = "locust-ckpt/"
ABORTED_PREFIX = "soak-aborted/"
MISSING_KEY = "soak-missing/no-such-object"

MIB = 1024 * 1024
KIB = 1024
DRAIN_CONCURRENCY = 8  # stated in the gateway config below; part of the fd tolerance
GATEWAY_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 15.0
FLUSH_TIMEOUT_S = 900.0
ABORTED_PUT_DECLARED_BYTES = 4 * MIB
ABORTED_PUT_SENT_BYTES = 1 * MIB
ABORTED_PUT_EVERY = 3  # samples
RSS_GROWTH_LIMIT_PCT = 10.0
# Threads: the spool's I/O pool and asyncio's default executor start their threads lazily, up to fixed
# bounds; a burst more concurrent than any in the warm-up can still add one or two. A leak (a thread per
# request, per burst or per drain) grows without bound and overshoots this within minutes.
THREAD_TOLERANCE = 2
QUICK_FD_FACTOR = 3
LOCUST_GRACE_S = 120.0  # Locust's start and stop beyond --duration
SPOOL_SETTLE_S = 30.0
# The gateway's backend pool keeps idle connections 30 s (aiohttp keepalive_timeout in runtime/backend.py),
# and its cleanup timer runs every 30 s, so an idle connection is closed within 60 s. After that, with no
# load, every fd the load opened must be closed again: the idle fd count must be back where it started.
IDLE_WAIT_S = 70.0
IDLE_FD_TOLERANCE = 0  # how long the spool may take to unlink drained files after the flush
# Idle tasks: the spool's heal loop and the drainer's janitor come and go on their own timers, so the idle
# count after the flush may differ from the one before by a task or two; a leak per request or per burst is
# thousands of tasks by the end of a run.
IDLE_TASK_TOLERANCE = 2
LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")

# --------------------------------------------------------------------------------------------------------
# Options


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1.5h`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 30m, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@dataclass(frozen=True, slots=True)
class Workload:
    """What Locust runs (docs/loadtests.md has the options)."""

    dataset_objects: int
    dataset_object_size: str
    readers: int
    read_rate: float
    read_size: str
    ckpt_writers: int
    ckpt_size: str
    ckpt_part_size: str
    ckpt_part_concurrency: int
    ckpt_period_s: float
    ckpt_warmup_s: float
    lister_users: int
    lister_wait_s: float
    lister_page_size: int
    lister_heads: int

    def locust_args(self, offset_s: float) -> list[str]:
        return [
            "--s3-bucket", BUCKET, "--dataset-prefix", DATASET_PREFIX,
            "--dataset-objects", str(self.dataset_objects), "--dataset-object-size", self.dataset_object_size,
            "--readers", str(self.readers), "--read-rate", str(self.read_rate), "--read-size", self.read_size,
            "--ckpt-prefix", CKPT_PREFIX, "--ckpt-keep", "0", "--ckpt-writers", str(self.ckpt_writers),
            "--ckpt-size", self.ckpt_size, "--ckpt-part-size", self.ckpt_part_size,
            "--ckpt-part-concurrency", str(self.ckpt_part_concurrency),
            "--ckpt-period-s", str(self.ckpt_period_s), "--ckpt-warmup-s", str(self.ckpt_warmup_s),
            "--ckpt-offset-s", f"{offset_s:.3f}",
            "--lister-users", str(self.lister_users), "--lister-wait-s", str(self.lister_wait_s),
            "--lister-page-size", str(self.lister_page_size), "--lister-heads", str(self.lister_heads),
        ]  # fmt: skip

    def describe(self) -> str:
        burst = parse_size(self.ckpt_size)
        share = burst / max(1, self.ckpt_writers)
        return (
            f"{self.readers} DatasetReader x {self.read_rate:g} ranged GET/s of {self.read_size} over "
            f"{self.dataset_objects} x {self.dataset_object_size} objects; "
            f"{self.ckpt_writers} CheckpointWriter, "
            f"a {self.ckpt_size} burst every {self.ckpt_period_s:g} s ({share / MIB:g} MiB per writer as one "
            f"multipart upload, {self.ckpt_part_size} parts, {self.ckpt_part_concurrency} in flight, "
            f"new keys every burst); {self.lister_users} Lister, a storm every ~{self.lister_wait_s:g} s "
            f"(ListObjectsV2 pages of {self.lister_page_size}, then {self.lister_heads} HEADs)"
        )


# The workloads of a full run and of a --quick one, field by field.
WORKLOADS: dict[str, tuple[Any, Any]] = {
    "dataset_objects": (32, 8),
    "dataset_object_size": ("8MiB", "1MiB"),
    "readers": (4, 2),
    "read_rate": (5.0, 5.0),
    "read_size": ("256KiB", "64KiB"),
    "ckpt_writers": (2, 2),
    "ckpt_size": ("128MiB", "20MiB"),
    "ckpt_part_size": ("8MiB", "5MiB"),
    "ckpt_part_concurrency": (2, 2),
    "ckpt_period_s": (60.0, 15.0),
    "ckpt_warmup_s": (10.0, 5.0),
    "lister_users": (1, 1),
    "lister_wait_s": (10.0, 3.0),
    "lister_page_size": (8, 3),
    "lister_heads": (10, 3),
}
FULL_WORKLOAD = Workload(**{name: full for name, (full, _) in WORKLOADS.items()})
QUICK_WORKLOAD = Workload(**{name: quick for name, (_, quick) in WORKLOADS.items()})


@dataclass(frozen=True, slots=True)
class Options:
    quick: bool
    duration_s: float
    warmup_s: float
    window_s: float
    interval_s: float
    out_dir: Path
    tmp_dir: Path | None
    keep_state: bool
    workload: Workload
    command: str


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = bench_parser(
        "soak",
        "Soak test: the Locust training mix against a spooling gateway with SeaweedFS for a long "
        "time; RSS, fds, threads and the spool sampled; durability checked at the end.",
        "a ~90 s run for CI; memory growth report-only",
    )
    p.add_argument("--duration", default=None, help="how long Locust runs (30m; quick 75s)")
    p.add_argument(
        "--warmup", default=None, help="excluded from growth figures (a sixth of the run; quick 20s)"
    )
    p.add_argument("--window", default=None, help="median window for warm-up/end figures (2 burst periods)")
    p.add_argument("--interval-s", type=float, default=None, help="seconds between samples (10; quick 2)")
    p.add_argument("--out", type=Path, default=None, help="results directory (results/soak-<timestamp>)")
    p.add_argument("--keep-state", action="store_true", help="keep SeaweedFS's and the gateway's state")
    p.add_argument("--readers", type=int, default=None, help="DatasetReader users (4; quick 2)")
    p.add_argument("--read-rate", type=float, default=None, help="GETs per second per reader (5)")
    p.add_argument("--ckpt-size", default=None, help="bytes per burst over all writers (128MiB; quick 20MiB)")
    p.add_argument("--ckpt-period-s", type=float, default=None, help="seconds between bursts (60; quick 15)")
    a = p.parse_args(argv)
    base = QUICK_WORKLOAD if a.quick else FULL_WORKLOAD
    changes: dict[str, Any] = {
        k: v
        for k, v in (
            ("readers", a.readers),
            ("read_rate", a.read_rate),
            ("ckpt_size", a.ckpt_size),
            ("ckpt_period_s", a.ckpt_period_s),
        )
        if v is not None
    }
    workload = Workload(**{**asdict(base), **changes})
    try:
        duration_s = parse_duration(a.duration or ("75s" if a.quick else "30m"))
        warmup_s = parse_duration(a.warmup) if a.warmup else (20.0 if a.quick else duration_s / 6)
        window_s = (
            parse_duration(a.window)
            if a.window
            else (15.0 if a.quick else max(60.0, 2 * workload.ckpt_period_s))
        )
        parse_size(workload.ckpt_size)
    except ValueError as exc:
        p.error(str(exc))
    if warmup_s + 2 * window_s > duration_s:
        p.error("the run must be longer than the warm-up plus two windows")
    if workload.readers < 0 or workload.read_rate <= 0 or workload.ckpt_period_s <= 0:
        p.error("--readers, --read-rate and --ckpt-period-s must be positive")
    interval_s = a.interval_s if a.interval_s is not None else (2.0 if a.quick else 10.0)
    if interval_s <= 0:
        p.error("--interval-s must be positive")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        quick=a.quick,
        duration_s=duration_s,
        warmup_s=warmup_s,
        window_s=window_s,
        interval_s=interval_s,
        out_dir=a.out if a.out is not None else Path("results") / f"soak-{stamp}",
        tmp_dir=a.tmp_dir,
        keep_state=a.keep_state,
        workload=workload,
        command=shlex.join(["python", "-m", "loadtests.soak", *(sys.argv[1:] if argv is None else argv)]),
    )


class SoakError(Exception):
    """The run itself broke (not a missed target): exit 2."""


# --------------------------------------------------------------------------------------------------------
# The ledger: runs inside the Locust process (the generated locustfile calls install_ledger)

LOCUSTFILE_TEMPLATE = '''"""Generated by loadtests/soak.py for one soak run: the training pattern's users and
shape, plus the soak's ledger of acknowledged checkpoint objects."""

import sys

if {root!r} not in sys.path:
    sys.path.insert(0, {root!r})

from loadtests.locustfile_training import CheckpointWriter, DatasetReader, Lister, TrainingShape  # noqa: E402
from loadtests.soak import install_ledger  # noqa: E402

install_ledger({ledger!r})

__all__ = ["CheckpointWriter", "DatasetReader", "Lister", "TrainingShape"]
'''


def expected_digests(share_bytes: int, part_bytes: int) -> tuple[str, str]:
    """MD5 of one writer's object and its multipart ETag, from the part buffers this process sends
    (``loadtests.locust_s3.part_data``: one random buffer per part size, per process)."""
    from loadtests.locust_s3 import part_data, part_sizes  # Locust's process only: this imports Locust

    whole = hashlib.md5(usedforsecurity=False)
    part_md5s = b""
    sizes = part_sizes(share_bytes, part_bytes)
    for size in sizes:
        data = part_data(size)
        whole.update(data)
        part_md5s += hashlib.md5(data, usedforsecurity=False).digest()
    etag = f"{hashlib.md5(part_md5s, usedforsecurity=False).hexdigest()}-{len(sizes)}"
    return whole.hexdigest(), etag


def install_ledger(path: str) -> None:
    """In the Locust process: append ``{key, size, md5, etag_expected, etag_returned, t}`` to ``path`` (JSON
    lines) for every CompleteMultipartUpload the gateway acknowledged. Written and flushed per entry, so a
    run that dies still leaves the ledger of what was acknowledged up to then."""
    from locust import events  # Locust's process only

    from loadtests.locust_phases import listener
    from loadtests.locust_s3 import LoadOptions

    state: dict[str, Any] = {}
    fh = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the Locust process

    @listener(events.test_start)
    def _on_start(environment: Any, **_kw: Any) -> None:
        opts = LoadOptions.from_parsed(environment.parsed_options)
        state["size"] = opts.share_bytes
        state["part_bytes"] = opts.ckpt_part_bytes
        state["bucket"] = opts.bucket

    @listener(events.request)
    def _on_request(
        request_type: str, name: str, response: Any = None, exception: Any = None, url: str = "", **_kw: Any
    ) -> None:
        if name != "POST complete multipart" or exception is not None or "size" not in state:
            return
        path = unquote(urlsplit(url).path)
        key = path.split("/", 2)[2] if path.count("/") >= 2 else ""
        if "digests" not in state:
            state["digests"] = expected_digests(state["size"], state["part_bytes"])
        md5, etag = state["digests"]
        returned = ""
        try:
            root = ET.fromstring(getattr(response, "content", b"") or b"")
            returned = next((el.text or "" for el in root.iter() if el.tag.endswith("ETag")), "").strip('"')
        except ET.ParseError:
            pass
        entry = {"key": key, "size": state["size"], "md5": md5, "etag_expected": etag}
        entry |= {"etag_returned": returned, "t": time.time()}
        fh.write(json.dumps(entry) + "\n")

    @listener(events.quit)
    def _on_quit(**_kw: Any) -> None:
        fh.close()


# --------------------------------------------------------------------------------------------------------
# /proc


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS``/``VmHWM`` (KiB) and ``Threads`` from ``/proc/<pid>/status``; empty if the process is gone."""
    out: dict[str, int] = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "Threads"):
            out[name] = int(rest.split()[0])
    return out


def proc_cpu_s(pid: int) -> float:
    fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if len(fields) > 12 else 0.0


def proc_nice(pid: int) -> int | None:
    fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return int(fields[16]) if len(fields) > 16 else None


def fd_table(pid: int) -> dict[int, str]:
    """Open fds of ``pid`` and what they point to (``readlink /proc/<pid>/fd/N``); empty if it is gone."""
    table: dict[int, str] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return table
    for name in names:
        with contextlib.suppress(OSError):  # closed between listdir and readlink
            table[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return table


def fd_kind(target: str) -> str:
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    return "file" if target.startswith("/") else "other"


def fd_kinds(table: dict[int, str]) -> dict[str, int]:
    """Open fds by what they point to: socket, file, pipe, other (eventpoll, eventfd, ...)."""
    kinds = {"socket": 0, "file": 0, "pipe": 0, "other": 0}
    for target in table.values():
        kinds[fd_kind(target)] += 1
    return kinds


def non_socket_fds(table: dict[int, str]) -> str:
    """``fd=target`` of every fd but the sockets, ``;``-separated: what a leaked file would show as (an
    unlinked spool file reads ``/.../data/<id> (deleted)``)."""
    return ";".join(f"{fd}={t}" for fd, t in sorted(table.items()) if fd_kind(t) != "socket")


# --------------------------------------------------------------------------------------------------------
# Our processes


@dataclass(slots=True)
class Gateway:
    popen: subprocess.Popen[bytes]
    pid: int
    host: str
    port: int
    log: Path
    spool_dir: Path
    config_text: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"


def gateway_toml(d: Path, backend_url: str, spool_dir: Path) -> str:
    return f"""{server_toml(d / "state", log_level="INFO", shutdown_grace_s=10)}
[backend]
endpoint = "{backend_url}"
region = "{REGION}"

[spool]
enabled = true
dir = "{spool_dir}"
drain_concurrency = {DRAIN_CONCURRENCY}

[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
"""


def start_gateway(root: Path, backend_url: str) -> Gateway:
    d = root / "gateway"
    d.mkdir()
    spool_dir = d / "spool"
    text = gateway_toml(d, backend_url, spool_dir)
    # cwd=ROOT: `-m s3lanes` runs this working tree's code
    gw = harness_start_gateway(
        d, text, source=ROOT, timeout_s=GATEWAY_START_TIMEOUT_S, error=SoakError, spool_dir=spool_dir
    )
    return Gateway(gw.popen, gw.pid, gw.endpoint.host, gw.endpoint.port, gw.log, spool_dir, text)


def stop_process(popen: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM by pid, SIGKILL after ``timeout_s``; the exit code."""
    return harness_stop_process(popen, timeout_s)


# --------------------------------------------------------------------------------------------------------
# Talking to the gateway (plain http.client: no event loop, no Locust)


def _signed(
    gw: Gateway, method: str, key: str, *, secret: str = SECRET_KEY, payload: str = EMPTY_SHA256
) -> tuple[str, dict[str, str]]:
    path = f"/{BUCKET}/{quote(key, safe='/')}"
    headers = {"host": gw.netloc}
    headers |= sign_headers(
        method, path, "", headers, access_key=ACCESS_KEY, secret_key=secret, region=REGION,
        payload_hash=payload, now_wall=time.time(),
    )  # fmt: skip
    return path, headers


def _request(
    gw: Gateway,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=timeout_s)
    try:
        conn.request(method, target, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def gateway_status(gw: Gateway) -> dict[str, Any]:
    status, body = _request(gw, "GET", "/_s3lanes/status")
    if status != 200:
        raise SoakError(f"/_s3lanes/status answered {status}: {body[:300]!r}")
    doc: dict[str, Any] = json.loads(body)
    return doc


def flush(gw: Gateway, prefix: str, timeout_s: float) -> dict[str, Any]:
    q = f"bucket={BUCKET}&prefix={quote(prefix, safe='')}&timeout={timeout_s:g}"
    status, body = _request(gw, "POST", f"/_s3lanes/flush?{q}", timeout_s=timeout_s + 30)
    doc: dict[str, Any] = json.loads(body) if body else {}
    doc["http_status"] = status
    return doc


@dataclass(slots=True)
class Probes:
    """The deliberate errors: what was sent, and what did not fail the way it should."""

    sent: dict[str, int] = field(
        default_factory=lambda: {"bad_signature": 0, "missing_key": 0, "aborted_put": 0}
    )
    unexpected: list[str] = field(default_factory=list)
    aborted_keys: list[str] = field(default_factory=list)

    def bad_signature(self, gw: Gateway) -> None:
        self.sent["bad_signature"] += 1
        path, headers = _signed(gw, "GET", f"{DATASET_PREFIX}train-000000.tar", secret=WRONG_SECRET)
        self._expect("bad_signature", gw, "GET", path, headers, 403, b"SignatureDoesNotMatch")

    def missing_key(self, gw: Gateway) -> None:
        self.sent["missing_key"] += 1
        path, headers = _signed(gw, "GET", MISSING_KEY)
        self._expect("missing_key", gw, "GET", path, headers, 404, b"NoSuchKey")

    def _expect(
        self,
        what: str,
        gw: Gateway,
        method: str,
        path: str,
        headers: dict[str, str],
        status: int,
        code: bytes,
    ) -> None:
        try:
            got, body = _request(gw, method, path, headers)
        except OSError as exc:
            self.unexpected.append(f"{what}: {exc!r}")
            return
        if got != status or code not in body:
            self.unexpected.append(f"{what}: HTTP {got} {body[:200]!r}")

    def aborted_put(self, gw: Gateway) -> None:
        """A spooled PUT (a checkpoint-looking key) that announces 4 MiB, sends 1 MiB and hangs up: the
        gateway must neither acknowledge nor keep it."""
        n = self.sent["aborted_put"]
        self.sent["aborted_put"] += 1
        key = f"{ABORTED_PREFIX}step-{n:06d}/__0_0.distcp"
        path, headers = _signed(gw, "PUT", key, payload=UNSIGNED_PAYLOAD)
        headers["content-length"] = str(ABORTED_PUT_DECLARED_BYTES)
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        try:
            with socket.create_connection((gw.host, gw.port), timeout=PROBE_TIMEOUT_S) as sock:
                sock.sendall(head.encode() + os.urandom(ABORTED_PUT_SENT_BYTES))
        except OSError as exc:
            self.unexpected.append(f"aborted_put: could not send: {exc!r}")
            return
        self.aborted_keys.append(key)


# --------------------------------------------------------------------------------------------------------
# Samples


SAMPLE_FIELDS = (
    "t_s", "wall", "phase", "rss_kib", "hwm_kib", "fds", "fd_socket", "fd_file", "fd_pipe", "fd_other",
    "threads", "cpu_s", "spool_pending_bytes", "spool_pending_objects", "spool_open_uploads",
    "spool_backend_uploads_open", "spool_used_bytes", "spool_oldest_pending_age_s", "drain_in_flight",
    "drain_failing", "dispatcher_waiting", "dispatcher_in_flight", "spool_data_files", "journal_bytes",
    "weed_rss_kib", "locust_rss_kib", "loadavg1", "spool_acked_bytes_total", "spool_drained_bytes_total",
    "event_loop_tasks",
    *(f"{name}_max" for name in ("spool_pending_bytes", "spool_oldest_pending_age_s", "drain_in_flight",
                                  "dispatcher_waiting", "dispatcher_in_flight")),
    "status_polls", "fd_non_socket",
)  # fmt: skip


def status_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of one ``/_s3lanes/status`` document that a sample keeps (None where absent)."""
    spool = doc.get("spool", {})
    drain = spool.get("drain", {})
    disp = doc.get("dispatcher", {})
    return {
        "spool_pending_bytes": spool.get("pending_bytes"),
        "spool_pending_objects": spool.get("pending_objects"),
        "spool_open_uploads": spool.get("open_uploads"),
        "spool_backend_uploads_open": spool.get("backend_uploads_open"),
        "spool_used_bytes": spool.get("used_bytes"),
        "spool_oldest_pending_age_s": spool.get("oldest_pending_age_s"),
        "spool_acked_bytes_total": spool.get("acked_bytes_total"),
        "spool_drained_bytes_total": spool.get("drained_bytes_total"),
        "drain_in_flight": drain.get("in_flight"),
        "drain_failing": len(drain.get("failing", [])) if drain else None,
        "dispatcher_waiting": disp.get("waiting"),
        "dispatcher_in_flight": disp.get("in_flight"),
        "event_loop_tasks": doc.get("event_loop_tasks"),
    }


@dataclass(slots=True)
class StatusWatch:
    """Maxima of the status figures between two samples. The status is polled about once a second, the
    /proc sample every ``--interval-s``: a burst and its drain take about a second on a quiet machine and
    would mostly fall between 10 s samples."""

    WATCHED: ClassVar[tuple[str, ...]] = (
        "spool_pending_bytes",
        "spool_oldest_pending_age_s",
        "drain_in_flight",
        "dispatcher_waiting",
        "dispatcher_in_flight",
    )
    maxima: dict[str, float] = field(default_factory=dict)
    polls: int = 0

    def observe(self, figures: dict[str, Any]) -> None:
        self.polls += 1
        for name in self.WATCHED:
            value = figures.get(name)
            if value is not None:
                self.maxima[name] = max(self.maxima.get(name, 0), value)

    def poll(self, gw: Gateway) -> None:
        # a gateway that does not answer shows in the next sample
        with contextlib.suppress(OSError, SoakError, ValueError):
            self.observe(status_figures(gateway_status(gw)))

    def take(self) -> dict[str, Any]:
        """The maxima since the last take (``*_max``), and start over."""
        out: dict[str, Any] = {f"{name}_max": self.maxima.get(name) for name in self.WATCHED}
        out["status_polls"] = self.polls
        self.maxima, self.polls = {}, 0
        return out


def _dir_count(path: Path) -> int:
    try:
        return sum(1 for _ in os.scandir(path))
    except OSError:
        return -1


def take_sample(
    gw: Gateway,
    t_s: float,
    phase: str,
    weed_pid: int | None,
    locust_pid: int | None,
    watch: StatusWatch | None = None,
) -> dict[str, Any]:
    st = proc_status(gw.pid)
    table = fd_table(gw.pid)
    kinds = fd_kinds(table)
    s: dict[str, Any] = {"t_s": round(t_s, 2), "wall": round(time.time(), 2), "phase": phase}
    s |= {"rss_kib": st.get("VmRSS", 0), "hwm_kib": st.get("VmHWM", 0), "fds": sum(kinds.values())}
    s |= {f"fd_{k}": v for k, v in kinds.items()}
    s["fd_non_socket"] = non_socket_fds(table)
    s |= {"threads": st.get("Threads", 0), "cpu_s": round(proc_cpu_s(gw.pid), 2)}
    try:
        figures = status_figures(gateway_status(gw))
    except (OSError, SoakError, ValueError):
        figures = status_figures({})
    s |= figures
    if watch is not None:
        watch.observe(figures)
        s |= watch.take()
    s |= {
        "spool_data_files": _dir_count(gw.spool_dir / "data"),
        "journal_bytes": (gw.spool_dir / "journal").stat().st_size
        if (gw.spool_dir / "journal").exists()
        else 0,
        "weed_rss_kib": proc_status(weed_pid).get("VmRSS", 0) if weed_pid else 0,
        "locust_rss_kib": proc_status(locust_pid).get("VmRSS", 0) if locust_pid else 0,
        "loadavg1": round(os.getloadavg()[0], 2),
    }
    return s


def write_samples(path: Path, samples: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=SAMPLE_FIELDS, extrasaction="ignore")
        w.writeheader()
        for s in samples:
            w.writerow({k: ("" if s.get(k) is None else s.get(k)) for k in SAMPLE_FIELDS})


# --------------------------------------------------------------------------------------------------------
# Analysis (pure)


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(t_s, y)`` in y per hour; None with fewer than 3 points."""
    if len(points) < 3:
        return None
    ts = [t for t, _ in points]
    ys = [y for _, y in points]
    t_mean, y_mean = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - t_mean) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - t_mean) * (y - y_mean) for t, y in zip(ts, ys, strict=True)) / var * 3600


def window(samples: Iterable[dict[str, Any]], start_s: float, end_s: float) -> list[dict[str, Any]]:
    return [s for s in samples if start_s <= s["t_s"] <= end_s]


def median_of(samples: Sequence[dict[str, Any]], name: str) -> float | None:
    values = [float(s[name]) for s in samples if s.get(name) is not None]
    return statistics.median(values) if values else None


def nearest(samples: Sequence[dict[str, Any]], t_s: float) -> dict[str, Any]:
    return min(samples, key=lambda s: abs(s["t_s"] - t_s))


def fd_tolerance(w: Workload) -> int:
    """How far the median fd count may rise between the warm-up window and the last window.

    The fd count follows the connections open at the moment of the sample: each request in flight holds a
    client socket and usually a backend socket, a spooled part also a data file. Both windows hold the same
    number of bursts, but where a sample lands in a burst is chance. The tolerance is one burst's worth of
    concurrency: every writer's parts in flight plus the drain's uploads. A leak of one fd per request, per
    part or per burst exceeds it many times over in a run (thousands of requests, dozens of bursts)."""
    return w.ckpt_writers * w.ckpt_part_concurrency + DRAIN_CONCURRENCY


@dataclass(frozen=True, slots=True)
class Growth:
    """One quantity, warm-up window vs last window."""

    at_warmup_end: float
    at_end: float
    warmup_median: float
    end_median: float
    max_after_warmup: float
    min_after_warmup: float

    @property
    def growth(self) -> float:
        return self.end_median - self.warmup_median

    @property
    def growth_pct(self) -> float:
        return 100.0 * self.growth / self.warmup_median if self.warmup_median else math.nan

    @property
    def max_growth_pct(self) -> float:
        return (
            100.0 * (self.max_after_warmup - self.warmup_median) / self.warmup_median
            if self.warmup_median
            else math.nan
        )


def growth_of(
    samples: Sequence[dict[str, Any]], name: str, warmup_s: float, window_s: float, end_s: float
) -> Growth:
    after = [s for s in samples if s["t_s"] >= warmup_s and s.get(name) is not None]
    first = window(after, warmup_s, warmup_s + window_s)
    last = window(after, end_s - window_s, end_s)
    if not after or not first or not last:
        raise SoakError(f"not enough samples after the warm-up for {name}")
    return Growth(
        at_warmup_end=float(nearest(after, warmup_s)[name]),
        at_end=float(after[-1][name]),
        warmup_median=float(median_of(first, name) or 0),
        end_median=float(median_of(last, name) or 0),
        max_after_warmup=max(float(s[name]) for s in after),
        min_after_warmup=min(float(s[name]) for s in after),
    )


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def locust_figures(prefix: Path) -> dict[str, Any]:
    """Requests and failures by type from Locust's CSVs; the checkpoint bursts from the phase CSV."""
    stats = read_csv(Path(f"{prefix}_stats.csv"))
    by_type = {
        f"{r['Type']} {r['Name']}".strip(): {
            "requests": int(r["Request Count"]),
            "failures": int(r["Failure Count"]),
            "median_ms": float(r["Median Response Time"] or 0),
            "p99_ms": float(r["99%"]) if r.get("99%") not in (None, "", "N/A") else None,
            "rps": round(float(r["Requests/s"] or 0), 2),
        }
        for r in stats
        if r["Name"] != "Aggregated"
    }
    http = {k: v for k, v in by_type.items() if not k.startswith("BURST ")}
    failures = [
        {"method": r["Method"], "name": r["Name"], "error": r["Error"], "occurrences": int(r["Occurrences"])}
        for r in read_csv(Path(f"{prefix}_failures.csv"))
    ]
    bursts = read_csv(Path(f"{prefix}_bursts.csv"))
    closed = [b for b in bursts if b.get("Open") == "0"]
    durations = [float(b["Duration (s)"]) for b in closed]
    return {
        "requests_total": sum(v["requests"] for v in http.values()),
        "failures_total": sum(v["failures"] for v in by_type.values()),
        "by_type": by_type,
        "failures": failures,
        "bursts": {
            "count": len(bursts),
            "open_at_stop": len(bursts) - len(closed),
            "failed_writers": sum(int(b.get("Failed Writers") or 0) for b in bursts),
            "bytes": sum(int(float(b.get("Bytes") or 0)) for b in closed),
            "duration_s_median": round(statistics.median(durations), 2) if durations else None,
            "duration_s_max": round(max(durations), 2) if durations else None,
        },
    }


def log_problems(path: Path) -> dict[str, Any]:
    """Tracebacks, ERROR lines and WARNING lines of the gateway log, counted, with the first few shown.
    The deliberate probes cause WARNING lines (403, 404); they are not a problem."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    tracebacks = [i for i, ln in enumerate(lines) if "Traceback" in ln]
    errors = [ln for ln in lines if LOG_PROBLEM.search(ln) and "Traceback" not in ln]
    warnings = [ln for ln in lines if " WARNING " in ln]
    return {
        "lines": len(lines),
        "tracebacks": len(tracebacks),
        "error_lines": len(errors),
        "warning_lines": len(warnings),
        "first_traceback": "\n".join(lines[tracebacks[0] : tracebacks[0] + 30]) if tracebacks else "",
        "first_errors": errors[:5],
        "warning_kinds": _kinds(warnings),
    }


def _kinds(lines: Sequence[str]) -> dict[str, int]:
    """WARNING lines grouped by their message with numbers and keys blurred."""
    out: dict[str, int] = {}
    for ln in lines:
        msg = ln.split(" WARNING ", 1)[1]
        msg = re.sub(r"\S*/\S*|\d+(\.\d+)?", "#", msg)[:120]
        out[msg] = out.get(msg, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:10])


# --------------------------------------------------------------------------------------------------------
# The run


@dataclass(slots=True)
class Run:
    opts: Options
    out: Path
    tmp: Path
    facts: dict[str, Any] = field(default_factory=dict)
    t0: float = 0.0  # time.monotonic() at the Locust launch: t_s of the samples
    before: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    after: list[dict[str, Any]] = field(default_factory=list)
    probes: Probes = field(default_factory=Probes)
    checks: dict[str, Any] = field(default_factory=dict)
    locust_exit: int | None = None
    locust_elapsed_s: float = 0.0
    gateway_exit: int | None = None
    nice: dict[str, int | None] = field(default_factory=dict)
    gateway_cfg: str = ""

    log = staticmethod(progress)


def client_config(endpoint_url: str) -> ClientConfig:
    return ClientConfig(
        endpoint_url=endpoint_url, region=REGION, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
        max_pool_connections=8, expect_100_continue=False,
    )  # fmt: skip


def prep_dataset(run: Run, gw: Gateway) -> None:
    w = run.opts.workload
    with GatewayClient(client_config(gw.url)) as client:
        todo = prepare(
            client, bucket=BUCKET, prefix=DATASET_PREFIX, objects=w.dataset_objects,
            size_bytes=int(parse_size(w.dataset_object_size)), concurrency=4, progress=False,
        )  # fmt: skip
    run.log(f"dataset: wrote {len(todo.to_write)} objects")


def start_locust(run: Run, gw: Gateway, ledger: Path) -> tuple[subprocess.Popen[bytes], list[str]]:
    w = run.opts.workload
    locustfile = run.out / "locustfile_soak.py"
    locustfile.write_text(LOCUSTFILE_TEMPLATE.format(root=str(ROOT), ledger=str(ledger.resolve())))
    # Anchor the bursts to the launch: a quarter period in, so the run ends 3/4 period after the last one.
    offset_s = (time.time() + w.ckpt_period_s / 4) % w.ckpt_period_s
    cmd = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
        "--host", gw.url, "--run-time", f"{run.opts.duration_s:.0f}s", "--spawn-rate", "10",
        "--csv", str(run.out / "locust"), "--html", str(run.out / "report.html"), "--loglevel", "INFO",
        *w.locust_args(offset_s),
    ]  # fmt: skip
    env = dict(os.environ)
    env |= {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    }  # fmt: skip
    with open(run.out / "locust.log", "wb") as log_fh:
        popen = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return popen, cmd


def run_load(run: Run, gw: Gateway, weed: SeaweedProcess) -> None:
    o = run.opts
    ledger = run.out / "ledger.jsonl"
    ledger.write_text("")
    locust, cmd = start_locust(run, gw, ledger)
    run.facts["locust_command"] = shlex.join(cmd)
    t0 = run.t0 = time.monotonic()
    for b in run.before:  # t_s counts from the Locust launch: the idle sample came before it
        b["t_s"] = round(b["wall"] - time.time(), 2)
    run.log(f"Locust pid {locust.pid}: {o.duration_s:.0f} s of {o.workload.describe()}")
    n = 0
    next_at = t0
    deadline = t0 + o.duration_s + LOCUST_GRACE_S
    last_report = t0
    watch = StatusWatch()
    try:
        while locust.poll() is None:
            now = time.monotonic()
            if now > deadline:
                run.checks["locust_overran"] = True
                run.log("Locust did not stop in time; stopping it")
                stop_process(locust)
                break
            if now >= next_at:
                if n == 1:
                    run.nice["locust"] = proc_nice(locust.pid)
                run.samples.append(take_sample(gw, now - t0, "run", weed.pid, locust.pid, watch))
                if gw.popen.poll() is not None:
                    raise SoakError(f"the gateway exited with {gw.popen.returncode}:\n" + tail(gw.log))
                run.probes.bad_signature(gw)
                run.probes.missing_key(gw)
                if n % ABORTED_PUT_EVERY == 1:
                    run.probes.aborted_put(gw)
                n += 1
                next_at = t0 + n * o.interval_s
                if now - last_report >= 60 or n == 1:
                    last_report = now
                    s = run.samples[-1]
                    run.log(
                        f"t={s['t_s']:.0f}s rss={s['rss_kib'] / KIB:.1f} MiB fds={s['fds']}"
                        f" threads={s['threads']} load={s['loadavg1']}"
                        f" spool_pending_max={(s['spool_pending_bytes_max'] or 0) / MIB:.1f} MiB"
                    )
            else:
                watch.poll(gw)
            time.sleep(max(0.05, min(1.0, next_at - time.monotonic())))
    finally:
        if locust.poll() is None:
            stop_process(locust)
    run.locust_exit = locust.returncode
    run.locust_elapsed_s = time.monotonic() - t0
    run.samples.append(take_sample(gw, time.monotonic() - t0, "after_load", weed.pid, None, watch))
    run.log(f"Locust exited with {run.locust_exit} after {run.locust_elapsed_s:.0f} s")


def abort_open_uploads(run: Run, gw: Gateway) -> list[str]:
    """Multipart uploads a stopped writer left open (a burst that ran into the end): aborted, reported."""
    aborted: list[str] = []
    with GatewayClient(client_config(gw.url)) as client:
        page = client.call("list_multipart_uploads", Bucket=BUCKET, Prefix=CKPT_PREFIX, lane=None)
        for up in page.get("Uploads", []):
            client.call(
                "abort_multipart_upload", Bucket=BUCKET, Key=up["Key"], UploadId=up["UploadId"], lane=None
            )
            aborted.append(up["Key"])
    return aborted


def verify_ledger(run: Run, weed: SeaweedProcess) -> dict[str, Any]:
    """Every acknowledged checkpoint object, read back from SeaweedFS directly: size and MD5."""
    entries = [json.loads(ln) for ln in (run.out / "ledger.jsonl").read_text().splitlines() if ln.strip()]
    latest = {e["key"]: e for e in entries}  # keys are never reused (--ckpt-keep 0); last wins anyway
    bad: list[str] = []
    etag_mismatch = 0
    checked_bytes = 0
    with GatewayClient(client_config(weed.endpoint_url)) as client:
        on_backend = {o.key: o for o in client.list_objects(BUCKET, CKPT_PREFIX, lane=None)}
        for key, e in sorted(latest.items()):
            if e["etag_returned"] != e["etag_expected"]:
                etag_mismatch += 1
            if key not in on_backend:
                bad.append(f"{key}: not on the backend")
                continue
            resp = client.call("get_object", Bucket=BUCKET, Key=key, lane=None)
            md5 = hashlib.md5(usedforsecurity=False)
            size = 0
            body = resp["Body"]
            try:
                for chunk in body.iter_chunks(MIB):
                    md5.update(chunk)
                    size += len(chunk)
            finally:
                body.close()
            checked_bytes += size
            if size != e["size"] or md5.hexdigest() != e["md5"]:
                bad.append(f"{key}: {size} bytes, md5 {md5.hexdigest()}, expected {e['size']} / {e['md5']}")
    return {
        "acknowledged": len(latest),
        "acknowledged_bytes": sum(int(e["size"]) for e in latest.values()),
        "on_backend_byte_exact": len(latest) - len(bad),
        "checked_bytes": checked_bytes,
        "backend_objects_under_prefix": len(on_backend),
        "etag_mismatches": etag_mismatch,
        "problems": bad[:20],
        "ok": bool(latest) and not bad and etag_mismatch == 0,
    }


def check_aborted_absent(run: Run, gw: Gateway, weed: SeaweedProcess) -> dict[str, Any]:
    seen: list[str] = []
    for url in (gw.url, weed.endpoint_url):
        with GatewayClient(client_config(url)) as client:
            seen += [f"{url}: {o.key}" for o in client.list_objects(BUCKET, ABORTED_PREFIX, lane=None)]
    return {"sent": len(run.probes.aborted_keys), "visible": seen[:10], "ok": not seen}


def wait_spool_settled(gw: Gateway) -> dict[str, Any]:
    """After the flush: the spool holds nothing and its data directory is empty (no leaked files)."""
    deadline = time.monotonic() + SPOOL_SETTLE_S
    while True:
        spool = gateway_status(gw)["spool"]
        files = _dir_count(gw.spool_dir / "data")
        done = spool["pending_objects"] == 0 and spool["open_uploads"] == 0 and files == 0
        if done or time.monotonic() > deadline:
            return {
                "pending_objects": spool["pending_objects"],
                "pending_bytes": spool["pending_bytes"],
                "open_uploads": spool["open_uploads"],
                "data_files": files,
                "ok": done,
            }
        time.sleep(0.5)


def finish(run: Run, gw: Gateway, weed: SeaweedProcess) -> None:
    c = run.checks
    c["open_uploads_aborted"] = abort_open_uploads(run, gw)
    run.log(f"aborted {len(c['open_uploads_aborted'])} open uploads; flushing {CKPT_PREFIX}")
    t0 = time.monotonic()
    doc = flush(gw, CKPT_PREFIX, FLUSH_TIMEOUT_S)
    c["flush"] = {
        "http_status": doc.get("http_status"),
        "durable": doc.get("durable"),
        "pending_objects": doc.get("pending_objects"),
        "waited_s": round(time.monotonic() - t0, 2),
    }
    run.log(f"flush: {c['flush']}; verifying the ledger against SeaweedFS")
    c["spool_settled"] = wait_spool_settled(gw)
    c["ledger"] = verify_ledger(run, weed)
    c["aborted_puts"] = check_aborted_absent(run, gw, weed)
    run.after.append(take_sample(gw, time.monotonic() - run.t0, "after_flush", weed.pid, None))
    run.log(f"waiting up to {IDLE_WAIT_S:.0f} s for idle connections to close")
    idle_fds = len(fd_table(gw.pid))
    deadline = time.monotonic() + IDLE_WAIT_S
    while idle_fds > run.before[0]["fds"] and time.monotonic() < deadline:
        time.sleep(1.0)
        idle_fds = len(fd_table(gw.pid))
    run.after.append(take_sample(gw, time.monotonic() - run.t0, "idle_after", weed.pid, None))
    c["idle_wait_s"] = round(run.after[-1]["t_s"] - run.after[-2]["t_s"], 1)
    run.log(f"ledger: {c['ledger']['on_backend_byte_exact']}/{c['ledger']['acknowledged']} byte-exact")


# --------------------------------------------------------------------------------------------------------
# Summary, plot, report


def summarise(run: Run) -> dict[str, Any]:
    o = run.opts
    w = o.workload
    samples = [s for s in run.samples if s["phase"] == "run"]
    end_s = samples[-1]["t_s"] if samples else 0.0
    rss = growth_of(samples, "rss_kib", o.warmup_s, o.window_s, end_s)
    fds = growth_of(samples, "fds", o.warmup_s, o.window_s, end_s)
    threads = growth_of(samples, "threads", o.warmup_s, o.window_s, end_s)
    tasks = growth_of(samples, "event_loop_tasks", o.warmup_s, o.window_s, end_s)
    post = [s for s in samples if s["t_s"] >= o.warmup_s]
    rss_slope = slope_per_hour([(s["t_s"], s["rss_kib"] / KIB) for s in post])
    fd_slope = slope_per_hour([(s["t_s"], float(s["fds"])) for s in post])
    locust = locust_figures(run.out / "locust")
    fd_tol = fd_tolerance(w) * (QUICK_FD_FACTOR if o.quick else 1)
    idle = {
        k: {
            n: x.get(n)
            for n in (
                *("fds", "fd_socket", "fd_file", "fd_pipe", "fd_other"),
                *("threads", "rss_kib", "event_loop_tasks"),
            )
        }
        for k, x in (("before", run.before[0]), ("after", run.after[-1]))
    }
    idle_fd_growth = int(idle["after"]["fds"] or 0) - int(idle["before"]["fds"] or 0)
    tasks_before, tasks_after = idle["before"]["event_loop_tasks"], idle["after"]["event_loop_tasks"]
    idle_task_growth = (
        None if tasks_before is None or tasks_after is None else int(tasks_after) - int(tasks_before)
    )
    before_fds = set(run.before[0]["fd_non_socket"].split(";"))
    opened = [x for x in run.after[-1]["fd_non_socket"].split(";") if x and x not in before_fds]
    last = samples[-1] if samples else {}
    cpu_s = (samples[-1]["cpu_s"] - samples[0]["cpu_s"]) if len(samples) > 1 else 0.0
    logs = log_problems(run.out / "gateway.log")
    c = run.checks
    settled = c["spool_settled"]
    end_of_load = next((x for x in run.samples if x["phase"] == "after_load"), last)
    spooled_bytes = int(end_of_load.get("spool_acked_bytes_total") or 0)

    def peak(name: str) -> float:
        """The largest value of ``name`` seen (the 1 Hz maxima included)."""
        values = [x.get(f"{name}_max") for x in samples] + [x.get(name) for x in samples]
        return max((float(v) for v in values if v is not None), default=0.0)

    def mib(kib: float) -> float:
        return round(kib / KIB, 1)

    targets: dict[str, dict[str, Any]] = {
        "locust_failures": {
            "value": locust["failures_total"],
            "limit": 0,
            "ok": locust["failures_total"] == 0,
        },
        "locust_ran_the_whole_duration": {
            "value": round(run.locust_elapsed_s, 1),
            "limit": f">= {o.duration_s:.0f} s, exit 0",
            "ok": run.locust_exit == 0
            and run.locust_elapsed_s >= o.duration_s - 1
            and not c.get("locust_overran"),
        },
        "deliberate_errors_as_expected": {
            "value": len(run.probes.unexpected),
            "limit": 0,
            "ok": not run.probes.unexpected,
        },
        "rss_growth_pct": {
            "value": round(rss.growth_pct, 2),
            "limit": f"< {RSS_GROWTH_LIMIT_PCT:g}" + (" (report only in --quick)" if o.quick else ""),
            "ok": o.quick or rss.growth_pct < RSS_GROWTH_LIMIT_PCT,
        },
        "fd_growth": {"value": fds.growth, "limit": f"<= {fd_tol}", "ok": fds.growth <= fd_tol},
        "idle_fds_back_to_start": {
            "value": idle_fd_growth,
            "limit": f"<= {IDLE_FD_TOLERANCE}",
            "ok": idle_fd_growth <= IDLE_FD_TOLERANCE,
        },
        "thread_growth": {
            "value": threads.growth,
            "limit": f"<= {THREAD_TOLERANCE}",
            "ok": threads.growth <= THREAD_TOLERANCE,
        },
        "event_loop_task_growth": {
            "value": tasks.growth,
            "limit": f"<= {fd_tol}",
            "ok": tasks.growth <= fd_tol,
        },
        "idle_tasks_back_to_start": {
            "value": idle_task_growth,
            "limit": f"<= {IDLE_TASK_TOLERANCE}",
            "ok": idle_task_growth is not None and idle_task_growth <= IDLE_TASK_TOLERANCE,
        },
        "checkpoint_flush_durable": {
            "value": c["flush"]["durable"],
            "limit": True,
            "ok": c["flush"]["durable"] is True and c["flush"]["http_status"] == 200,
        },
        "checkpoints_byte_exact_on_backend": {
            "value": f"{c['ledger']['on_backend_byte_exact']}/{c['ledger']['acknowledged']}",
            "limit": "all (and at least one)",
            "ok": c["ledger"]["ok"],
        },
        "checkpoints_went_through_the_spool": {
            "value": spooled_bytes,
            "limit": f">= {c['ledger']['acknowledged_bytes']} (the ledger's bytes)",
            "ok": spooled_bytes >= c["ledger"]["acknowledged_bytes"] > 0,
        },
        "aborted_puts_invisible": {
            "value": len(c["aborted_puts"]["visible"]),
            "limit": 0,
            "ok": c["aborted_puts"]["ok"],
        },
        "spool_empty_after_flush": {
            "value": f"{settled['pending_objects']} pending, {settled['data_files']} data files",
            "limit": "0, 0",
            "ok": c["spool_settled"]["ok"],
        },
        "gateway_log_tracebacks": {"value": logs["tracebacks"], "limit": 0, "ok": logs["tracebacks"] == 0},
        "gateway_clean_exit": {"value": run.gateway_exit, "limit": 0, "ok": run.gateway_exit == 0},
    }
    return {
        "command": o.command,
        "quick": o.quick,
        "started_utc": run.facts.get("started_utc"),
        "machine": run.facts.get("machine"),
        "nice": run.nice,
        "loadavg1_mean": round(statistics.fmean(s["loadavg1"] for s in samples), 2) if samples else None,
        "duration_s": o.duration_s,
        "warmup_s": o.warmup_s,
        "window_s": o.window_s,
        "interval_s": o.interval_s,
        "samples": len(samples),
        "workload": asdict(w) | {"description": w.describe()},
        "locust": locust,
        "deliberate_errors": {"sent": run.probes.sent, "unexpected": run.probes.unexpected[:20]},
        "rss_mib": {
            "at_warmup_end": mib(rss.at_warmup_end),
            "at_end": mib(rss.at_end),
            "warmup_window_median": mib(rss.warmup_median),
            "end_window_median": mib(rss.end_median),
            "max_after_warmup": mib(rss.max_after_warmup),
            "growth_pct": round(rss.growth_pct, 2),
            "max_growth_pct": round(rss.max_growth_pct, 2),
            "slope_mib_per_h": None if rss_slope is None else round(rss_slope, 2),
            "hwm_at_end": mib(last.get("hwm_kib", 0)),
        },
        "fds": asdict(fds)
        | {"growth": fds.growth, "tolerance": fd_tol, "slope_per_h": fd_slope and round(fd_slope, 2)},
        "idle": idle
        | {
            "fd_growth": idle_fd_growth,
            "wait_s": c["idle_wait_s"],
            "non_socket_fds_not_there_before": opened,
        },
        "threads": asdict(threads) | {"growth": threads.growth, "tolerance": THREAD_TOLERANCE},
        "event_loop_tasks": asdict(tasks) | {"growth": tasks.growth, "tolerance": fd_tol},
        "spool": {
            "pending_bytes_at_end_of_load": end_of_load.get("spool_pending_bytes"),
            "pending_objects_at_end_of_load": end_of_load.get("spool_pending_objects"),
            "pending_bytes_max": int(peak("spool_pending_bytes")),
            "oldest_pending_age_s_max": round(peak("spool_oldest_pending_age_s"), 1),
            "drain_in_flight_max": int(peak("drain_in_flight")),
            "dispatcher_in_flight_max": int(peak("dispatcher_in_flight")),
            "dispatcher_waiting_max": int(peak("dispatcher_waiting")),
            "acked_bytes_total": spooled_bytes,
            "drained_bytes_total": end_of_load.get("spool_drained_bytes_total"),
            "status_polls": sum(int(x.get("status_polls") or 0) for x in samples),
            "journal_bytes_max": max(s["journal_bytes"] for s in samples) if samples else None,
            "after_flush": c["spool_settled"],
        },
        "gateway_cpu_s": round(cpu_s, 1),
        "gateway_cpu_pct_of_one_core": round(100 * cpu_s / max(1.0, end_s), 1),
        "weed_rss_mib": {"first": mib(samples[0]["weed_rss_kib"]), "last": mib(last.get("weed_rss_kib", 0))}
        if samples
        else {},
        "checks": c,
        "gateway_log": logs,
        "gateway_exit": run.gateway_exit,
        "targets": targets,
        "ok": all(t["ok"] for t in targets.values()),
    }


def plot(run: Run, s: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    samples = [x for x in run.samples if x["phase"] == "run"]
    t_min = [x["t_s"] / 60 for x in samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ax = axes[0]
    ax.plot(t_min, [x["rss_kib"] / KIB for x in samples], label="gateway RSS")
    ax.set_ylabel("MiB")
    ax.set_title(
        f"s3lanes soak: RSS {s['rss_mib']['growth_pct']:+.1f} % after warm-up, "
        f"slope {s['rss_mib']['slope_mib_per_h']} MiB/h"
    )
    ax = axes[1]
    ax.plot(t_min, [x["fds"] for x in samples], label="open fds")
    ax.plot(t_min, [x["fd_socket"] for x in samples], label="of which sockets", alpha=0.6)
    ax.plot(t_min, [x["threads"] for x in samples], label="threads")
    ax.plot(t_min, [x.get("event_loop_tasks") or 0 for x in samples], label="event-loop tasks", alpha=0.6)
    ax.set_ylabel("count")
    ax = axes[2]
    ax.plot(
        t_min,
        [(x.get("spool_pending_bytes_max") or 0) / MIB for x in samples],
        label="spool pending (max of the 1 s polls since the previous sample)",
    )
    ax.set_ylabel("MiB")
    ax.set_xlabel("minutes since Locust started")
    o = run.opts
    for ax in axes:
        ax.axvline(o.warmup_s / 60, color="grey", linestyle="--", linewidth=1)
        ax.axvspan(o.warmup_s / 60, (o.warmup_s + o.window_s) / 60, color="grey", alpha=0.1)
        end = t_min[-1] if t_min else 0
        ax.axvspan(end - o.window_s / 60, end, color="grey", alpha=0.1)
        ax.legend(loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def report(s: dict[str, Any]) -> str:
    r, f, th, sp = s["rss_mib"], s["fds"], s["threads"], s["spool"]
    tk = s["event_loop_tasks"]
    i0, i1 = s["idle"]["before"], s["idle"]["after"]
    loc = s["locust"]
    ledger = s["checks"]["ledger"]
    lines = [
        f"## Soak {'(quick) ' if s['quick'] else ''}{'OK' if s['ok'] else 'TARGETS MISSED'}",
        "",
        f"- command: `{s['command']}` ({s['started_utc']}, {s['machine']})",
        f"- niceness {s['nice']}; mean load average {s['loadavg1_mean']}",
        f"- {s['duration_s']:.0f} s, warm-up {s['warmup_s']:.0f} s, windows {s['window_s']:.0f} s, "
        f"{s['samples']} samples every {s['interval_s']:g} s",
        f"- workload: {s['workload']['description']}",
        "",
        "| target | value | limit | |",
        "|---|---|---|---|",
        *(
            f"| {k} | {v['value']} | {v['limit']} | {'ok' if v['ok'] else 'MISSED'} |"
            for k, v in s["targets"].items()
        ),
        "",
        f"Requests: {loc['requests_total']} (failures {loc['failures_total']}); deliberate errors sent "
        f"{s['deliberate_errors']['sent']}, not as expected: {len(s['deliberate_errors']['unexpected'])}",
        "",
        "| request | count | failures | median ms | p99 ms | req/s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {k} | {v['requests']} | {v['failures']} | {v['median_ms']:g} | {v['p99_ms']} | {v['rps']} |"
            for k, v in sorted(loc["by_type"].items())
        ),
        "",
        f"Bursts: {loc['bursts']['count']} ({loc['bursts']['open_at_stop']} open at stop, "
        f"{loc['bursts']['failed_writers']} failed writers), median {loc['bursts']['duration_s_median']} s, "
        f"max {loc['bursts']['duration_s_max']} s",
        "",
        "| | warm-up end | warm-up window median | end window median | at end | max after warm-up | growth |",
        "|---|---|---|---|---|---|---|",
        f"| RSS MiB | {r['at_warmup_end']} | {r['warmup_window_median']} | {r['end_window_median']} | "
        f"{r['at_end']} | {r['max_after_warmup']} | {r['growth_pct']:+.2f} % "
        f"(max {r['max_growth_pct']:+.2f} %), slope {r['slope_mib_per_h']} MiB/h |",
        f"| fds | {f['at_warmup_end']:g} | {f['warmup_median']:g} | {f['end_median']:g} | {f['at_end']:g} | "
        f"{f['max_after_warmup']:g} | {f['growth']:+g} (slope {f['slope_per_h']}/h) |",
        f"| threads | {th['at_warmup_end']:g} | {th['warmup_median']:g} | {th['end_median']:g} | "
        f"{th['at_end']:g} | {th['max_after_warmup']:g} | {th['growth']:+g} |",
        f"| event-loop tasks | {tk['at_warmup_end']:g} | {tk['warmup_median']:g} | {tk['end_median']:g} | "
        f"{tk['at_end']:g} | {tk['max_after_warmup']:g} | {tk['growth']:+g} |",
        "",
        f"Spool: pending at the end of the load {sp['pending_bytes_at_end_of_load']} bytes "
        f"({sp['pending_objects_at_end_of_load']} objects), max {sp['pending_bytes_max']} bytes, oldest "
        f"pending age max {sp['oldest_pending_age_s_max']} s, "
        f"drain in flight max {sp['drain_in_flight_max']}, "
        f"journal max {sp['journal_bytes_max']} bytes; after the flush {sp['after_flush']}",
        f"Durability: flush {s['checks']['flush']}; ledger {ledger['on_backend_byte_exact']}/"
        f"{ledger['acknowledged']} byte-exact ({ledger['checked_bytes']} bytes), "
        f"open uploads aborted at the end: {len(s['checks']['open_uploads_aborted'])}",
        f"Gateway: {s['gateway_cpu_s']} CPU s ({s['gateway_cpu_pct_of_one_core']} % of a core); log "
        f"{s['gateway_log']['tracebacks']} tracebacks, {s['gateway_log']['error_lines']} ERROR lines, "
        f"{s['gateway_log']['warning_lines']} WARNING lines; exit {s['gateway_exit']}",
        f"Idle, before the load / {s['idle']['wait_s']:g} s after the flush: fds {i0['fds']} / {i1['fds']} "
        f"(sockets {i0['fd_socket']} / {i1['fd_socket']}), threads {i0['threads']} / {i1['threads']}, "
        f"event-loop tasks {i0['event_loop_tasks']} / {i1['event_loop_tasks']}, "
        f"RSS {i0['rss_kib'] / KIB:.1f} / {i1['rss_kib'] / KIB:.1f} MiB; non-socket fds open at the end "
        f"that were not at the start: {s['idle']['non_socket_fds_not_there_before'] or 'none'}",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# main


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_soak(run: Run) -> None:
    weed = seaweed(run.tmp / "seaweedfs", "soak", ACCESS_KEY, SECRET_KEY, (BUCKET,))
    gw: Gateway | None = None
    try:
        run.log(f"state in {run.tmp}; starting SeaweedFS")
        weed.start()
        gw = start_gateway(run.tmp, weed.endpoint_url)
        run.gateway_cfg = gw.config_text
        run.nice |= {"soak": os.getpriority(os.PRIO_PROCESS, 0), "gateway": proc_nice(gw.pid)}
        run.nice["seaweedfs"] = proc_nice(weed.pid) if weed.pid else None
        run.log(f"gateway pid {gw.pid} at {gw.url}, spool {gw.spool_dir}")
        run.t0 = time.monotonic()
        run.before.append(take_sample(gw, 0.0, "idle_before", weed.pid, None))
        prep_dataset(run, gw)
        run_load(run, gw, weed)
        finish(run, gw, weed)
    finally:
        if gw is not None:
            run.gateway_exit = stop_process(gw.popen)
            shutil.copy(gw.log, run.out / "gateway.log")
        weed.stop()


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed soak still tears down
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="s3lanes-soak-", dir=opts.tmp_dir))
    run = Run(opts, opts.out_dir, tmp)
    facts = machine_facts()
    run.facts["machine"] = ", ".join(f"{k}: {v}" for k, v in facts.items())
    run.facts["started_utc"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    try:
        run_soak(run)
    except KeyboardInterrupt:
        run.log("interrupted; tore down")
        return 130
    except SoakError as exc:
        run.log(f"the soak broke: {exc}")
        write_samples(opts.out_dir / "samples.csv", run.before + run.samples + run.after)
        return 2
    finally:
        if not opts.keep_state:
            shutil.rmtree(tmp, ignore_errors=True)
    write_samples(opts.out_dir / "samples.csv", run.before + run.samples + run.after)
    s = summarise(run)
    s["plot"] = str(opts.out_dir / "soak.png") if plot(run, s, opts.out_dir / "soak.png") else None
    s["gateway_config"] = run.gateway_cfg
    s["locust_command"] = run.facts.get("locust_command")
    (opts.out_dir / "summary.json").write_text(json.dumps(s, indent=2, default=str) + "\n")
    text = report(s)
    (opts.out_dir / "summary.md").write_text(text + "\n")
    print(text)
    print(f"\n(results in {opts.out_dir})", file=sys.stderr)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
