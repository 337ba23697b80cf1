"""HTTP-level behaviour of the gateway: Expect: 100-continue, keep-alive after empty uploads, virtual-hosted-
style addressing, and a prompt 503 when the backend cannot be reached.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import pytest

from tests.e2e.conftest import Gateway, start_gateway, stop_gateway
from tests.e2e.s3raw import (
    EMPTY_SHA256,
    UNSIGNED_PAYLOAD,
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
# A hang check, not a benchmark: botocore's stall on a missing 100 Continue is 60 s.
EMPTY_PUT_BOUND_S = 10.0
# The unreachable backend must be reported well within the client's patience.
UNREACHABLE_BOUND_S = 5.0


# --- a tiny HTTP/1.1 reader over a raw socket (http.client hides interim responses) -----------------------


def read_head(rfile: BinaryIO) -> tuple[int, dict[str, str]]:
    status_line = rfile.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := rfile.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def read_response(rfile: BinaryIO, *, head_request: bool = False) -> tuple[int, dict[str, str], bytes]:
    status, headers = read_head(rfile)
    if head_request or status in (204, 304) or 100 <= status < 200:
        return status, headers, b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(rfile.readline().split(b";")[0], 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b""):
                    pass
                return status, headers, body
            body += rfile.read(size)
            rfile.readline()
    return status, headers, rfile.read(int(headers.get("content-length", "0")))


@pytest.fixture
def conn(gateway: Gateway) -> Iterator[tuple[socket.socket, BinaryIO]]:
    parts = urlsplit(gateway.http_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    rfile = sock.makefile("rb")
    try:
        yield sock, rfile
    finally:
        rfile.close()
        sock.close()


def signed_put_headers(gateway: Gateway, target: str, body: bytes, **extra: str) -> dict[str, str]:
    return sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(body)), "Expect": "100-continue", **extra},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=sha256_hex(body),
    )


# --- Expect: 100-continue ----------------------------------------------------------------------------------


def test_expect_100_continue_is_answered_before_the_body_is_sent(
    gateway: Gateway, backend: Any, bucket: str, conn: tuple[socket.socket, BinaryIO]
) -> None:
    sock, rfile = conn
    body = os.urandom(300 * KiB)
    target = key_path(bucket, "expect")
    sock.sendall(request_bytes("PUT", target, signed_put_headers(gateway, target, body)))

    status, _ = read_head(rfile)  # no body sent yet: this can only be the interim answer
    assert status == 100
    sock.sendall(body)
    status, headers, _ = read_response(rfile)
    assert status == 200
    assert headers["etag"].strip('"') == hashlib.md5(body).hexdigest()
    assert backend.get_object(Bucket=bucket, Key="expect")["Body"].read() == body


def test_expect_100_continue_with_empty_body_gets_100_then_200_and_keeps_the_connection(
    gateway: Gateway, backend: Any, bucket: str, conn: tuple[socket.socket, BinaryIO]
) -> None:
    sock, rfile = conn
    for key in ("empty-1", "empty-2"):  # twice on one connection: the connection stays usable
        target = key_path(bucket, key)
        sock.sendall(request_bytes("PUT", target, signed_put_headers(gateway, target, b"")))
        status, _ = read_head(rfile)
        assert status == 100
        status, headers, _ = read_response(rfile)
        assert status == 200
        assert headers.get("connection", "").lower() != "close"
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == b""

    target = key_path(bucket, "empty-2")
    get = sign(
        "GET",
        gateway.http_url,
        target,
        {},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=EMPTY_SHA256,
    )
    sock.sendall(request_bytes("GET", target, get))
    status, _, body = read_response(rfile)
    assert (status, body) == (200, b"")


def test_expect_100_continue_with_bad_signature_gets_the_final_error_instead_of_100(
    gateway: Gateway, backend: Any, bucket: str, conn: tuple[socket.socket, BinaryIO]
) -> None:
    sock, rfile = conn
    body = os.urandom(MiB)
    target = key_path(bucket, "refused")
    headers = sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(body)), "Expect": "100-continue"},
        access_key=gateway.access_key,
        secret_key="wrong secret",
        payload_hash=UNSIGNED_PAYLOAD,
    )
    sock.sendall(request_bytes("PUT", target, headers))
    status, _, error = read_response(rfile)  # the body was never sent
    assert status == 403
    assert error_fields(error)["Code"] == "SignatureDoesNotMatch"
    assert not object_exists(backend, bucket, "refused")


@pytest.mark.parametrize(
    "headers",
    [{"Content-MD5": "not base64!!"}, {"Authorization-Secret": "wrong"}],
    ids=["refused-after-auth", "refused-at-auth"],
)
def test_a_refused_upload_never_lets_its_body_be_read_as_the_next_request(
    gateway: Gateway, backend: Any, bucket: str, conn: tuple[socket.socket, BinaryIO], headers: dict[str, str]
) -> None:
    """The refused body (here shaped like a request line) must not be parsed as a request: the gateway
    either closes the connection or reads the body away; the next request still gets its own answer."""
    sock, rfile = conn
    target = key_path(bucket, "refused")
    smuggled = f"DELETE {key_path(bucket, 'victim')} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    body = smuggled + b"x" * (KiB - len(smuggled))
    secret = "wrong" if "Authorization-Secret" in headers else gateway.secret_key
    extra = {k: v for k, v in headers.items() if k != "Authorization-Secret"}
    signed = sign(
        "PUT",
        gateway.http_url,
        target,
        {"Content-Length": str(len(body)), **extra},
        access_key=gateway.access_key,
        secret_key=secret,
        payload_hash=UNSIGNED_PAYLOAD,
    )
    backend.put_object(Bucket=bucket, Key="victim", Body=b"still here")
    sock.sendall(request_bytes("PUT", target, signed) + body)
    status, response_headers, _ = read_response(rfile)
    assert status in (400, 403)

    get = sign(
        "GET",
        gateway.http_url,
        key_path(bucket, "victim"),
        {},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=EMPTY_SHA256,
    )
    try:
        sock.sendall(request_bytes("GET", key_path(bucket, "victim"), get))
        next_line = rfile.readline()
    except ConnectionError:
        next_line = b""
    if next_line:  # the connection was kept: the answer must be the one to the GET
        assert response_headers.get("connection", "").lower() != "close"
        assert next_line.startswith(b"HTTP/1.1 200"), next_line
    assert backend.get_object(Bucket=bucket, Key="victim")["Body"].read() == b"still here"
    assert not object_exists(backend, bucket, "refused")


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_boto3_empty_put_twice_on_one_client_does_not_stall(
    gateway: Gateway, bucket: str, https: bool
) -> None:
    client = gateway.client(https=https)
    for key in ("zero-a", "zero-b", "zero-a"):
        started = time.monotonic()
        client.put_object(Bucket=bucket, Key=key, Body=b"")
        elapsed_s = time.monotonic() - started
        assert elapsed_s < EMPTY_PUT_BOUND_S, f"empty PUT of {key} took {elapsed_s:.1f} s"
    assert client.get_object(Bucket=bucket, Key="zero-b")["Body"].read() == b""


# --- virtual-hosted-style ----------------------------------------------------------------------------------


def vhost_request(
    gateway: Gateway, bucket: str, method: str, target: str, body: bytes = b"", **extra: str
) -> Any:
    port = urlsplit(gateway.http_url).port
    host = f"{bucket}.localhost:{port}"
    headers = {**extra}
    if method == "PUT":
        headers["Content-Length"] = str(len(body))
    signed = sign(
        method,
        gateway.http_url,
        target,
        headers,
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=sha256_hex(body),
        host=host,
    )
    assert signed["Host"] == host
    return send(gateway.http_url, method, target, signed, body)


def test_virtual_hosted_style_put_get_head_list(gateway: Gateway, backend: Any, bucket: str) -> None:
    data = os.urandom(300 * KiB)
    key = "vhost dir/ü+object.bin"
    target = "/" + quote(key, safe="/~")

    resp = vhost_request(gateway, bucket, "PUT", target, data)
    assert resp.status == 200, resp.body
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data  # the bucket came from Host

    resp = vhost_request(gateway, bucket, "GET", target)
    assert (resp.status, resp.body) == (200, data)
    resp = vhost_request(gateway, bucket, "GET", target, Range="bytes=10-19")
    assert (resp.status, resp.body) == (206, data[10:20])
    assert vhost_request(gateway, bucket, "HEAD", "/").status == 200

    backend.put_object(Bucket=bucket, Key="second", Body=b"2")
    resp = vhost_request(gateway, bucket, "GET", "/?list-type=2&prefix=")
    assert resp.status == 200
    root = ElementTree.fromstring(resp.body)
    ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
    assert {k.text for k in root.findall("s3:Contents/s3:Key", ns)} == {key, "second"}

    resp = vhost_request(gateway, bucket, "GET", "/missing-key")
    assert resp.status == 404
    assert error_fields(resp.body)["Code"] == "NoSuchKey"


# --- unreachable backend -----------------------------------------------------------------------------------


def closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def orphan_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A second gateway whose backend is a closed loopback port. Yields (url, access key, secret)."""
    tmp: Path = tmp_path_factory.mktemp("orphan-gateway")
    access_key, secret_key = "orphan-access", "orphan-secret-key"
    toml = f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp / "state"}"
shutdown_grace_s = 2

[backend]
endpoint = "http://127.0.0.1:{closed_loopback_port()}"
connect_timeout_s = 2
read_timeout_s = 5

[[credentials]]
access_key = "{access_key}"
secret_key = "{secret_key}"
"""
    proc, ready, log_path = start_gateway(tmp, toml)
    try:
        yield ready["endpoints"][0], access_key, secret_key
    finally:
        code = stop_gateway(proc)
        log_text = log_path.read_text(errors="replace")
        assert code == 0, log_text[-4000:]
        assert "Traceback" not in log_text, log_text[-8000:]


@pytest.mark.parametrize(
    ("method", "target", "size"),
    [
        ("GET", "/bucket/key", 0),
        ("GET", "/", 0),
        ("PUT", "/bucket/small", 1000),
        ("PUT", "/bucket/large", 2 * MiB),
    ],
    ids=["get-object", "list-buckets", "put-small", "put-large"],
)
def test_unreachable_backend_is_a_prompt_503(
    orphan_gateway: tuple[str, str, str], method: str, target: str, size: int
) -> None:
    url, access_key, secret_key = orphan_gateway
    body = os.urandom(size)
    headers = {"Content-Length": str(size)} if method == "PUT" else {}
    signed = sign(
        method,
        url,
        target,
        headers,
        access_key=access_key,
        secret_key=secret_key,
        payload_hash=sha256_hex(body),
    )
    started = time.monotonic()
    resp = send(url, method, target, signed, body)
    elapsed_s = time.monotonic() - started
    assert resp.status == 503
    assert error_fields(resp.body)["Code"] == "ServiceUnavailable"
    assert resp.header("Retry-After") is not None
    assert elapsed_s < UNREACHABLE_BOUND_S, f"503 took {elapsed_s:.1f} s"


def test_unreachable_backend_head_is_503_without_body(orphan_gateway: tuple[str, str, str]) -> None:
    url, access_key, secret_key = orphan_gateway
    signed = sign(
        "HEAD",
        url,
        "/bucket/key",
        {"Connection": "close"},
        access_key=access_key,
        secret_key=secret_key,
        payload_hash=EMPTY_SHA256,
    )
    raw = exchange_until_close(url, request_bytes("HEAD", "/bucket/key", signed))
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep and head.startswith(b"HTTP/1.1 503"), raw[:300]
    assert rest == b""


def test_unreachable_backend_still_authenticates_first(orphan_gateway: tuple[str, str, str]) -> None:
    url, access_key, _ = orphan_gateway
    signed = sign(
        "GET", url, "/bucket/key", {}, access_key=access_key, secret_key="wrong", payload_hash=EMPTY_SHA256
    )
    resp = send(url, "GET", "/bucket/key", signed)
    assert resp.status == 403
    assert error_fields(resp.body)["Code"] == "SignatureDoesNotMatch"
