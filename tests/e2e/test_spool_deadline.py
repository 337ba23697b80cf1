"""The spool's durability deadline end to end: a real ``s3lanes serve`` whose drain (4 MB/s) cannot put a
16 MiB object on SeaweedFS within a 2 s ``max_age_s`` says so in its status, its metrics and its log, and
stops saying so once the object is durable."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from s3lanes.__main__ import render_status
from tests.e2e.conftest import Gateway, slow_spool_toml, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def deadline_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("deadline-gateway")
    toml = slow_spool_toml(4_000_000, spool_extra="max_age_s = 2\n")
    proc, gw = start_plain_gateway(tmp, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=toml)
    try:
        yield gw
    finally:
        stop_and_check(proc, gw)


def deadline(gw: Gateway) -> dict[str, Any]:
    doc: dict[str, Any] = gw.status()["spool"]["drain"]["deadline"]
    return doc


def metrics(gw: Gateway) -> dict[str, float]:
    with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {
        name: float(value)
        for line in text.splitlines()
        if line.startswith("s3lanes_spool_")
        for name, _, value in [line.rpartition(" ")]
    }


def test_a_deadline_that_cannot_be_met_is_reported_until_the_data_is_durable(
    deadline_gateway: Gateway, bucket: str
) -> None:
    gw = deadline_gateway
    assert deadline(gw)["status"] == "ok: nothing pending"
    s3 = gw.client()
    resp = s3.put_object(Bucket=bucket, Key="ckpt/step_1/big.distcp", Body=os.urandom(16 * MiB))
    assert resp["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"
    seen: dict[str, Any] = {}
    until = time.monotonic() + 3.0
    while time.monotonic() < until:  # the keeper looks twice a second
        seen = deadline(gw)
        if seen["at_risk"]:
            break
        time.sleep(0.1)
    assert seen["at_risk"] is True, json.dumps(seen)
    assert seen["deadline_s"] == 2.0
    assert seen["backlog_bytes"] > 0
    assert str(seen["status"]).startswith("AT RISK")
    assert "  durability deadline: AT RISK" in render_status(gw.status())  # `s3lanes status`
    m = metrics(gw)
    assert m["s3lanes_spool_deadline_at_risk"] == 1.0
    assert m["s3lanes_spool_deadline_seconds"] == 2.0
    assert m["s3lanes_spool_projected_durable_seconds"] > 0
    assert "durability deadline at risk" in gw.log_path.read_text(errors="replace")
    gw.flush(bucket)
    time.sleep(0.7)
    assert deadline(gw)["at_risk"] is False
    assert metrics(gw)["s3lanes_spool_deadline_at_risk"] == 0.0
