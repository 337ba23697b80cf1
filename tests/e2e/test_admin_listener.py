"""``[server] admin_listen``: /metrics and /_s3lanes/* on their own listener, not on the S3 one (except the
signed durability API, POST /_s3lanes/flush); without it all share the S3 listener (the other tests)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e


def http(url: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def split_gateway(seaweed: Any, tmp_path: Path) -> Iterator[tuple[Gateway, str]]:
    proc, gw = start_plain_gateway(
        tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, server_toml='admin_listen = "127.0.0.1:0"'
    )
    try:
        admin_url = json.loads((tmp_path / "ready.json").read_text())["admin"]
        assert admin_url and admin_url != gw.http_url
        yield gw, admin_url
    finally:
        stop_and_check(proc, gw)


def test_admin_endpoints_answer_on_the_admin_listener(split_gateway: tuple[Gateway, str]) -> None:
    _, admin = split_gateway
    status, text = http(f"{admin}/metrics")
    assert status == 200 and "s3lanes_build_info" in text
    for path in ("/_s3lanes/healthz", "/_s3lanes/readyz", "/_s3lanes/status", "/_s3lanes/metrics"):
        status, _ = http(f"{admin}{path}")
        assert status == 200, path
    assert "spool" in json.loads(http(f"{admin}/_s3lanes/status")[1])
    status, text = http(f"{admin}/some-bucket/some-key")  # no S3 on the admin listener
    assert status == 404 and "admin listener" in text


def test_the_s3_listener_no_longer_serves_them_but_keeps_s3_and_flush(
    split_gateway: tuple[Gateway, str], unique_bucket: str
) -> None:
    gw, _ = split_gateway
    status, text = http(f"{gw.http_url}/metrics")  # ListObjects of a bucket "metrics", unsigned: an S3 error
    assert status != 200 and "<Error>" in text and "s3lanes_build_info" not in text
    for path in ("/_s3lanes/healthz", "/_s3lanes/readyz", "/_s3lanes/status", "/_s3lanes/metrics"):
        status, text = http(f"{gw.http_url}{path}")
        assert status >= 400 and "<Error>" in text, (path, status, text)
    status, text = http(f"{gw.http_url}/_s3lanes/drain?pause=1", method="POST")
    assert status >= 400 and "<Error>" in text
    s3 = gw.client()
    s3.put_object(Bucket=unique_bucket, Key="ckpt/a", Body=b"a")
    assert s3.get_object(Bucket=unique_bucket, Key="ckpt/a")["Body"].read() == b"a"
    status, text = http(f"{gw.http_url}/_s3lanes/flush?bucket={unique_bucket}&timeout=30", method="POST")
    assert status == 200 and json.loads(text)["durable"] is True
