"""Several worker processes on one node: the supervisor, and the board the workers share their budget on.

Theory of operation
-------------------
One Python process runs one event loop, so one core. With ``[server] workers = N`` (N > 1) the
``s3lanes serve`` process becomes a :class:`Supervisor`: it binds the listeners itself (so a taken port fails
before anything starts), starts the embedded store if there is one, and forks N workers. Each worker runs the
ordinary gateway on the inherited listening sockets: the kernel hands every new connection to one of the
processes blocked in ``accept`` on the shared socket, so a connection lives on one worker from its first
request to its last. The supervisor runs no event loop and serves nothing; it

- waits until every worker reports it is serving (a byte on a pipe) before it writes the ready file;
- restarts a worker that exits while the node is not stopping (after ``RESTART_HOLD_S`` if the worker died
  young, so a worker that cannot start does not spin);
- on SIGTERM or SIGINT sends SIGTERM to every worker, each of which drains as a single gateway does; a
  second signal is passed on too (the workers then skip the rest of their drain); workers still alive after
  ``stop_timeout_s`` are killed. Its exit status is 0 when every worker exited 0.

Workers run in their own process group (a terminal's Ctrl-C reaches the supervisor only, which passes on
one SIGTERM) and ask the kernel for SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), so a killed
supervisor leaves no worker serving on its own.

The lane budget of the write lanes holds for the node, not per worker: each worker is a member of the
cluster budget (``s3lanes.runtime.cluster``), named ``<node_id>.w<index>``. Without ``[cluster].redis_url``
their blackboard is a :class:`FileBoard`, a directory of report files under the state directory that every
worker reads and writes; with it, the workers join the cluster's Redis like any gateway. On the file board
(with or without Redis) they also split the node's bandwidth lane by lane (``s3lanes.core.node_lanes``), so
every lane's guarantee and cap holds for the node whichever worker its connections landed on; with Redis,
each lane is paced to the tighter of the cluster's allowance and the worker's part of the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from s3lanes.clock import Clock
from s3lanes.core.metrics_merge import merge_expositions
from s3lanes.runtime.cluster import BoardRound

log = logging.getLogger("s3lanes.workers")

SIBLING_TIMEOUT_S = 2.0  # a worker that does not answer a scrape within this is left out of it
RESTART_HOLD_S = 1.0  # a worker that died within YOUNG_S of its start is restarted after this hold
YOUNG_S = 10.0
POLL_S = 0.1  # the supervisor's loop: reap, restart, pass signals on
_PR_SET_PDEATHSIG = 1


class FileBoard:
    """The cluster blackboard of the workers of one node: ``<dir>/<node id>`` holds a worker's report, its
    first line the wall-clock time it expires at. Writes are atomic (a temporary file renamed over the
    old), so a reader sees a whole report or the previous one. The files are a few hundred bytes, written
    and read twice a second, on a local directory; the exchange runs on the event loop."""

    def __init__(self, directory: Path, clock: Clock) -> None:
        self._dir = directory
        self._clock = clock
        directory.mkdir(parents=True, exist_ok=True)

    async def exchange(self, node_id: str, payload: bytes, ttl_s: float, score: float) -> BoardRound:
        now = self._clock.wall()
        path = self._dir / node_id
        old = self._read(path, now)
        tmp = self._dir / f".{node_id}.{os.getpid()}.tmp"
        tmp.write_bytes(f"{now + ttl_s!r}\n".encode() + payload)
        os.replace(tmp, path)
        live: list[bytes] = []
        for entry in sorted(os.listdir(self._dir)):
            if entry.startswith("."):
                continue
            if entry == node_id:
                live.append(payload)
                continue
            got = self._read(self._dir / entry, now)
            if got is not None:
                live.append(got)
        return BoardRound(board_now=now, payloads=live, previous=old)

    @staticmethod
    def _read(path: Path, now: float) -> bytes | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        head, _, payload = raw.partition(b"\n")
        try:
            expires = float(head)
        except ValueError:
            return None
        return payload if expires > now else None

    async def close(self) -> None:
        return None


def clear_board(directory: Path) -> None:
    """Forget the reports a previous run left (its workers are gone)."""
    if directory.is_dir():
        for entry in os.listdir(directory):
            with contextlib.suppress(FileNotFoundError):
                (directory / entry).unlink()


class NodeMetrics:
    """This worker's exposition for its siblings, and the node's (all workers') for a scrape."""

    def __init__(self, supervisor_pid: int, index: int, count: int, render: Callable[[], bytes]) -> None:
        self._supervisor = supervisor_pid
        self.index = index
        self.count = count
        self._render = render
        self._server: asyncio.AbstractServer | None = None

    def address(self, index: int) -> str:
        return f"\0s3lanes-{self._supervisor}-w{index}"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.address(self.index))
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)

    async def _serve(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self._render())
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _read(self, index: int) -> str:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.address(index))
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            return (await reader.read(-1)).decode()
        finally:
            writer.close()

    async def gather(self, own: bytes) -> bytes:
        """The node's exposition: this worker's ``own`` and its siblings', merged."""
        others = [i for i in range(self.count) if i != self.index]
        got = await asyncio.gather(
            *(asyncio.wait_for(self._read(i), SIBLING_TIMEOUT_S) for i in others), return_exceptions=True
        )
        texts = {self.index: own.decode()}
        for i, text in zip(others, got, strict=True):
            if isinstance(text, str):
                texts[i] = text
            elif not isinstance(text, (OSError, TimeoutError)):
                raise text
        tail = (
            "# HELP s3lanes_workers Worker processes of this gateway ([server] workers).\n"
            "# TYPE s3lanes_workers gauge\n"
            f"s3lanes_workers {self.count}\n"
            "# HELP s3lanes_workers_scraped Workers whose metrics are in this scrape (the others did not"
            " answer in time: restarting or stuck).\n"
            "# TYPE s3lanes_workers_scraped gauge\n"
            f"s3lanes_workers_scraped {len(texts)}\n"
        )
        return (merge_expositions(texts) + tail).encode()


@dataclass(slots=True)
class _Worker:
    pid: int
    started: float  # monotonic
    ready_fd: int | None  # read end of the worker's ready pipe until it reported


# run_worker(index, ready_fd) runs one worker in the forked child and returns its exit status; it writes a
# byte to ready_fd once it serves.
RunWorker = Callable[[int, int], int]


class Supervisor:
    """Forks and keeps ``n`` workers; see the module docstring."""

    def __init__(self, n: int, run_worker: RunWorker, *, stop_timeout_s: float) -> None:
        self.n = n
        self._run_worker = run_worker
        self._stop_timeout_s = stop_timeout_s
        self._workers: dict[int, _Worker] = {}
        self._restart_at: dict[int, float] = {}
        self._signals = 0
        self.restarts = 0

    # -- the workers ------------------------------------------------------------------------------------

    def pids(self) -> list[int]:
        return [self._workers[i].pid for i in sorted(self._workers)]

    def start(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for i in range(self.n):
            self._fork(i)

    def _fork(self, index: int) -> None:
        r, w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(r)
                for fd in [x.ready_fd for x in self._workers.values()]:
                    if fd is not None:
                        os.close(fd)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.setpgid(0, 0)
                _die_with_parent()
                if os.getppid() != parent:  # the supervisor died before the request took effect
                    return
                code = self._run_worker(index, w)
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                logging.shutdown()
                os._exit(code)
        os.close(w)
        self._workers[index] = _Worker(pid=pid, started=time.monotonic(), ready_fd=r)
        log.info("worker %d started (pid %d)", index, pid)

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every worker serves; False if one exited first, the timeout passed or a signal came."""
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = {w.ready_fd: i for i, w in self._workers.items() if w.ready_fd is not None}
            if not waiting:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self._signals:
                return False
            readable, _, _ = select.select(list(waiting), [], [], min(left, POLL_S))
            for fd in readable:
                i = waiting[fd]
                got = os.read(fd, 1)
                os.close(fd)
                self._workers[i].ready_fd = None
                if not got:  # the worker exited before serving
                    log.error("worker %d exited before it served", i)
                    return False

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Keep the workers until a signal (or ``should_stop()``); then stop them. Returns the exit status."""
        while not self._signals and not should_stop():
            self._reap(restart=True)
            now = time.monotonic()
            for i, at in list(self._restart_at.items()):
                if now >= at:
                    del self._restart_at[i]
                    self.restarts += 1
                    self._fork(i)
            self._drop_ready_reports()
            time.sleep(POLL_S)
        return self.stop()

    def stop(self) -> int:
        self._restart_at.clear()
        self._signal_all(signal.SIGTERM)
        passed_on = max(1, self._signals)
        deadline = time.monotonic() + self._stop_timeout_s
        failed = False
        while self._workers and time.monotonic() < deadline:
            failed |= self._reap(restart=False)
            if self._signals > passed_on:  # a second signal: the workers skip their drain
                passed_on = self._signals
                self._signal_all(signal.SIGTERM)
            time.sleep(POLL_S)
        if self._workers:
            log.error("workers %s did not stop within %.0f s: killed", self.pids(), self._stop_timeout_s)
            self._signal_all(signal.SIGKILL)
            while self._workers:
                self._reap(restart=False)
                time.sleep(POLL_S)
            failed = True
        return 1 if failed else 0

    def _reap(self, *, restart: bool) -> bool:
        """Collect exited workers; True if one of them failed (exit status not 0)."""
        failed = False
        for i, w in list(self._workers.items()):
            try:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = w.pid, 0
            if pid == 0:
                continue
            del self._workers[i]
            if w.ready_fd is not None:
                os.close(w.ready_fd)
            code = os.waitstatus_to_exitcode(status)
            failed |= code != 0
            if not restart:
                if code != 0:
                    log.warning("worker %d (pid %d) exited with status %d", i, w.pid, code)
                continue
            hold = RESTART_HOLD_S if time.monotonic() - w.started < YOUNG_S else 0.0
            log.error("worker %d (pid %d) exited with status %d; restarting it", i, w.pid, code)
            self._restart_at[i] = time.monotonic() + hold
        return failed

    def _drop_ready_reports(self) -> None:
        """A restarted worker's ready byte: log it and close the pipe."""
        for i, w in self._workers.items():
            if w.ready_fd is not None:
                readable, _, _ = select.select([w.ready_fd], [], [], 0)
                if readable:
                    if os.read(w.ready_fd, 1):
                        log.info("worker %d (pid %d) serves", i, w.pid)
                    os.close(w.ready_fd)
                    w.ready_fd = None

    def _signal_all(self, sig: signal.Signals) -> None:
        for w in self._workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, sig)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1


def _die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError) as exc:
        if getattr(exc, "errno", None) not in (None, errno.EINVAL, errno.ENOSYS):
            log.warning("the worker will not follow the supervisor's death: %s", exc)
