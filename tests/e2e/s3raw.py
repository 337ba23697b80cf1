"""Crafted S3 requests for the end-to-end tests: signed with botocore, sent byte for byte over a raw socket.

boto3 fixes up whatever it sends (it recomputes hashes, adds checksums, retries), so a test that needs a
*wrong* request builds it here: :func:`sign` signs exactly the headers given, with the literal
``x-amz-content-sha256`` given (botocore's plain ``SigV4Auth`` keeps that header; its S3 subclass would
replace it), and :func:`send` writes the request head and body as they are. The body is written from a
second thread while the response is read, so a server that answers early (and closes) does not deadlock
the test on a full socket buffer. Plain HTTP only: an SSL socket must not be read and written from two
threads at once.

Also here: aws-chunked framing (:func:`aws_chunked`), HTTP chunked transfer coding (:func:`te_chunked`),
checksums in S3's base64 form, S3 error XML parsing, and emptying a bucket straight on the backend.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import hmac
import http.client
import socket
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
REGION = "us-east-1"
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def key_path(bucket: str, key: str | None = None) -> str:
    """Path-style request path in S3's canonical encoding."""
    path = "/" + quote(bucket, safe="~")
    if key is not None:
        path += "/" + quote(key, safe="/~")
    return path


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def signing_clock(when: datetime.datetime) -> Iterator[None]:
    """Make botocore sign (and presign) as if it were ``when`` (naive UTC). Both signer families are
    patched: with awscrt installed, boto3 clients sign with the CRT signers in ``botocore.crt.auth``."""
    import botocore.crt.auth

    def fake_now(remove_tzinfo: bool = True) -> datetime.datetime:
        return when if remove_tzinfo else when.replace(tzinfo=datetime.UTC)

    with (
        mock.patch.object(botocore.auth, "get_current_datetime", fake_now),
        mock.patch.object(botocore.crt.auth, "get_current_datetime", fake_now),
    ):
        yield


def utc_now() -> datetime.datetime:
    """Now as a naive UTC datetime, botocore's convention."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


class _LiteralS3Auth(botocore.auth.SigV4Auth):
    """SigV4 as S3 computes it: no path normalisation, and x-amz-content-sha256 signed as given."""

    def _normalize_url_path(self, path: str) -> str:
        return path


def sign(
    method: str,
    base_url: str,
    target: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    payload_hash: str,
    host: str | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """Return ``headers`` plus Host, X-Amz-Date, X-Amz-Content-SHA256 and Authorization.

    ``target`` is the encoded path and query. ``host`` overrides the Host header (virtual-hosted-style
    requests sent to 127.0.0.1). ``now`` is a naive UTC datetime for a skewed or old signature.
    """
    netloc = urlsplit(base_url).netloc
    hdrs = {"Host": host or netloc, **headers, "X-Amz-Content-SHA256": payload_hash}
    req = AWSRequest(method=method, url=f"http://{host or netloc}{target}", headers=hdrs)
    auth = _LiteralS3Auth(Credentials(access_key, secret_key), "s3", REGION)
    if now is None:
        auth.add_auth(req)
    else:
        with signing_clock(now):
            auth.add_auth(req)
    return dict(req.headers.items())


@dataclass(frozen=True)
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def error_code(self) -> str | None:
        return error_code(self.body)


def error_code(body: bytes) -> str | None:
    """The <Code> of an S3 error document (None if the body is not one)."""
    if not body:
        return None
    root = ElementTree.fromstring(body)
    if root.tag.removeprefix(S3_NS) != "Error":
        return None
    code = root.find("Code")
    return code.text if code is not None else None


def error_fields(body: bytes) -> dict[str, str]:
    root = ElementTree.fromstring(body)
    assert root.tag == "Error", body[:300]
    return {child.tag: child.text or "" for child in root}


def send(
    base_url: str,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes = b"",
    *,
    timeout_s: float = 30.0,
) -> Response:
    """Send one request exactly as given (no header is added) over plain HTTP and read the response."""
    parts = urlsplit(base_url)
    assert parts.scheme == "http", "raw requests go over plain HTTP"
    assert parts.hostname is not None and parts.port is not None
    head = request_bytes(method, target, headers)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    send_error: list[BaseException] = []

    def write() -> None:
        try:
            sock.sendall(head + body)
        except OSError as exc:  # the server answered early and closed; the response tells why
            send_error.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        data = resp.read()
        return Response(resp.status, resp.headers, data)
    finally:
        writer.join(timeout_s)
        sock.close()


def request_bytes(method: str, target: str, headers: Mapping[str, str]) -> bytes:
    """An HTTP/1.1 request head, exactly as given."""
    lines = [f"{method} {target} HTTP/1.1\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]
    return "".join(lines).encode("utf-8")


def exchange_until_close(
    base_url: str, data: bytes, *, half_close: bool = False, timeout_s: float = 10.0
) -> bytes:
    """Write ``data`` (optionally shut down our sending side) and return every byte the server sends
    until it closes: for checks on what follows a response head (nothing, for HEAD)."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    received = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def signed_request(
    base_url: str,
    method: str,
    target: str,
    *,
    access_key: str,
    secret_key: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    payload_hash: str | None = None,
    content_length: bool = True,
) -> Response:
    """Sign (hex SHA-256 of ``body`` unless ``payload_hash`` says otherwise) and send."""
    hdrs = dict(headers or {})
    if content_length and (body or method in ("PUT", "POST")):
        hdrs.setdefault("Content-Length", str(len(body)))
    signed = sign(
        method,
        base_url,
        target,
        hdrs,
        access_key=access_key,
        secret_key=secret_key,
        payload_hash=payload_hash if payload_hash is not None else sha256_hex(body),
    )
    return send(base_url, method, target, signed, body)


def aws_chunked(
    payload: bytes,
    *,
    chunk_bytes: int = 64 * 1024,
    trailers: Iterable[tuple[str, str]] = (),
) -> bytes:
    """aws-chunked framing with unsigned chunks, as botocore writes it: ``hex\\r\\ndata\\r\\n ... 0\\r\\n``,
    then one ``name:value\\r\\n`` per trailer, then ``\\r\\n``."""
    out = []
    for start in range(0, len(payload), chunk_bytes):
        chunk = payload[start : start + chunk_bytes]
        out.append(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    out.append(b"0\r\n")
    out.extend(f"{name}:{value}\r\n".encode() for name, value in trailers)
    out.append(b"\r\n")
    return b"".join(out)


def aws_chunked_headers(decoded_length: int, trailer: str | None = "x-amz-checksum-crc32") -> dict[str, str]:
    hdrs = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(decoded_length)}
    if trailer is not None:
        hdrs["X-Amz-Trailer"] = trailer
        hdrs["X-Amz-Sdk-Checksum-Algorithm"] = trailer.removeprefix("x-amz-checksum-").upper()
    return hdrs


def te_chunked(body: bytes, piece_bytes: int = 16 * 1024) -> bytes:
    """HTTP/1.1 chunked transfer coding of ``body`` (what botocore uses under aws-chunked over HTTPS)."""
    out = [
        b"%x\r\n" % len(body[i : i + piece_bytes]) + body[i : i + piece_bytes] + b"\r\n"
        for i in range(0, len(body), piece_bytes)
    ]
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def client_error(exc: ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a boto3 ClientError."""
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]


def object_exists(backend: Any, bucket: str, key: str) -> bool:
    try:
        backend.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if client_error(exc)[1] == 404:
            return False
        raise
    return True


def all_keys(backend: Any, bucket: str, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for page in backend.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return keys


def empty_and_delete_bucket(backend: Any, bucket: str) -> None:
    """Abort uploads, delete every object, delete the bucket; a bucket that is already gone is fine."""
    try:
        uploads = backend.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    except ClientError as exc:
        if client_error(exc)[0] == "NoSuchBucket":
            return
        raise
    for up in uploads:
        backend.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    keys = all_keys(backend, bucket)
    for start in range(0, len(keys), 1000):
        backend.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
        )
    backend.delete_bucket(Bucket=bucket)


def signing_key(secret_key: str, date: str, region: str = REGION, service: str = "s3") -> bytes:
    key = f"AWS4{secret_key}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def signed_aws_chunked(
    payload: bytes, signed_headers: Mapping[str, str], secret_key: str, *, chunk_bytes: int = 64 * 1024
) -> bytes:
    """aws-chunked framing with chunk signatures (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``), computed here from
    the SigV4 spec, independently of the gateway: each chunk's signature chains on the previous one, the
    first on the signature in the Authorization header."""
    amz_date = signed_headers["X-Amz-Date"]
    auth = signed_headers["Authorization"]
    previous = auth.rpartition("Signature=")[2]
    scope = auth.partition("Credential=")[2].partition(",")[0].split("/", 1)[1]
    key = signing_key(secret_key, amz_date[:8])
    chunks = [payload[i : i + chunk_bytes] for i in range(0, len(payload), chunk_bytes)] + [b""]
    out = []
    for chunk in chunks:
        sts = "\n".join(
            ["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, EMPTY_SHA256, sha256_hex(chunk)]
        )
        previous = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        out.append(b"%x;chunk-signature=%s\r\n" % (len(chunk), previous.encode()) + chunk + b"\r\n")
    return b"".join(out)
