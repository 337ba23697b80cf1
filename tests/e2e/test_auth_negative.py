"""Requests the gateway must refuse: each gets S3's error code and HTTP status, and stores nothing.

Requests are crafted with botocore's signer and sent byte for byte (``tests.e2e.s3raw``), so the only thing
wrong with each is the thing under test. Every refusal has a control: the same request, untampered, is
accepted. "Stores nothing" is checked straight on SeaweedFS: a new key does not appear, and an existing
object keeps its old bytes. Small (<= 256 KiB) and large bodies go through different gateway paths (read
whole and verified before sending, versus streamed with the tail held back), so the body checks run at both
sizes.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import Gateway
from tests.e2e.s3raw import (
    STREAMING_SIGNED,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    Response,
    aws_chunked,
    aws_chunked_headers,
    client_error,
    crc32_b64,
    error_fields,
    exchange_until_close,
    key_path,
    md5_b64,
    object_exists,
    request_bytes,
    send,
    sha256_hex,
    sign,
    signed_aws_chunked,
    signed_request,
    te_chunked,
    utc_now,
)

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
SIZES = pytest.mark.parametrize("size", [KiB, 2 * MiB], ids=["small", "large"])
OLD = b"the previous version of this object"


def assert_s3_error(resp: Response, status: int, code: str) -> dict[str, str]:
    assert resp.status == status, (resp.status, resp.body[:500])
    fields = error_fields(resp.body)
    assert fields["Code"] == code, fields
    return fields


def assert_stored(backend: Any, bucket: str, key: str, data: bytes) -> None:
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def put(
    gateway: Gateway,
    bucket: str,
    key: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    payload_hash: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Response:
    return signed_request(
        gateway.http_url,
        "PUT",
        key_path(bucket, key),
        access_key=access_key or gateway.access_key,
        secret_key=secret_key or gateway.secret_key,
        body=body,
        headers=headers,
        payload_hash=payload_hash,
    )


def put_aws_chunked(
    gateway: Gateway,
    bucket: str,
    key: str,
    framed: bytes,
    decoded_length: int,
    *,
    transfer_chunked: bool = False,
) -> Response:
    """PUT an aws-chunked body (STREAMING-UNSIGNED-PAYLOAD-TRAILER, CRC32 trailer) framed by the caller."""
    target = key_path(bucket, key)
    hdrs = aws_chunked_headers(decoded_length)
    if transfer_chunked:  # what botocore does over HTTPS: no Content-Length at all
        hdrs["Transfer-Encoding"] = "chunked"
        wire = te_chunked(framed)
    else:
        hdrs["Content-Length"] = str(len(framed))
        wire = framed
    signed = sign(
        "PUT",
        gateway.http_url,
        target,
        hdrs,
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=STREAMING_UNSIGNED_TRAILER,
    )
    return send(gateway.http_url, "PUT", target, signed, wire)


# --- identity and signature ---------------------------------------------------------------------------------


def test_control_crafted_signed_put_is_accepted(gateway: Gateway, backend: Any, bucket: str) -> None:
    data = os.urandom(KiB)
    resp = put(gateway, bucket, "ok", data)
    assert resp.status == 200, resp.body
    assert_stored(backend, bucket, "ok", data)


def test_wrong_secret_is_signature_does_not_match(gateway: Gateway, backend: Any, bucket: str) -> None:
    resp = put(gateway, bucket, "k", os.urandom(KiB), secret_key="not-the-secret")
    fields = assert_s3_error(resp, 403, "SignatureDoesNotMatch")
    assert "not-the-secret" not in resp.body.decode()
    assert fields.get("AWSAccessKeyId", gateway.access_key) == gateway.access_key
    assert not object_exists(backend, bucket, "k")


def test_wrong_secret_with_boto3_is_refused_before_the_body(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    """boto3 sends Expect: 100-continue; the refusal comes instead of the 100, and boto3 reports it."""
    for https in (False, True):
        client = gateway.client(https=https, secret="not-the-secret")
        with pytest.raises(ClientError) as exc:
            client.put_object(Bucket=bucket, Key="k", Body=os.urandom(2 * MiB))
        assert client_error(exc.value) == ("SignatureDoesNotMatch", 403)
        with pytest.raises(ClientError) as exc:
            client.list_objects_v2(Bucket=bucket)
        assert client_error(exc.value) == ("SignatureDoesNotMatch", 403)
    assert not object_exists(backend, bucket, "k")


def test_unknown_access_key_is_invalid_access_key_id(gateway: Gateway, backend: Any, bucket: str) -> None:
    resp = put(gateway, bucket, "k", os.urandom(KiB), access_key="AKIDUNKNOWN0000000000", secret_key="x")
    assert_s3_error(resp, 403, "InvalidAccessKeyId")
    assert not object_exists(backend, bucket, "k")

    target = key_path(bucket)
    hdrs = sign(
        "GET",
        gateway.http_url,
        target,
        {},
        access_key="AKIDUNKNOWN0000000000",
        secret_key="x",
        payload_hash=sha256_hex(b""),
    )
    assert_s3_error(send(gateway.http_url, "GET", target, hdrs), 403, "InvalidAccessKeyId")


def test_anonymous_requests_are_access_denied(gateway: Gateway, backend: Any, bucket: str) -> None:
    backend.put_object(Bucket=bucket, Key="private", Body=b"private bytes")
    netloc = gateway.http_url.removeprefix("http://")

    resp = send(gateway.http_url, "GET", key_path(bucket, "private"), {"Host": netloc})
    assert_s3_error(resp, 403, "AccessDenied")
    assert b"private bytes" not in resp.body

    resp = send(gateway.http_url, "GET", key_path(bucket), {"Host": netloc})
    assert_s3_error(resp, 403, "AccessDenied")

    body = os.urandom(KiB)
    resp = send(
        gateway.http_url,
        "PUT",
        key_path(bucket, "anon"),
        {"Host": netloc, "Content-Length": str(len(body))},
        body,
    )
    assert_s3_error(resp, 403, "AccessDenied")
    assert not object_exists(backend, bucket, "anon")


@pytest.mark.parametrize("offset_min", [-20, 20], ids=["past", "future"])
def test_skewed_clock_is_request_time_too_skewed(
    gateway: Gateway, backend: Any, bucket: str, offset_min: int
) -> None:
    body = os.urandom(KiB)
    target = key_path(bucket, "skewed")
    hdrs = sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(body))},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=sha256_hex(body),
        now=utc_now() + datetime.timedelta(minutes=offset_min),
    )
    assert_s3_error(send(gateway.http_url, "PUT", target, hdrs, body), 403, "RequestTimeTooSkewed")
    assert not object_exists(backend, bucket, "skewed")


def test_clock_within_tolerance_is_accepted(gateway: Gateway, backend: Any, bucket: str) -> None:
    body = b"five minutes off is fine"
    target = key_path(bucket, "slightly-skewed")
    hdrs = sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(body))},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=sha256_hex(body),
        now=utc_now() - datetime.timedelta(minutes=5),
    )
    assert send(gateway.http_url, "PUT", target, hdrs, body).status == 200
    assert_stored(backend, bucket, "slightly-skewed", body)


# --- x-amz-content-sha256 ----------------------------------------------------------------------------------


def tamper(data: bytes) -> bytes:
    """Same length, one byte different, near the end (so a streamed body is mostly sent before it shows)."""
    i = len(data) - 10
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


@SIZES
def test_tampered_body_with_literal_sha256_is_rejected_and_stores_nothing(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    resp = put(gateway, bucket, "fresh", tamper(data), payload_hash=sha256_hex(data))
    assert_s3_error(resp, 400, "XAmzContentSHA256Mismatch")
    assert not object_exists(backend, bucket, "fresh")


@SIZES
def test_tampered_body_with_literal_sha256_leaves_existing_object_unchanged(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    backend.put_object(Bucket=bucket, Key="existing", Body=OLD)
    data = os.urandom(size)
    resp = put(gateway, bucket, "existing", tamper(data), payload_hash=sha256_hex(data))
    assert_s3_error(resp, 400, "XAmzContentSHA256Mismatch")
    assert_stored(backend, bucket, "existing", OLD)


@SIZES
def test_control_literal_sha256_put_is_accepted(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    resp = put(gateway, bucket, "good", data, payload_hash=sha256_hex(data))
    assert resp.status == 200, resp.body
    assert_stored(backend, bucket, "good", data)


def test_unsigned_payload_put_is_accepted(gateway: Gateway, backend: Any, bucket: str) -> None:
    data = os.urandom(300 * KiB)
    resp = put(gateway, bucket, "unsigned", data, payload_hash=UNSIGNED_PAYLOAD)
    assert resp.status == 200, resp.body
    assert_stored(backend, bucket, "unsigned", data)


def test_body_shorter_than_content_length_stores_nothing(gateway: Gateway, backend: Any, bucket: str) -> None:
    """The client says 2 MiB, sends less and half-closes: the object must not appear truncated."""
    data = os.urandom(2 * MiB)
    target = key_path(bucket, "short")
    hdrs = sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(data))},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=UNSIGNED_PAYLOAD,
    )
    answer = exchange_until_close(
        gateway.http_url, request_bytes("PUT", target, hdrs) + data[: MiB + 7], half_close=True
    )
    # Either an IncompleteBody answer or a closed connection is fine; a 200 is not.
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert not object_exists(backend, bucket, "short")


# --- aws-chunked -------------------------------------------------------------------------------------------


@SIZES
@pytest.mark.parametrize("transfer_chunked", [False, True], ids=["content-length", "te-chunked"])
def test_control_aws_chunked_put_is_stored_without_framing(
    gateway: Gateway, backend: Any, bucket: str, size: int, transfer_chunked: bool
) -> None:
    data = os.urandom(size)
    framed = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc32_b64(data))])
    resp = put_aws_chunked(gateway, bucket, "chunked", framed, len(data), transfer_chunked=transfer_chunked)
    assert resp.status == 200, resp.body
    head = backend.head_object(Bucket=bucket, Key="chunked")
    assert head["ContentLength"] == size
    assert "aws-chunked" not in head.get("ContentEncoding", "")
    assert_stored(backend, bucket, "chunked", data)


def test_control_zero_byte_aws_chunked_put(gateway: Gateway, backend: Any, bucket: str) -> None:
    framed = aws_chunked(b"", trailers=[("x-amz-checksum-crc32", crc32_b64(b""))])
    assert framed == b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"  # botocore's 36 bytes
    for transfer_chunked in (False, True):
        resp = put_aws_chunked(gateway, bucket, "empty", framed, 0, transfer_chunked=transfer_chunked)
        assert resp.status == 200, resp.body
        assert_stored(backend, bucket, "empty", b"")


def broken_framings(data: bytes) -> dict[str, bytes]:
    trailer = f"x-amz-checksum-crc32:{crc32_b64(data)}\r\n\r\n".encode()
    good = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc32_b64(data))])
    first = 64 * KiB if len(data) > 64 * KiB else len(data)
    return {
        # a chunk-size line that is not hex
        "bad-hex-size": b"zz\r\n" + data + b"\r\n0\r\n" + trailer,
        # chunk data not followed by CRLF
        "missing-crlf": b"%x\r\n" % len(data) + data + b"XX0\r\n" + trailer,
        # the first chunk announces more bytes than it carries; the rest of the body is swallowed as data
        "chunk-longer-than-sent": b"%x\r\n" % (first + 100) + data[:first] + b"\r\n0\r\n" + trailer,
        # the body stops before the final zero-size chunk
        "no-final-chunk": good[: good.rindex(b"0\r\nx-amz-checksum-crc32")],
        # garbage after the end of the aws-chunked body
        "bytes-after-end": good + b"5\r\nextra\r\n",
    }


@SIZES
@pytest.mark.parametrize(
    "variant", ["bad-hex-size", "missing-crlf", "chunk-longer-than-sent", "no-final-chunk", "bytes-after-end"]
)
def test_broken_aws_chunked_framing_is_incomplete_body(
    gateway: Gateway, backend: Any, bucket: str, size: int, variant: str
) -> None:
    backend.put_object(Bucket=bucket, Key="existing", Body=OLD)
    data = os.urandom(size)
    framed = broken_framings(data)[variant]
    for key in ("fresh", "existing"):
        resp = put_aws_chunked(gateway, bucket, key, framed, len(data))
        assert_s3_error(resp, 400, "IncompleteBody")
    assert not object_exists(backend, bucket, "fresh")
    assert_stored(backend, bucket, "existing", OLD)


@SIZES
def test_decoded_length_disagreeing_with_the_chunks_is_incomplete_body(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    framed = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc32_b64(data))])
    for key, declared in (("more-declared", size + 1), ("less-declared", size - 1)):
        resp = put_aws_chunked(gateway, bucket, key, framed, declared)
        assert_s3_error(resp, 400, "IncompleteBody")
        assert not object_exists(backend, bucket, key)


@SIZES
@pytest.mark.parametrize("transfer_chunked", [False, True], ids=["content-length", "te-chunked"])
def test_wrong_trailer_checksum_is_bad_digest(
    gateway: Gateway, backend: Any, bucket: str, size: int, transfer_chunked: bool
) -> None:
    backend.put_object(Bucket=bucket, Key="existing", Body=OLD)
    data = os.urandom(size)
    framed = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc32_b64(data + b"x"))])
    for key in ("fresh", "existing"):
        resp = put_aws_chunked(gateway, bucket, key, framed, len(data), transfer_chunked=transfer_chunked)
        assert_s3_error(resp, 400, "BadDigest")
    assert not object_exists(backend, bucket, "fresh")
    assert_stored(backend, bucket, "existing", OLD)


def test_missing_announced_trailer_is_malformed_trailer(gateway: Gateway, backend: Any, bucket: str) -> None:
    data = os.urandom(KiB)
    framed = aws_chunked(data)  # x-amz-trailer announces a CRC32 that never comes
    assert_s3_error(put_aws_chunked(gateway, bucket, "k", framed, len(data)), 400, "MalformedTrailerError")
    assert not object_exists(backend, bucket, "k")


def test_aws_chunked_without_decoded_length_is_missing_content_length(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    data = os.urandom(KiB)
    framed = aws_chunked(data, trailers=[("x-amz-checksum-crc32", crc32_b64(data))])
    target = key_path(bucket, "k")
    hdrs = aws_chunked_headers(len(data))
    del hdrs["X-Amz-Decoded-Content-Length"]
    hdrs["Content-Length"] = str(len(framed))
    signed = sign(
        "PUT",
        gateway.http_url,
        target,
        hdrs,
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=STREAMING_UNSIGNED_TRAILER,
    )
    assert_s3_error(send(gateway.http_url, "PUT", target, signed, framed), 411, "MissingContentLength")
    assert not object_exists(backend, bucket, "k")


def put_signed_chunks(
    gateway: Gateway, bucket: str, key: str, data: bytes, *, corrupt: bool = False
) -> Response:
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD (Java SDK v1, Hadoop S3A); ``corrupt`` flips a payload byte after
    the chunk signatures were computed."""
    target = key_path(bucket, key)
    hdrs = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(len(data))}
    signed = sign(
        "PUT",
        gateway.http_url,
        target,
        hdrs,
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=STREAMING_SIGNED,
    )
    framed = signed_aws_chunked(data, signed, gateway.secret_key, chunk_bytes=64 * KiB)
    assert framed.count(b"chunk-signature=") == -(-len(data) // (64 * KiB)) + 1
    signed["Content-Length"] = str(len(framed))  # not signed: it depends on the signatures
    if corrupt:
        i = framed.index(data[len(data) // 2 : len(data) // 2 + 16])
        framed = framed[:i] + bytes([framed[i] ^ 1]) + framed[i + 1 :]
    return send(gateway.http_url, "PUT", target, signed, framed)


@SIZES
def test_control_signed_chunks_are_accepted(gateway: Gateway, backend: Any, bucket: str, size: int) -> None:
    data = os.urandom(size)
    resp = put_signed_chunks(gateway, bucket, "signed-chunks", data)
    assert resp.status == 200, resp.body
    assert_stored(backend, bucket, "signed-chunks", data)


@SIZES
def test_tampered_signed_chunk_is_signature_does_not_match(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    backend.put_object(Bucket=bucket, Key="existing", Body=OLD)
    data = os.urandom(size)
    for key in ("fresh", "existing"):
        assert_s3_error(
            put_signed_chunks(gateway, bucket, key, data, corrupt=True), 403, "SignatureDoesNotMatch"
        )
    assert not object_exists(backend, bucket, "fresh")
    assert_stored(backend, bucket, "existing", OLD)


# --- Content-MD5 and checksum headers ----------------------------------------------------------------------


@SIZES
def test_wrong_content_md5_is_bad_digest(gateway: Gateway, backend: Any, bucket: str, size: int) -> None:
    backend.put_object(Bucket=bucket, Key="existing", Body=OLD)
    data = os.urandom(size)
    for key in ("fresh", "existing"):
        resp = put(
            gateway,
            bucket,
            key,
            data,
            headers={"Content-MD5": md5_b64(data + b"x")},
            payload_hash=UNSIGNED_PAYLOAD,
        )
        assert_s3_error(resp, 400, "BadDigest")
    assert not object_exists(backend, bucket, "fresh")
    assert_stored(backend, bucket, "existing", OLD)


@SIZES
def test_control_right_content_md5_is_accepted(
    gateway: Gateway, backend: Any, bucket: str, size: int
) -> None:
    data = os.urandom(size)
    resp = put(
        gateway, bucket, "md5", data, headers={"Content-MD5": md5_b64(data)}, payload_hash=UNSIGNED_PAYLOAD
    )
    assert resp.status == 200, resp.body
    assert_stored(backend, bucket, "md5", data)


@pytest.mark.parametrize("value", ["not base64!!", "AAAA", ""], ids=["not-base64", "too-short", "empty"])
def test_malformed_content_md5_is_invalid_digest(
    gateway: Gateway, backend: Any, bucket: str, value: str
) -> None:
    resp = put(gateway, bucket, "k", os.urandom(KiB), headers={"Content-MD5": value})
    assert_s3_error(resp, 400, "InvalidDigest")
    assert not object_exists(backend, bucket, "k")


@SIZES
def test_wrong_checksum_header_is_bad_digest(gateway: Gateway, backend: Any, bucket: str, size: int) -> None:
    data = os.urandom(size)
    headers = {"x-amz-checksum-crc32": crc32_b64(data + b"x"), "x-amz-sdk-checksum-algorithm": "CRC32"}
    resp = put(gateway, bucket, "crc", data, headers=headers, payload_hash=UNSIGNED_PAYLOAD)
    assert_s3_error(resp, 400, "BadDigest")
    assert not object_exists(backend, bucket, "crc")


def delete_objects_request(
    gateway: Gateway, bucket: str, keys: list[str], content_md5: str | None
) -> Response:
    body = (
        "<Delete>"
        + "".join(f"<Object><Key>{k}</Key></Object>" for k in keys)
        + "<Quiet>true</Quiet></Delete>"
    ).encode()
    headers = {"Content-Type": "application/xml"}
    if content_md5 is not None:
        headers["Content-MD5"] = content_md5 if content_md5 else md5_b64(body)
    return post_delete(gateway, bucket, body, headers)


def post_delete(gateway: Gateway, bucket: str, body: bytes, headers: dict[str, str]) -> Response:
    return signed_request(
        gateway.http_url,
        "POST",
        key_path(bucket) + "?delete",
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        body=body,
        headers=headers,
    )


def test_delete_objects_with_wrong_content_md5_deletes_nothing(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    """minio and rclone protect DeleteObjects with Content-MD5; a mismatch must not delete anything."""
    for key in ("keep-1", "keep-2"):
        backend.put_object(Bucket=bucket, Key=key, Body=b"k")
    resp = delete_objects_request(gateway, bucket, ["keep-1", "keep-2"], md5_b64(b"something else"))
    assert_s3_error(resp, 400, "BadDigest")
    assert object_exists(backend, bucket, "keep-1") and object_exists(backend, bucket, "keep-2")

    resp = delete_objects_request(gateway, bucket, ["keep-1", "keep-2"], "")  # the right MD5: control
    assert resp.status == 200, resp.body
    assert not object_exists(backend, bucket, "keep-1") and not object_exists(backend, bucket, "keep-2")


MALFORMED_DELETES = {
    "wrong root": "<Foo><Object><Key>a</Key></Object><Object><Key>b</Key></Object></Foo>",
    "key outside an object": "<Delete><Object><Key>a</Key></Object><Key>b</Key></Delete>",
    "object without a key": "<Delete><Object><Key>a</Key></Object><Object><VersionId>x</VersionId></Object>"
    "<Extra><Key>b</Key></Extra></Delete>",
    "nested object": "<Delete><Object><Key>a</Key><Object><Key>b</Key></Object></Object></Delete>",
    "quiet not a boolean": "<Delete><Quiet>maybe</Quiet><Object><Key>a</Key></Object>"
    "<Object><Key>b</Key></Object></Delete>",
    "two keys in one object": "<Delete><Object><Key>a</Key><Key>b</Key></Object></Delete>",
    "no objects": "<Delete><Quiet>true</Quiet></Delete>",
    "too many objects": "<Delete>" + "<Object><Key>a</Key></Object>" * 1001 + "</Delete>",
    "truncated": "<Delete><Object><Key>a</Key></Object><Object><Key>b</Key>",
    "empty": "",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_DELETES))
def test_malformed_delete_objects_is_malformed_xml_and_deletes_nothing(
    gateway: Gateway, backend: Any, bucket: str, name: str
) -> None:
    """Checked by the gateway as S3 checks it, spooled keys or not: the store would delete the keys of some
    of these documents (SeaweedFS ignores the root's name and stray elements)."""
    for key in ("a", "b"):
        backend.put_object(Bucket=bucket, Key=key, Body=b"k")
    body = MALFORMED_DELETES[name].encode()
    resp = post_delete(
        gateway, bucket, body, {"Content-Type": "application/xml", "Content-MD5": md5_b64(body)}
    )
    assert_s3_error(resp, 400, "MalformedXML")
    assert object_exists(backend, bucket, "a") and object_exists(backend, bucket, "b")


MALFORMED_COMPLETES = {
    "wrong root": "<Foo><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag></Part></Foo>",
    "no parts": "<CompleteMultipartUpload></CompleteMultipartUpload>",
    "part without an etag": "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part>"
    "</CompleteMultipartUpload>",
    "part number not a number": "<CompleteMultipartUpload><Part><PartNumber>one</PartNumber>"
    "<ETag>{etag}</ETag></Part></CompleteMultipartUpload>",
    "stray element": "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag></Part>"
    "<Extra/></CompleteMultipartUpload>",
    "truncated": "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag>",
}


@pytest.mark.parametrize("spooled", [False, True], ids=["proxied", "spooled"])
@pytest.mark.parametrize("name", sorted(MALFORMED_COMPLETES))
def test_malformed_complete_multipart_upload_is_malformed_xml_and_completes_nothing(
    gateway: Gateway, spool_gateway: Gateway, backend: Any, bucket: str, name: str, spooled: bool
) -> None:
    """Checked by the gateway as S3 checks it, for uploads the store holds and uploads the spool holds:
    SeaweedFS completes an upload from a document whose root is not CompleteMultipartUpload. The upload
    stays open, and the right document (the control) completes it afterwards."""
    gw = spool_gateway if spooled else gateway
    s3 = gw.client()
    key = f"ckpt/complete-{name.replace(' ', '-')}"
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    data = os.urandom(100 * KiB)
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=data)["ETag"]
    body = MALFORMED_COMPLETES[name].replace("{etag}", etag).encode()
    target = f"{key_path(bucket, key)}?uploadId={upload_id}"
    resp = signed_request(
        gw.http_url,
        "POST",
        target,
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        body=body,
        headers={"Content-Type": "application/xml"},
    )
    assert_s3_error(resp, 400, "MalformedXML")
    gw.flush(bucket)
    assert not object_exists(backend, bucket, key)
    parts = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)["Parts"]
    assert [p["PartNumber"] for p in parts] == [1]

    parts_doc = {"Parts": [{"PartNumber": 1, "ETag": etag}]}  # the control: a well-formed document
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload=parts_doc)
    gw.flush(bucket)
    assert_stored(backend, bucket, key, data)


# --- several identities -------------------------------------------------------------------------------------


def test_second_identity_works_through_the_same_gateway(gateway: Gateway, backend: Any, bucket: str) -> None:
    admin = gateway.client()
    user2 = gateway.client(https=True, access_key=gateway.user2_access_key, secret=gateway.user2_secret_key)
    a_data, u_data = os.urandom(300 * KiB), os.urandom(300 * KiB)
    # Interleaved, on the one gateway: each identity's requests verify against its own secret.
    admin.put_object(Bucket=bucket, Key="by-admin", Body=a_data)
    user2.put_object(Bucket=bucket, Key="by-user2", Body=u_data)
    assert user2.get_object(Bucket=bucket, Key="by-admin")["Body"].read() == a_data
    assert admin.get_object(Bucket=bucket, Key="by-user2")["Body"].read() == u_data
    assert {o["Key"] for o in user2.list_objects_v2(Bucket=bucket)["Contents"]} == {"by-admin", "by-user2"}
    assert_stored(backend, bucket, "by-user2", u_data)

    # user2's access key with admin's secret is not user2.
    resp = put(
        gateway, bucket, "mixed", b"x", access_key=gateway.user2_access_key, secret_key=gateway.secret_key
    )
    assert_s3_error(resp, 403, "SignatureDoesNotMatch")
    assert not object_exists(backend, bucket, "mixed")
