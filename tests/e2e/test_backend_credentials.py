"""The backend identity from the AWS credential chain, end to end: a real ``s3lanes serve`` in front of the
session's SeaweedFS, with ``[backend] credential_source = "aws"`` and its credentials served by a container
credentials endpoint (the ECS / EKS Pod Identity protocol) that this test runs on loopback. The endpoint
hands out keys SeaweedFS knows, alternating between its two identities, each valid for a few seconds, so the
gateway must refresh them during a drain that lasts longer than that.

SeaweedFS refuses any ``X-Amz-Security-Token`` it did not issue itself (its own STS), so the endpoint hands
out an empty token; that a session token is sent and signed is pinned in tests/runtime/test_credentials.py.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, slow_spool_toml, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
LIFETIME_S = 4.0  # each handed-out key pair expires this long after it is handed out

# Everything in the chain ahead of the container provider (and instance metadata after it) switched off.
_CHAIN_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)


class CredentialsEndpoint:
    """A container credentials endpoint: every GET hands out the next key pair of ``pairs``, in turn."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs
        self.handed_out: list[str] = []  # access keys, in order
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._lock:
                    access_key, secret_key = outer.pairs[len(outer.handed_out) % len(outer.pairs)]
                    outer.handed_out.append(access_key)
                expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=LIFETIME_S)
                body = json.dumps(
                    {
                        "AccessKeyId": access_key,
                        "SecretAccessKey": secret_key,
                        "Token": "",
                        "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v2/credentials"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CredentialsEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def calls(self) -> int:
        with self._lock:
            return len(self.handed_out)


def hold_drain(gw: Gateway, pause: bool) -> None:
    req = urllib.request.Request(
        f"{gw.http_url}/_s3lanes/drain?{'pause' if pause else 'resume'}=1", method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.loads(resp.read()) == {"paused": pause}


@pytest.fixture
def chain_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment the gateway subprocess inherits: nothing of the AWS chain but what a test sets."""
    for name in _CHAIN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield


def test_a_drain_keeps_working_while_the_backend_credentials_rotate(
    seaweed: Any, unique_bucket: str, tmp_path: Path, chain_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = [
        (seaweed.admin.access_key, seaweed.admin.secret_key),
        (seaweed.user2.access_key, seaweed.user2.secret_key),
    ]
    with CredentialsEndpoint(pairs) as endpoint:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url)
        # 12 MiB drained at 2 MB/s: about 6 s, longer than one key pair lives.
        toml = 'credential_source = "aws"\n' + slow_spool_toml(2_000_000)
        proc, gw = start_plain_gateway(
            tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=toml
        )
        try:
            bodies = {f"ckpt/step_7/shard-{i}.distcp": os.urandom(4 * MiB) for i in range(3)}
            hold_drain(gw, True)  # the whole drain happens after the writes, however slow they are
            client = gw.client()
            try:
                for key, body in bodies.items():
                    resp = client.put_object(Bucket=unique_bucket, Key=key, Body=body)
                    assert resp["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"
            finally:
                client.close()
            assert gw.status()["spool"]["pending_objects"] == len(bodies)
            calls_at_ack = endpoint.calls()
            hold_drain(gw, False)
            doc = gw.flush(unique_bucket, timeout_s=120)
            assert doc["durable"]
            assert endpoint.calls() >= calls_at_ack + 2, (calls_at_ack, endpoint.handed_out)
            # Both identities were current at some point of the drain (the pairs alternate).
            assert set(endpoint.handed_out[calls_at_ack:]) == {p[0] for p in pairs}
            direct = s3_client(seaweed)
            try:
                for key, body in bodies.items():
                    assert direct.get_object(Bucket=unique_bucket, Key=key)["Body"].read() == body
            finally:
                direct.close()
            log = gw.log_path.read_text(errors="replace")
            assert "credentials from the AWS chain (container-role" in log, log[-3000:]
            assert "credentials rotated" in log
            status = gw.status()["pools"]["backends"]["default"]["credentials"]
            assert status["source"] == "aws" and status["method"] == "container-role"
            assert status["refreshes"] >= 3
        finally:
            stop_and_check(proc, gw)


def test_no_credentials_in_the_chain_is_one_clear_line_and_exit_code_2(
    seaweed: Any, tmp_path: Path, chain_env: None
) -> None:
    cfg = tmp_path / "s3lanes.toml"
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp_path / "state"}"

[backend]
endpoint = "{seaweed.endpoint_url}"
credential_source = "aws"

[[credentials]]
access_key = "client-key"
secret_key = "client-secret"
"""
    )
    out = subprocess.run(
        [sys.executable, "-m", "s3lanes", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "Unclosed" not in out.stderr, out.stderr
    assert "s3lanes: [backend] credential_source = 'aws': no AWS credentials found" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
