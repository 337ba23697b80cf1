"""Storage pools and network planes: two SeaweedFS behind one gateway, one namespace for the clients.

The session's SeaweedFS is the default backend (datasets); a second SeaweedFS, with its own identity, is the
``ckpt`` backend, reached through a byte-counting relay that also records the source address of every
connection. ``checkpoints-*`` buckets are routed to it under another name (``prod-*``), so the tests also see
that every name in every answer is the client's. The gateway binds the ckpt backend's connections to
127.0.0.2, and its checkpoint lane's to 127.0.0.3 (network planes), which the relay sees as peers.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.handlers
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check
from tests.e2e.relay import CountingRelay

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
PLANE_ADDR = "127.0.0.2"
CHECKPOINT_PLANE_ADDR = "127.0.0.3"


@dataclass(frozen=True)
class Store:
    endpoint_url: str
    identity: SeaweedIdentity

    def client(self) -> Any:
        c = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.identity.access_key,
            aws_secret_access_key=self.identity.secret_key,
            region_name="us-east-1",
            config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )
        c.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
        return c


@dataclass(frozen=True)
class Pools:
    gw: Gateway
    proc: subprocess.Popen[bytes]
    store2: Store
    relay: CountingRelay
    datasets: str  # client name = backend name, on the default backend
    checkpoints: str  # client name, on store2 as `renamed`
    renamed: str


@pytest.fixture(scope="module")
def store2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    ident = SeaweedIdentity("ckpt", "s3lanes-test-ckpt", secrets.token_urlsafe(30))
    weed = SeaweedProcess(
        SeaweedOptions(state_dir=tmp_path_factory.mktemp("seaweed-ckpt"), identities=(ident,))
    )
    weed.start()
    try:
        yield Store(weed.endpoint_url, ident)
    finally:
        weed.stop()


@pytest.fixture(scope="module")
def pools(seaweed: Any, store2: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    port = int(store2.endpoint_url.rsplit(":", 1)[1])
    relay = CountingRelay("127.0.0.1", port)
    relay.start()
    suffix = uuid.uuid4().hex[:8]
    datasets, checkpoints, renamed = f"datasets-{suffix}", f"checkpoints-{suffix}", f"prod-{suffix}"
    extra = f"""
[backends.ckpt]
endpoint = "http://127.0.0.1:{relay.port}"
access_key = "{store2.identity.access_key}"
secret_key = "{store2.identity.secret_key}"
source_address = "{PLANE_ADDR}"
lane_source_address = {{ checkpoint = "{CHECKPOINT_PLANE_ADDR}" }}

[[routes]]
bucket = "{checkpoints}"
backend = "ckpt"
backend_bucket = "{renamed}"
"""
    tmp = tmp_path_factory.mktemp("pools-gateway")
    proc, gw = start_plain_gateway(tmp, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=extra)
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket=datasets)
        s3.create_bucket(Bucket=checkpoints)
        yield Pools(gw, proc, store2, relay, datasets, checkpoints, renamed)
        for bucket in (datasets, checkpoints):
            gw.flush(bucket)
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    s3.delete_object(Bucket=bucket, Key=obj["Key"])
            for up in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
            s3.delete_bucket(Bucket=bucket)
    finally:
        stop_and_check(proc, gw)
        relay.stop()


def names(client: Any) -> set[str]:
    return {b["Name"] for b in client.list_buckets()["Buckets"]}


def test_buckets_live_on_their_backends_under_one_namespace(pools: Pools, backend: Any) -> None:
    direct2 = pools.store2.client()
    assert pools.renamed in names(direct2) and pools.checkpoints not in names(direct2)
    assert pools.datasets in names(backend) and pools.renamed not in names(backend)
    seen = names(pools.gw.client())
    assert {pools.datasets, pools.checkpoints} <= seen
    assert pools.renamed not in seen, "a backend's own name for a routed bucket must not leak"
    # HeadBucket/Location name the client's bucket.
    pools.gw.client().head_bucket(Bucket=pools.checkpoints)
    with pytest.raises(ClientError) as info:
        pools.gw.client().head_bucket(Bucket=f"nothing-{uuid.uuid4().hex[:8]}")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_boto3_operations_work_on_both_pools(pools: Pools, backend: Any) -> None:
    s3 = pools.gw.client()
    direct2 = pools.store2.client()
    for bucket, where, backend_bucket in (
        (pools.datasets, backend, pools.datasets),
        (pools.checkpoints, direct2, pools.renamed),
    ):
        data = os.urandom(300 * 1024)
        s3.put_object(Bucket=bucket, Key="dir/small.bin", Body=data, Metadata={"k": "v"})
        pools.gw.flush(bucket)
        assert where.get_object(Bucket=backend_bucket, Key="dir/small.bin")["Body"].read() == data
        got = s3.get_object(Bucket=bucket, Key="dir/small.bin", Range="bytes=10-19")
        assert got["Body"].read() == data[10:20]
        assert s3.head_object(Bucket=bucket, Key="dir/small.bin")["Metadata"] == {"k": "v"}
        listing = s3.list_objects_v2(Bucket=bucket, Prefix="dir/", Delimiter="/")
        assert listing["Name"] == bucket
        assert [o["Key"] for o in listing["Contents"]] == ["dir/small.bin"]
        v1 = s3.list_objects(Bucket=bucket)
        assert v1["Name"] == bucket
        # Multipart: every answer names the client's bucket.
        parts = [os.urandom(5 * MiB), os.urandom(1 * MiB)]
        up = s3.create_multipart_upload(Bucket=bucket, Key="mp.bin")
        assert up["Bucket"] == bucket
        etags = [
            s3.upload_part(Bucket=bucket, Key="mp.bin", UploadId=up["UploadId"], PartNumber=i + 1, Body=p)[
                "ETag"
            ]
            for i, p in enumerate(parts)
        ]
        listed = s3.list_parts(Bucket=bucket, Key="mp.bin", UploadId=up["UploadId"])
        assert listed["Bucket"] == bucket and len(listed["Parts"]) == 2
        done = s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp.bin",
            UploadId=up["UploadId"],
            MultipartUpload={"Parts": [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]},
        )
        assert done["Bucket"] == bucket
        assert backend_bucket not in done.get("Location", "") or backend_bucket == bucket
        pools.gw.flush(bucket)
        assert where.get_object(Bucket=backend_bucket, Key="mp.bin")["Body"].read() == b"".join(parts)
        s3.delete_object(Bucket=bucket, Key="mp.bin")
        pools.gw.flush(bucket)
        assert "Contents" not in where.list_objects_v2(Bucket=backend_bucket, Prefix="mp.bin")
    # An error naming the bucket names the client's.
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=pools.checkpoints, Key="missing")
    assert info.value.response["Error"]["Code"] == "NoSuchKey"
    assert pools.renamed.encode() not in str(info.value.response).encode()


def test_s3fs_and_the_aws_cli_work_across_pools(pools: Pools, tmp_path: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=pools.gw.access_key,
        secret=pools.gw.secret_key,
        client_kwargs={"endpoint_url": pools.gw.http_url, "region_name": "us-east-1"},
        skip_instance_cache=True,
    )
    data = os.urandom(2 * MiB + 17)
    for bucket in (pools.datasets, pools.checkpoints):
        with fs.open(f"{bucket}/s3fs/blob", "wb") as fh:
            fh.write(data)
        assert fs.cat(f"{bucket}/s3fs/blob") == data
        assert fs.ls(f"{bucket}/s3fs/") == [f"{bucket}/s3fs/blob"]
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    aws(pools.gw, "s3", "cp", str(src), f"s3://{pools.checkpoints}/cli/f.bin")
    assert "f.bin" in aws(pools.gw, "s3", "ls", f"s3://{pools.checkpoints}/cli/")
    buckets = aws(pools.gw, "s3", "ls")
    assert pools.checkpoints in buckets and pools.renamed not in buckets


def aws(gw: Gateway, *args: str) -> str:
    env = {k: v for k, v in gw.env().items() if k != "AWS_CA_BUNDLE"}
    cli = str(Path(sys.executable).parent / "aws")
    proc = subprocess.run(
        [cli, "--endpoint-url", gw.http_url, *args], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return proc.stdout.decode()


def test_copy_between_backends_is_streamed_byte_exact(pools: Pools) -> None:
    s3 = pools.gw.client()
    direct2 = pools.store2.client()
    single = os.urandom(3 * MiB + 5)
    s3.put_object(
        Bucket=pools.datasets,
        Key="src/single",
        Body=single,
        ContentType="application/x-test",
        Metadata={"a": "1"},
    )
    parts = [os.urandom(5 * MiB), os.urandom(2 * MiB)]
    up = s3.create_multipart_upload(Bucket=pools.datasets, Key="src/multi")
    etags = [
        s3.upload_part(
            Bucket=pools.datasets, Key="src/multi", UploadId=up["UploadId"], PartNumber=i + 1, Body=p
        )["ETag"]
        for i, p in enumerate(parts)
    ]
    s3.complete_multipart_upload(
        Bucket=pools.datasets,
        Key="src/multi",
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]},
    )
    pools.gw.flush(pools.datasets)
    # datasets (default) -> checkpoints (ckpt): metadata copied by default.
    res = s3.copy_object(
        Bucket=pools.checkpoints,
        Key="copy/single",
        CopySource={"Bucket": pools.datasets, "Key": "src/single"},
    )
    assert res["CopyObjectResult"]["ETag"].strip('"') == hashlib.md5(single).hexdigest()
    head = direct2.head_object(Bucket=pools.renamed, Key="copy/single")
    assert head["ContentType"] == "application/x-test" and head["Metadata"] == {"a": "1"}
    assert direct2.get_object(Bucket=pools.renamed, Key="copy/single")["Body"].read() == single
    # A multipart source, metadata replaced.
    s3.copy_object(
        Bucket=pools.checkpoints,
        Key="copy/multi",
        CopySource={"Bucket": pools.datasets, "Key": "src/multi"},
        MetadataDirective="REPLACE",
        Metadata={"b": "2"},
    )
    assert direct2.get_object(Bucket=pools.renamed, Key="copy/multi")["Body"].read() == b"".join(parts)
    assert direct2.head_object(Bucket=pools.renamed, Key="copy/multi")["Metadata"] == {"b": "2"}
    # And back, from the renamed bucket to the default backend; reads through the gateway agree.
    s3.copy_object(
        Bucket=pools.datasets,
        Key="back/single",
        CopySource={"Bucket": pools.checkpoints, "Key": "copy/single"},
    )
    assert s3.get_object(Bucket=pools.datasets, Key="back/single")["Body"].read() == single
    # Within one backend, a renamed source bucket is renamed in the copy source too.
    s3.copy_object(
        Bucket=pools.checkpoints,
        Key="copy/again",
        CopySource={"Bucket": pools.checkpoints, "Key": "copy/single"},
    )
    assert direct2.get_object(Bucket=pools.renamed, Key="copy/again")["Body"].read() == single
    # Conditions on the source still hold across backends.
    with pytest.raises(ClientError) as info:
        s3.copy_object(
            Bucket=pools.checkpoints,
            Key="copy/never",
            CopySource={"Bucket": pools.datasets, "Key": "src/single"},
            CopySourceIfMatch='"0123456789abcdef0123456789abcdef"',
        )
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    # UploadPartCopy between backends: into a spooled upload the gateway holds the part itself (read from
    # the source's store), so it works; into an upload on the store itself it is refused, clearly.
    up = s3.create_multipart_upload(Bucket=pools.checkpoints, Key="copy/parts")
    first = s3.upload_part_copy(
        Bucket=pools.checkpoints,
        Key="copy/parts",
        UploadId=up["UploadId"],
        PartNumber=1,
        CopySource={"Bucket": pools.datasets, "Key": "src/single"},
    )
    s3.complete_multipart_upload(
        Bucket=pools.checkpoints,
        Key="copy/parts",
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"ETag": first["CopyPartResult"]["ETag"], "PartNumber": 1}]},
    )
    pools.gw.flush(pools.checkpoints)
    assert direct2.get_object(Bucket=pools.renamed, Key="copy/parts")["Body"].read() == single
    direct = pools.gw.client()
    direct.meta.events.register(
        "before-sign.s3.CreateMultipartUpload",
        lambda request, **_: request.headers.__setitem__("x-s3lanes-write-through", "true"),
    )
    up = direct.create_multipart_upload(Bucket=pools.checkpoints, Key="copy/direct")
    with pytest.raises(ClientError) as info:
        s3.upload_part_copy(
            Bucket=pools.checkpoints,
            Key="copy/direct",
            UploadId=up["UploadId"],
            PartNumber=1,
            CopySource={"Bucket": pools.datasets, "Key": "src/single"},
        )
    err = info.value.response
    assert (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]) == ("NotImplemented", 501)
    s3.abort_multipart_upload(Bucket=pools.checkpoints, Key="copy/direct", UploadId=up["UploadId"])


def test_source_addresses_are_seen_by_the_backend(pools: Pools) -> None:
    """Network planes on the wire: the ckpt backend sees reads from 127.0.0.2 and checkpoint drains from
    127.0.0.3, as configured, and nothing from the default source address."""
    s3 = pools.gw.client()
    before = pools.relay.bytes_by_peer()
    blob = os.urandom(4 * MiB)
    s3.put_object(Bucket=pools.checkpoints, Key="planes/ckpt.bin", Body=blob)  # checkpoint lane, spooled
    pools.gw.flush(pools.checkpoints)
    mid = pools.relay.bytes_by_peer()
    up_ckpt = mid.get(CHECKPOINT_PLANE_ADDR, (0, 0))[0] - before.get(CHECKPOINT_PLANE_ADDR, (0, 0))[0]
    assert up_ckpt >= len(blob), (before, mid)
    # A read (not the checkpoint lane): over the backend's own address.
    assert s3.get_object(Bucket=pools.checkpoints, Key="planes/ckpt.bin")["Body"].read() == blob
    s3.head_object(Bucket=pools.checkpoints, Key="planes/ckpt.bin")
    after = pools.relay.bytes_by_peer()
    assert set(after) <= {PLANE_ADDR, CHECKPOINT_PLANE_ADDR}, after
    down_plane = after.get(PLANE_ADDR, (0, 0))[1] - mid.get(PLANE_ADDR, (0, 0))[1]
    assert down_plane >= len(blob), (mid, after)


def test_each_backend_has_its_own_scheduler_and_status(pools: Pools) -> None:
    status = pools.gw.status()["pools"]
    assert status["backends"]["ckpt"]["bottleneck"] == "ckpt"
    assert status["backends"]["default"]["bottleneck"] == "default"
    assert status["backends"]["ckpt"]["routes"] == [
        {"bucket": pools.checkpoints, "backend_bucket": pools.renamed}
    ]
    assert set(status["schedulers"]) == {"default", "ckpt"}
    health = status["backends"]["ckpt"]["health"]
    assert health["state"] == "ok" and health["requests"] > 0 and health["last_ok_at"] is not None
    import urllib.request

    with urllib.request.urlopen(f"{pools.gw.http_url}/_s3lanes/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 's3lanes_pool_capacity_bytes_per_second{pool="ckpt"}' in text
    assert 's3lanes_pool_lane_rate_bytes_per_second{lane="checkpoint",pool="default"}' in text


def test_checkpoint_load_on_one_pool_is_not_charged_to_the_other(pools: Pools) -> None:
    """Separate bottlenecks, separate schedulers: checkpoint bytes drained to the ckpt pool are granted by its
    scheduler only; the default pool's checkpoint lane sees none of them."""
    s3 = pools.gw.client()

    def granted(pool: str) -> int:
        sched = pools.gw.status()["pools"]["schedulers"][pool]
        lane = next(ln for ln in sched["lanes"] if ln["name"] == "checkpoint")
        return int(lane["granted_bytes_total"])

    before = {p: granted(p) for p in ("default", "ckpt")}
    blob = os.urandom(6 * MiB)
    s3.put_object(Bucket=pools.checkpoints, Key="isolation/blob", Body=blob)
    pools.gw.flush(pools.checkpoints)
    after = {p: granted(p) for p in ("default", "ckpt")}
    assert after["ckpt"] - before["ckpt"] >= len(blob)
    assert after["default"] == before["default"]


def test_backends_declared_to_share_a_bottleneck_share_one_scheduler(seaweed: Any, tmp_path: Path) -> None:
    extra = f"""
[backends.twin]
endpoint = "{seaweed.endpoint_url}"
shares_bottleneck_with = "default"

[[routes]]
bucket = "twin-{uuid.uuid4().hex[:8]}"
backend = "twin"
"""
    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=extra)
    try:
        status = gw.status()["pools"]
        assert status["backends"]["twin"]["bottleneck"] == "default"
        assert set(status["schedulers"]) == {"default"}
    finally:
        stop_and_check(proc, gw)


def test_an_unreachable_backend_shows_as_down_in_the_status(seaweed: Any, tmp_path: Path) -> None:
    extra = f"""
[backends.gone]
endpoint = "http://127.0.0.1:9"
connect_timeout_s = 1

[[routes]]
bucket = "gone-{uuid.uuid4().hex[:8]}"
backend = "gone"
"""
    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=extra)
    try:
        bucket = extra.split('bucket = "')[1].split('"')[0]
        s3 = gw.client()
        for _ in range(5):
            with pytest.raises(ClientError) as info:
                s3.head_bucket(Bucket=bucket)
            assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        backends = gw.status()["pools"]["backends"]
        assert backends["gone"]["health"]["state"] == "down"
        assert "unreachable" in backends["gone"]["health"]["last_failure"]
        assert backends["default"]["health"]["state"] == "ok"
    finally:
        stop_and_check(proc, gw)
