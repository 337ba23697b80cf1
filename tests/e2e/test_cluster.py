"""Many gateways, one store: three ``s3lanes serve`` sharing one checkpoint budget through a real Redis.

Each gateway has its own spool and is configured with the store's bandwidth (40 MB/s, below what SeaweedFS
does on this machine, so the caps bind). The checkpoint lane may take 30% of it while dataset reads are
active *anywhere*: the readers run on nodes 2 and 3 only, node 1 holds almost all the checkpoint data and
has no reader of its own, so without the cluster budget it would drain at the full 40 MB/s. Drain rates are
read from each gateway's own counters (``s3lanes_lane_bytes_total{lane="checkpoint",direction="up"}``) and
their sum checked on the wire by a counting relay in front of SeaweedFS that all three share.

``redis-server`` is Debian's package (apt-get install redis-server); each test starts its own on a free
loopback port in a temporary directory and stops it by pid. Missing binary: the test fails, it does not skip.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from s3lanes.clock import SystemClock
from s3lanes.config import ClusterConfig, Config
from s3lanes.core.cluster_budget import Mode
from s3lanes.core.scheduler import Scheduler
from s3lanes.runtime.cluster import ClusterMember
from s3lanes.runtime.wiring import scheduler_config
from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, start_gateway, stop_gateway
from tests.e2e.relay import CountingRelay

pytestmark = pytest.mark.e2e

BANDWIDTH_BPS = 40_000_000
CAP = 0.30
MiB = 1024 * 1024
NODE1_OBJECTS = 32  # x 8 MiB: node 1's checkpoint, more than it drains while reads are active
NODE1_OBJECT_BYTES = 8 * MiB
# Before the readers stop node 1 is topped up to this backlog: at ~37 MB/s it lasts the rest of the test.
NODE1_TOPUP_BYTES = 340_000_000
TRICKLE_BYTES = 1 * MiB  # nodes 2 and 3: one such checkpoint object per second each
READ_OBJECT_BYTES = 1 * MiB


# -- redis-server -------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` (no persistence) on a loopback port; restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: apt-get install redis-server (Debian package)")
        self.binary = binary
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        args += ["--dir", str(self.workdir), "--protected-mode", "no", "--daemonize", "no"]
        args += ["--logfile", str(self.workdir / "redis.log")]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not start:\n{log}")
            time.sleep(0.02)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crashed or unplugged Redis (no goodbye to the clients)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- the Redis board on its own (fast) ----------------------------------------------------------------------


def _member(url: str, node: str, name: str, *, timeout_s: float = 0.25) -> ClusterMember:
    clock = SystemClock()
    cfg = ClusterConfig(redis_url=url, name=name, node_id=node, interval_s=0.5, redis_timeout_s=timeout_s)
    sched = Scheduler(scheduler_config(Config(), BANDWIDTH_BPS), clock.monotonic())
    return ClusterMember(cfg, sched, clock)


async def test_redis_board_shares_reports_and_a_dead_or_silent_redis_never_blocks(
    redis_server: RedisServer,
) -> None:
    name = f"board-{secrets.token_hex(4)}"
    a, b = _member(redis_server.url, "a", name), _member(redis_server.url, "b", name)
    try:
        for _ in range(2):
            await a.step()
            await b.step()
        assert a.redis_up and b.redis_up
        assert [n["node_id"] for n in b.status()["nodes"]] == ["a", "b"]
        assert a.lease.last_view is not None and a.lease.last_view.nodes == ("a", "b")
        # Report ages are on Redis' clock: fresh, whatever this machine's wall clock says.
        assert all(0 <= n["age_s"] < 1.0 for n in b.status()["nodes"])

        redis_server.kill()
        started = time.monotonic()
        await a.step()
        assert time.monotonic() - started < 1.0
        assert not a.redis_up and a.lease.mode is Mode.SAFE and a.redis_errors == 1
    finally:
        await a.close()
        await b.close()

    # A Redis that accepts connections and never answers: the round is cut by the timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        c = _member(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", "c", name, timeout_s=0.2)
        started = time.monotonic()
        await c.step()
        assert time.monotonic() - started < 1.0
        assert not c.redis_up and c.lease.mode is Mode.SAFE
        await c.close()
    finally:
        silent.close()


async def test_redis_board_forgets_a_node_that_stops_reporting(redis_server: RedisServer) -> None:
    name = f"forget-{secrets.token_hex(4)}"
    a, b = _member(redis_server.url, "a", name), _member(redis_server.url, "b", name)
    try:
        await a.step()
        await b.step()
        await asyncio.sleep(1.6)  # b silent for longer than the TTL (3 x 0.5 s): Redis expired its key
        await a.step()
        assert a.lease.last_view is not None and a.lease.last_view.nodes == ("a",)
    finally:
        await a.close()
        await b.close()


# -- three gateways -----------------------------------------------------------------------------------------


def _gateway_toml(tmp: Path, seaweed: Any, backend: str, redis_url: str, name: str, node: str) -> str:
    admin = seaweed.admin
    return f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp / "state"}"
shutdown_grace_s = 5
drain_on_shutdown_s = 0

[backend]
endpoint = "{backend}"
bandwidth = "{BANDWIDTH_BPS}"

[scheduler]
# The read-latency guard is proven in simulation; on this 2-core machine CPU contention alone inflates
# backend TTFB and would cut the writes (tests/e2e/test_lanes.py). Here the cluster budget is under test.
latency_target_ms = 2000

[cluster]
redis_url = "{redis_url}"
name = "{name}"
node_id = "{node}"
interval_s = 0.5

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""


class Node:
    def __init__(self, proc: subprocess.Popen[bytes], gw: Gateway) -> None:
        self.proc = proc
        self.gw = gw

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.gw.http_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def drained(self) -> float:
        return self.metrics().get("s3lanes_lane_bytes_total{direction=up,lane=checkpoint}", 0.0)


def _loop(stop: threading.Event, errors: list[BaseException], fn: Callable[[], Any], pause_s: float) -> None:
    try:
        while not stop.is_set():
            fn()
            stop.wait(pause_s)
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def _wait_for(what: str, ok: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _rates(nodes: list[Node], relay: CountingRelay, seconds: float) -> tuple[list[float], float]:
    """Each node's checkpoint drain rate (its own counter) and the wire's upload rate, over ``seconds``."""
    before = [n.drained() for n in nodes]
    t0 = time.monotonic()
    time.sleep(seconds)
    after = [n.drained() for n in nodes]
    t1 = time.monotonic()
    wire = relay.windows(t0, t1)
    wire_bps = sum(up for up, _ in wire) / (len(wire) * relay.window_s) if wire else 0.0
    return [(b - a) / (t1 - t0) for a, b in zip(before, after, strict=True)], wire_bps


def _lane_view(node: Node) -> dict[str, float]:
    """What node's checkpoint lane is told and does (for failure reports)."""
    m = node.metrics()
    keys = {
        "allowance": "s3lanes_cluster_allowance_bytes_per_second{lane=checkpoint}",
        "budget": "s3lanes_cluster_budget_bytes_per_second{lane=checkpoint}",
        "limit": "s3lanes_lane_limit_bytes_per_second{lane=checkpoint}",
        "rate": "s3lanes_lane_rate_bytes_per_second{lane=checkpoint}",
        "queued": "s3lanes_lane_queue_depth{lane=checkpoint}",
        "inflight": "s3lanes_lane_inflight{lane=checkpoint}",
    }
    return {
        k: round(m.get(v, -1.0) / (1e6 if k in ("allowance", "budget", "limit", "rate") else 1), 2)
        for k, v in keys.items()
    }


def _mb(xs: list[float]) -> list[float]:
    return [round(x / 1e6, 2) for x in xs]


def test_three_gateways_keep_the_cluster_checkpoint_cap_and_use_the_whole_store_when_reads_stop(
    seaweed: Any, redis_server: RedisServer, bucket: str, tmp_path: Path
) -> None:
    parts = urlsplit(seaweed.endpoint_url)
    relay = CountingRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    name = f"e2e-{secrets.token_hex(4)}"
    nodes: list[Node] = []
    stop_reads, stop_trickle = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    report: list[str] = []
    try:
        for i in (1, 2, 3):
            tmp = tmp_path / f"n{i}"
            tmp.mkdir()
            toml = _gateway_toml(
                tmp, seaweed, f"http://127.0.0.1:{relay.port}", redis_server.url, name, f"n{i}"
            )
            proc, ready, log_path = start_gateway(tmp, toml)
            gw = Gateway(
                http_url=ready["endpoints"][0],
                https_url="",
                ca_bundle="",
                access_key=seaweed.admin.access_key,
                secret_key=seaweed.admin.secret_key,
                user2_access_key="",
                user2_secret_key="",
                backend_url=seaweed.endpoint_url,
                pid=proc.pid,
                log_path=log_path,
            )
            nodes.append(Node(proc, gw))
        n1, n2, n3 = nodes
        _wait_for(
            "three nodes in every gateway's view",
            lambda: all(n.metrics().get("s3lanes_cluster_nodes") == 3 for n in nodes),
            15,
        )

        # Readers on nodes 2 and 3 (dataset objects stored on the backend directly).
        direct = s3_client(seaweed)
        payload = os.urandom(READ_OBJECT_BYTES)
        for i in range(4):
            direct.put_object(Bucket=bucket, Key=f"data/shard-{i}", Body=payload)
        direct.close()

        def reader(node: Node, i: int) -> Callable[[], Any]:
            s3 = node.gw.client()
            return lambda: s3.get_object(Bucket=bucket, Key=f"data/shard-{i % 4}")["Body"].read()

        for i, node in enumerate((n2, n3)):
            threads.append(threading.Thread(target=_loop, args=(stop_reads, errors, reader(node, i), 0.1)))
        for t in threads:
            t.start()
        _wait_for(
            "reads active in the cluster view of every gateway",
            lambda: all(n.metrics().get("s3lanes_cluster_reads_active") == 1 for n in nodes),
            15,
        )

        # Node 1 gets the big checkpoint (into its spool, at local disk speed); nodes 2 and 3 a trickle.
        blob = os.urandom(NODE1_OBJECT_BYTES)

        def write_node1(step: int, count: int) -> None:
            def part(p: int) -> None:
                s3 = n1.gw.client()
                for k in range(p, count, 4):
                    s3.put_object(Bucket=bucket, Key=f"ckpt/step-{step}/rank0-{k:03}.pt", Body=blob)

            writers = [threading.Thread(target=part, args=(p,)) for p in range(4)]
            for t in writers:
                t.start()
            for t in writers:
                t.join(120)

        write_node1(1, NODE1_OBJECTS)
        small = os.urandom(TRICKLE_BYTES)

        def trickle(node: Node, rank: int) -> Callable[[], Any]:
            s3 = node.gw.client()
            n = iter(range(10**6))
            return lambda: s3.put_object(
                Bucket=bucket, Key=f"ckpt/step-1/rank{rank}-{next(n):04}.pt", Body=small
            )

        for rank, node in ((1, n2), (2, n3)):
            t = threading.Thread(target=_loop, args=(stop_trickle, errors, trickle(node, rank), 1.0))
            t.start()
            threads.append(t)

        # 1. Readers active: the sum of the three drains within the cluster cap, node 1 with most of it.
        time.sleep(3.0)  # rounds see node 1's backlog; buckets settle
        rates, wire = _rates(nodes, relay, 6.0)
        total = sum(rates)
        report.append(
            f"reads active: drains MB/s {_mb(rates)} sum {total / 1e6:.2f}, wire {wire / 1e6:.2f};"
            f" node 1: {_lane_view(n1)}"
        )
        assert total <= (CAP + 0.05) * BANDWIDTH_BPS, report
        assert wire <= (CAP + 0.05) * BANDWIDTH_BPS, report
        assert total >= (CAP - 0.10) * BANDWIDTH_BPS, report  # and the budget is used, not starved
        assert rates[0] >= 0.6 * total, report

        # 2. Redis dies: the gateways keep serving and draining on their safe share (B / 3 each).
        redis_server.kill()
        _wait_for(
            "redis_up 0 everywhere",
            lambda: all(n.metrics().get("s3lanes_cluster_redis_up") == 0 for n in nodes),
            5,
        )
        time.sleep(2.0)  # safe mode reaches the safe share within 4 intervals
        rates, wire = _rates(nodes, relay, 3.0)
        total = sum(rates)
        report.append(f"Redis down: drains MB/s {_mb(rates)} sum {total / 1e6:.2f}, wire {wire / 1e6:.2f}")
        assert all(n.metrics().get("s3lanes_cluster_safe_mode") == 1 for n in nodes), report
        assert rates[0] > 0.5 * CAP * BANDWIDTH_BPS / 3, report  # node 1 keeps draining at about B/N
        assert total <= (CAP + 0.05) * BANDWIDTH_BPS, report
        for node in nodes:  # still serving: a read and a spooled write through every gateway
            s3 = node.gw.client()
            s3.get_object(Bucket=bucket, Key="data/shard-0")["Body"].read()
            s3.put_object(Bucket=bucket, Key=f"ckpt/outage/{node.gw.pid}", Body=b"x" * 1000)

        # 3. Redis is back: every gateway finds it and the three views again.
        redis_server.start()
        _wait_for(
            "redis_up 1 and three nodes everywhere",
            lambda: all(
                m.get("s3lanes_cluster_redis_up") == 1 and m.get("s3lanes_cluster_nodes") == 3
                for m in (n.metrics() for n in nodes)
            ),
            10,
        )
        time.sleep(2.0)  # learning (one TTL), then normal
        rates, wire = _rates(nodes, relay, 3.0)
        report.append(
            f"Redis back: drains MB/s {_mb(rates)} sum {sum(rates) / 1e6:.2f}, wire {wire / 1e6:.2f}"
        )
        assert all(n.metrics().get("s3lanes_cluster_safe_mode") == 0 for n in nodes), report
        assert sum(rates) <= (CAP + 0.05) * BANDWIDTH_BPS, report
        assert rates[0] >= 0.6 * sum(rates), report

        # 4. Readers stop: after the read activity expires everywhere, the drains use the whole store.
        pending = n1.gw.status()["spool"]["pending_bytes"]
        write_node1(2, max(0, NODE1_TOPUP_BYTES - pending) // NODE1_OBJECT_BYTES + 1)
        stop_reads.set()
        _wait_for(
            "reads inactive in every view",
            lambda: all(n.metrics().get("s3lanes_cluster_reads_active") == 0 for n in nodes),
            10,
        )
        time.sleep(1.0)
        rates, wire = _rates(nodes, relay, 4.0)
        total = sum(rates)
        pending = n1.gw.status()["spool"]["pending_bytes"]
        report.append(
            f"reads stopped: drains MB/s {_mb(rates)} sum {total / 1e6:.2f}, wire {wire / 1e6:.2f};"
            f" node 1: {_lane_view(n1)}, {pending / 1e6:.0f} MB still pending"
        )
        assert pending > 0, report  # node 1 was backlogged throughout the window
        assert total >= 0.7 * BANDWIDTH_BPS, report
        assert wire >= 0.7 * BANDWIDTH_BPS, report
        assert not errors, errors
        print("\n".join(report))
    finally:
        stop_reads.set()
        stop_trickle.set()
        for t in threads:
            t.join(30)
        logs = []
        for node in nodes:
            code = stop_gateway(node.proc)
            text = node.gw.log_path.read_text(errors="replace")
            logs.append((code, text))
        relay.stop()
    for code, text in logs:
        assert code == 0, text[-4000:]
        assert "Traceback" not in text, text[-8000:]
