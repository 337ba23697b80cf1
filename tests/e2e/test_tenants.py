"""Tenants: a restricted access key reaches only its grants and its lanes, and a refused request never
reaches the backend (a byte-counting relay between the gateway and SeaweedFS sees nothing)."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check
from tests.e2e.relay import CountingRelay

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Setup:
    gw: Gateway
    proc: subprocess.Popen[bytes]
    relay: CountingRelay
    bucket: str

    def user(self) -> Any:
        return self.gw.client(access_key=self.gw.user2_access_key, secret=self.gw.user2_secret_key)

    def backend_bytes(self) -> int:
        return sum(up + down for up, down in self.relay.bytes_by_peer().values())


@pytest.fixture(scope="module")
def setup(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    port = int(seaweed.endpoint_url.rsplit(":", 1)[1])
    relay = CountingRelay("127.0.0.1", port)
    relay.start()
    bucket = f"tenants-{uuid.uuid4().hex[:8]}"
    user2 = seaweed.user2
    extra = f"""
[tenants.{user2.access_key}]
lanes = ["dataset", "checkpoint", "metadata"]
read = ["{bucket}/public/", "{bucket}/ckpt/job-42/"]
write = ["{bucket}/ckpt/job-42/"]

[[credentials]]
access_key = "{user2.access_key}"
secret_key = "{user2.secret_key}"
"""
    tmp = tmp_path_factory.mktemp("tenants-gateway")
    proc, gw = start_plain_gateway(
        tmp, seaweed, backend_endpoint=f"http://127.0.0.1:{relay.port}", extra_toml=extra
    )
    gw = Gateway(
        **{**gw.__dict__, "user2_access_key": user2.access_key, "user2_secret_key": user2.secret_key}
    )
    admin = gw.client()
    # Set up on the store directly: writes through the gateway would teach its classifier that public/ takes
    # checkpoint writes (reads there would then be the restore lane).
    direct = s3_client(seaweed)
    try:
        direct.create_bucket(Bucket=bucket)
        direct.put_object(Bucket=bucket, Key="public/readme.txt", Body=b"hello")
        direct.put_object(Bucket=bucket, Key="public/model.pt", Body=b"weights")
        direct.put_object(Bucket=bucket, Key="ckpt/job-7/secret", Body=b"not yours")
        yield Setup(gw, proc, relay, bucket)
        gw.flush(bucket)
        for page in admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                admin.delete_object(Bucket=bucket, Key=obj["Key"])
        admin.delete_bucket(Bucket=bucket)
    finally:
        direct.close()
        stop_and_check(proc, gw)
        relay.stop()


def denied(call: Any) -> None:
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    assert (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]) == ("AccessDenied", 403), err


def test_granted_requests_work(setup: Setup) -> None:
    s3 = setup.user()
    b = setup.bucket
    s3.put_object(Bucket=b, Key="ckpt/job-42/step-1/shard-0", Body=b"mine")
    s3.put_object(Bucket=b, Key="ckpt/job-42/model.pt", Body=b"weights")
    # Reading a .pt back is the restore lane (a default rule), which this key may not use; hinted into a lane
    # it may use, the same read is granted (lanes are about service, grants about data).
    denied(lambda: s3.get_object(Bucket=b, Key="ckpt/job-42/model.pt"))
    hinted = setup.user()
    hinted.meta.events.register(
        "before-sign.s3.GetObject",
        lambda request, **_: request.headers.__setitem__("x-s3lanes-lane", "dataset"),
    )
    assert hinted.get_object(Bucket=b, Key="ckpt/job-42/model.pt")["Body"].read() == b"weights"
    listed = s3.list_objects_v2(Bucket=b, Prefix="ckpt/job-42/")
    assert [o["Key"] for o in listed["Contents"]] == ["ckpt/job-42/model.pt", "ckpt/job-42/step-1/shard-0"]
    assert s3.get_object(Bucket=b, Key="public/readme.txt")["Body"].read() == b"hello"
    s3.copy_object(Bucket=b, Key="ckpt/job-42/readme", CopySource={"Bucket": b, "Key": "public/readme.txt"})
    s3.delete_object(Bucket=b, Key="ckpt/job-42/readme")


def test_everything_else_is_refused_before_the_backend(setup: Setup) -> None:
    s3 = setup.user()
    b = setup.bucket
    before = setup.backend_bytes()
    denied(lambda: s3.get_object(Bucket=b, Key="ckpt/job-7/secret"))
    denied(lambda: s3.put_object(Bucket=b, Key="public/defaced.txt", Body=b"x"))
    denied(lambda: s3.put_object(Bucket=b, Key="ckpt/job-7/overwrite", Body=b"x"))
    denied(lambda: s3.list_objects_v2(Bucket=b))
    denied(lambda: s3.list_objects_v2(Bucket=b, Prefix="ckpt/"))
    denied(lambda: s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "public/readme.txt"}]}))
    denied(lambda: s3.list_buckets())
    denied(lambda: s3.create_bucket(Bucket=f"{b}-mine"))
    denied(lambda: s3.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Enabled"}))
    denied(
        lambda: s3.copy_object(
            Bucket=b, Key="ckpt/job-42/stolen", CopySource={"Bucket": b, "Key": "ckpt/job-7/secret"}
        )
    )
    # Lanes: a hint for a lane this key may not use, and a read the defaults put in the restore lane.
    hinted = setup.user()
    hinted.meta.events.register(
        "before-sign.s3.GetObject",
        lambda request, **_: request.headers.__setitem__("x-s3lanes-lane", "restore"),
    )
    denied(lambda: hinted.get_object(Bucket=b, Key="public/readme.txt"))
    denied(lambda: s3.get_object(Bucket=b, Key="public/model.pt"))
    assert setup.backend_bytes() == before, "a refused request reached the backend"
    # The admin key is not restricted.
    assert setup.gw.client().get_object(Bucket=b, Key="ckpt/job-7/secret")["Body"].read() == b"not yours"


def test_presigned_urls_follow_the_same_grants(setup: Setup) -> None:
    # botocore presigns with SigV2 unless told otherwise.
    s3 = setup.gw.client(
        access_key=setup.gw.user2_access_key, secret=setup.gw.user2_secret_key, signature_version="s3v4"
    )
    b = setup.bucket
    ok = s3.generate_presigned_url(
        "get_object", Params={"Bucket": b, "Key": "public/readme.txt"}, ExpiresIn=300
    )
    with urllib.request.urlopen(ok, timeout=10) as resp:
        assert resp.read() == b"hello"
    before = setup.backend_bytes()
    for key in ("ckpt/job-7/secret", "public/model.pt"):
        url = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": key}, ExpiresIn=300)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=10)
        with info.value as err:
            assert err.code == 403
            assert b"<Code>AccessDenied</Code>" in err.read()
    put = s3.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "public/x"}, ExpiresIn=300)
    req = urllib.request.Request(put, data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    with info.value as err:
        assert err.code == 403
    assert setup.backend_bytes() == before
