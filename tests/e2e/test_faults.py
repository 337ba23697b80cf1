"""Faults, end to end: a spooling gateway in front of a store that misbehaves, and a spool disk that fails.

The store is SeaweedFS behind :class:`~tests.e2e.faulty_backend.FaultyBackend`, an HTTP proxy that can be
slow, answer injected ``500 InternalError`` or ``503 SlowDown``, stop answering, or go away. Each test states
what the client saw, that every acknowledged write ended up on the store byte for byte, and that the gateway
recovered by itself (or, where it cannot, what it takes). Injected answers carry a request id starting with
``FAULTY``, which the gateway keeps in ``x-s3lanes-backend-request-id``: that is how a test tells an error
relayed from the store from one the gateway made up. The gateway must never make up a 500.

The figures the tests print (``FIGURE ...``, visible with ``-s``) are recorded in ``docs/reliability.md``.
Faults covered elsewhere: SIGKILL at random moments and a store that refuses connections
(``test_spool_crash.py``), clients leaving proxied requests (``test_disconnects.py``), SIGTERM while draining
(``test_operations.py``), failing fsync/fdatasync and a journal write hitting ENOSPC in-process
(``tests/runtime/test_spool_faults.py``). Clients leaving requests to or from the spool are here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check, stop_gateway
from tests.e2e.faulty_backend import FAULT_REQUEST_ID_PREFIX, FaultyBackend
from tests.e2e.s3raw import UNSIGNED_PAYLOAD, key_path, request_bytes, sign

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
BACKEND_ID_HEADER = "x-s3lanes-backend-request-id"
SOURCE_HEADER = "x-s3lanes-source"
RETRY_BASE_S = 0.2
RETRY_MAX_S = 1.0
# Put after `[backend] endpoint = ...` by start_plain_gateway: short timeouts so a dead store shows at once,
# a short drain backoff so the drain resumes quickly once the store is back.
FAULT_TOML = f"""
connect_timeout_s = 2
read_timeout_s = {{read_timeout_s}}

[spool]
retry_base_s = {RETRY_BASE_S}
retry_max_s = {RETRY_MAX_S}
{{spool_extra}}"""
PROMPT_S = 15.0  # an answer the gateway cannot give must come back within this, not hang


# -- fixtures and helpers ----------------------------------------------------------------------------------


@pytest.fixture
def store(seaweed: Any) -> Iterator[FaultyBackend]:
    proxy = FaultyBackend(seaweed.endpoint_url, seed=8)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def gateway_on(
    store: FaultyBackend, seaweed: Any, tmp: Path, *, read_timeout_s: float = 5, spool_extra: str = ""
) -> tuple[Any, Gateway]:
    return start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=store.url,
        extra_toml=FAULT_TOML.format(read_timeout_s=read_timeout_s, spool_extra=spool_extra),
    )


def restart(store: FaultyBackend, seaweed: Any, tmp: Path, **kw: Any) -> tuple[Any, Gateway]:
    """The same gateway again (same state directory); the previous log is kept beside the new one."""
    runs = len(list(tmp.glob("gateway-*.log")))
    (tmp / "gateway.log").rename(tmp / f"gateway-{runs}.log")
    return gateway_on(store, seaweed, tmp, **kw)


def warm_up(gw: Gateway, bucket: str) -> None:
    """A job that has been writing: the gateway has checked the bucket on the store (cached 30 s; a bucket
    seen before keeps absorbing writes while the store misbehaves)."""
    s3 = sdk_client(gw)
    s3.put_object(Bucket=bucket, Key="warmup/.keep", Body=b"")
    s3.close()
    gw.flush(bucket, timeout_s=30)


def flush_answer(gw: Gateway, bucket: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    query = urllib.parse.urlencode({"bucket": bucket, "timeout": str(timeout_s)})
    req = urllib.request.Request(f"{gw.http_url}/_s3lanes/flush?{query}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s + 30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metric(gw: Gateway, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample family over the series that carry ``labels``."""
    with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        rest = series[len(name) :]
        if rest and not rest.startswith("{"):
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def backend_contents(backend: Any, bucket: str) -> dict[str, str]:
    """key -> SHA-256 of every object in the bucket, read straight from SeaweedFS."""
    out: dict[str, str] = {}
    for page in backend.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = sha(backend.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return out


def assert_store_holds(backend: Any, bucket: str, acked: dict[str, bytes]) -> None:
    expected = {"warmup/.keep": sha(b""), **{k: sha(v) for k, v in acked.items()}}
    got = backend_contents(backend, bucket)
    assert got == expected, {
        "missing": sorted(set(expected) - set(got)),
        "extra": sorted(set(got) - set(expected)),
        "different": sorted(k for k in expected if k in got and got[k] != expected[k]),
    }
    assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def headers_of(resp_or_exc: Any) -> dict[str, str]:
    meta = resp_or_exc.response if isinstance(resp_or_exc, ClientError) else resp_or_exc
    return dict(meta["ResponseMetadata"]["HTTPHeaders"])


def relayed(exc: ClientError) -> bool:
    """The error came from the store (here: the fault injector), not from the gateway."""
    return headers_of(exc).get(BACKEND_ID_HEADER, "").startswith(FAULT_REQUEST_ID_PREFIX)


def gateway_made_500s(gw: Gateway) -> list[str]:
    """Log lines of 500s the gateway answered itself (relayed answers are not logged as its own errors)."""
    return [line for line in gw.log_path.read_text(errors="replace").splitlines() if " -> 500 " in line]


def sdk_client(gw: Gateway, total_attempts: int = 1) -> Any:
    """A boto3 client for the gateway making at most ``total_attempts`` attempts per call (1: what the client
    saw, unretried; more: an SDK retrying as by default, standard mode). Not ``Gateway.client``: botocore's
    ``max_attempts`` counts retries, so that client retries once."""
    return boto3.client(
        "s3",
        endpoint_url=gw.http_url,
        aws_access_key_id=gw.access_key,
        aws_secret_access_key=gw.secret_key,
        region_name="us-east-1",
        config=BotoConfig(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": total_attempts, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


def write_through(client: Any) -> Any:
    """Make the client's PutObject calls skip the spool (``x-s3lanes-write-through: true``)."""

    def add_header(params: dict[str, Any], **_: Any) -> None:
        params["headers"]["x-s3lanes-write-through"] = "true"

    client.meta.events.register("before-call.s3.PutObject", add_header)
    return client


def spooled_multipart(s3: Any, bucket: str, key: str, parts: list[bytes]) -> str:
    mpu = s3.create_multipart_upload(Bucket=bucket, Key=key)
    etags = [
        s3.upload_part(Bucket=bucket, Key=key, UploadId=mpu["UploadId"], PartNumber=n, Body=part)["ETag"]
        for n, part in enumerate(parts, start=1)
    ]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=mpu["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
    )
    assert headers_of(done).get(SOURCE_HEADER) == "spool", headers_of(done)
    return str(done["ETag"])


def put_acked(s3: Any, bucket: str, key: str, data: bytes) -> float:
    """A spooled PUT that must be acknowledged by the spool; returns its latency in seconds."""
    t0 = time.monotonic()
    resp = s3.put_object(Bucket=bucket, Key=key, Body=data)
    took = time.monotonic() - t0
    assert resp["ETag"] == md5_etag(data), key
    assert headers_of(resp).get(SOURCE_HEADER) == "spool", (key, headers_of(resp))
    return took


def on_store(backend: Any, bucket: str, key: str) -> str | None:
    """The ETag of the object on SeaweedFS, None if there is none."""
    try:
        return str(backend.head_object(Bucket=bucket, Key=key)["ETag"])
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return None
        raise


def under(bucket: str, prefix: str) -> Callable[[str, str], bool]:
    """A fault filter: requests for keys of ``bucket`` under ``prefix``."""
    start = key_path(bucket, prefix)
    return lambda _method, path: path.startswith(start)


def max_attempts_within(window_s: float) -> int:
    """The most drain attempts one entry can make in ``window_s`` with the configured backoff: each wait is
    at least half its cap (jitter), the cap doubling from RETRY_BASE_S up to RETRY_MAX_S."""
    attempts, t = 1, 0.0
    while True:
        cap = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (attempts - 1))
        t += cap / 2
        if t > window_s:
            return attempts
        attempts += 1


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s} s"
        time.sleep(0.05)


def p50(values: list[float]) -> float:
    return statistics.median(values)


# -- a slow store ------------------------------------------------------------------------------------------

SLOW_DELAY_S = 0.3


def test_slow_backend_spooled_writes_are_acked_at_disk_speed_reads_are_slow_but_correct(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """The store takes +300 ms per request. Client sees: spooled checkpoint PUTs acknowledged far faster
    than one store round trip (median ack < 1/3 of the median proxied read), proxied GETs slow but
    byte-exact. Acknowledged data: all of it on the store after flush. Recovery: nothing to recover; the
    drain completes at the store's pace."""
    proc, gw = gateway_on(store, seaweed, tmp_path)
    try:
        warm_up(gw, bucket)
        s3 = sdk_client(gw)
        store.slow(SLOW_DELAY_S)
        acked = {f"ckpt/step-1/shard-{i}.bin": os.urandom(256 * KiB) for i in range(10)}
        ack_s = [put_acked(s3, bucket, key, data) for key, data in acked.items()]
        t0 = time.monotonic()
        gw.flush(bucket, timeout_s=60)
        flush_s = time.monotonic() - t0
        read_s = []
        for key, data in list(acked.items())[:5]:  # drained: proxied to the slow store now
            t0 = time.monotonic()
            resp = s3.get_object(Bucket=bucket, Key=key)
            assert resp["Body"].read() == data, key
            read_s.append(time.monotonic() - t0)
            assert headers_of(resp).get(SOURCE_HEADER) is None, "read from the spool, not the store"
        store.pass_through()
        print(
            f"\nFIGURE slow: backend +{SLOW_DELAY_S * 1000:.0f} ms/request; spooled 256 KiB PUT ack p50"
            f" {p50(ack_s) * 1000:.0f} ms (max {max(ack_s) * 1000:.0f} ms); proxied GET p50"
            f" {p50(read_s) * 1000:.0f} ms; flush of 10 objects {flush_s:.2f} s"
        )
        assert min(read_s) >= SLOW_DELAY_S  # the fault was really there
        assert p50(ack_s) * 3 < p50(read_s), (ack_s, read_s)
        assert_store_holds(backend, bucket, acked)
        assert gateway_made_500s(gw) == []
        s3.close()
    finally:
        store.pass_through()
        stop_and_check(proc, gw)


# -- a storm of 500s ---------------------------------------------------------------------------------------

STORM_S = 3.0


def test_500_storm_is_relayed_or_retried_and_spooled_data_lands_byte_exact_after_it(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """Half of the store's answers are ``500 InternalError`` for 3 s. Client sees: proxied reads and writes
    get the store's 500 relayed unchanged (request id FAULTY...) when the SDK does not retry, succeed when
    it does; spooled writes are acknowledged as usual. The gateway itself answers no 500. Acknowledged
    data: the drainer retries through the storm; everything is on the store byte-exact (the multipart
    object with the acknowledged ETag) shortly after it ends. Recovery: automatic."""
    proc, gw = gateway_on(store, seaweed, tmp_path)
    try:
        warm_up(gw, bucket)
        reads = {f"data/r-{i}.bin": os.urandom(64 * KiB) for i in range(4)}
        for key, data in reads.items():
            backend.put_object(Bucket=bucket, Key=key, Body=data)
        s3, s3_retrying = sdk_client(gw), sdk_client(gw, 10)
        store.errors("internal", 0.5)
        storm_started = time.monotonic()

        acked = {f"ckpt/step-2/shard-{i}.bin": os.urandom(128 * KiB * (i + 1)) for i in range(6)}
        for key, data in acked.items():
            put_acked(s3, bucket, key, data)
        parts = [os.urandom(5 * MiB), os.urandom(MiB)]
        mpu_etag = spooled_multipart(s3, bucket, "ckpt/step-2/model.bin", parts)
        acked["ckpt/step-2/model.bin"] = b"".join(parts)

        outcomes: Counter[str] = Counter()
        for i in range(24):
            key = f"data/r-{i % 4}.bin"
            try:
                assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == reads[key]
                outcomes["200"] += 1
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "InternalError", exc.response
                assert relayed(exc), f"a 500 the gateway made up: {exc.response}"
                outcomes["500 relayed"] += 1
        sdk_retries = 0
        for key, data in reads.items():
            resp = s3_retrying.get_object(Bucket=bucket, Key=key)
            assert resp["Body"].read() == data
            sdk_retries += resp["ResponseMetadata"]["RetryAttempts"]
        through = write_through(sdk_client(gw, 10))
        direct = os.urandom(300 * KiB)
        resp = through.put_object(Bucket=bucket, Key="direct/through.bin", Body=direct)
        assert headers_of(resp).get(SOURCE_HEADER) is None  # not spooled: on the store already
        assert backend.get_object(Bucket=bucket, Key="direct/through.bin")["Body"].read() == direct
        sdk_retries += resp["ResponseMetadata"]["RetryAttempts"]
        acked["direct/through.bin"] = direct

        time.sleep(max(0.0, STORM_S - (time.monotonic() - storm_started)))
        store.pass_through()
        storm_ended = time.monotonic()
        gw.flush(bucket, timeout_s=60)
        to_durable_s = time.monotonic() - storm_ended
        drain = gw.status()["spool"]["drain"]
        injected_to_drain = sum(
            1 for s in store.seen() if s.injected and s.path.startswith(key_path(bucket, "ckpt/"))
        )
        print(
            f"\nFIGURE 500 storm: p=0.5 for {storm_ended - storm_started:.1f} s; {store.injected} injected"
            " 500s"
            f" ({injected_to_drain} to drain requests); proxied GETs without retry {dict(outcomes)};"
            f" SDK retries {sdk_retries} for 5 calls, all succeeded; drain attempts failed"
            f" {drain['uploads_failed']}, ok {drain['uploads_ok']};"
            f" durable {to_durable_s:.2f} s after the storm"
        )
        assert outcomes["200"] and outcomes["500 relayed"], outcomes
        assert injected_to_drain > 0 and drain["uploads_failed"] > 0, (injected_to_drain, drain)
        assert_store_holds(backend, bucket, {**acked, **reads})
        assert backend.head_object(Bucket=bucket, Key="ckpt/step-2/model.bin")["ETag"] == mpu_etag
        assert gateway_made_500s(gw) == []
        s3.close()
        s3_retrying.close()
        through.close()
    finally:
        store.pass_through()
        stop_and_check(proc, gw)


# -- a SlowDown storm --------------------------------------------------------------------------------------

SLOWDOWN_STORM_S = 4.0


def test_slowdown_storm_backs_the_drain_off_and_acks_continue(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """90 % of the store's answers are ``503 SlowDown`` for 4 s. Client sees: proxied requests get the
    store's 503 SlowDown relayed (with a Retry-After the gateway adds); spooled writes keep being
    acknowledged. The gateway backs off:
    the scheduler cuts the lanes that met 503s (``slowdown_fraction`` in the status), and each spooled
    object is retried no more often than the capped exponential backoff allows (no hot loop against a
    store asking for less). Acknowledged data: all on the store byte-exact after the storm."""
    proc, gw = gateway_on(store, seaweed, tmp_path)
    try:
        warm_up(gw, bucket)
        backend.put_object(Bucket=bucket, Key="data/r.bin", Body=b"r" * 1000)
        s3 = sdk_client(gw)
        store.errors("slowdown", 0.9)
        storm_started = time.monotonic()
        acked: dict[str, bytes] = {}
        ack_s: list[float] = []
        relayed_503s, retry_after = 0, set()
        cut_lanes: set[str] = set()
        i = 0
        while time.monotonic() - storm_started < SLOWDOWN_STORM_S:
            key = f"ckpt/step-3/shard-{i}.bin"
            acked[key] = os.urandom(256 * KiB)
            ack_s.append(put_acked(s3, bucket, key, acked[key]))
            try:
                s3.get_object(Bucket=bucket, Key="data/r.bin")["Body"].read()
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "SlowDown", exc.response
                assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 503
                assert relayed(exc), exc.response
                relayed_503s += 1
                retry_after.add(headers_of(exc).get("retry-after"))
                # The store sent none; the gateway adds one to every 503 it relays.
                assert headers_of(exc).get("retry-after") == "1", headers_of(exc)
            for lane in gw.status()["scheduler"]["lanes"]:
                if lane["slowdown_fraction"] is not None:
                    cut_lanes.add(lane["name"])
            i += 1
            time.sleep(0.2)
        store.pass_through()
        storm_ended = time.monotonic()
        gw.flush(bucket, timeout_s=60)
        to_durable_s = time.monotonic() - storm_ended

        attempts = Counter(
            s.path
            for s in store.seen()
            if s.method == "PUT" and storm_started <= s.at < storm_ended and "/ckpt/step-3/" in s.path
        )
        bound = max_attempts_within(storm_ended - storm_started)
        drain_errors = metric(gw, "s3lanes_backend_errors_total", kind="drain")
        print(
            f"\nFIGURE SlowDown storm: p=0.9 for {storm_ended - storm_started:.1f} s;"
            f" {len(acked)} spooled PUTs acked"
            f" (p50 {p50(ack_s) * 1000:.0f} ms); {relayed_503s} proxied GETs got 503 SlowDown relayed"
            f" (Retry-After {sorted(map(str, retry_after))}); lanes cut: {sorted(cut_lanes)}; drain attempts"
            f" per object during the storm max {max(attempts.values(), default=0)} (backoff bound {bound}),"
            f" drain errors {drain_errors:.0f}; durable {to_durable_s:.2f} s after the storm"
        )
        assert relayed_503s > 0
        assert "checkpoint" in cut_lanes, cut_lanes
        assert drain_errors > 0
        assert max(attempts.values(), default=0) <= bound, attempts
        assert_store_holds(backend, bucket, {**acked, "data/r.bin": b"r" * 1000})
        assert gateway_made_500s(gw) == []
        s3.close()
    finally:
        store.pass_through()
        stop_and_check(proc, gw)


# -- a store that stops answering --------------------------------------------------------------------------


def test_hung_backend_gives_504_promptly_spooled_writes_continue_and_drain_resumes(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """The store accepts connections and never answers (a hung process, a black-holed network; the store
    refusing connections is test_spool_crash's outage). Client sees: proxied requests end with the
    gateway's own ``504 GatewayTimeout`` after ``read_timeout_s`` (2 s here), not a hang; spooled writes are
    acknowledged as usual and readable from the spool. Acknowledged data: drained once the store answers
    again. Recovery: automatic."""
    proc, gw = gateway_on(store, seaweed, tmp_path, read_timeout_s=2)
    try:
        warm_up(gw, bucket)
        backend.put_object(Bucket=bucket, Key="data/r.bin", Body=b"r")
        s3 = sdk_client(gw)
        store.slow(3600.0)
        hung_at = time.monotonic()
        acked = {f"ckpt/step-4/shard-{i}.bin": os.urandom(200 * KiB) for i in range(4)}
        ack_s = [put_acked(s3, bucket, key, data) for key, data in acked.items()]
        for key, data in acked.items():
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        t0 = time.monotonic()
        with pytest.raises(ClientError) as timed_out:
            s3.get_object(Bucket=bucket, Key="data/r.bin")
        took_s = time.monotonic() - t0
        assert timed_out.value.response["ResponseMetadata"]["HTTPStatusCode"] == 504, timed_out.value.response
        assert timed_out.value.response["Error"]["Code"] == "GatewayTimeout"
        assert took_s < PROMPT_S, f"the 504 took {took_s:.1f} s"
        status, doc = flush_answer(gw, bucket, 1.0)
        assert status == 504 and doc["pending_objects"] == len(acked), doc

        store.pass_through()
        back_at = time.monotonic()
        gw.flush(bucket, timeout_s=60)
        to_durable_s = time.monotonic() - back_at
        print(
            f"\nFIGURE hung backend: proxied GET -> 504 GatewayTimeout after {took_s:.2f} s"
            f" (read_timeout_s 2); spooled PUT ack p50 {p50(ack_s) * 1000:.0f} ms; hung for"
            f" {back_at - hung_at:.1f} s, durable {to_durable_s:.2f} s after the store answered again"
        )
        assert_store_holds(backend, bucket, {**acked, "data/r.bin": b"r"})
        assert gateway_made_500s(gw) == []
        s3.close()
    finally:
        store.pass_through()
        stop_and_check(proc, gw)


# -- the spool disk fills up -------------------------------------------------------------------------------

SPOOL_DISK_BYTES = 16 * MiB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB filesystem (tmpfs) for the spool, so that a full disk is a real ENOSPC."""
    mnt = tmp_path / "spool-disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SPOOL_DISK_BYTES},mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"cannot mount a {SPOOL_DISK_BYTES // MiB} MiB tmpfs for the spool (needs root or CAP_SYS_ADMIN):"
            f" {done.stderr.strip()}"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill_disk(disk: Path) -> Path:
    """Another tenant of the disk takes every free block: write until ENOSPC."""
    path = disk / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk = b"\0" * MiB
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return path


def test_spool_disk_full_refuses_the_write_that_hit_it_keeps_acked_data_and_recovers(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path, small_disk: Path
) -> None:
    """The spool's disk (a real 16 MiB filesystem) is filled by someone else.

    * A data file hitting ENOSPC: the client sees ``503 ServiceUnavailable`` ("spool disk is full") with
      Retry-After; nothing partial is left; the spool stays in service. Once space is freed the next write
      is spooled again, with no manual step.
    * The journal append hitting ENOSPC (0-byte PUTs: their data files need no blocks): that client sees a
      503, the journal is cut back to its last good length, the spool goes out of service (``degraded``)
      and later writes go write-through. What the spool holds keeps draining, multipart uploads included
      (docs/spool.md). Keys drained meanwhile are closed to other writes (503 SlowDown) until the journal
      is rewritten, since a restart before that would drain them again. Once space is back, the spool
      rewrites its journal and is back in service by itself; overwrites and deletes then stay the newest,
      also after a restart.
    Acknowledged data: every acknowledged object ends up on the store byte-exact, in its newest version."""
    proc, gw = gateway_on(store, seaweed, tmp_path, spool_extra=f'dir = "{small_disk}"\nretry_after_s = 2\n')
    data_dir = small_disk / "data"
    try:
        warm_up(gw, bucket)
        s3 = sdk_client(gw)
        # The store fails every drain of ckpt/ for now, so what is acknowledged stays on the small disk.
        store.errors("internal", 1.0, match=under(bucket, "ckpt/"))
        acked = {"ckpt/a.bin": os.urandom(MiB)}
        put_acked(s3, bucket, "ckpt/a.bin", acked["ckpt/a.bin"])
        parts = [os.urandom(5 * MiB), os.urandom(MiB)]
        spooled_multipart(s3, bucket, "ckpt/m.bin", parts)
        acked["ckpt/m.bin"] = b"".join(parts)
        files_before = sorted(os.listdir(data_dir))

        filler = fill_disk(small_disk)
        with pytest.raises(ClientError) as full:
            s3.put_object(Bucket=bucket, Key="ckpt/b.bin", Body=os.urandom(MiB))
        err = full.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 503, err
        assert err["Error"]["Code"] == "ServiceUnavailable" and "full" in err["Error"]["Message"], err
        full_retry_after = headers_of(full.value).get("retry-after")
        assert full_retry_after, headers_of(full.value)
        assert not relayed(full.value)
        assert sorted(os.listdir(data_dir)) == files_before  # the partial file is gone
        assert gw.status()["spool"]["degraded"] is None

        filler.unlink()  # space comes back: the spool takes writes again by itself
        acked["ckpt/b.bin"] = os.urandom(MiB)
        put_acked(s3, bucket, "ckpt/b.bin", acked["ckpt/b.bin"])

        # Now the journal itself runs out of space.
        filler = fill_disk(small_disk)
        refused: dict[str, Any] | None = None
        refused_exc: ClientError | None = None
        for i in range(300):
            key = f"ckpt/empty-{i}"
            try:
                resp = s3.put_object(Bucket=bucket, Key=key, Body=b"")
            except ClientError as exc:
                refused, refused_exc = exc.response, exc
                break
            assert headers_of(resp).get(SOURCE_HEADER) == "spool"
            acked[key] = b""
        assert refused is not None, "300 journal records fit on a full disk"
        # The journal is shared with the drain, whose own records (a failed attempt's `unwire`, bookkeeping)
        # may be the ones that hit ENOSPC first: then the spool is already out of service when the next PUT
        # arrives, and that PUT goes to the store (failing here), whose answer is relayed. Either way no
        # write was acknowledged without a journal record.
        if refused_exc is not None and relayed(refused_exc):
            assert gw.status()["spool"]["degraded"] is not None, refused
        else:
            assert refused["ResponseMetadata"]["HTTPStatusCode"] == 503, refused
        degraded = gw.status()["spool"]["degraded"]
        assert degraded is not None and "No space left" in degraded, degraded
        # Out of service: the next checkpoint write goes straight to the store.
        store.pass_through()
        acked["ckpt/c.bin"] = os.urandom(100 * KiB)
        resp = s3.put_object(Bucket=bucket, Key="ckpt/c.bin", Body=acked["ckpt/c.bin"])
        assert headers_of(resp).get(SOURCE_HEADER) is None, headers_of(resp)
        assert backend.get_object(Bucket=bucket, Key="ckpt/c.bin")["Body"].read() == acked["ckpt/c.bin"]
        # What the spool holds keeps draining while it is out of service (docs/spool.md), multipart included.
        degraded_flush, degraded_doc = flush_answer(gw, bucket, 30.0)
        still_degraded = gw.status()["spool"]["degraded"]
        assert still_degraded is not None, "the journal healed while its disk was still full"
        # Their `done` records are only in memory: a restart now would drain them again, so the gateway
        # closes those keys to other writes until its journal is rewritten (503 SlowDown, Retry-After).
        for call in (
            lambda: s3.put_object(Bucket=bucket, Key="ckpt/a.bin", Body=os.urandom(200 * KiB)),
            lambda: s3.delete_object(Bucket=bucket, Key="ckpt/b.bin"),
        ):
            with pytest.raises(ClientError) as closed:
                call()
            assert closed.value.response["Error"]["Code"] == "SlowDown", closed.value.response
            assert headers_of(closed.value).get("retry-after"), headers_of(closed.value)
        filler.unlink()
        # Space is back: the spool rewrites its journal and returns to service by itself.
        wait_for("the spool back in service", lambda: gw.status()["spool"]["degraded"] is None, 30.0)
        acked["ckpt/a.bin"] = os.urandom(200 * KiB)
        resp = s3.put_object(Bucket=bucket, Key="ckpt/a.bin", Body=acked["ckpt/a.bin"])
        assert headers_of(resp).get(SOURCE_HEADER) == "spool", headers_of(resp)
        s3.delete_object(Bucket=bucket, Key="ckpt/b.bin")
        del acked["ckpt/b.bin"]
        gw.flush(bucket, timeout_s=60)
        assert on_store(backend, bucket, "ckpt/b.bin") is None
        s3.close()
        code = stop_gateway(proc)
        assert code == 0, gw.log_path.read_text(errors="replace")[-4000:]

        proc, gw = restart(store, seaweed, tmp_path, spool_extra=f'dir = "{small_disk}"\n')
        log = gw.log_path.read_text(errors="replace")
        assert "spool recovery:" in log, log[-3000:]
        assert "LOST" not in log, log[-3000:]
        assert gw.status()["spool"]["degraded"] is None
        s3 = sdk_client(gw)
        acked["ckpt/d.bin"] = os.urandom(100 * KiB)
        put_acked(s3, bucket, "ckpt/d.bin", acked["ckpt/d.bin"])
        gw.flush(bucket, timeout_s=60)
        recovery_line = next(line for line in log.splitlines() if "spool recovery: " in line)
        recovery_line = recovery_line.split(": ", 1)[1]
        print(
            "\nFIGURE disk full: data-file ENOSPC -> 503 ServiceUnavailable"
            f" (Retry-After {full_retry_after}), spool in service again once space is freed; journal ENOSPC"
            f" after {sum(1 for k in acked if 'empty-' in k)} 0-byte PUTs ->"
            f" 503 then degraded ({still_degraded!r}) and write-through; flush while degraded:"
            f" {degraded_flush} {degraded_doc.get('pending_objects')} pending; keys drained meanwhile closed"
            f" (SlowDown) until the journal was rewritten; after restart: {recovery_line}"
        )
        s3.close()
        problems = []
        if degraded_flush != 200:
            problems.append(
                "acknowledged data did not drain while the spool was out of service (a journal write had"
                f" failed): {degraded_doc}"
            )
        if on_store(backend, bucket, "ckpt/a.bin") != md5_etag(acked["ckpt/a.bin"]):
            problems.append("the restart drained the old spooled a.bin over the newer one written through")
        if on_store(backend, bucket, "ckpt/b.bin") is not None:
            problems.append("the restart drained the old spooled b.bin again after it was deleted")
        got = backend_contents(backend, bucket)
        got.pop("ckpt/b.bin", None)
        expected = {"warmup/.keep": sha(b""), **{k: sha(v) for k, v in acked.items()}}
        assert {k: v for k, v in got.items() if k != "ckpt/a.bin"} == {
            k: v for k, v in expected.items() if k != "ckpt/a.bin"
        }
        assert not problems, problems
    finally:
        store.pass_through()
        if proc.poll() is None:
            stop_and_check(proc, gw)
        for old in tmp_path.glob("gateway-*.log"):
            assert "Traceback" not in old.read_text(errors="replace"), old.read_text(errors="replace")[-4000:]


# -- a damaged journal -------------------------------------------------------------------------------------


def test_damaged_journal_exits_3_and_a_torn_tail_is_truncated_and_drained(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """A gateway SIGKILLed with acknowledged writes in its spool (the store was down). Then:

    * a copy of its state with one byte flipped in the middle of the journal: the gateway refuses to
      start, exit code 3, a message naming the damage, and the journal left as it was (the evidence);
    * the original state plus a torn tail (the first half of a record appended, as a crash mid-append
      leaves it) and a data file no record names: the gateway starts, truncates the tail, removes the
      orphan, and drains every acknowledged write byte-exact. No manual step."""
    proc, gw = gateway_on(store, seaweed, tmp_path)
    try:
        warm_up(gw, bucket)
        s3 = sdk_client(gw)
        store.down()
        acked = {f"ckpt/step-5/shard-{i}.bin": os.urandom(100 * KiB * (i + 1)) for i in range(3)}
        for key, data in acked.items():
            put_acked(s3, bucket, key, data)
        s3.close()
    finally:
        proc.kill()
        proc.wait()
    spool = tmp_path / "state" / "spool"
    journal = (spool / "journal").read_bytes()

    # 1. Damage in the middle.
    damaged_tmp = tmp_path / "damaged"
    shutil.copytree(tmp_path / "state", damaged_tmp / "state")
    damaged = bytearray(journal)
    damaged[5 + 12] ^= 0xFF  # inside the first frame (after the 5-byte file header); others follow
    (damaged_tmp / "state" / "spool" / "journal").write_bytes(bytes(damaged))
    cfg = (tmp_path / "s3lanes.toml").read_text().replace(str(tmp_path / "state"), str(damaged_tmp / "state"))
    (damaged_tmp / "s3lanes.toml").write_text(cfg)
    out = subprocess.run(
        [sys.executable, "-m", "s3lanes", "serve", "--config", str(damaged_tmp / "s3lanes.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    said = out.stdout + out.stderr
    assert "journal is damaged" in said and "Refusing to start" in said, said[-2000:]
    assert (damaged_tmp / "state" / "spool" / "journal").read_bytes() == bytes(damaged)

    # 2. A torn tail: the start of the last record again, cut off mid-frame; and an unacknowledged file.
    last_frame = journal.rindex(b"\xa5\x5a")
    torn = journal[last_frame : last_frame + (len(journal) - last_frame) // 2]
    (spool / "journal").write_bytes(journal + torn)
    orphan = spool / "data" / ("e" * 32)
    orphan.write_bytes(b"written, never acknowledged")
    store.up()
    proc, gw = restart(store, seaweed, tmp_path)
    try:
        log = gw.log_path.read_text(errors="replace")
        assert f"torn journal tail of {len(torn)} bytes truncated" in log, log[-3000:]
        assert "1 unacknowledged files removed" in log, log[-3000:]
        assert not orphan.exists()
        gw.flush(bucket, timeout_s=60)
        assert_store_holds(backend, bucket, acked)
        print(
            f"\nFIGURE journal: mid-file damage -> exit {out.returncode}; torn tail of {len(torn)} bytes ->"
            f" truncated, {len(acked)} acknowledged objects drained"
        )
    finally:
        stop_and_check(proc, gw)


# -- clients that leave mid-request, with the spool ----------------------------------------------------------


def open_raw(
    gw: Gateway, method: str, target: str, headers: dict[str, str], body: bytes = b""
) -> socket.socket:
    """Connect and send a signed request head (and ``body``, possibly short of its Content-Length)."""
    parts = urlsplit(gw.http_url)
    assert parts.hostname is not None and parts.port is not None
    signed = sign(
        method,
        gw.http_url,
        target,
        headers,
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        payload_hash=UNSIGNED_PAYLOAD,
    )
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(request_bytes(method, target, signed) + body)
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a RST (SO_LINGER 0), as a killed client's kernel would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def test_client_gone_mid_spooled_upload_and_mid_spool_download_leaves_nothing_behind(
    seaweed: Any, backend: Any, bucket: str, store: FaultyBackend, tmp_path: Path
) -> None:
    """test_disconnects.py covers proxied requests; these go to and from the spool. A client that resets
    the connection mid-upload: nothing acknowledged, the partial spool file removed, the space reserved for
    it released, nothing on the store. A client that resets mid-download of a spooled object (served from
    the spool): the object is still there and drains. No traceback either way; the gateway keeps
    serving."""
    proc, gw = gateway_on(store, seaweed, tmp_path)
    data_dir = tmp_path / "state" / "spool" / "data"
    try:
        warm_up(gw, bucket)
        s3 = sdk_client(gw)
        store.errors("internal", 1.0, match=under(bucket, "ckpt/"))  # keep spooled objects in the spool
        big = os.urandom(32 * MiB)
        put_acked(s3, bucket, "ckpt/big.bin", big)
        files = sorted(os.listdir(data_dir))
        used = gw.status()["spool"]["used_bytes"]

        sock = open_raw(
            gw, "PUT", key_path(bucket, "ckpt/cut.bin"), {"Content-Length": str(8 * MiB)}, os.urandom(3 * MiB)
        )
        try:
            wait_for("mid-upload", lambda: gw.status()["spool"]["reserved_bytes"] >= 8 * MiB)
            wait_for("writing a spool file", lambda: len(os.listdir(data_dir)) > len(files))
        finally:
            reset(sock)
        wait_for("cleaned up", lambda: gw.status()["spool"]["reserved_bytes"] == 0)
        wait_for("partial file removed", lambda: sorted(os.listdir(data_dir)) == files)
        assert gw.status()["spool"]["used_bytes"] == used

        sock = open_raw(gw, "GET", key_path(bucket, "ckpt/big.bin"), {})
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(64 * KiB)
                assert chunk, head
                head += chunk
            assert head.startswith(b"HTTP/1.1 200") and b"x-s3lanes-source: spool" in head.lower(), head[:500]
        finally:
            reset(sock)
        resp = s3.get_object(Bucket=bucket, Key="ckpt/big.bin")
        assert sha(resp["Body"].read()) == sha(big)
        store.pass_through()
        gw.flush(bucket, timeout_s=60)
        assert_store_holds(backend, bucket, {"ckpt/big.bin": big})
        assert "Traceback" not in gw.log_path.read_text(errors="replace")
        s3.close()
    finally:
        store.pass_through()
        stop_and_check(proc, gw)
