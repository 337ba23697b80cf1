"""The weed process: start (with readiness probes), supervise (:meth:`SeaweedProcess.wait_exit`), stop.

See :mod:`s3lanes.seaweed` for the theory of operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from s3lanes.durable import replace_file
from s3lanes.seaweed.command import (
    SeaweedPorts,
    bucket_head_headers,
    build_command,
    choose_ports,
    endpoint_url,
    find_weed_binary,
    has_volume_server,
    weed_environment,
)
from s3lanes.seaweed.options import SeaweedError, SeaweedOptions, SeaweedStartError, s3_config

log = logging.getLogger("s3lanes.seaweed")

PROBE_TIMEOUT_S = 2.0  # one readiness probe; weed on loopback answers in milliseconds once up
POLL_INTERVAL_S = 0.1  # between readiness rounds; start-up takes about 1 s, so 0.1 s costs nothing
KILL_WAIT_S = 5.0  # after SIGKILL the kernel reaps at once; this only guards against a stuck D-state
LOG_TAIL_LINES = 40
LOG_TAIL_READ_BYTES = 256 * 1024
PORT_ATTEMPTS = 2  # the brief window between choosing ports and weed binding them can be lost once
# Printed by weed when a port it was told to use is taken (4.48: "Port allocation failed: port N for S3
# (specified by flag s3.port) is not available"); older releases die with the Go error text.
_PORT_COLLISION_RE = re.compile(r"Port allocation failed|address already in use", re.I)
# glog's E/F prefixes (E1202 17:23:51.002931 ...), Go's flag package and panics.
_ERROR_LINE_RE = re.compile(r"^[EF]\d{4} |flag provided but not defined|invalid value|panic:|fatal", re.I)
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


class _PortCollision(SeaweedStartError):
    """weed exited because one of its ports was taken between our choice and its bind."""


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
            except BaseException as exc:
                self._after_failed_attempt(exc, attempt)

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
            except BaseException as exc:
                self._after_failed_attempt(exc, attempt)

    def _after_failed_attempt(self, exc: BaseException, attempt: int) -> None:
        """Kill weed after a failed start attempt; return (to retry with fresh ports) only when it lost a
        port race and attempts are left, else re-raise ``exc``."""
        self._kill_now()
        if not isinstance(exc, _PortCollision) or attempt == PORT_ATTEMPTS:
            raise exc
        log.warning("weed lost a port race, retrying with fresh ports: %s", exc.log_tail[-300:])

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
            if status != 200 or not has_volume_server(body):
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
