"""The gateway under test: a real ``s3lanes serve`` process in front of the session's SeaweedFS.

It runs as a subprocess (as users run it), with an HTTP and an HTTPS listener on free loopback ports. The
HTTPS certificate comes from a throw-away CA made by trustme; clients trust it through ``ca_bundle``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import trustme
from botocore.config import Config as BotoConfig

from loadtests.harness.gateway import spawn, wait_ready
from tests.conftest import s3_client

GATEWAY_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Gateway:
    http_url: str
    https_url: str
    ca_bundle: str
    access_key: str
    secret_key: str
    user2_access_key: str
    user2_secret_key: str
    backend_url: str
    pid: int
    log_path: Path

    def client(
        self, *, https: bool = False, secret: str | None = None, access_key: str | None = None, **config: Any
    ) -> Any:
        """A boto3 S3 client pointed at the gateway (HTTPS makes botocore use aws-chunked uploads).

        ``access_key``/``secret`` override the admin key pair (e.g. user2's, or a wrong secret)."""
        cfg = BotoConfig(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
            **config,
        )
        return boto3.client(
            "s3",
            endpoint_url=self.https_url if https else self.http_url,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret or self.secret_key,
            region_name="us-east-1",
            verify=self.ca_bundle if https else None,
            config=cfg,
        )

    def flush(self, bucket: str, prefix: str = "", timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait until what the gateway spooled under bucket/prefix is on the backend (no-op without a spool).

        Tests call this before looking at the backend directly."""
        query = urllib.parse.urlencode({"bucket": bucket, "prefix": prefix, "timeout": str(timeout_s)})
        req = urllib.request.Request(f"{self.http_url}/_s3lanes/flush?{query}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s + 30) as resp:
                doc: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read())
            # A bucket already deleted, with nothing of it in the spool: nothing to wait for.
            assert exc.code == 404 and doc["pending_objects"] == 0, (exc.code, doc)
            return doc
        assert doc["durable"], doc
        return doc

    def drain_paused(self, paused: bool) -> None:
        """Pause (or resume) the spool's drain: what is spooled meanwhile stays in the spool, whatever the
        machine's load. A flush waits for the drain, so resume it first."""
        which = "pause" if paused else "resume"
        req = urllib.request.Request(f"{self.http_url}/_s3lanes/drain?{which}=1", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read()) == {"paused": paused}

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http_url}/_s3lanes/status", timeout=30) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc

    def env(self) -> dict[str, str]:
        """Environment for CLI tools (aws) talking to the gateway."""
        env = dict(os.environ)
        env.update(
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            AWS_DEFAULT_REGION="us-east-1",
            AWS_CA_BUNDLE=self.ca_bundle,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )
        return env


def start_gateway(
    tmp: Path, config_toml: str, *, extra_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], dict[str, Any], Path]:
    cfg_path = tmp / "s3lanes.toml"
    cfg_path.write_text(config_toml)
    ready = tmp / "ready.json"
    ready.unlink(missing_ok=True)  # a previous gateway's, in a reused directory
    log_path = tmp / "gateway.log"
    argv = [sys.executable, "-m", "s3lanes", "serve", "--config", str(cfg_path), "--ready-file", str(ready)]
    proc = spawn([*argv, *extra_args], log_path, cwd=None, new_session=False)
    try:
        doc = wait_ready(
            proc, ready, log_path, GATEWAY_START_TIMEOUT_S, "gateway", error=RuntimeError, poll_s=0.05
        )
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, doc, log_path


def start_plain_gateway(
    tmp: Path, seaweed: Any, *, backend_endpoint: str, extra_toml: str = "", server_toml: str = ""
) -> tuple[subprocess.Popen[bytes], Gateway]:
    """A second gateway (HTTP only, the admin identity) with extra config sections, for tests that need
    settings the session gateway does not have. ``extra_toml`` goes inside ``[backend]`` (and may open
    further sections), ``server_toml`` inside ``[server]``. The caller stops it with :func:`stop_gateway`."""
    admin = seaweed.admin
    toml = f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp / "state"}"
shutdown_grace_s = 5
{server_toml}

[backend]
endpoint = "{backend_endpoint}"
{extra_toml}

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""
    proc, ready, log_path = start_gateway(tmp, toml)
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
    return proc, gw


def slow_spool_toml(rate_bps: int, *, drain_concurrency: int = 2, spool_extra: str = "") -> str:
    """``extra_toml`` for :func:`start_plain_gateway`: a spooling gateway whose drain runs at ``rate_bps``.

    Small scheduler chunks and burst so the drain is paced from its first byte; a small per-request cost so
    that listings are not queued ~0.1 s each behind the drain (the metadata lane's share of a few MB/s); a
    latency target the 2-core machine cannot miss by CPU contention alone (see test_lanes.py), so the
    guard does not cut the checkpoint lane to its floor."""
    return f"""
bandwidth = "{rate_bps}"

[scheduler]
latency_target_ms = 2000
request_cost_bytes = "4KiB"
chunk_bytes = "256KiB"
burst_bytes = "256KiB"

[spool]
drain_concurrency = {drain_concurrency}
{spool_extra}"""


def stop_and_check(proc: subprocess.Popen[bytes], gw: Gateway) -> None:
    """Stop a gateway; it must exit 0 without having logged a traceback."""
    code = stop_gateway(proc)
    text = gw.log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert "Traceback" not in text, text[-8000:]


def stop_gateway(proc: subprocess.Popen[bytes], timeout_s: float = 30.0, drain_wait_s: float = 10.0) -> int:
    """SIGTERM; after ``drain_wait_s`` a second SIGTERM (the gateway then skips the rest of its shutdown
    drain: the spool keeps what is left for the next start); SIGKILL after ``timeout_s`` in all."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(min(drain_wait_s, timeout_s))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(max(0.0, timeout_s - drain_wait_s))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode


@pytest.fixture(scope="session")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1", "*.localhost")
    ca_path, cert_path, key_path = d / "ca.pem", d / "cert.pem", d / "key.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.private_key_pem.write_to_path(str(key_path))
    with open(cert_path, "wb") as fh:
        for blob in cert.cert_chain_pems:
            fh.write(blob.bytes())
    return ca_path, cert_path, key_path


@pytest.fixture(scope="session")
def gateway(
    seaweed: Any, tls_ca: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The session gateway without a write spool: every request is proxied to the backend."""
    yield from _session_gateway(seaweed, tls_ca, tmp_path_factory.mktemp("gateway"), spool=False)


@pytest.fixture(scope="session")
def spool_gateway(
    seaweed: Any, tls_ca: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The session gateway with its write spool on (the default): checkpoint-lane writes are absorbed."""
    yield from _session_gateway(seaweed, tls_ca, tmp_path_factory.mktemp("spool-gateway"), spool=True)


def _session_gateway(
    seaweed: Any, tls_ca: tuple[Path, Path, Path], tmp: Path, *, spool: bool
) -> Iterator[Gateway]:
    ca_path, cert_path, key_path = tls_ca
    admin, user2 = seaweed.admin, seaweed.user2
    toml = f"""
[server]
listen = "127.0.0.1:0"
https_listen = "127.0.0.1:0"
tls_cert = "{cert_path}"
tls_key = "{key_path}"
domains = ["localhost"]
state_dir = "{tmp / "state"}"
log_level = "INFO"
shutdown_grace_s = 5

[backend]
endpoint = "{seaweed.endpoint_url}"
region = "us-east-1"
connect_timeout_s = 2
read_timeout_s = 30

[spool]
enabled = {"true" if spool else "false"}

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"

[[credentials]]
access_key = "{user2.access_key}"
secret_key = "{user2.secret_key}"
"""
    proc, ready, log_path = start_gateway(tmp, toml)
    http_url = next(u for u in ready["endpoints"] if u.startswith("http://"))
    https_url = next(u for u in ready["endpoints"] if u.startswith("https://")).replace(
        "127.0.0.1", "localhost"
    )
    gw = Gateway(
        http_url=http_url,
        https_url=https_url,
        ca_bundle=str(ca_path),
        access_key=admin.access_key,
        secret_key=admin.secret_key,
        user2_access_key=user2.access_key,
        user2_secret_key=user2.secret_key,
        backend_url=seaweed.endpoint_url,
        pid=proc.pid,
        log_path=log_path,
    )
    try:
        yield gw
    finally:
        code = stop_gateway(proc)
        log_text = log_path.read_text(errors="replace")
        assert code == 0, f"gateway exited with {code}:\n{log_text[-4000:]}"
        assert "Traceback" not in log_text, f"gateway logged a traceback:\n{log_text[-8000:]}"


@pytest.fixture(scope="session")
def backend(seaweed: Any) -> Iterator[Any]:
    """A boto3 client straight to SeaweedFS (admin identity), bypassing the gateway: the ground truth for
    "what was stored", and how tests set up and check state independently of the gateway."""
    client = s3_client(seaweed)
    try:
        yield client
    finally:
        client.close()


def new_bucket_name() -> str:
    return f"e2e-{secrets.token_hex(6)}"


@pytest.fixture
def bucket(unique_bucket: str) -> str:
    """A fresh empty bucket, created on the backend directly (so a gateway bug cannot hide in the setup)."""
    return unique_bucket
