# ruff: noqa: F811  (the fixtures of test_spool_parity, imported by name, are test parameters here)
"""A spooled object answers as the store does across its life: held in the spool, and once drained.

The same calls go through a spooling gateway whose drain is held back for keys under ``held/`` (the
``held`` fixture of ``test_spool_parity``) and straight to SeaweedFS; then the drain is let run and the
drained object is compared once more, on the store itself.
"""

from __future__ import annotations

import base64
import gzip
import time
import zlib
from typing import Any

import pytest

from tests.e2e import s3raw
from tests.e2e.test_spool_parity import (  # noqa: F401 (fixtures)
    HELD,
    Held,
    assert_spooled,
    held,
    held_gateway,
    source,
    store_bucket,
)

pytestmark = pytest.mark.e2e

# Bodies written without a Content-Type: the store sniffs the type of a non-empty body.
UNTYPED_BODIES = {
    "text": b"plain words\n",
    "html": b"  <html><body>hi</body></html>",
    "binary": bytes(range(256)) * 4,
    "gzip": gzip.compress(b"zipped " * 50, mtime=0),
    "empty": b"",
}


def _release_and_flush(held: Held, bucket: str) -> None:
    held.release()
    held.gw.flush(bucket)


def test_an_object_written_without_content_type_has_the_stores_type_in_the_spool_and_after_the_drain(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """PutObject (sniffed by the store), CreateMultipartUpload and a CopyObject replacing the headers, all
    without Content-Type: the spooled object shows the type the store gives the same write, and keeps it
    on the store after the drain (the drain sends it)."""
    s3 = held.gw.client()
    keys = []
    for name, body in UNTYPED_BODIES.items():
        key = f"{HELD}untyped-{name}"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        backend.put_object(Bucket=store_bucket, Key=key, Body=body)
        keys.append(key)
    key = f"{HELD}untyped-mpu"
    for client, name in ((s3, bucket), (backend, store_bucket)):
        up = client.create_multipart_upload(Bucket=name, Key=key)
        part = client.upload_part(Bucket=name, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 10)
        client.complete_multipart_upload(
            Bucket=name,
            Key=key,
            UploadId=up["UploadId"],
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
        )
        client.copy_object(
            Bucket=name,
            Key=f"{HELD}untyped-copy",
            CopySource={"Bucket": name, "Key": f"{HELD}untyped-text"},
            MetadataDirective="REPLACE",
        )
    keys += [key, f"{HELD}untyped-copy"]
    want = {k: backend.head_object(Bucket=store_bucket, Key=k)["ContentType"] for k in keys}
    assert want[f"{HELD}untyped-text"] == "text/plain; charset=utf-8"  # the store does sniff
    for k in keys:
        assert_spooled(held.gw, backend, bucket, k)
        got = s3.head_object(Bucket=bucket, Key=k)
        assert got["ContentType"] == want[k], k
        assert s3.get_object(Bucket=bucket, Key=k)["ContentType"] == want[k], k
    _release_and_flush(held, bucket)
    for k in keys:
        assert backend.head_object(Bucket=bucket, Key=k)["ContentType"] == want[k], k
        assert s3.head_object(Bucket=bucket, Key=k)["ContentType"] == want[k], k


def test_a_conditional_put_over_a_spooled_key_that_holds_is_answered_at_once_from_the_spool(
    held: Held, backend: Any, bucket: str
) -> None:
    """If-Match with the spooled object's ETag, If-None-Match with another: spooled and acknowledged
    without waiting for the (held) drain, then drained in order."""
    s3 = held.gw.client()
    key = f"{HELD}cput-ok"
    etag = s3.put_object(Bucket=bucket, Key=key, Body=b"existing")["ETag"]
    started = time.monotonic()
    first = s3.put_object(Bucket=bucket, Key=key, Body=b"second", IfMatch=etag)
    second = s3.put_object(Bucket=bucket, Key=key, Body=b"third", IfNoneMatch=etag)
    assert time.monotonic() - started < 5.0, "the conditional PUTs waited for the drain"
    assert source(first) == source(second) == "spool"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"third"
    with pytest.raises(Exception, match="PreconditionFailed"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"stale", IfMatch=first["ETag"])
    assert_spooled(held.gw, backend, bucket, key)
    _release_and_flush(held, bucket)
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == b"third"


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_head_range_part_number_empty_metadata_and_an_unvalued_checksum_answer_as_the_store(
    held: Held, backend: Any, seaweed: Any, bucket: str, store_bucket: str
) -> None:
    """HEAD ignores Range (200, the whole length); partNumber=1 of a single PUT counts one part; an empty
    user-metadata value is dropped; x-amz-sdk-checksum-algorithm without a value: the checksum is computed,
    answered and kept. As the store answers, in the spool and after the drain."""
    s3 = held.gw.client()
    key = f"{HELD}head"
    body = b"payload!" * 100
    for client, name in ((s3, bucket), (backend, store_bucket)):
        client.put_object(Bucket=name, Key=key, Body=body, Metadata={"empty": "", "full": "v"})
    assert_spooled(held.gw, backend, bucket, key)

    def view(client: Any, name: str) -> list[Any]:
        out = []
        for extra in ({"Range": "bytes=0-9"}, {"Range": "bytes=5000-"}, {"PartNumber": 1}, {}):
            resp = client.head_object(Bucket=name, Key=key, **extra)
            out.append(
                (
                    resp["ResponseMetadata"]["HTTPStatusCode"],
                    resp["ContentLength"],
                    resp.get("PartsCount"),
                    resp["Metadata"],
                )
            )
        return out

    want = view(backend, store_bucket)
    assert want[0][:2] == (200, len(body))
    assert view(s3, bucket) == want

    ckey = f"{HELD}unvalued"
    answers = {}
    targets = (
        (held.gw.http_url, bucket, held.gw.access_key, held.gw.secret_key),
        (seaweed.endpoint_url, store_bucket, seaweed.admin.access_key, seaweed.admin.secret_key),
    )
    for endpoint, name, access_key, secret_key in targets:
        resp = s3raw.signed_request(
            endpoint,
            "PUT",
            s3raw.key_path(name, ckey),
            access_key=access_key,
            secret_key=secret_key,
            body=b"payload!",
            headers={"x-amz-sdk-checksum-algorithm": "CRC32"},
        )
        assert resp.status == 200
        answers[name] = resp.header("x-amz-checksum-crc32")
    assert answers[bucket] == answers[store_bucket] == _crc32(b"payload!")
    assert_spooled(held.gw, backend, bucket, ckey)
    got = s3.head_object(Bucket=bucket, Key=ckey, ChecksumMode="ENABLED")
    assert got.get("ChecksumCRC32") == _crc32(b"payload!")
    _release_and_flush(held, bucket)
    assert view(backend, bucket) == want
    drained = backend.head_object(Bucket=bucket, Key=ckey, ChecksumMode="ENABLED")
    assert drained.get("ChecksumCRC32") == _crc32(b"payload!")


def test_a_copy_of_a_spooled_multipart_object_keeps_its_multipart_etag_as_on_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """CopyObject of a multipart source: the store keeps the source's part layout and ETag; so does the
    spool, in the spool and once the copy is drained."""
    s3 = held.gw.client()
    src, dst = f"{HELD}mp-src", f"{HELD}mp-copy"
    parts = [b"a" * (5 * 1024 * 1024), b"tail"]
    etags = {}
    for client, name in ((s3, bucket), (backend, store_bucket)):
        up = client.create_multipart_upload(Bucket=name, Key=src)
        listed = [
            {
                "PartNumber": n,
                "ETag": client.upload_part(
                    Bucket=name, Key=src, UploadId=up["UploadId"], PartNumber=n, Body=body
                )["ETag"],
            }
            for n, body in enumerate(parts, start=1)
        ]
        client.complete_multipart_upload(
            Bucket=name, Key=src, UploadId=up["UploadId"], MultipartUpload={"Parts": listed}
        )
        copied = client.copy_object(Bucket=name, Key=dst, CopySource={"Bucket": name, "Key": src})
        etags[name] = copied["CopyObjectResult"]["ETag"].strip('"')
    assert etags[bucket] == etags[store_bucket]
    assert etags[bucket].endswith("-2")
    assert_spooled(held.gw, backend, bucket, dst)
    got = s3.get_object(Bucket=bucket, Key=dst)
    assert got["Body"].read() == b"".join(parts)
    assert got["ETag"].strip('"') == etags[bucket]
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    _release_and_flush(held, bucket)
    assert backend.head_object(Bucket=bucket, Key=dst)["ETag"].strip('"') == etags[bucket]
