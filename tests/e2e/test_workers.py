"""``[server] workers = 2``: a supervisor and two worker processes on one listening socket, in front of the
session's SeaweedFS. Each worker is made the only one accepting (the other stopped with SIGSTOP: a stopped
process takes no connection from the shared accept queue), so the tests know which worker served what."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.timeout(240)


def _toml(tmp: Path, seaweed: Any) -> str:
    admin = seaweed.admin
    return f"""
[server]
listen = "127.0.0.1:0"
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
def workers_gateway(tmp_path: Path, seaweed: Any) -> Iterator[tuple[Any, Gateway, dict[str, Any]]]:
    proc, ready, log_path = start_gateway(tmp_path, _toml(tmp_path, seaweed))
    admin = seaweed.admin
    gw = Gateway(
        http_url=ready["endpoints"][0],
        https_url="",
        ca_bundle="",
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
    # Both workers are members of the node's budget: each sees the other's report on the board.
    deadline = time.monotonic() + 30
    while True:
        nodes = [n["node_id"] for n in _status(gw)["cluster"]["nodes"]]
        if len(nodes) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(n.rsplit(".", 1)[1] for n in nodes) == ["w0", "w1"], nodes
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


def test_more_workers_with_the_spool_on_is_a_config_error(tmp_path: Path, seaweed: Any) -> None:
    toml = _toml(tmp_path, seaweed).replace("enabled = false", "enabled = true")
    with pytest.raises(RuntimeError) as info:
        start_gateway(tmp_path, toml)
    assert "cannot share one write spool yet" in str(info.value)
