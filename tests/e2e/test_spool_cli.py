"""Operator commands around the spool: `s3lanes flush`, `s3lanes status`, a refused damaged journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from s3lanes.core.journal import encode_batch, file_header
from tests.e2e.conftest import Gateway, start_gateway

pytestmark = pytest.mark.e2e


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "s3lanes", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_flush_command_waits_until_the_backend_has_the_data(
    spool_gateway: Gateway, backend: Any, bucket: str
) -> None:
    s3 = spool_gateway.client()
    data = os.urandom(3 * 1024 * 1024)
    put = s3.put_object(Bucket=bucket, Key="ckpt/step-1/model.pt", Body=data)
    assert put["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"

    done = cli(
        "flush", "--url", spool_gateway.http_url, "--bucket", bucket, "--prefix", "ckpt/", "--timeout", "60"
    )
    assert done.returncode == 0, done.stderr
    assert "durable" in done.stdout
    assert backend.get_object(Bucket=bucket, Key="ckpt/step-1/model.pt")["Body"].read() == data


def test_flush_command_signs_when_credentials_are_set(spool_gateway: Gateway, bucket: str) -> None:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID=spool_gateway.access_key, AWS_SECRET_ACCESS_KEY=spool_gateway.secret_key)
    done = cli("flush", "--url", spool_gateway.http_url, "--bucket", bucket, env=env)
    assert done.returncode == 0, done.stderr
    env["AWS_SECRET_ACCESS_KEY"] = "wrong-secret"
    # A bad signature is not an authorization failure for a loopback peer (loopback may flush unsigned),
    # so the command still works here; what matters is that signing does not break it.
    assert cli("flush", "--url", spool_gateway.http_url, "--bucket", bucket, env=env).returncode == 0


def test_flush_command_reports_an_unreachable_gateway() -> None:
    done = cli("flush", "--url", "http://127.0.0.1:9", "--bucket", "b", "--timeout", "1")
    assert done.returncode == 1
    assert "cannot reach" in done.stderr


def test_status_command_shows_the_spool(spool_gateway: Gateway) -> None:
    out = cli("status", "--url", spool_gateway.http_url)
    assert out.returncode == 0, out.stderr
    assert "Write spool " in out.stdout and "Pending objects: " in out.stdout


def test_a_damaged_journal_stops_the_gateway_loudly(seaweed: Any, tmp_path: Path) -> None:
    spool_dir = tmp_path / "state" / "spool"
    (spool_dir / "data").mkdir(parents=True)
    records = [
        {"t": "mpu", "seq": i, "u": f"s3lanes-{i}", "b": "b", "k": "k", "m": [], "ak": "a", "at": 1.0}
        for i in range(1, 4)
    ]
    good = file_header() + encode_batch(records)
    damaged = bytearray(good)
    damaged[len(file_header()) + 12] ^= 0xFF  # inside the first frame; two good frames follow
    (spool_dir / "journal").write_bytes(bytes(damaged))
    admin = seaweed.admin
    toml = f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp_path / "state"}"

[backend]
endpoint = "{seaweed.endpoint_url}"

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""
    with pytest.raises(RuntimeError) as exc:
        start_gateway(tmp_path, toml)
    log = (tmp_path / "gateway.log").read_text()
    assert "journal is damaged" in log, log
    assert "Refusing to start" in log
    assert "Unclosed" not in log, log  # the backend sessions were closed before the exit
    # Nothing was rewritten: the operator still has the evidence.
    assert (spool_dir / "journal").read_bytes() == bytes(damaged)
    assert "did not start" in str(exc.value)
