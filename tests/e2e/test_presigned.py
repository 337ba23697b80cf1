"""Presigned URLs made by boto3 and used by a plain HTTP client (urllib), through the gateway.

A presigned request carries its signature in the query string (``X-Amz-Signature``...) and no payload hash
(UNSIGNED-PAYLOAD). The gateway verifies it and must not forward those parameters to the backend.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Any

import pytest

from tests.e2e.conftest import Gateway
from tests.e2e.s3raw import error_fields, object_exists, signing_clock, utc_now

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture(params=["http", "https"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def s3(gateway: Gateway, scheme: str) -> Any:
    # Without an explicit signature version botocore presigns S3 URLs with SigV2.
    return gateway.client(https=scheme == "https", signature_version="s3v4")


@pytest.fixture
def ssl_ctx(gateway: Gateway) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=gateway.ca_bundle)


def fetch(
    url: str, ssl_ctx: ssl.SSLContext, *, method: str = "GET", data: bytes | None = None
) -> tuple[int, Message, bytes]:
    """One request with urllib; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(
            req, timeout=30, context=ssl_ctx if url.startswith("https") else None
        ) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, err.read()


def presign_at(s3: Any, when: datetime.datetime, method: str, expires_s: int, **params: Any) -> str:
    """A presigned URL whose X-Amz-Date is ``when`` (naive UTC) instead of now."""
    with signing_clock(when):
        url = str(s3.generate_presigned_url(method, Params=params, ExpiresIn=expires_s))
    assert f"X-Amz-Date={when:%Y%m%dT%H%M%S}Z" in url
    return url


def tamper_signature(url: str) -> str:
    head, sep, signature = url.partition("X-Amz-Signature=")
    assert sep and len(signature[:64]) == 64
    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    return head + sep + flipped


@pytest.mark.parametrize("size", [0, 1000, 2 * MiB], ids=["0B", "1000B", "2MiB"])
def test_presigned_get_is_byte_exact(s3: Any, bucket: str, ssl_ctx: ssl.SSLContext, size: int) -> None:
    data = os.urandom(size)
    key = "presigned dir/ü+file.bin"
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    assert "X-Amz-Signature=" in url

    status, headers, body = fetch(url, ssl_ctx)
    assert status == 200
    assert body == data
    assert headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'


def test_presigned_get_with_response_override(s3: Any, bucket: str, ssl_ctx: ssl.SSLContext) -> None:
    s3.put_object(Bucket=bucket, Key="doc", Body=b"payload")
    url = s3.generate_presigned_url(
        "get_object",
        Params={"Bucket": bucket, "Key": "doc", "ResponseContentType": "text/x-presigned"},
        ExpiresIn=300,
    )
    status, headers, body = fetch(url, ssl_ctx)
    assert (status, body) == (200, b"payload")
    assert headers["Content-Type"] == "text/x-presigned"


@pytest.mark.parametrize("size", [0, 1000, 2 * MiB], ids=["0B", "1000B", "2MiB"])
def test_presigned_put_is_stored_byte_exact(
    s3: Any, backend: Any, bucket: str, ssl_ctx: ssl.SSLContext, size: int
) -> None:
    data = os.urandom(size)
    key = "uploads/ü name+%.bin"
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)

    status, headers, _ = fetch(url, ssl_ctx, method="PUT", data=data)
    assert status == 200
    assert headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_expired_presigned_get_is_access_denied(s3: Any, bucket: str, ssl_ctx: ssl.SSLContext) -> None:
    s3.put_object(Bucket=bucket, Key="old", Body=b"secret")
    two_hours_ago = utc_now() - datetime.timedelta(hours=2)
    url = presign_at(s3, two_hours_ago, "get_object", 60, Bucket=bucket, Key="old")

    status, _, body = fetch(url, ssl_ctx)
    assert status == 403
    fields = error_fields(body)
    assert fields["Code"] == "AccessDenied"
    assert "expired" in fields["Message"].lower()
    assert b"secret" not in body


def test_expired_presigned_put_is_access_denied_and_stores_nothing(
    s3: Any, backend: Any, bucket: str, ssl_ctx: ssl.SSLContext
) -> None:
    two_hours_ago = utc_now() - datetime.timedelta(hours=2)
    url = presign_at(s3, two_hours_ago, "put_object", 60, Bucket=bucket, Key="late")

    status, _, body = fetch(url, ssl_ctx, method="PUT", data=os.urandom(1000))
    assert status == 403
    assert error_fields(body)["Code"] == "AccessDenied"
    assert not object_exists(backend, bucket, "late")


def test_presigned_url_expires_after_its_lifetime(s3: Any, bucket: str, ssl_ctx: ssl.SSLContext) -> None:
    """The same URL works, then (time itself under test) stops working once ExpiresIn has passed."""
    s3.put_object(Bucket=bucket, Key="short-lived", Body=b"now you see me")
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "short-lived"}, ExpiresIn=2
    )
    assert fetch(url, ssl_ctx)[0] == 200
    time.sleep(3.1)  # X-Amz-Date has second resolution: 2 s lifetime + up to 1 s of truncation
    status, _, body = fetch(url, ssl_ctx)
    assert status == 403
    assert error_fields(body)["Code"] == "AccessDenied"


def test_tampered_presigned_get_signature_does_not_match(
    s3: Any, bucket: str, ssl_ctx: ssl.SSLContext
) -> None:
    s3.put_object(Bucket=bucket, Key="guarded", Body=b"guarded body")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "guarded"}, ExpiresIn=300)

    status, _, body = fetch(tamper_signature(url), ssl_ctx)
    assert status == 403
    assert error_fields(body)["Code"] == "SignatureDoesNotMatch"
    assert b"guarded body" not in body


def test_presigned_url_for_one_key_does_not_open_another(
    s3: Any, bucket: str, ssl_ctx: ssl.SSLContext
) -> None:
    s3.put_object(Bucket=bucket, Key="public", Body=b"p")
    s3.put_object(Bucket=bucket, Key="private", Body=b"q")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "public"}, ExpiresIn=300)

    status, _, body = fetch(url.replace("/public?", "/private?"), ssl_ctx)
    assert status == 403
    assert error_fields(body)["Code"] == "SignatureDoesNotMatch"


def test_sigv2_presigned_url_is_refused_with_an_s3_error(
    gateway: Gateway, bucket: str, ssl_ctx: ssl.SSLContext
) -> None:
    """The gateway verifies SigV4 only; a SigV2 URL (botocore's default for presign) gets a clear 400."""
    s3v2 = gateway.client()
    s3v2.put_object(Bucket=bucket, Key="v2", Body=b"v2 body")
    url = s3v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=300)
    assert "Signature=" in url and "X-Amz-Signature=" not in url

    status, _, body = fetch(url, ssl_ctx)
    assert status == 400
    assert error_fields(body)["Code"] == "InvalidRequest"
    assert b"v2 body" not in body


def test_tampered_presigned_put_stores_nothing(
    s3: Any, backend: Any, bucket: str, ssl_ctx: ssl.SSLContext
) -> None:
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "forged"}, ExpiresIn=300)

    status, _, body = fetch(tamper_signature(url), ssl_ctx, method="PUT", data=os.urandom(300 * KiB))
    assert status == 403
    assert error_fields(body)["Code"] == "SignatureDoesNotMatch"
    assert not object_exists(backend, bucket, "forged")
