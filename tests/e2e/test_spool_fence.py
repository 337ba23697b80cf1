"""Fencing of drain requests left on the wire: a store that stalls while the gateway dies (or gives up).

A private SeaweedFS per module (so that stopping it does not disturb other tests) is frozen with SIGSTOP by
its pid while a drain request of the old state is on the wire (the bytes sit in the store's socket buffer).
A newer state of the keys is acknowledged (a DELETE, or a PUT of v2), the gateway is SIGKILLed and started
again on the same spool, the store is resumed (before or after the restart), and after a flush that answers
durable the store, read directly with boto3, must hold the newest acknowledged state of every key: the old
request must not win even when the store applies it after the newer one. The no-crash variant does the same
with a drainer that gives up on the old request (a short backend read timeout). Several keys per trial, so
that the store's order of applying the old and the new request varies within one run.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from loadtests.crashmodel import CrashConfig, run_crash
from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess
from tests.conftest import Backend, s3_client
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.test_spool_crash import flush_answer

pytestmark = pytest.mark.e2e

KEYS = 6
BODY_BYTES = 48 * 1024  # fits the store's socket buffer whole: the store applies it once it resumes
FENCE_S = 1.5


class StallableSeaweed:
    """A SeaweedFS of this module only, which a test may freeze (SIGSTOP) and thaw (SIGCONT) by its pid."""

    def __init__(self, proc: SeaweedProcess, backend: Backend) -> None:
        self.proc = proc
        self.backend = backend
        self.admin = backend.admin
        self.endpoint_url = backend.endpoint_url

    def stall(self) -> None:
        pid = self.proc.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid = self.proc.pid
        if pid is not None and self.proc.returncode is None:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def stallable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StallableSeaweed]:
    admin = SeaweedIdentity("admin", "s3lanes-fence-admin", secrets.token_urlsafe(30))
    user2 = SeaweedIdentity("user2", "s3lanes-fence-user2", secrets.token_urlsafe(30))
    proc = SeaweedProcess(
        SeaweedOptions(state_dir=tmp_path_factory.mktemp("seaweed-stall"), identities=(admin, user2))
    )
    proc.start()
    weed = StallableSeaweed(proc, Backend(endpoint_url=proc.endpoint_url, admin=admin, user2=user2))
    try:
        yield weed
    finally:
        weed.resume()
        proc.stop()


@pytest.fixture
def store(stallable: StallableSeaweed) -> Iterator[Any]:
    client = s3_client(stallable.backend)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def fence_bucket(stallable: StallableSeaweed, store: Any) -> Iterator[str]:
    name = f"fence-{secrets.token_hex(5)}"
    store.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        stallable.resume()
        for page in store.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for up in page.get("Uploads", []):
                store.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
        for page in store.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                store.delete_object(Bucket=name, Key=obj["Key"])
        store.delete_bucket(Bucket=name)


def gateway_toml(read_timeout_s: float) -> str:
    return f"""
connect_timeout_s = 2
read_timeout_s = {read_timeout_s}

[spool]
retry_base_s = 0.1
retry_max_s = 0.5
fence_s = {FENCE_S}
"""


def start(weed: StallableSeaweed, tmp: Path, read_timeout_s: float) -> tuple[Any, Gateway]:
    log = tmp / "gateway.log"
    if log.exists():
        runs = len(list(tmp.glob("gateway-*.log")))
        log.rename(tmp / f"gateway-{runs}.log")
    return start_plain_gateway(
        tmp, weed, backend_endpoint=weed.endpoint_url, extra_toml=gateway_toml(read_timeout_s)
    )


def body(tag: str, i: int) -> bytes:
    return hashlib.sha256(f"{tag}-{i}".encode()).digest() * (BODY_BYTES // 32)


def wait_in_flight(gw: Gateway, at_least: int, timeout_s: float = 10.0) -> None:
    """Until the drainer has at least this many uploads out (their bytes then sit in the store's sockets)."""
    deadline = time.monotonic() + timeout_s
    while gw.status()["spool"]["drain"]["in_flight"] < at_least:
        assert time.monotonic() < deadline, gw.status()["spool"]
        time.sleep(0.05)
    time.sleep(0.5)  # the bodies are small: handed to the kernel right after the request starts


def store_state(store: Any, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(store.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise


def label(data: bytes | None) -> str:
    if data is None:
        return "absent"
    for tag in ("v1", "v2"):
        if any(data == body(tag, i) for i in range(KEYS)):
            return tag
    return f"{len(data)} other bytes"


def assert_store_holds(store: Any, bucket: str, newest: dict[str, bytes | None]) -> None:
    wrong = {}
    for key, want in newest.items():
        got = store_state(store, bucket, key)
        if got != want:
            wrong[key] = f"holds {label(got)}, not {label(want)}"
    assert not wrong, f"{len(wrong)} of {len(newest)} keys do not hold the newest acknowledged state: {wrong}"
    leftover = store.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert leftover == [], leftover


def flush_durable(gw: Gateway, bucket: str) -> dict[str, Any]:
    return gw.flush(bucket, timeout_s=90)


def warm_up(gw: Gateway, bucket: str) -> Any:
    s3 = gw.client()
    s3.put_object(Bucket=bucket, Key="warmup/.keep", Body=b"")
    gw.flush(bucket, timeout_s=30)
    return s3


@pytest.mark.timeout(240)
@pytest.mark.parametrize("newer", ["delete", "put"])
@pytest.mark.parametrize("resume", ["after-restart", "before-restart"])
def test_a_drain_request_left_on_the_wire_by_a_killed_gateway_does_not_overwrite_the_newer_state(
    stallable: StallableSeaweed, store: Any, fence_bucket: str, tmp_path: Path, newer: str, resume: str
) -> None:
    bucket = fence_bucket
    proc, gw = start(stallable, tmp_path, read_timeout_s=60)
    newest: dict[str, bytes | None] = {}
    try:
        s3 = warm_up(gw, bucket)
        keys = [f"ckpt/shard-{i}.bin" for i in range(KEYS)]
        stallable.stall()
        for i, key in enumerate(keys):
            s3.put_object(Bucket=bucket, Key=key, Body=body("v1", i))
        wait_in_flight(gw, min(KEYS, 8))
        for i, key in enumerate(keys):
            if newer == "delete":
                s3.delete_object(Bucket=bucket, Key=key)
                newest[key] = None
            else:
                newest[key] = body("v2", i)
                s3.put_object(Bucket=bucket, Key=key, Body=newest[key])
        proc.kill()  # SIGKILL with the old requests in the stalled store's sockets
        proc.wait()
        if resume == "before-restart":
            stallable.resume()
        proc, gw = start(stallable, tmp_path, read_timeout_s=60)
        spool = gw.status()["spool"]
        assert spool["keys_in_doubt"] == KEYS, spool  # recovery found a drain request of each on the wire
        if resume == "after-restart":
            time.sleep(1.0)  # the restarted gateway sends the newer state into the stalled store too
            status, doc = flush_answer(gw, bucket, 0.5)
            assert status == 504 and doc["durable"] is False, doc
            stallable.resume()
        doc = flush_durable(gw, bucket)
        assert doc["durable"] is True, doc
        assert_store_holds(store, bucket, newest)
        assert gw.status()["spool"]["keys_in_doubt"] == 0
        time.sleep(2 * FENCE_S)  # nothing late comes after "durable" either
        assert_store_holds(store, bucket, newest)
    finally:
        stallable.resume()
        stop_gateway(proc)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("newer", ["delete", "put"])
def test_a_drain_request_the_drainer_gave_up_on_does_not_overwrite_the_newer_state(
    stallable: StallableSeaweed, store: Any, fence_bucket: str, tmp_path: Path, newer: str
) -> None:
    bucket = fence_bucket
    proc, gw = start(stallable, tmp_path, read_timeout_s=1.5)
    newest: dict[str, bytes | None] = {}
    try:
        s3 = warm_up(gw, bucket)
        keys = [f"ckpt/shard-{i}.bin" for i in range(KEYS)]
        stallable.stall()
        for i, key in enumerate(keys):
            s3.put_object(Bucket=bucket, Key=key, Body=body("v1", i))
        wait_in_flight(gw, min(KEYS, 8))
        for i, key in enumerate(keys):
            if newer == "delete":
                s3.delete_object(Bucket=bucket, Key=key)
                newest[key] = None
            else:
                newest[key] = body("v2", i)
                s3.put_object(Bucket=bucket, Key=key, Body=newest[key])
        time.sleep(5.0)  # the drainer times out on v1, holds the keys, then sends the newer state: also stuck
        stallable.resume()
        doc = flush_durable(gw, bucket)
        assert doc["durable"] is True, doc
        assert_store_holds(store, bucket, newest)
        time.sleep(2 * FENCE_S)
        assert_store_holds(store, bucket, newest)
    finally:
        stallable.resume()
        stop_gateway(proc)


@pytest.mark.timeout(300)
def test_randomized_crash_run_with_the_store_stalled_at_every_kill_ends_with_the_newest_state(
    stallable: StallableSeaweed, store: Any, fence_bucket: str, tmp_path: Path
) -> None:
    """The fast variant of ``python -m loadtests.spool_crash --stall``: a few kills, each while the store is
    frozen, resumed before or after the restart; the store must end with exactly what was acknowledged,
    with no multipart upload left, once flush answered durable."""
    seed = secrets.randbelow(2**31)

    def stall_store(frozen: bool) -> None:
        if frozen:
            stallable.stall()
        else:
            stallable.resume()

    report = run_crash(
        CrashConfig(
            ops=60,
            kills=5,
            seed=seed,
            max_kill_phase_s=150,
            flush_timeout_s=90,
            stall=True,
            stall_min_s=1.5,
            stall_max_s=3.0,
            fence_s=FENCE_S,
            check_each_kill=True,
        ),
        work_dir=tmp_path,
        backend_endpoint=stallable.endpoint_url,
        access_key=stallable.admin.access_key,
        secret_key=stallable.admin.secret_key,
        bucket=fence_bucket,
        backend=store,
        say=print,
        stall_store=stall_store,
    )
    summary = f"{report.summary()}\nseed {seed}; logs in {tmp_path}"
    print(summary)
    assert report.ok, summary
    assert report.stats.kills >= 5, summary
