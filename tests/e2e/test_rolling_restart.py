"""A gateway restarted under load, as a rolling update of the DaemonSet restarts each node's gateway: boto3
clients with the retry budget of docs/deploy.md ("Rolling updates") see no error, and every write the old
or the new gateway acknowledged is on the store after the restart.

The restart is the real thing: SIGTERM (readiness 503, the shutdown drain, the listener closes, in-flight
requests finish), the process exits, and a new ``s3lanes serve`` starts on the same port with the same state
directory (it replays the spool's journal). Meanwhile the clients' connections are refused: what a job on a
node sees while its gateway is away.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests.e2e.conftest import start_gateway, stop_gateway

pytestmark = pytest.mark.e2e

# The client side of a rolling update, as docs/deploy.md recommends it (scaled down: the gap here is the
# few seconds a gateway takes to restart on this machine, not a pod's reschedule).
RETRY_BUDGET = {"mode": "standard", "max_attempts": 10}
CONNECT_TIMEOUT_S = 2
READ_TIMEOUT_S = 60
RESTARTS = 2
WRITERS = 2
READERS = 2
OBJECT_BYTES = 64 * 1024
PROGRESS = 10  # PUTs and GETs acknowledged by each gateway before the next restart


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _client(url: str, seaweed: Any, retries: dict[str, Any]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=seaweed.admin.access_key,
        aws_secret_access_key=seaweed.admin.secret_key,
        region_name="us-east-1",
        config=BotoConfig(
            s3={"addressing_style": "path"},
            retries=retries,
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
        ),
    )


class _Load:
    """Writers PUT fresh checkpoint shards (spooled), readers GET known objects, until stopped."""

    def __init__(self, url: str, seaweed: Any, bucket: str, read_keys: dict[str, bytes]) -> None:
        self.url, self.seaweed, self.bucket, self.read_keys = url, seaweed, bucket, read_keys
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, str] = {}  # key -> md5 of what the gateway acknowledged
        self.reads_ok = 0
        self.retried = 0  # requests that needed at least one retry (the budget was used)
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(WRITERS)
        ] + [threading.Thread(target=self._read, args=(r,), daemon=True) for r in range(READERS)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=READ_TIMEOUT_S * 3)
            assert not t.is_alive(), "a load thread is stuck"

    def ops(self) -> tuple[int, int]:
        """PUTs and GETs acknowledged so far."""
        with self.lock:
            return len(self.acked), self.reads_ok

    def _note(self, resp: dict[str, Any]) -> None:
        if resp["ResponseMetadata"].get("RetryAttempts", 0):
            self.retried += 1

    def _write(self, w: int) -> None:
        client = _client(self.url, self.seaweed, RETRY_BUDGET)
        i = 0
        try:
            while not self.stop.is_set():
                key = f"ckpt/run1/step_{i}/shard-{w}.pt"
                body = os.urandom(OBJECT_BYTES)
                try:
                    resp = client.put_object(Bucket=self.bucket, Key=key, Body=body)
                except Exception as exc:  # every client-visible failure is the finding
                    with self.lock:
                        self.errors.append(f"PUT {key}: {exc!r}")
                    return
                with self.lock:
                    self.acked[key] = hashlib.md5(body).hexdigest()
                    self._note(resp)
                i += 1
        finally:
            client.close()

    def _read(self, r: int) -> None:
        client = _client(self.url, self.seaweed, RETRY_BUDGET)
        keys = sorted(self.read_keys)
        i = r
        try:
            while not self.stop.is_set():
                key = keys[i % len(keys)]
                try:
                    resp = client.get_object(Bucket=self.bucket, Key=key)
                    body = resp["Body"].read()
                except Exception as exc:
                    with self.lock:
                        self.errors.append(f"GET {key}: {exc!r}")
                    return
                with self.lock:
                    if body != self.read_keys[key]:
                        self.errors.append(f"GET {key}: wrong body ({len(body)} bytes)")
                        return
                    self.reads_ok += 1
                    self._note(resp)
                i += 1
        finally:
            client.close()


def _gateway_toml(tmp: Path, port: int, seaweed: Any) -> str:
    return f"""
[server]
listen = "127.0.0.1:{port}"
state_dir = "{tmp / "state"}"
shutdown_grace_s = 10
drain_on_shutdown_s = 2

[backend]
endpoint = "{seaweed.endpoint_url}"
region = "us-east-1"

[spool]
enabled = true

[[credentials]]
access_key = "{seaweed.admin.access_key}"
secret_key = "{seaweed.admin.secret_key}"
"""


def _wait_for_progress(load: _Load, at_least: int, timeout_s: float = 60.0) -> None:
    """Until ``at_least`` more PUTs *and* GETs are acknowledged. Both kinds, not their sum: a client back from
    a refused connection sleeps out botocore's backoff (up to 20 s in standard mode), and the readers alone
    would otherwise make the progress while the writers sleep, so that the next restart comes before any
    write got through the new gateway."""
    puts, gets = load.ops()
    deadline = time.monotonic() + timeout_s
    while True:
        now_puts, now_gets = load.ops()
        if now_puts >= puts + at_least and now_gets >= gets + at_least:
            return
        assert not load.errors, load.errors
        assert time.monotonic() < deadline, (
            f"the load made no progress in {timeout_s:.0f} s: {now_puts - puts} PUTs and"
            f" {now_gets - gets} GETs of {at_least} each"
        )
        time.sleep(0.05)


def _stop_clean(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    code = stop_gateway(proc, timeout_s=60.0, drain_wait_s=30.0)
    text = log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert "Traceback" not in text, text[-8000:]
    return text


def test_restart_under_load_is_invisible_to_clients_with_the_retry_budget(
    seaweed: Any, backend: Any, bucket: str, tmp_path: Path
) -> None:
    read_keys = {f"data/train-{n:04d}.tar": os.urandom(OBJECT_BYTES) for n in range(8)}
    for key, body in read_keys.items():
        backend.put_object(Bucket=bucket, Key=key, Body=body)

    port = _free_port()
    toml = _gateway_toml(tmp_path, port, seaweed)
    proc, _, log_path = start_gateway(tmp_path, toml)
    url = f"http://127.0.0.1:{port}"
    load = _Load(url, seaweed, bucket, read_keys)
    load.start()
    try:
        _wait_for_progress(load, PROGRESS)
        for _ in range(RESTARTS):
            _stop_clean(proc, log_path)
            # The gap: nothing listens on the port; the clients' connections are refused and retried.
            time.sleep(1.0)
            proc, _, log_path = start_gateway(tmp_path, toml)
            _wait_for_progress(load, PROGRESS)
    finally:
        load.finish()

    assert not load.errors, f"client-visible errors across {RESTARTS} restarts: {load.errors}"
    assert load.retried > 0, "no request needed a retry: the restarts did not reach the clients"
    print(f"{len(load.acked)} PUTs and {load.reads_ok} GETs acknowledged, {load.retried} needed retries")

    # No acknowledged write lost: every one is on the store once the (new) gateway has drained.
    flush = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "s3lanes",
                "flush",
                "--url",
                url,
                "--bucket",
                bucket,
                "--prefix",
                "ckpt/",
            ),
            *("--timeout", "120"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert flush.returncode == 0, flush.stdout + flush.stderr
    _stop_clean(proc, log_path)
    assert len(load.acked) >= (RESTARTS + 1) * PROGRESS  # writes went through every gateway
    for key, md5 in load.acked.items():
        body = backend.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.md5(body).hexdigest() == md5, f"{key}: the store does not hold the acknowledged bytes"
