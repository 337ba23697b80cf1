"""``[server] workers = 2`` with the spool on: worker 0 owns the spool and its drain, worker 1 forwards what
may touch the spool to it (s3lanes.http.forward) and reads locally what the spool holds nothing of. A
connection is pinned to a worker by stopping the other one (SIGSTOP) until a first answer has come back on it,
as in test_workers.py; the other is then resumed, since worker 1 needs worker 0 to answer what it forwards."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import boto3
import psutil
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024


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
enabled = true

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""


@pytest.fixture
def spool_workers(tmp_path: Path, seaweed: Any) -> Iterator[tuple[Any, Gateway, list[int]]]:
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
        yield proc, gw, list(ready["workers"])
    finally:
        for pid in ready["workers"]:
            if psutil.pid_exists(pid):
                psutil.Process(pid).send_signal(signal.SIGCONT)
        stop_gateway(proc)


def _pin(workers: list[int], accepting: int) -> None:
    for pid in workers:
        if pid != accepting:
            psutil.Process(pid).send_signal(signal.SIGSTOP)
    psutil.Process(accepting).send_signal(signal.SIGCONT)


def _resume(workers: list[int]) -> None:
    for pid in workers:
        psutil.Process(pid).send_signal(signal.SIGCONT)


def _client_on(gw: Gateway, workers: list[int], accepting: int) -> Any:
    """A boto3 client whose (one, kept-alive) connection was accepted by the worker ``accepting``."""
    _pin(workers, accepting)
    c = gw.client()
    c.list_buckets()  # answered locally by any worker: opens the connection
    _resume(workers)
    return c


def _http_on(gw: Gateway, workers: list[int], accepting: int) -> http.client.HTTPConnection:
    _pin(workers, accepting)
    parts = urlsplit(gw.http_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    conn.request("GET", "/_s3lanes/healthz")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200
    _resume(workers)
    return conn


def _post(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path)
    resp = conn.getresponse()
    doc: dict[str, Any] = json.loads(resp.read())
    return resp.status, doc


def _owner_gets(conn: http.client.HTTPConnection) -> float:
    """GetObject requests worker 0 has answered (the node's /metrics, labelled by worker)."""
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "s3lanes_requests_total"
        and s.labels.get("worker") == "0"
        and s.labels.get("operation") == "GetObject"
    )


def _store(seaweed: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=seaweed.endpoint_url,
        aws_access_key_id=seaweed.admin.access_key,
        aws_secret_access_key=seaweed.admin.secret_key,
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _source(resp: Any) -> str:
    return str(resp["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source", "backend"))


def _on_store(store: Any, bucket: str, key: str) -> bool:
    try:
        store.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("404", "NoSuchKey"), exc.response
        return False
    return True


def test_writes_through_either_worker_are_read_through_the_other_before_the_drain(
    spool_workers: Any, seaweed: Any
) -> None:
    proc, gw, workers = spool_workers
    w0, w1 = workers
    bucket = "spool-workers-ryw"
    store = _store(seaweed)
    gw.client().create_bucket(Bucket=bucket)
    on0, on1 = _client_on(gw, workers, w0), _client_on(gw, workers, w1)
    admin1 = _http_on(gw, workers, w1)
    assert _post(admin1, "/_s3lanes/drain?pause=1") == (200, {"paused": True})  # forwarded to worker 0
    a, b = os.urandom(MiB), os.urandom(2 * MiB)
    assert _source(on1.put_object(Bucket=bucket, Key="ckpt/a", Body=a)) == "spool"  # worker 1 has no spool
    assert _source(on0.put_object(Bucket=bucket, Key="ckpt/b", Body=b)) == "spool"
    # A multipart upload begun on one worker, continued and completed on the other.
    up = on1.create_multipart_upload(Bucket=bucket, Key="ckpt/mp")["UploadId"]
    part1, part2 = os.urandom(5 * MiB), os.urandom(1024)
    e1 = on0.upload_part(Bucket=bucket, Key="ckpt/mp", UploadId=up, PartNumber=1, Body=part1)["ETag"]
    e2 = on1.upload_part(Bucket=bucket, Key="ckpt/mp", UploadId=up, PartNumber=2, Body=part2)["ETag"]
    listed = on1.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in listed] == [up]
    parts = on0.list_parts(Bucket=bucket, Key="ckpt/mp", UploadId=up)["Parts"]
    assert [p["PartNumber"] for p in parts] == [1, 2]
    on0.complete_multipart_upload(
        Bucket=bucket,
        Key="ckpt/mp",
        UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    for key in ("ckpt/a", "ckpt/b", "ckpt/mp"):
        assert not _on_store(store, bucket, key), key  # the drain is paused: only the spool has them
    # One status: worker 1 shows the spool worker 0 holds.
    admin1.request("GET", "/_s3lanes/status")
    status = json.loads(admin1.getresponse().read())
    assert status["worker"]["index"] == 1
    assert status["spool"]["owner_worker"] == 0 and status["spool"]["pending_objects"] == 3, status["spool"]
    for c in (on0, on1):
        assert c.get_object(Bucket=bucket, Key="ckpt/a")["Body"].read() == a
        assert c.get_object(Bucket=bucket, Key="ckpt/b")["Body"].read() == b
        assert c.get_object(Bucket=bucket, Key="ckpt/mp")["Body"].read() == part1 + part2
        assert c.head_object(Bucket=bucket, Key="ckpt/b")["ContentLength"] == 2 * MiB
        keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]]
        assert keys == ["ckpt/a", "ckpt/b", "ckpt/mp"]
    # The internal header means nothing on a TCP listener: a client cannot choose its request id with it.
    forged = _client_on(gw, workers, w0)  # the owner: it would trust the header on its unix socket

    def forge(request: Any, **_: Any) -> None:
        request.headers["x-s3lanes-forwarded"] = "rid=FORGED0001;peer=127.0.0.1"

    forged.meta.events.register("before-send.s3.GetObject", forge)  # unsigned, as a forger would
    got = forged.get_object(Bucket=bucket, Key="ckpt/b")
    assert got["Body"].read() == b
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"] != "FORGED0001"
    # A delete through worker 1 wins over the spooled write, on both workers.
    on1.delete_object(Bucket=bucket, Key="ckpt/a")
    for c in (on0, on1):
        with pytest.raises(ClientError) as info:
            c.get_object(Bucket=bucket, Key="ckpt/a")
        assert info.value.response["Error"]["Code"] == "NoSuchKey"
    # A flush through worker 1 waits for the drain (resumed) to put everything on the store.
    assert _post(admin1, "/_s3lanes/drain?resume=1") == (200, {"paused": False})
    query = urlencode({"bucket": bucket, "prefix": "", "timeout": "120"})
    status, doc = _post(admin1, f"/_s3lanes/flush?{query}")
    assert status == 200 and doc["durable"], doc
    assert store.get_object(Bucket=bucket, Key="ckpt/b")["Body"].read() == b
    assert store.get_object(Bucket=bucket, Key="ckpt/mp")["Body"].read() == part1 + part2
    assert not _on_store(store, bucket, "ckpt/a")
    # Drained: worker 1 reads the bucket from the store itself again, with no round trip to worker 0 (the
    # summary clears within its refresh), which then counts none of worker 1's GETs of it.
    on1 = _client_on(gw, workers, w1)  # a new connection surely on worker 1
    deadline = time.monotonic() + 10
    local = 0  # GETs in a row worker 0 did not see
    while local < 3 and time.monotonic() < deadline:
        before = _owner_gets(admin1)
        assert on1.get_object(Bucket=bucket, Key="ckpt/b")["Body"].read() == b
        local = local + 1 if _owner_gets(admin1) == before else 0
        time.sleep(0.2)
    assert local == 3, "worker 1 still sends reads of the drained bucket to worker 0"
    before = _owner_gets(admin1)
    for _ in range(5):  # bodies read: the connection stays on worker 1
        assert on1.get_object(Bucket=bucket, Key="ckpt/b")["Body"].read() == b
    assert _owner_gets(admin1) == before
    # While the spool holds something of the bucket, worker 1's reads go to worker 0.
    assert _post(admin1, "/_s3lanes/drain?pause=1") == (200, {"paused": True})
    on0.put_object(Bucket=bucket, Key="ckpt/c", Body=b"c")
    assert on1.get_object(Bucket=bucket, Key="ckpt/b")["Body"].read() == b
    assert _owner_gets(admin1) == before + 1
    assert _post(admin1, "/_s3lanes/drain?resume=1") == (200, {"paused": False})
    admin1.close()
    assert stop_gateway(proc) == 0
    assert "Traceback" not in gw.log_path.read_text()


def test_a_killed_spool_owner_is_restarted_and_recovery_drains_what_it_acknowledged(
    spool_workers: Any, seaweed: Any
) -> None:
    proc, gw, workers = spool_workers
    w0, w1 = workers
    bucket = "spool-workers-crash"
    store = _store(seaweed)
    gw.client().create_bucket(Bucket=bucket)
    on1 = _client_on(gw, workers, w1)
    admin1 = _http_on(gw, workers, w1)
    assert _post(admin1, "/_s3lanes/drain?pause=1") == (200, {"paused": True})
    bodies = {f"ckpt/k{i}": os.urandom(300 * 1024 + i) for i in range(5)}
    for key, body in bodies.items():
        assert _source(on1.put_object(Bucket=bucket, Key=key, Body=body)) == "spool"
    psutil.Process(w0).kill()  # the owner, with everything acknowledged still in its spool only
    # Meanwhile worker 1 never answers from the store alone: the spooled key is "busy" (503) or right.
    try:
        got = on1.get_object(Bucket=bucket, Key="ckpt/k0")["Body"].read()
        assert got == bodies["ckpt/k0"]
    except ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 503, exc.response
    deadline = time.monotonic() + 60
    new = None
    while time.monotonic() < deadline:
        children = {p.pid for p in psutil.Process(proc.pid).children()} - {w0, w1}
        if children and f"worker 0 (pid {min(children)}) serves" in gw.log_path.read_text():
            new = min(children)
            break
        time.sleep(0.2)
    assert new is not None, "the supervisor did not restart worker 0"
    # Recovery replays the journal and drains (the pause did not survive the owner).
    query = urlencode({"bucket": bucket, "prefix": "", "timeout": "120"})
    status, doc = _post(admin1, f"/_s3lanes/flush?{query}")
    assert status == 200 and doc["durable"], doc
    for key, body in bodies.items():
        assert store.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key
        assert on1.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key
    admin1.close()
    assert stop_gateway(proc) == 0
    text = gw.log_path.read_text()
    assert f"worker 0 (pid {w0}) exited with status -9; restarting it" in text
