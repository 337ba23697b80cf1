"""Operations: health and readiness probes, request ids in answers and logs, JSON logs, graceful shutdown.

Graceful shutdown is the contract Kubernetes and systemd rely on: SIGTERM -> readiness 503, new checkpoint
writes go to the backend directly, the spool keeps draining until it is empty or ``drain_on_shutdown_s``
passes, then the process exits 0; whatever is left is drained after the next start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import s3raw
from tests.e2e.conftest import Gateway, slow_spool_toml, start_gateway, start_plain_gateway, stop_gateway

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
SOURCE_HEADER = "x-s3lanes-source"
REQUEST_ID = re.compile(r"^[0-9A-F]{16}$")


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def source(resp: dict[str, Any]) -> str | None:
    value = resp["ResponseMetadata"]["HTTPHeaders"].get(SOURCE_HEADER)
    return None if value is None else str(value)


def exists(backend: Any, bucket: str, key: str) -> bool:
    try:
        backend.head_object(Bucket=bucket, Key=key)
    except backend.exceptions.ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def restart_dir(tmp: Path) -> Path:
    """Where a second gateway on the same state directory keeps its own config, log and ready file."""
    out = tmp / "restart"
    out.mkdir(exist_ok=True)
    return out


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the gateway did not exit within {timeout_s} s of SIGTERM")


# --- probes and request ids ---


def test_health_and_readiness_probes_answer_on_a_running_gateway(gateway: Gateway) -> None:
    assert http_get(f"{gateway.http_url}/_s3lanes/healthz") == (200, "ok\n")
    assert http_get(f"{gateway.http_url}/_s3lanes/readyz") == (200, "ready\n")
    assert gateway.status()["state"] == "ready"


def test_answers_carry_the_gateway_request_id_and_keep_the_backend_one(gateway: Gateway, bucket: str) -> None:
    s3 = gateway.client()
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    ok = s3.get_object(Bucket=bucket, Key="k")["ResponseMetadata"]
    assert REQUEST_ID.match(ok["RequestId"]), ok
    ids = {s3.head_object(Bucket=bucket, Key="k")["ResponseMetadata"]["RequestId"] for _ in range(3)}
    assert len(ids) == 3, "every request gets its own id"
    try:
        s3.get_object(Bucket=bucket, Key="missing")
        pytest.fail("expected NoSuchKey")
    except s3.exceptions.NoSuchKey as exc:
        err = exc.response
    # A relayed backend error: the id in the XML body is the backend's, the header is ours.
    assert REQUEST_ID.match(err["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]), err


def test_json_logs_name_the_request_id_the_client_saw(seaweed: Any, tmp_path: Path) -> None:
    """A backend that refuses connections: the client gets 503 with a request id, and the gateway's JSON
    log line about it carries the same id."""
    proc, gw = start_plain_gateway(
        tmp_path,
        seaweed,
        backend_endpoint="http://127.0.0.1:9",  # the discard port: nothing listens
        extra_toml="connect_timeout_s = 1\n",
        server_toml='log_format = "json"\n',
    )
    try:
        s3 = gw.client()
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.head_bucket(Bucket="anything")
        meta = info.value.response["ResponseMetadata"]
        assert meta["HTTPStatusCode"] == 503, meta
        rid = meta["HTTPHeaders"]["x-amz-request-id"]
        assert REQUEST_ID.match(rid), rid
    finally:
        assert stop_gateway(proc) == 0
    lines = gw.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records, lines[-20:]
    for rec in records:
        assert {"ts", "level", "logger", "msg"} <= rec.keys(), rec
    about = [r for r in records if r.get("request_id") == rid]
    assert about, f"no log record with request id {rid}: {records}"
    assert all(r["level"] in ("WARNING", "ERROR") for r in about), about
    # Quiet in steady state: nothing is logged per request at INFO.
    assert not [r for r in records if r["level"] == "INFO" and r.get("request_id")], records


# --- graceful shutdown ---


def slow_spooling_gateway(
    tmp: Path, seaweed: Any, bandwidth_bps: int, server_toml: str = ""
) -> tuple[subprocess.Popen[bytes], Gateway]:
    """A spooling gateway whose drain is paced at ``bandwidth_bps``: 12 MiB at 4 MB/s take ~3 s, long enough
    to look at the gateway while it drains."""
    return start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        extra_toml=slow_spool_toml(bandwidth_bps),
        server_toml=server_toml,
    )


def spool_blobs(gw: Gateway, bucket: str, prefix: str, count: int, size: int) -> dict[str, bytes]:
    """PUT ``count`` random objects through the checkpoint lane; each must be absorbed by the spool."""
    s3 = gw.client()
    blobs = {f"{prefix}{i}": os.urandom(size) for i in range(count)}
    for key, data in blobs.items():
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=data)) == "spool", key
    return blobs


def test_sigterm_drains_the_spool_while_serving_then_exits(
    seaweed: Any, backend: Any, bucket: str, tmp_path: Path
) -> None:
    proc, gw = slow_spooling_gateway(tmp_path, seaweed, 4_000_000)
    s3 = gw.client()
    try:
        blobs = spool_blobs(gw, bucket, "ckpt/step-1/shard-", 4, 3 * MiB)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while http_get(f"{gw.http_url}/_s3lanes/readyz")[0] != 503:
            assert time.monotonic() < deadline, "readiness did not turn 503 after SIGTERM"
            time.sleep(0.02)
        assert http_get(f"{gw.http_url}/_s3lanes/readyz") == (503, "draining\n")
        assert http_get(f"{gw.http_url}/_s3lanes/healthz")[0] == 200
        # Still serving: a new checkpoint write goes to the backend directly, reads see spooled data.
        late = os.urandom(256 * 1024)
        resp = s3.put_object(Bucket=bucket, Key="ckpt/step-2/late", Body=late)
        assert source(resp) is None, resp["ResponseMetadata"]["HTTPHeaders"]
        assert backend.get_object(Bucket=bucket, Key="ckpt/step-2/late")["Body"].read() == late
        assert (
            s3.get_object(Bucket=bucket, Key="ckpt/step-1/shard-3")["Body"].read()
            == blobs["ckpt/step-1/shard-3"]
        )
        code = wait_exit(proc, 60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            stop_gateway(proc)
    text = gw.log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert "shutdown: spool drained" in text, text[-4000:]
    assert took > 1.0, f"exited after {took:.2f} s: too fast to have drained 12 MiB at 4 MB/s"
    for key, data in blobs.items():
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    assert not list((tmp_path / "state" / "spool" / "data").iterdir()), "spool files left after the drain"


def test_shutdown_deadline_leaves_the_rest_to_recovery(
    seaweed: Any, backend: Any, bucket: str, tmp_path: Path
) -> None:
    """drain_on_shutdown_s = 1 at 1 MB/s: the gateway exits after about a second with data still spooled;
    the next start (full speed) drains it."""
    proc, gw = slow_spooling_gateway(tmp_path, seaweed, 1_000_000, "drain_on_shutdown_s = 1\n")
    try:
        blobs = spool_blobs(gw, bucket, "ckpt/deadline/shard-", 4, 2 * MiB)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            stop_gateway(proc)
    text = gw.log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert "not yet on the backend" in text, text[-4000:]
    assert took < 1.0 + 5 + 5, (
        f"took {took:.1f} s: drain deadline 1 s + shutdown_grace_s 5 s + start-up slack"
    )
    left = [k for k in blobs if not exists(backend, bucket, k)]
    assert left, "everything drained within a second at 1 MB/s: the test did not exercise the deadline"
    # Restart at full speed: recovery resumes the drain of what was left.
    restart_and_flush(tmp_path, gw, backend, bucket, blobs)


def test_second_sigterm_skips_the_drain(seaweed: Any, backend: Any, bucket: str, tmp_path: Path) -> None:
    proc, gw = slow_spooling_gateway(tmp_path, seaweed, 500_000)
    try:
        blobs = spool_blobs(gw, bucket, "ckpt/x/", 3, 2 * MiB)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "exited before the drain could have finished (6 MiB at 0.5 MB/s)"
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            stop_gateway(proc)
    assert code == 0, gw.log_path.read_text()[-4000:]
    assert took < 8, f"the second SIGTERM should stop the drain at once; took {took:.1f} s"
    restart_and_flush(tmp_path, gw, backend, bucket, blobs)


def restart_and_flush(tmp: Path, gw: Gateway, backend: Any, bucket: str, blobs: dict[str, bytes]) -> None:
    """Start a gateway at full speed on the stopped one's state directory: recovery resumes the drain, and
    every object ends up on the backend, byte-exact."""
    cfg = re.sub(r'bandwidth = "\d+"', "", (tmp / "s3lanes.toml").read_text())
    proc, ready, _log = start_gateway(restart_dir(tmp), cfg)
    try:
        dataclasses.replace(gw, http_url=ready["endpoints"][0], pid=proc.pid).flush(bucket, timeout_s=60)
        for key, data in blobs.items():
            assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    finally:
        assert stop_gateway(proc) == 0


def test_signed_gets_of_admin_paths_are_s3_requests(gateway: Gateway, bucket: str) -> None:
    """``GET b.<domain>/_s3lanes/status`` signed by a tenant reads the key ``_s3lanes/status`` of bucket b; a
    path-style signed GET names the bucket ``_s3lanes``, which S3 refuses. Unsigned, they are admin pages."""

    s3 = gateway.client()
    s3.put_object(Bucket=bucket, Key="_s3lanes/status", Body=b"an object, not the status")
    netloc = gateway.http_url.removeprefix("http://")
    port = netloc.rsplit(":", 1)[1]
    for target, host in (("/_s3lanes/status", f"{bucket}.localhost:{port}"), ("/_s3lanes/status", None)):
        headers = s3raw.sign(
            "GET",
            gateway.http_url,
            target,
            {},
            access_key=gateway.access_key,
            secret_key=gateway.secret_key,
            payload_hash=s3raw.sha256_hex(b""),
            host=host,
        )
        resp = s3raw.send(gateway.http_url, "GET", target, headers)
        if host is not None:
            assert (resp.status, resp.body) == (200, b"an object, not the status")
        else:
            assert (resp.status, resp.error_code) == (400, "InvalidBucketName"), resp.body[:300]
    assert json.loads(http_get(f"{gateway.http_url}/_s3lanes/status")[1])["state"] == "ready"
