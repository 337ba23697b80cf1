"""boto3 through the gateway, over HTTP and HTTPS, against a real SeaweedFS: every operation comes back
byte-exact, and what the backend stored (read straight from SeaweedFS) is what the client sent.

Over HTTP botocore signs the payload (hex SHA-256, Content-Length); over HTTPS it sends aws-chunked
``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` bodies with a CRC32 trailer and no Content-Length. Both paths of the
gateway's body pipeline are therefore covered by the same tests (``scheme`` parameter).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from tests.e2e.conftest import Gateway, new_bucket_name
from tests.e2e.s3raw import (
    STREAMING_UNSIGNED_TRAILER,
    all_keys,
    client_error,
    empty_and_delete_bucket,
    error_fields,
    exchange_until_close,
    key_path,
    object_exists,
    request_bytes,
    send,
    sha256_hex,
    sign,
)

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB

# Keys that need URL-encoding, in the path and in listings.
AWKWARD_KEYS = (
    "with space/file name.txt",
    "plus+sign+key",
    "unicodé/ключ/文件.bin",
    "percent%20literal%",
    "tilde~key",
    "nested/a/b/c/d/e.bin",
    "punct &=;:@$,!'()*[]",
)


@pytest.fixture(params=["http", "https"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["proxied", "spooled"])
def gw(request: pytest.FixtureRequest) -> Gateway:
    """Every operation runs through a gateway without a spool and through one whose spool absorbs writes
    (reads then come from the spool until the drain; tests flush before looking at the backend)."""
    name = "gateway" if request.param == "proxied" else "spool_gateway"
    return cast(Gateway, request.getfixturevalue(name))


@pytest.fixture
def s3(gw: Gateway, scheme: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    # Set up after (and so torn down before) the test's bucket: what the spool holds for the bucket is
    # drained before the bucket is deleted on the backend.
    bucket = request.getfixturevalue("bucket") if "bucket" in request.fixturenames else None
    yield gw.client(https=scheme == "https")
    if bucket is not None:
        gw.flush(bucket)


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def multipart_etag(parts: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(joined).hexdigest()}-{len(parts)}"'


def capture_requests(client: Any, event: str) -> list[dict[str, str]]:
    """Record the headers botocore puts on the wire for ``event`` (e.g. ``PutObject``)."""
    seen: list[dict[str, str]] = []

    def hook(request: Any, **_: Any) -> None:
        seen.append(
            {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        )

    client.meta.events.register(f"before-send.s3.{event}", hook)
    return seen


def read(client: Any, bucket: str, key: str, **kwargs: Any) -> bytes:
    body: bytes = client.get_object(Bucket=bucket, Key=key, **kwargs)["Body"].read()
    return body


# --- PutObject / GetObject -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 300 * KiB, 9 * MiB], ids=["0B", "1B", "300KiB", "9MiB"])
def test_put_object_is_stored_byte_exact_with_md5_etag(
    s3: Any, backend: Any, bucket: str, scheme: str, size: int, gw: Gateway
) -> None:
    data = os.urandom(size)
    wire = capture_requests(s3, "PutObject")
    put = s3.put_object(Bucket=bucket, Key="obj.bin", Body=data)

    assert put["ETag"] == md5_etag(data)
    # The test exercises the body encoding it claims to.
    sent = wire[-1]
    if scheme == "https":
        assert sent["x-amz-content-sha256"] == STREAMING_UNSIGNED_TRAILER
        assert "aws-chunked" in sent.get("content-encoding", "")
        assert sent["x-amz-trailer"] == "x-amz-checksum-crc32"
    else:
        assert sent["x-amz-content-sha256"] == sha256_hex(data)

    got = s3.get_object(Bucket=bucket, Key="obj.bin")
    assert got["Body"].read() == data
    assert got["ContentLength"] == size
    assert got["ETag"] == md5_etag(data)
    # What SeaweedFS holds: the payload without framing, and no aws-chunked content-encoding.
    gw.flush(bucket)
    direct = backend.get_object(Bucket=bucket, Key="obj.bin")
    assert direct["Body"].read() == data
    assert "aws-chunked" not in direct.get("ContentEncoding", "")


def test_keys_needing_url_encoding_round_trip(s3: Any, backend: Any, bucket: str, gw: Gateway) -> None:
    bodies = {key: f"body of {key}".encode() + os.urandom(17) for key in AWKWARD_KEYS}
    for key, body in bodies.items():
        assert s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"] == md5_etag(body)
    for key, body in bodies.items():
        assert read(s3, bucket, key) == body, key
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body)
    gw.flush(bucket)
    for key, body in bodies.items():
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(listed) == sorted(AWKWARD_KEYS)
    assert set(all_keys(backend, bucket)) == set(AWKWARD_KEYS)


def test_put_object_overwrites(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"first version")
    s3.put_object(Bucket=bucket, Key="k", Body=b"second")
    assert read(s3, bucket, "k") == b"second"


@pytest.mark.parametrize(
    ("range_header", "start", "end"),
    [("bytes=10-19", 10, 20), ("bytes=-7", 1000 - 7, 1000), ("bytes=990-", 990, 1000), ("bytes=0-0", 0, 1)],
)
def test_get_object_range(s3: Any, bucket: str, range_header: str, start: int, end: int) -> None:
    data = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    got = s3.get_object(Bucket=bucket, Key="r", Range=range_header)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["Body"].read() == data[start:end]
    assert got["ContentLength"] == end - start
    assert got["ContentRange"] == f"bytes {start}-{end - 1}/1000"


def test_get_object_unsatisfiable_range_is_relayed(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="r", Body=os.urandom(1000))
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=2000-3000")
    assert client_error(exc.value) == ("InvalidRange", 416)


def test_get_object_range_on_large_object_streams_the_right_slice(s3: Any, bucket: str) -> None:
    data = os.urandom(3 * MiB + 5)
    s3.put_object(Bucket=bucket, Key="big", Body=data)
    got = s3.get_object(Bucket=bucket, Key="big", Range=f"bytes={MiB}-{2 * MiB + 99}")
    assert got["Body"].read() == data[MiB : 2 * MiB + 100]


def test_get_object_if_match_and_if_none_match(s3: Any, bucket: str) -> None:
    data = b"conditional body"
    etag = s3.put_object(Bucket=bucket, Key="c", Body=data)["ETag"]

    assert read(s3, bucket, "c", IfMatch=etag) == data
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert client_error(exc.value) == ("PreconditionFailed", 412)

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert client_error(exc.value)[1] == 304
    assert read(s3, bucket, "c", IfNoneMatch='"0123456789abcdef0123456789abcdef"') == data


def test_get_object_if_modified_since(s3: Any, bucket: str) -> None:
    data = b"dated body"
    s3.put_object(Bucket=bucket, Key="d", Body=data)
    last_modified = s3.head_object(Bucket=bucket, Key="d")["LastModified"]

    assert read(s3, bucket, "d", IfModifiedSince=last_modified - datetime.timedelta(days=1)) == data
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="d", IfModifiedSince=last_modified + datetime.timedelta(seconds=1))
    assert client_error(exc.value)[1] == 304


def test_get_object_response_overrides(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="o.bin", Body=b"override me", ContentType="application/octet-stream")
    got = s3.get_object(
        Bucket=bucket,
        Key="o.bin",
        ResponseContentType="text/x-s3lanes-test",
        ResponseContentDisposition='attachment; filename="renamed.txt"',
        ResponseCacheControl="no-store",
        ResponseContentLanguage="de-CH",
    )
    assert got["Body"].read() == b"override me"
    assert got["ContentType"] == "text/x-s3lanes-test"
    assert got["ContentDisposition"] == 'attachment; filename="renamed.txt"'
    assert got["CacheControl"] == "no-store"
    assert got["ContentLanguage"] == "de-CH"


# --- HeadObject / errors relayed ----------------------------------------------------------------------------


def test_head_object(s3: Any, bucket: str) -> None:
    data = os.urandom(4321)
    s3.put_object(Bucket=bucket, Key="h", Body=data, ContentType="application/x-test")
    head = s3.head_object(Bucket=bucket, Key="h")
    assert head["ContentLength"] == 4321
    assert head["ETag"] == md5_etag(data)
    assert head["ContentType"] == "application/x-test"


def test_head_object_conditional(s3: Any, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="hc", Body=b"head conditional")["ETag"]
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="hc", IfNoneMatch=etag)
    assert client_error(exc.value)[1] == 304
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="hc", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert client_error(exc.value)[1] == 412
    assert s3.head_object(Bucket=bucket, Key="hc", IfMatch=etag)["ContentLength"] == 16


def test_head_missing_object_is_404_without_body(s3: Any, gateway: Gateway, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="missing")
    assert client_error(exc.value)[1] == 404

    # On the wire: read everything up to EOF; nothing may follow the header section.
    target = key_path(bucket, "missing")
    headers = sign(
        "HEAD",
        gateway.http_url,
        target,
        {"Connection": "close"},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=sha256_hex(b""),
    )
    raw = exchange_until_close(gateway.http_url, request_bytes("HEAD", target, headers))
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep and head.startswith(b"HTTP/1.1 404"), raw[:200]
    assert rest == b""


def test_no_such_key_is_relayed_unchanged(s3: Any, gateway: Gateway, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="nope/missing.bin")
    assert client_error(exc.value) == ("NoSuchKey", 404)

    # Same request through the gateway and straight to SeaweedFS: same status and error document fields.
    target = key_path(bucket, "nope/missing.bin")
    answers = []
    for url in (gateway.http_url, gateway.backend_url):
        hdrs = sign(
            "GET",
            url,
            target,
            {},
            access_key=gateway.access_key,
            secret_key=gateway.secret_key,
            payload_hash=sha256_hex(b""),
        )
        answers.append(send(url, "GET", target, hdrs))
    via_gateway, direct = answers
    assert via_gateway.status == direct.status == 404
    assert via_gateway.header("Content-Type") == direct.header("Content-Type")
    gw_fields, direct_fields = error_fields(via_gateway.body), error_fields(direct.body)
    assert gw_fields["Code"] == direct_fields["Code"] == "NoSuchKey"
    assert gw_fields.get("Message") == direct_fields.get("Message")
    assert gw_fields.get("Key") == direct_fields.get("Key")


def test_no_such_bucket_is_relayed(s3: Any) -> None:
    missing = new_bucket_name()
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=missing, Key="k")
    assert client_error(exc.value) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=missing)
    assert client_error(exc.value) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=missing, Key="k", Body=b"x")
    assert client_error(exc.value) == ("NoSuchBucket", 404)


def test_operations_the_gateway_does_not_model_pass_through(s3: Any, backend: Any, bucket: str) -> None:
    def strip(resp: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in resp.items() if k != "ResponseMetadata"}

    assert strip(s3.get_bucket_versioning(Bucket=bucket)) == strip(
        backend.get_bucket_versioning(Bucket=bucket)
    )
    assert strip(s3.get_bucket_location(Bucket=bucket)) == strip(backend.get_bucket_location(Bucket=bucket))
    assert s3.get_bucket_location(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


# --- DeleteObject / DeleteObjects -------------------------------------------------------------------------


def test_delete_object(s3: Any, backend: Any, bucket: str, gw: Gateway) -> None:
    s3.put_object(Bucket=bucket, Key="gone soon", Body=b"x")
    resp = s3.delete_object(Bucket=bucket, Key="gone soon")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    gw.flush(bucket)
    assert not object_exists(backend, bucket, "gone soon")
    # Deleting what is not there is not an error in S3.
    assert s3.delete_object(Bucket=bucket, Key="never existed")["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_delete_objects(s3: Any, backend: Any, bucket: str, gw: Gateway) -> None:
    keys = ["d/1", "d/2", "unicodé ü", "keep/1", "keep/2", "plus+sign"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    doomed = ["d/1", "d/2", "unicodé ü", "plus+sign"]
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed]})
    assert {d["Key"] for d in resp.get("Deleted", [])} == set(doomed)
    assert not resp.get("Errors")
    assert set(all_keys(s3, bucket)) == {"keep/1", "keep/2"}
    gw.flush(bucket)
    assert set(all_keys(backend, bucket)) == {"keep/1", "keep/2"}

    quiet = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "keep/1"}], "Quiet": True})
    assert not quiet.get("Errors")
    gw.flush(bucket)
    assert set(all_keys(backend, bucket)) == {"keep/2"}


# --- listings ----------------------------------------------------------------------------------------------

LISTING_KEYS = ("a/1", "a/2", "a/b/3", "b/4", "c", "d e/5", "ü/6", "x&y/7")


@pytest.fixture
def listing_bucket(backend: Any, bucket: str) -> str:
    """A bucket holding LISTING_KEYS, written straight to the backend."""
    for key in LISTING_KEYS:
        backend.put_object(Bucket=bucket, Key=key, Body=key.encode())
    return bucket


def test_list_objects_v2_prefix_and_delimiter(s3: Any, listing_bucket: str) -> None:
    resp = s3.list_objects_v2(Bucket=listing_bucket, Prefix="a/")
    assert {o["Key"] for o in resp["Contents"]} == {"a/1", "a/2", "a/b/3"}
    assert {o["Size"] for o in resp["Contents"]} == {3, 5}

    resp = s3.list_objects_v2(Bucket=listing_bucket, Delimiter="/")
    assert {o["Key"] for o in resp.get("Contents", [])} == {"c"}
    assert {p["Prefix"] for p in resp["CommonPrefixes"]} == {"a/", "b/", "d e/", "ü/", "x&y/"}

    resp = s3.list_objects_v2(Bucket=listing_bucket, Prefix="a/", Delimiter="/")
    assert {o["Key"] for o in resp["Contents"]} == {"a/1", "a/2"}
    assert {p["Prefix"] for p in resp["CommonPrefixes"]} == {"a/b/"}


def test_list_objects_v2_pagination(s3: Any, listing_bucket: str) -> None:
    seen: list[str] = []
    pages = 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=listing_bucket, PaginationConfig={"PageSize": 3}
    ):
        pages += 1
        assert page["KeyCount"] <= 3
        seen.extend(o["Key"] for o in page.get("Contents", []))
    assert pages >= 3
    assert len(seen) == len(set(seen))  # every key once
    assert set(seen) == set(LISTING_KEYS)


def test_list_objects_v2_prefix_needing_encoding(s3: Any, listing_bucket: str) -> None:
    for prefix, expected in (("ü/", {"ü/6"}), ("d e/", {"d e/5"}), ("x&y/", {"x&y/7"})):
        resp = s3.list_objects_v2(Bucket=listing_bucket, Prefix=prefix)
        assert {o["Key"] for o in resp["Contents"]} == expected, prefix


def test_list_objects_v2_pagination_with_delimiter(s3: Any, listing_bucket: str) -> None:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=listing_bucket, Delimiter="/", PaginationConfig={"PageSize": 2}
    ):
        pages += 1
        keys.extend(o["Key"] for o in page.get("Contents", []))
        prefixes.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
    assert pages >= 3
    assert sorted(keys) == ["c"]
    assert sorted(prefixes) == sorted(["a/", "b/", "d e/", "ü/", "x&y/"])


def test_list_objects_v2_encoding_type_url(s3: Any, listing_bucket: str) -> None:
    # An explicit EncodingType makes botocore hand back the keys as the server encoded them.
    resp = s3.list_objects_v2(Bucket=listing_bucket, EncodingType="url")
    assert resp["EncodingType"] == "url"
    raw_keys = {o["Key"] for o in resp["Contents"]}
    assert {unquote(k) for k in raw_keys} == set(LISTING_KEYS)
    assert "ü/6" not in raw_keys  # it really was encoded
    resp = s3.list_objects_v2(Bucket=listing_bucket, EncodingType="url", Delimiter="/")
    assert {unquote(p["Prefix"]) for p in resp["CommonPrefixes"]} == {"a/", "b/", "d e/", "ü/", "x&y/"}


def test_list_objects_v1(s3: Any, listing_bucket: str) -> None:
    resp = s3.list_objects(Bucket=listing_bucket, Prefix="a/")
    assert {o["Key"] for o in resp["Contents"]} == {"a/1", "a/2", "a/b/3"}
    resp = s3.list_objects(Bucket=listing_bucket, Delimiter="/")
    assert {o["Key"] for o in resp.get("Contents", [])} == {"c"}
    assert {p["Prefix"] for p in resp["CommonPrefixes"]} == {"a/", "b/", "d e/", "ü/", "x&y/"}

    seen: list[str] = []
    pages = 0
    for page in s3.get_paginator("list_objects").paginate(
        Bucket=listing_bucket, PaginationConfig={"PageSize": 2}
    ):
        pages += 1
        seen.extend(o["Key"] for o in page.get("Contents", []))
    assert pages >= 4
    assert len(seen) == len(set(seen))
    assert set(seen) == set(LISTING_KEYS)

    resp = s3.list_objects(Bucket=listing_bucket, EncodingType="url")
    assert {unquote(o["Key"]) for o in resp["Contents"]} == set(LISTING_KEYS)


# --- buckets -----------------------------------------------------------------------------------------------


def test_list_buckets(s3: Any, bucket: str) -> None:
    resp = s3.list_buckets()
    assert bucket in {b["Name"] for b in resp["Buckets"]}


def test_create_head_delete_bucket(s3: Any, backend: Any) -> None:
    name = new_bucket_name()
    try:
        s3.create_bucket(Bucket=name)
        assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert name in {b["Name"] for b in backend.list_buckets()["Buckets"]}
        s3.delete_bucket(Bucket=name)
        with pytest.raises(ClientError) as exc:
            s3.head_bucket(Bucket=name)
        assert client_error(exc.value)[1] == 404
        assert name not in {b["Name"] for b in backend.list_buckets()["Buckets"]}
    finally:
        empty_and_delete_bucket(backend, name)


# --- CopyObject ---------------------------------------------------------------------------------------------


def test_copy_object(s3: Any, backend: Any, bucket: str, gw: Gateway) -> None:
    data = os.urandom(300 * KiB)
    src = "src dir/ü+%.bin"
    s3.put_object(
        Bucket=bucket, Key=src, Body=data, Metadata={"origin": "source"}, ContentType="application/x-src"
    )

    copied = s3.copy_object(Bucket=bucket, Key="dst/copy.bin", CopySource={"Bucket": bucket, "Key": src})
    # SeaweedFS leaves the quotes off the ETag in CopyObjectResult; the MD5 is what matters.
    assert copied["CopyObjectResult"]["ETag"].strip('"') == hashlib.md5(data).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="dst/copy.bin")
    assert got["Body"].read() == data
    assert got["Metadata"] == {"origin": "source"}

    s3.copy_object(
        Bucket=bucket,
        Key="dst/replaced.bin",
        CopySource={"Bucket": bucket, "Key": src},
        MetadataDirective="REPLACE",
        Metadata={"origin": "replaced"},
    )
    gw.flush(bucket)
    got = backend.get_object(Bucket=bucket, Key="dst/replaced.bin")
    assert got["Body"].read() == data
    assert got["Metadata"] == {"origin": "replaced"}


# --- multipart ----------------------------------------------------------------------------------------------


def test_multipart_upload_complete_list_parts_list_uploads(
    s3: Any, backend: Any, bucket: str, gw: Gateway
) -> None:
    key = "mpu/ü object.bin"
    parts = [os.urandom(5 * MiB), os.urandom(MiB + 123)]
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    etags = []
    for number, body in enumerate(parts, start=1):
        resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
        assert resp["ETag"] == md5_etag(body)
        etags.append(resp["ETag"])

    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (1, len(parts[0]), etags[0]),
        (2, len(parts[1]), etags[1]),
    ]
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert (key, upload_id) in {(u["Key"], u["UploadId"]) for u in uploads}

    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
    )
    assert done["ETag"] == multipart_etag(parts)
    assert read(s3, bucket, key) == b"".join(parts)
    gw.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == b"".join(parts)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert upload_id not in {u["UploadId"] for u in uploads}


def test_upload_part_copy(s3: Any, bucket: str) -> None:
    source = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="copy source", Body=source)
    tail = os.urandom(2 * KiB)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="assembled")["UploadId"]
    first = s3.upload_part_copy(
        Bucket=bucket,
        Key="assembled",
        UploadId=upload_id,
        PartNumber=1,
        CopySource={"Bucket": bucket, "Key": "copy source"},
        CopySourceRange=f"bytes=0-{5 * MiB - 1}",
    )["CopyPartResult"]["ETag"]
    second = s3.upload_part(Bucket=bucket, Key="assembled", UploadId=upload_id, PartNumber=2, Body=tail)[
        "ETag"
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="assembled",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 2, "ETag": second}]},
    )
    assert read(s3, bucket, "assembled") == source[: 5 * MiB] + tail


def test_abort_multipart_upload(s3: Any, backend: Any, bucket: str, gw: Gateway) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="aborted")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="aborted", UploadId=upload_id, PartNumber=1, Body=os.urandom(KiB))
    resp = s3.abort_multipart_upload(Bucket=bucket, Key="aborted", UploadId=upload_id)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert upload_id not in {u["UploadId"] for u in uploads}
    with pytest.raises(ClientError) as exc:
        s3.list_parts(Bucket=bucket, Key="aborted", UploadId=upload_id)
    assert client_error(exc.value) == ("NoSuchUpload", 404)
    gw.flush(bucket)
    assert not object_exists(backend, bucket, "aborted")


def test_upload_file_and_download_file_use_multipart(s3: Any, bucket: str, tmp_path: Path) -> None:
    data = os.urandom(12 * MiB)
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(data)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)
    wire = capture_requests(s3, "UploadPart")

    s3.upload_file(str(src), bucket, "transfer/big.bin", Config=config)
    assert len(wire) == 3
    head = s3.head_object(Bucket=bucket, Key="transfer/big.bin")
    assert head["ETag"].endswith('-3"')
    assert head["ContentLength"] == len(data)

    s3.download_file(bucket, "transfer/big.bin", str(dst), Config=config)
    assert dst.read_bytes() == data


# --- tagging and metadata -----------------------------------------------------------------------------------


def test_object_tagging(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="tagged", Body=b"t")
    tags = [{"Key": "team", "Value": "storage"}, {"Key": "tier", "Value": "hot cold"}]
    s3.put_object_tagging(Bucket=bucket, Key="tagged", Tagging={"TagSet": tags})
    got = s3.get_object_tagging(Bucket=bucket, Key="tagged")["TagSet"]
    assert sorted(got, key=lambda t: t["Key"]) == tags
    s3.delete_object_tagging(Bucket=bucket, Key="tagged")
    assert s3.get_object_tagging(Bucket=bucket, Key="tagged")["TagSet"] == []


def test_user_metadata_and_standard_headers_round_trip(
    s3: Any, backend: Any, bucket: str, gw: Gateway
) -> None:
    metadata = {"color": "blue", "x-trace": "abc-123", "camelcase": "Value With Spaces"}
    s3.put_object(
        Bucket=bucket,
        Key="meta",
        Body=b"m",
        Metadata=metadata,
        ContentType="application/x-meta",
        CacheControl="max-age=60",
        ContentDisposition='inline; filename="m.txt"',
    )
    head = s3.head_object(Bucket=bucket, Key="meta")
    assert head["Metadata"] == metadata
    gw.flush(bucket)
    for client in (s3, backend):
        head = client.head_object(Bucket=bucket, Key="meta")
        assert head["Metadata"] == metadata
        assert head["ContentType"] == "application/x-meta"
        assert head["CacheControl"] == "max-age=60"
        assert head["ContentDisposition"] == 'inline; filename="m.txt"'
