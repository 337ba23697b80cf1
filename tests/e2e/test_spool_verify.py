"""Body verification of spooled writes: what the client promised about a body is checked before the spool
acknowledges it, and a body that breaks a promise leaves nothing, neither in the spool nor on the store.

The spool hashes a body on its I/O thread as it writes it (MD5 for the ETag, and the request's own
promises: a signed payload's SHA-256, an ``x-amz-checksum-*`` header or trailer, ``Content-MD5``), and
verifies once the last byte is written. Requests are crafted with botocore's signer and sent byte for byte
(``tests.e2e.s3raw``); each refusal has an accepted control, and every control must have been answered by
the spool (``x-s3lanes-source: spool``), so a write that went to the backend instead cannot pass for one.
Small bodies (one spool piece, written in a single trip to the I/O thread) and large ones (many pieces) take
different writer paths, so both sizes run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Gateway
from tests.e2e.s3raw import (
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    Response,
    aws_chunked,
    aws_chunked_headers,
    crc32_b64,
    error_fields,
    key_path,
    md5_b64,
    object_exists,
    send,
    sha256_hex,
    sign,
    signed_request,
)

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
SIZES = pytest.mark.parametrize("size", [3 * KiB, 3 * MiB + 5], ids=["one-piece", "many-pieces"])


@pytest.fixture
def spooled(spool_gateway: Gateway, bucket: str) -> Iterator[Gateway]:
    """The session spool gateway; what the test spooled is drained before the bucket goes."""
    yield spool_gateway
    spool_gateway.flush(bucket)


def spool_files(gw: Gateway) -> set[str]:
    data = Path(gw.log_path).parent / "state" / "spool" / "data"
    assert data.is_dir(), f"no spool data directory at {data}"
    return {p.name for p in data.iterdir()}


def tamper(data: bytes) -> bytes:
    """Same length, one byte different near the end (most of a large body is written before it shows)."""
    i = len(data) - 10
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


def put(gw: Gateway, bucket: str, key: str, body: bytes, **kwargs: Any) -> Response:
    return signed_request(
        gw.http_url,
        "PUT",
        key_path(bucket, key),
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        body=body,
        **kwargs,
    )


def put_trailer(gw: Gateway, bucket: str, key: str, data: bytes, crc: str) -> Response:
    """An aws-chunked PUT (STREAMING-UNSIGNED-PAYLOAD-TRAILER) whose CRC32 trailer says ``crc``."""
    framed = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc)])
    target = key_path(bucket, key)
    hdrs = aws_chunked_headers(len(data))
    hdrs["Content-Length"] = str(len(framed))
    signed = sign(
        "PUT",
        gw.http_url,
        target,
        hdrs,
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        payload_hash=STREAMING_UNSIGNED_TRAILER,
    )
    return send(gw.http_url, "PUT", target, signed, framed)


def assert_refused(resp: Response, code: str) -> None:
    assert resp.status == 400, (resp.status, resp.body[:500])
    assert error_fields(resp.body)["Code"] == code, resp.body[:500]


def assert_spooled(resp: Response, data: bytes) -> None:
    assert resp.status == 200, (resp.status, resp.body[:500])
    assert resp.header("x-s3lanes-source") == "spool", "the control was not answered by the spool"
    assert resp.header("ETag") == f'"{hashlib.md5(data).hexdigest()}"'


@SIZES
def test_signed_payload_sha256_is_verified_before_the_spool_acks(
    spooled: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    before = spool_files(spooled)
    assert_refused(
        put(spooled, bucket, "sha/bad", tamper(data), payload_hash=sha256_hex(data)),
        "XAmzContentSHA256Mismatch",
    )
    assert spool_files(spooled) <= before, "the refused body left a spool file"
    assert put(spooled, bucket, "sha/bad", b"", payload_hash=None).status == 200  # the key is usable
    assert_spooled(put(spooled, bucket, "sha/good", data), data)  # signed with the body's own SHA-256
    spooled.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="sha/good")["Body"].read() == data
    assert backend.get_object(Bucket=bucket, Key="sha/bad")["Body"].read() == b""


@SIZES
def test_checksum_header_is_verified_before_the_spool_acks(
    spooled: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    before = spool_files(spooled)
    wrong = {"x-amz-checksum-crc32": crc32_b64(data + b"x")}
    resp = put(spooled, bucket, "crc/bad", data, headers=wrong, payload_hash=UNSIGNED_PAYLOAD)
    assert_refused(resp, "BadDigest")
    assert spool_files(spooled) <= before, "the refused body left a spool file"
    right = {"x-amz-checksum-crc32": crc32_b64(data)}
    good = put(spooled, bucket, "crc/good", data, headers=right, payload_hash=UNSIGNED_PAYLOAD)
    assert_spooled(good, data)
    assert good.header("x-amz-checksum-crc32") == crc32_b64(data)
    spooled.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="crc/good")["Body"].read() == data
    assert not object_exists(backend, bucket, "crc/bad")


@SIZES
def test_checksum_trailer_is_verified_before_the_spool_acks(
    spooled: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    before = spool_files(spooled)
    assert_refused(put_trailer(spooled, bucket, "trailer/bad", data, crc32_b64(data + b"x")), "BadDigest")
    assert spool_files(spooled) <= before, "the refused body left a spool file"
    assert_spooled(put_trailer(spooled, bucket, "trailer/good", data, crc32_b64(data)), data)
    spooled.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="trailer/good")["Body"].read() == data
    assert not object_exists(backend, bucket, "trailer/bad")


@SIZES
def test_every_promise_at_once_is_verified_and_one_broken_is_enough(
    spooled: Gateway, backend: Any, bucket: str, size: int
) -> None:
    """Signed SHA-256, CRC32 header and Content-MD5 together, as rclone-like clients can send them."""
    data = os.urandom(size)
    promises = {"x-amz-checksum-crc32": crc32_b64(data), "Content-MD5": md5_b64(data)}
    assert_spooled(put(spooled, bucket, "all/good", data, headers=promises), data)
    for name, value in [("x-amz-checksum-crc32", crc32_b64(b"other")), ("Content-MD5", md5_b64(b"other"))]:
        before = spool_files(spooled)
        resp = put(spooled, bucket, "all/bad", data, headers={**promises, name: value})
        assert_refused(resp, "BadDigest")
        assert spool_files(spooled) <= before, f"the body refused for {name} left a spool file"
    spooled.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="all/good")["Body"].read() == data
    assert not object_exists(backend, bucket, "all/bad")
