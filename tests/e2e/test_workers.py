"""``[server] workers = 2``: a supervisor and two worker processes on one listening socket, in front of the
session's SeaweedFS. Each worker is made the only one accepting (the other stopped with SIGSTOP: a stopped
process takes no connection from the shared accept queue), so the tests know which worker served what."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import psutil
import pytest
from botocore.config import Config as BotoConfig
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Gateway, start_gateway, stop_gateway
from tests.e2e.relay import CountingRelay
from tests.e2e.test_cluster import RedisServer

pytestmark = pytest.mark.timeout(240)

BANDWIDTH_BPS = 40_000_000
OBJECT_BYTES = 4 * 1024 * 1024


def _toml(tmp: Path, seaweed: Any, tls: tuple[Path, Path, Path] | None = None) -> str:
    admin = seaweed.admin
    https = ""
    if tls is not None:
        https = f'https_listen = "127.0.0.1:0"\ntls_cert = "{tls[1]}"\ntls_key = "{tls[2]}"'
    return f"""
[server]
listen = "127.0.0.1:0"
{https}
state_dir = "{tmp / "state"}"
workers = 2
shutdown_grace_s = 5

[backend]
endpoint = "{seaweed.endpoint_url}"
bandwidth = "1GB/s"

[spool]
enabled = false

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""


@pytest.fixture
def workers_gateway(
    tmp_path: Path, seaweed: Any, tls_ca: tuple[Path, Path, Path]
) -> Iterator[tuple[Any, Gateway, dict[str, Any]]]:
    proc, ready, log_path = start_gateway(tmp_path, _toml(tmp_path, seaweed, tls_ca))
    admin = seaweed.admin
    gw = Gateway(
        http_url=ready["endpoints"][0],
        https_url=ready["endpoints"][1],
        ca_bundle=str(tls_ca[0]),
        access_key=admin.access_key,
        secret_key=admin.secret_key,
        user2_access_key="",
        user2_secret_key="",
        backend_url=seaweed.endpoint_url,
        pid=proc.pid,
        log_path=log_path,
    )
    try:
        yield proc, gw, ready
    finally:
        for pid in ready["workers"]:  # never leave a worker stopped
            if psutil.pid_exists(pid):
                psutil.Process(pid).send_signal(signal.SIGCONT)
        stop_gateway(proc)


def _only(accepting: int, others: list[int]) -> None:
    for pid in others:
        psutil.Process(pid).send_signal(signal.SIGSTOP)
    psutil.Process(accepting).send_signal(signal.SIGCONT)


def _status(gw: Gateway) -> dict[str, Any]:
    with urllib.request.urlopen(f"{gw.http_url}/_s3lanes/status", timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def test_two_workers_serve_one_port_and_share_the_lane_budget(workers_gateway: Any) -> None:
    proc, gw, ready = workers_gateway
    w0, w1 = ready["workers"]
    assert {p.pid for p in psutil.Process(proc.pid).children()} >= {w0, w1}
    bucket = "workers-ryw"
    gw.client().create_bucket(Bucket=bucket)
    _only(w0, [w1])
    gw.client().put_object(Bucket=bucket, Key="a/b", Body=b"written through worker 0")
    _only(w1, [w0])
    c1 = gw.client()  # a new client: its connections are accepted by worker 1
    assert c1.get_object(Bucket=bucket, Key="a/b")["Body"].read() == b"written through worker 0"
    assert [o["Key"] for o in c1.list_objects_v2(Bucket=bucket)["Contents"]] == ["a/b"]
    assert gw.client(https=True).get_object(Bucket=bucket, Key="a/b")["Body"].read().startswith(b"written")
    # Both workers are members of the node's budget: each sees the other's report on the board.
    deadline = time.monotonic() + 30
    while True:
        nodes = [n["node_id"] for n in _status(gw)["cluster"]["nodes"]]
        if len(nodes) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(n.rsplit(".", 1)[1] for n in nodes) == ["w0", "w1"], nodes
    assert _status(gw)["worker"] == {"index": 1, "count": 2, "pid": w1}  # worker 0 is stopped
    # One /metrics for the node: whichever worker answers, both workers' samples, labelled.
    psutil.Process(w0).send_signal(signal.SIGCONT)
    for accepting, other in ((w0, w1), (w1, w0)):
        _only(accepting, [other])
        with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        psutil.Process(other).send_signal(signal.SIGCONT)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["s3lanes_workers_scraped"].samples[0].value == 1  # the stopped one cannot answer
        with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["s3lanes_workers"].samples[0].value == 2
        assert families["s3lanes_workers_scraped"].samples[0].value == 2
        workers = {s.labels.get("worker") for f in families.values() for s in f.samples}
        assert {"0", "1"} <= workers


def test_a_killed_worker_is_replaced_and_sigterm_stops_them_all(workers_gateway: Any) -> None:
    proc, gw, ready = workers_gateway
    w0, w1 = ready["workers"]
    bucket = "workers-crash"
    gw.client().create_bucket(Bucket=bucket)
    psutil.Process(w0).kill()
    c = gw.client()  # worker 1 serves meanwhile
    for i in range(5):
        c.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x" * 1000)
    deadline = time.monotonic() + 60
    while True:
        children = {p.pid for p in psutil.Process(proc.pid).children()} - {w0, w1}
        if children or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(children) == 1, "the supervisor did not start a new worker 0"
    (new,) = children
    ready_new = time.monotonic() + 60
    while f"worker 0 (pid {new}) serves" not in gw.log_path.read_text() and time.monotonic() < ready_new:
        time.sleep(0.2)
    _only(new, [w1])
    assert gw.client().get_object(Bucket=bucket, Key="k4")["Body"].read() == b"x" * 1000
    psutil.Process(w1).send_signal(signal.SIGCONT)
    assert stop_gateway(proc) == 0
    for pid in (new, w1):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    text = gw.log_path.read_text()
    assert f"worker 0 (pid {w0}) exited with status -9; restarting it" in text
    assert "Traceback" not in text, text[-4000:]


def _loop(stop: threading.Event, errors: list[BaseException], fn: Any) -> None:
    try:
        while not stop.is_set():
            fn()
    except BaseException as exc:
        errors.append(exc)


def _shaped_gateway(
    tmp_path: Path, seaweed: Any
) -> tuple[CountingRelay, subprocess.Popen[bytes], dict[str, Any], Path]:
    """Two workers paced at BANDWIDTH_BPS in front of a byte-counting relay to the store."""
    parts = urlsplit(seaweed.endpoint_url)
    relay = CountingRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    toml = _toml(tmp_path, seaweed).replace(seaweed.endpoint_url, f"http://127.0.0.1:{relay.port}")
    toml = toml.replace('bandwidth = "1GB/s"', f'bandwidth = "{BANDWIDTH_BPS}"')
    toml += "\n[scheduler]\nlatency_target_ms = 2000\n"  # CPU contention is not store latency (test_lanes.py)
    proc, ready, log_path = start_gateway(tmp_path, toml)
    return relay, proc, ready, log_path


def _client(url: str, seaweed: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=seaweed.admin.access_key,
        aws_secret_access_key=seaweed.admin.secret_key,
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, read_timeout=60),
    )


def test_the_write_cap_holds_for_the_node_not_per_worker(tmp_path: Path, seaweed: Any) -> None:
    """Readers and writers on both workers, behind a byte-counting relay: the checkpoint lanes of the two
    workers together keep to 30 % of the store's bandwidth while reads are active (each worker alone would
    allow itself 30 %: 60 % in all), and the two together to the store's bandwidth, 70/30."""
    relay, proc, ready, log_path = _shaped_gateway(tmp_path, seaweed)
    w = ready["workers"]
    url = ready["endpoints"][0]
    bucket = "workers-cap"

    def client() -> Any:
        return _client(url, seaweed)

    stop_reads, stop_writes = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    try:
        payload = os.urandom(OBJECT_BYTES)
        setup = client()
        setup.create_bucket(Bucket=bucket)
        for i in range(2):
            setup.put_object(Bucket=bucket, Key=f"data/{i}", Body=payload)
        for k in range(2):  # each worker gets 2 readers and 4 writers, connected while it alone accepts
            _only(w[k], [w[1 - k]])
            for i in range(2):
                s3 = client()
                s3.head_object(Bucket=bucket, Key=f"data/{i}")  # opens the connection on worker k

                def read(s3: Any = s3, i: int = i) -> None:
                    s3.get_object(Bucket=bucket, Key=f"data/{i}")["Body"].read()

                threads.append(threading.Thread(target=_loop, args=(stop_reads, errors, read)))
            for j in range(4):
                s3 = client()
                s3.head_bucket(Bucket=bucket)
                n = iter(range(10**6))

                def write(s3: Any = s3, j: int = j, k: int = k, n: Any = n) -> None:
                    s3.put_object(Bucket=bucket, Key=f"ckpt/w{k}/{j}-{next(n)}", Body=payload)

                threads.append(threading.Thread(target=_loop, args=(stop_writes, errors, write)))
        psutil.Process(w[0]).send_signal(signal.SIGCONT)
        for t in threads:
            t.start()
        time.sleep(4.0)  # reads become active, the workers' reports meet on the board, caps apply
        since = time.monotonic()
        time.sleep(6.0)
        until = time.monotonic()
    finally:
        for pid in w:
            psutil.Process(pid).send_signal(signal.SIGCONT)
        stop_reads.set()
        stop_writes.set()
        for t in threads:
            t.join(60)
        code = stop_gateway(proc)
        relay.stop()
    assert not errors, errors
    windows = relay.windows(since, until)
    up = sum(u for u, _d in windows) / (len(windows) * relay.window_s)
    down = sum(d for _u, d in windows) / (len(windows) * relay.window_s)
    report = f"writes {up / 1e6:.1f} MB/s, reads {down / 1e6:.1f} MB/s, windows {windows}"
    assert down > 0.2 * BANDWIDTH_BPS, report  # reads were active throughout
    assert 0.1 * BANDWIDTH_BPS < up <= 0.30 * BANDWIDTH_BPS * 1.15, report
    # The node's bandwidth holds for both workers together (each paces to its part of it, split by
    # demand), and so does the 70/30 split: each worker alone would allow itself the whole 40 MB/s. Per
    # window, medians: a window in which the board's split was still settling (a loaded machine delays
    # the reports) does not decide it.
    total = statistics.median((u + d) / relay.window_s for u, d in windows)
    share = statistics.median(d / (u + d) for u, d in windows if u + d > 0)
    assert total <= 1.1 * BANDWIDTH_BPS, report
    # Writes are paced at their cap less its headroom ([scheduler] cap_headroom, 0.1: 27 % of the link), so
    # reads carry about 73 %; without a node-wide split they carry 80 % or more of far more bytes.
    assert 0.65 <= share <= 0.79, report
    assert code == 0
    assert "Traceback" not in log_path.read_text()


READERS = 6
WRITERS = 12  # enough that their queue makes worker 1's demand as large as worker 0's


def test_readers_on_one_worker_and_writers_on_the_other_keep_70_30_for_the_node(
    tmp_path: Path, seaweed: Any
) -> None:
    """All the readers' connections on worker 0, all the writers' on worker 1, behind a byte-counting relay.
    The node's bandwidth is split per lane (core.node_lanes), so the reads keep their 70 % of the node while
    the writes stay under 30 %, and the two together within the node's bandwidth. Once the readers stop,
    the writes take the link."""
    relay, proc, ready, log_path = _shaped_gateway(tmp_path, seaweed)
    w = ready["workers"]
    url = ready["endpoints"][0]
    bucket = "workers-split"

    def client() -> Any:
        return _client(url, seaweed)

    stop_reads, stop_writes = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    readers: list[threading.Thread] = []
    writers: list[threading.Thread] = []
    served_by: dict[str, int] = {}
    try:
        payload = os.urandom(OBJECT_BYTES)
        setup = client()
        setup.create_bucket(Bucket=bucket)
        for i in range(READERS):
            setup.put_object(Bucket=bucket, Key=f"data/{i}", Body=payload)
        _only(w[0], [w[1]])  # the readers' connections: worker 0
        for i in range(READERS):
            s3 = client()
            s3.head_object(Bucket=bucket, Key=f"data/{i}")

            def read(s3: Any = s3, i: int = i) -> None:
                s3.get_object(Bucket=bucket, Key=f"data/{i}")["Body"].read()

            readers.append(threading.Thread(target=_loop, args=(stop_reads, errors, read)))
        served_by["readers"] = _status_index(url)
        _only(w[1], [w[0]])  # the writers' connections: worker 1
        for j in range(WRITERS):
            s3 = client()
            s3.head_bucket(Bucket=bucket)
            n = iter(range(10**6))

            def write(s3: Any = s3, j: int = j, n: Any = n) -> None:
                s3.put_object(Bucket=bucket, Key=f"ckpt/{j}-{next(n)}", Body=payload)

            writers.append(threading.Thread(target=_loop, args=(stop_writes, errors, write)))
        served_by["writers"] = _status_index(url)
        psutil.Process(w[0]).send_signal(signal.SIGCONT)
        for t in readers + writers:
            t.start()
        time.sleep(4.0)  # reads become active, the workers' reports meet on the board, the split applies
        both = (time.monotonic(), time.monotonic() + 6.0)
        time.sleep(6.0)
        stop_reads.set()
        for t in readers:
            t.join(60)
        time.sleep(4.0)  # the reads' hysteresis (read_idle_s, 2 s) passes, the next rounds lift the cap
        alone = (time.monotonic(), time.monotonic() + 4.0)
        time.sleep(4.0)
    finally:
        for pid in w:
            psutil.Process(pid).send_signal(signal.SIGCONT)
        stop_reads.set()
        stop_writes.set()
        for t in readers + writers:
            t.join(60)
        code = stop_gateway(proc)
        relay.stop()
    assert not errors, errors
    assert served_by == {"readers": 0, "writers": 1}
    windows = relay.windows(*both)
    up = sum(u for u, _d in windows) / (len(windows) * relay.window_s)
    down = sum(d for _u, d in windows) / (len(windows) * relay.window_s)
    report = f"writes {up / 1e6:.1f} MB/s, reads {down / 1e6:.1f} MB/s, windows {windows}"
    assert up > 0.1 * BANDWIDTH_BPS, report  # the writes are not starved
    assert up <= 0.30 * BANDWIDTH_BPS * 1.15, report
    assert down / (up + down) >= 0.68, report  # the reads' share of the node, on the wire
    assert (up + down) <= 1.1 * BANDWIDTH_BPS, report
    windows = relay.windows(*alone)
    up_alone = sum(u for u, _d in windows) / (len(windows) * relay.window_s)
    report = f"writes alone {up_alone / 1e6:.1f} MB/s, windows {windows}; before: {report}"
    # Well beyond their cap: the writes take the link (what 12 writers in the test process can send on a
    # loaded machine; their worker's part is 97.5 % of the link by then).
    assert up_alone >= 0.4 * BANDWIDTH_BPS, report
    assert code == 0
    assert "Traceback" not in log_path.read_text()


def _status_index(url: str) -> int:
    """The index of the worker that answers a new connection (the only one accepting)."""
    with urllib.request.urlopen(f"{url}/_s3lanes/status", timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return int(doc["worker"]["index"])


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_two_workers_beside_a_clusters_redis_split_the_node_on_their_board(
    tmp_path: Path, seaweed: Any, redis: RedisServer
) -> None:
    """With ``[cluster] redis_url`` the workers are members of the cluster's write budget on Redis and keep
    their file board for the node's split."""
    toml = _toml(tmp_path, seaweed) + (
        f'\n[cluster]\nredis_url = "{redis.url}"\nname = "wr"\nnode_id = "n"\ninterval_s = 0.5\n'
    )
    proc, ready, _ = start_gateway(tmp_path, toml)
    try:
        url = ready["endpoints"][0]
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{url}/_s3lanes/status", timeout=30) as resp:
                cluster = json.loads(resp.read())["cluster"]
            nodes = sorted(n["node_id"] for n in cluster["nodes"])
            split = cluster["node_lanes"] is not None and len(nodes) == 2
            if (cluster["redis_up"] and split and cluster["node_rules_mode"] == "node") or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.5)
        assert cluster["redis_up"], cluster
        assert nodes == ["n.w0", "n.w1"], cluster  # the Redis members
        assert cluster["node_rules_mode"] == "node", cluster  # the node's split, on the file board
        assert 0.0 < cluster["capacity_share"] < 1.0, cluster
        assert cluster["node_board_errors_total"] == 0
        assert sorted(os.listdir(tmp_path / "state" / "workers-board")) == ["n.w0", "n.w1"]
    finally:
        stop_gateway(proc)
