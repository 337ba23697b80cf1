"""The fsspec path (s3fs) through the gateway with lane choices, as docs/client.md ("fsspec and s3fs") shows
them: a per-request ``x-s3lanes-lane`` hint added by an s3fs client's botocore event hook, and a rule on the
access key (an "uploader" tenant whose writes go to ``dataset``). Both keep writes out of the spool: with the
drain held, a hinted or tenant write is on the store at once, an unhinted one only in the spool."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e

UPLOADER_KEY = "AKUPLOADER0000000001"
UPLOADER_SECRET = "uploader-secret-0123456789"


@pytest.fixture
def lane_gateway(seaweed: Any, tmp_path: Any) -> Iterator[Gateway]:
    admin = seaweed.admin
    # The uploader is a gateway key of its own, re-signed towards the store as the admin identity.
    extra = f"""
[[credentials]]
access_key = "{UPLOADER_KEY}"
secret_key = "{UPLOADER_SECRET}"
backend_access_key = "{admin.access_key}"
backend_secret_key = "{admin.secret_key}"

[[rules]]
lane = "dataset"
name = "uploader"
access_keys = ["{UPLOADER_KEY}"]
operations = ["write"]
"""
    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=extra)
    try:
        yield gw
    finally:
        post(f"{gw.http_url}/_s3lanes/drain?resume=1")
        stop_and_check(proc, gw)


def post(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=120) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def s3fs_for(gw: Gateway, key: str, secret: str, lane: str | None = None) -> Any:
    fs = fsspec.filesystem(
        "s3",
        key=key,
        secret=secret,
        endpoint_url=gw.http_url,
        client_kwargs={"region_name": "us-east-1"},
        config_kwargs={"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}},
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    if lane is not None:
        fs.connect()  # creates fs.s3, the aiobotocore client, so that a hook can be registered on it

        def hint(request: Any, **_: Any) -> None:
            request.headers["x-s3lanes-lane"] = lane

        fs.s3.meta.events.register("before-sign.s3", hint)
    return fs


def on_store(backend: Any, bucket: str, key: str) -> bool:
    listed = backend.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return any(o["Key"] == key for o in listed)


def test_s3fs_writes_choose_their_lane_by_hint_or_by_access_key(
    lane_gateway: Gateway, backend: Any, bucket: str
) -> None:
    gw = lane_gateway
    assert post(f"{gw.http_url}/_s3lanes/drain?pause=1")["paused"] is True
    plain = s3fs_for(gw, gw.access_key, gw.secret_key)
    hinted = s3fs_for(gw, gw.access_key, gw.secret_key, lane="dataset")
    uploader = s3fs_for(gw, UPLOADER_KEY, UPLOADER_SECRET)
    data = {name: os.urandom(200 * 1024) for name in ("plain", "hinted", "uploader")}

    plain.pipe_file(f"{bucket}/shards/plain.tar", data["plain"])
    hinted.pipe_file(f"{bucket}/shards/hinted.tar", data["hinted"])
    with uploader.open(f"{bucket}/shards/uploader.tar", "wb") as fh:
        fh.write(data["uploader"])

    # The unhinted write is a checkpoint-lane write: acknowledged from the spool, not yet on the store.
    assert not on_store(backend, bucket, "shards/plain.tar")
    assert plain.cat_file(f"{bucket}/shards/plain.tar") == data["plain"]  # read-your-writes from the spool
    # The hinted and the tenant's writes went to `dataset`, which is not spooled: on the store already.
    for name in ("hinted", "uploader"):
        key = f"shards/{name}.tar"
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data[name]
        assert uploader.cat_file(f"{bucket}/{key}") == data[name]
    assert sorted(uploader.ls(f"{bucket}/shards", detail=False)) == [
        f"{bucket}/shards/{n}.tar" for n in ("hinted", "plain", "uploader")
    ]

    post(f"{gw.http_url}/_s3lanes/drain?resume=1")
    assert post(f"{gw.http_url}/_s3lanes/flush?bucket={bucket}&prefix=shards/&timeout=60")["durable"] is True
    assert backend.get_object(Bucket=bucket, Key="shards/plain.tar")["Body"].read() == data["plain"]
