"""``GatewayClient`` and ``AsyncGatewayClient`` against the real gateway and, unchanged, against plain S3 (the
session's SeaweedFS directly): lane hints inside the signature, ranges, listings, streamed multipart uploads,
seekable ranged reads, write-through, bounded failure on an unreachable endpoint."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from s3lanes_client import (
    AsyncGatewayClient,
    BucketNotFound,
    ClientConfig,
    GatewayClient,
    Lane,
    RetriesExhausted,
    RetryPolicy,
    UploadFailed,
)
from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB


def gateway_config(gw: Gateway, **kwargs: Any) -> ClientConfig:
    return ClientConfig(
        endpoint_url=gw.http_url, access_key=gw.access_key, secret_key=gw.secret_key, **kwargs
    )


def plain_s3_config(seaweed: Any, **kwargs: Any) -> ClientConfig:
    """The session SeaweedFS itself, no gateway (it mishandles Expect: 100-continue: tests/conftest.py)."""
    return ClientConfig(
        endpoint_url=seaweed.endpoint_url,
        access_key=seaweed.admin.access_key,
        secret_key=seaweed.admin.secret_key,
        expect_100_continue=False,
        **kwargs,
    )


def lane_of(response: dict[str, Any]) -> tuple[str | None, str | None]:
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    return headers.get("x-s3lanes-lane"), headers.get("x-s3lanes-lane-reason")


def test_lane_hints_per_client_and_per_call_are_signed_and_honoured(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    backend.put_object(Bucket=bucket, Key="data/x.bin", Body=b"x" * 100)
    with GatewayClient(gateway_config(gateway, lane=Lane.DATASET)) as client:

        def get(**kwargs: Any) -> tuple[str | None, str | None]:
            response = client.call("get_object", Bucket=bucket, Key="data/x.bin", **kwargs)
            response["Body"].close()
            return lane_of(response)

        assert get() == ("dataset", "hint")  # the client's default hint
        assert get(lane="restore") == ("restore", "hint")  # per call
        assert get(lane=None) == ("dataset", "default:read")  # no hint: the gateway classifies
        head = client.call("head_object", Bucket=bucket, Key="data/x.bin", lane=Lane.METADATA)
        assert lane_of(head) == ("metadata", "hint")
        raw = client.s3.head_object(Bucket=bucket, Key="data/x.bin", S3LanesLane="restore")
        assert lane_of(raw) == ("restore", "hint")  # the raw boto3 client takes the same hint
    with GatewayClient(gateway_config(gateway)) as plain:
        response = plain.call("head_object", Bucket=bucket, Key="data/x.bin")
        assert lane_of(response) == ("metadata", "default:metadata")


def test_put_get_ranges_listing_head_delete_byte_exact(gateway: Gateway, backend: Any, bucket: str) -> None:
    blobs = {f"set/{i:03d}.bin": os.urandom(1000 + i * 333) for i in range(5)}
    with GatewayClient(gateway_config(gateway)) as client:
        for key, blob in blobs.items():
            put = client.put_bytes(bucket, key, blob, lane=Lane.CHECKPOINT)
            assert put["ETag"] == f'"{hashlib.md5(blob).hexdigest()}"'
        blob = blobs["set/004.bin"]
        assert client.get_bytes(bucket, "set/004.bin") == blob
        assert client.get_bytes(bucket, "set/004.bin", start=10, end=20) == blob[10:20]
        assert client.get_bytes(bucket, "set/004.bin", start=len(blob) - 7) == blob[-7:]
        assert client.get_bytes(bucket, "set/004.bin", start=5, end=5) == b""
        listed = list(client.list_objects(bucket, "set/", page_size=2))
        assert [(o.key, o.size) for o in listed] == [(k, len(v)) for k, v in blobs.items()]
        info = client.head(bucket, "set/001.bin")
        assert info is not None and info.size == len(blobs["set/001.bin"])
        assert client.head(bucket, "set/missing") is None
        with pytest.raises(ClientError) as missing:
            client.get_bytes(bucket, "set/missing")
        assert missing.value.response["Error"]["Code"] == "NoSuchKey"
        client.delete(bucket, "set/000.bin")
        assert client.head(bucket, "set/000.bin") is None
        assert client.retries == 0


def test_write_through_put_is_on_the_backend_when_acknowledged(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    blob = os.urandom(64 * KiB)
    with GatewayClient(gateway_config(gateway)) as client:
        client.put_bytes(bucket, "ckpt/wt/model.pt", blob, lane=Lane.CHECKPOINT, write_through=True)
    assert backend.get_object(Bucket=bucket, Key="ckpt/wt/model.pt")["Body"].read() == blob


def test_multipart_writer_streams_parallel_parts_and_reader_seeks(gateway: Gateway, bucket: str) -> None:
    blob = os.urandom(13 * MiB)
    with GatewayClient(gateway_config(gateway)) as client:
        with client.open_writer(bucket, "big/obj.bin", part_size_bytes=5 * MiB, max_inflight_parts=2) as w:
            step = MiB + 7
            for at in range(0, len(blob), step):
                w.write(memoryview(blob)[at : at + step])
            assert w.tell() == len(blob)
        assert w.etag is not None and w.etag.endswith("-3")  # 5 + 5 + 3 MiB
        head = client.head(bucket, "big/obj.bin")
        assert head is not None and head.size == len(blob) and head.etag == w.etag
        assert client.get_bytes(bucket, "big/obj.bin") == blob
        with client.open_reader(bucket, "big/obj.bin", block_bytes=MiB) as r:
            assert r.read(10) == blob[:10]
            r.seek(7 * MiB + 3)
            assert r.read(100) == blob[7 * MiB + 3 : 7 * MiB + 103]
            r.seek(-50, os.SEEK_END)
            assert r.read() == blob[-50:]
            r.seek(2 * MiB)
            assert r.read(3 * MiB) == blob[2 * MiB : 5 * MiB]  # larger than a block: one direct ranged GET


def test_small_writer_object_is_a_single_put(gateway: Gateway, bucket: str) -> None:
    with GatewayClient(gateway_config(gateway)) as client:
        with client.open_writer(bucket, "small.bin", part_size_bytes=5 * MiB) as w:
            w.write(b"hello ")
            w.write(b"world")
        assert w.etag == hashlib.md5(b"hello world").hexdigest()
        assert client.get_bytes(bucket, "small.bin") == b"hello world"


def test_multipart_writer_aborts_on_error_and_leaves_nothing(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    with GatewayClient(gateway_config(gateway)) as client:
        with (
            pytest.raises(RuntimeError, match="producer failed"),
            client.open_writer(bucket, "broken.bin", part_size_bytes=5 * MiB) as w,
        ):
            w.write(os.urandom(11 * MiB))  # two parts uploaded or in flight
            raise RuntimeError("producer failed")
        assert client.head(bucket, "broken.bin") is None
        w.close()  # closing an aborted writer does not commit it
        assert client.head(bucket, "broken.bin") is None
        # A part that fails (here: the bucket is gone) aborts the whole upload with a clear error.
        with (
            pytest.raises(UploadFailed, match="no-such-bucket-s3lanes"),
            client.open_writer("no-such-bucket-s3lanes", "x.bin", part_size_bytes=5 * MiB) as w,
        ):
            w.write(os.urandom(6 * MiB))
    assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_the_same_client_works_unchanged_against_plain_s3(seaweed: Any, backend: Any, bucket: str) -> None:
    blob = os.urandom(11 * MiB)
    with GatewayClient(plain_s3_config(seaweed, lane=Lane.DATASET)) as client:
        client.put_bytes(bucket, "p/small.bin", b"abc", lane=Lane.CHECKPOINT, write_through=True)
        with client.open_writer(bucket, "p/big.bin", part_size_bytes=5 * MiB) as w:
            w.write(blob)
        assert client.get_bytes(bucket, "p/big.bin", start=MiB, end=MiB + 10) == blob[MiB : MiB + 10]
        assert [o.key for o in client.list_objects(bucket, "p/")] == ["p/big.bin", "p/small.bin"]
        started = time.monotonic()
        status = client.wait_durable(bucket, "p/", timeout_s=30)
        assert status.durable and not status.gateway
        assert time.monotonic() - started < 2
    assert backend.get_object(Bucket=bucket, Key="p/big.bin")["Body"].read() == blob


async def test_async_client_against_the_gateway_and_plain_s3(
    gateway: Gateway, seaweed: Any, backend: Any, bucket: str
) -> None:
    blob = os.urandom(300 * KiB)
    async with AsyncGatewayClient(gateway_config(gateway, lane=Lane.DATASET)) as client:
        await client.put_bytes(bucket, "a/x.bin", blob, lane=Lane.CHECKPOINT)
        assert await client.get_bytes(bucket, "a/x.bin") == blob
        assert await client.get_bytes(bucket, "a/x.bin", start=100, end=200) == blob[100:200]
        response = await client.call("get_object", Bucket=bucket, Key="a/x.bin", lane=Lane.RESTORE)
        async with response["Body"] as stream:
            assert await stream.read() == blob
        assert lane_of(response) == ("restore", "hint")
        assert [o.key async for o in client.list_objects(bucket, "a/")] == ["a/x.bin"]
        info = await client.head(bucket, "a/x.bin")
        assert info is not None and info.size == len(blob)
        assert await client.head(bucket, "a/none") is None
    async with AsyncGatewayClient(plain_s3_config(seaweed)) as plain:
        assert await plain.get_bytes(bucket, "a/x.bin", start=0, end=10) == blob[:10]
        status = await plain.wait_durable(bucket, "a/", timeout_s=30)
        assert status.durable and not status.gateway
        await plain.delete(bucket, "a/x.bin")
    assert backend.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_an_unreachable_endpoint_fails_within_the_bound() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = RetryPolicy(total_timeout_s=1.5, base_delay_s=0.05, max_delay_s=0.2)
    config = ClientConfig(
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key="AK",
        secret_key="SK",
        retry=policy,
        connect_timeout_s=1.0,
    )
    # The documented bound (docs/client.md): no retry starts past total_timeout_s from the first attempt,
    # so the call fails at most total_timeout_s plus one attempt's own duration after it started; an attempt
    # that cannot connect lasts at most connect_timeout_s. The slack is for a loaded machine's scheduling
    # (not a part of the bound). Only the call is timed: building the boto3 client is not the retry loop's.
    bound_s = policy.total_timeout_s + config.connect_timeout_s
    slack_s = 1.0
    with GatewayClient(config) as client:
        started = time.monotonic()
        with pytest.raises(RetriesExhausted) as info:
            client.get_bytes("b", "k")
        elapsed = time.monotonic() - started
    assert elapsed < bound_s + slack_s, f"{elapsed:.2f} s against a bound of {bound_s:g} s"
    assert info.value.last_failure.code == "EndpointConnectionError"
    assert info.value.attempts >= 3


def test_wait_durable_on_a_missing_bucket_raises_bucket_not_found(
    spool_gateway: Gateway, bucket: str
) -> None:
    missing = f"{bucket}-missing"
    with GatewayClient(gateway_config(spool_gateway)) as client:
        assert client.wait_durable(bucket, "", timeout_s=10).durable  # an existing bucket is fine
        with pytest.raises(BucketNotFound) as info:
            client.wait_durable(missing, "ckpt/", timeout_s=10)
    assert isinstance(info.value, LookupError) and info.value.bucket == missing
    assert info.value.code == "NoSuchBucket"
    assert f"s3://{missing}" in str(info.value) and "no such bucket" in str(info.value)


async def test_async_wait_durable_on_a_missing_bucket_raises_bucket_not_found(
    spool_gateway: Gateway, bucket: str
) -> None:
    async with AsyncGatewayClient(gateway_config(spool_gateway)) as client:
        with pytest.raises(BucketNotFound):
            await client.wait_durable(f"{bucket}-missing", "", timeout_s=10)
