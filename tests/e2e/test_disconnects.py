"""Clients that go away mid-request leave the gateway's lane accounting at zero and the gateway serving.

Each test drives a real ``s3lanes serve`` over a raw socket (signed with :mod:`tests.e2e.s3raw`), proves the
request is mid-operation by reading ``/_s3lanes/status`` (budget held, or a ticket queued), disconnects, and
then polls the status until every lane's queued and in-flight ticket counts and the dispatcher's waiters and
grants are back to zero. A normal request afterwards still works, an aborted upload stored nothing on the
backend (checked on SeaweedFS directly), and the gateway logged no traceback for any of it (checked right
after each test here, and again for the whole session by the gateway fixture's teardown).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.s3raw import (
    EMPTY_SHA256,
    UNSIGNED_PAYLOAD,
    all_keys,
    key_path,
    object_exists,
    request_bytes,
    sign,
)

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
# Far more than the loopback socket buffers on both sides can hold, so the gateway is mid-stream when the
# client leaves.
DOWNLOAD_BYTES = 48 * MiB
UPLOAD_DECLARED_BYTES = 8 * MiB
UPLOAD_SENT_BYTES = 1 * MiB
QUIET_TIMEOUT_S = 10.0
NARROW_WINDOW_TICKETS = 2  # the narrow gateway's inflight_requests_max


# -- the status document -----------------------------------------------------------------------------------


def status(gw: Gateway) -> dict[str, Any]:
    with urllib.request.urlopen(gw.http_url + "/_s3lanes/status", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def counters(doc: dict[str, Any]) -> dict[str, int]:
    lanes = doc["scheduler"]["lanes"]
    return {
        "queued_tickets": sum(ln["queued_tickets"] for ln in lanes),
        "inflight_tickets": sum(ln["inflight_tickets"] for ln in lanes),
        "waiting": doc["dispatcher"]["waiting"],
        "in_flight": doc["dispatcher"]["in_flight"],
    }


def wait_for_status(
    gw: Gateway, ok: Callable[[dict[str, int]], bool], what: str, timeout_s: float = QUIET_TIMEOUT_S
) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc = status(gw)
        c = counters(doc)
        if ok(c):
            return c
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s} s: {c}\n{describe(doc)}")
        time.sleep(0.05)


def describe(doc: dict[str, Any]) -> str:
    """The scheduler state that explains a wait, for failure messages."""
    sch = doc["scheduler"]
    keys = ("reads_active", "guard_multiplier", "capacity_bps", "inflight_bytes", "inflight_bytes_max")
    lane_keys = ("queued_tickets", "queued_bytes", "inflight_tickets", "inflight_bytes", "limit_bps")
    lanes = {ln["name"]: {k: ln[k] for k in lane_keys} for ln in sch["lanes"]}
    return json.dumps({**{k: sch[k] for k in keys}, "lanes": lanes}, indent=1)


def wait_until_quiet(gw: Gateway) -> None:
    """Every lane's queued and in-flight tickets and the dispatcher's waiting/in_flight back to 0."""
    wait_for_status(gw, lambda c: not any(c.values()), "quiet")


@pytest.fixture
def no_new_traceback(gateway: Gateway) -> Iterator[None]:
    """Fail the test itself (not only the session teardown) if the gateway logged a traceback during it."""
    yield from _no_new_traceback(gateway.log_path)


def _no_new_traceback(log_path: Path) -> Iterator[None]:
    start = log_path.stat().st_size
    yield
    new = log_since(log_path, start)
    assert "Traceback" not in new, f"the gateway logged a traceback:\n{new[-8000:]}"


def log_since(log_path: Path, offset: int) -> str:
    with open(log_path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


# -- raw requests ------------------------------------------------------------------------------------------


def open_request(
    gw: Gateway,
    method: str,
    target: str,
    headers: dict[str, str],
    *,
    payload_hash: str,
    body: bytes = b"",
) -> socket.socket:
    """Connect, send a signed request head (and ``body``, possibly short of its Content-Length)."""
    parts = urlsplit(gw.http_url)
    assert parts.hostname is not None and parts.port is not None
    signed = sign(
        method,
        gw.http_url,
        target,
        headers,
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        payload_hash=payload_hash,
    )
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(request_bytes(method, target, signed) + body)
    return sock


def read_head_and_some_body(sock: socket.socket, body_bytes: int) -> tuple[bytes, int]:
    """Read the response head and at least ``body_bytes`` of its body; return the head and the body count."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(64 * KiB)
        assert chunk, f"connection closed before the response head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    got = len(rest)
    while got < body_bytes:
        chunk = sock.recv(256 * KiB)
        assert chunk, "connection closed mid-body"
        got += len(chunk)
    return head, got


def abort(sock: socket.socket) -> None:
    """Close abruptly: SO_LINGER 0 makes the close a RST, as a killed client's kernel would send."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def check_gateway_serves(gw: Gateway, bucket: str) -> None:
    s3 = gw.client()
    try:
        payload = os.urandom(300 * KiB)  # over 256 KiB: streamed through the body pipeline and its budget
        s3.put_object(Bucket=bucket, Key="after/check.bin", Body=payload)
        got = s3.get_object(Bucket=bucket, Key="after/check.bin")["Body"].read()
        assert got == payload
    finally:
        s3.close()


# -- mid-download ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("close", ["reset", "fin"])
def test_client_gone_mid_download_frees_its_budget(
    gateway: Gateway, backend: Any, bucket: str, no_new_traceback: None, close: str
) -> None:
    payload = os.urandom(DOWNLOAD_BYTES)
    backend.put_object(Bucket=bucket, Key="data/big.bin", Body=payload)
    wait_until_quiet(gateway)
    log_offset = gateway.log_path.stat().st_size

    sock = open_request(gateway, "GET", key_path(bucket, "data/big.bin"), {}, payload_hash=EMPTY_SHA256)
    try:
        head, got = read_head_and_some_body(sock, 1 * MiB)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert got < DOWNLOAD_BYTES
        # Mid-operation: the request's ticket (and the body's current chunk) are held by the gateway.
        wait_for_status(gateway, lambda c: c["in_flight"] >= 1, "mid-download")
    finally:
        if close == "reset":
            abort(sock)
        else:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    wait_until_quiet(gateway)
    # The client left; the backend did nothing wrong and must not be blamed in the log.
    assert "backend body failed" not in log_since(gateway.log_path, log_offset)
    check_gateway_serves(gateway, bucket)
    s3 = gateway.client()
    try:
        body = s3.get_object(Bucket=bucket, Key="data/big.bin")["Body"].read()
    finally:
        s3.close()
    assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
    wait_until_quiet(gateway)


# -- mid-upload --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("payload_hash", ["unsigned", "sha256"])
def test_client_gone_mid_upload_frees_its_budget_and_stores_nothing(
    gateway: Gateway, backend: Any, bucket: str, no_new_traceback: None, payload_hash: str
) -> None:
    wait_until_quiet(gateway)
    declared = os.urandom(UPLOAD_DECLARED_BYTES)
    key = "ckpt/step_1/model.safetensors"
    sock = open_request(
        gateway,
        "PUT",
        key_path(bucket, key),
        {"Content-Length": str(UPLOAD_DECLARED_BYTES)},
        payload_hash=UNSIGNED_PAYLOAD if payload_hash == "unsigned" else hashlib.sha256(declared).hexdigest(),
        body=declared[:UPLOAD_SENT_BYTES],
    )
    try:
        # Mid-operation: the upload holds its current body chunk's budget while it waits for more body.
        wait_for_status(gateway, lambda c: c["in_flight"] >= 1, "mid-upload")
    finally:
        abort(sock)

    wait_until_quiet(gateway)
    assert not object_exists(backend, bucket, key)
    assert all_keys(backend, bucket) == []
    check_gateway_serves(gateway, bucket)
    assert all_keys(backend, bucket) == ["after/check.bin"]
    wait_until_quiet(gateway)


def test_client_gone_mid_small_upload_is_dropped_quietly(
    gateway: Gateway, backend: Any, bucket: str, no_new_traceback: None
) -> None:
    """A body of at most 256 KiB is read whole before any budget is asked for: the disconnect surfaces as a
    failed read of the client's body, which must not become a logged traceback."""
    declared = 200 * KiB
    key = "ckpt/small.bin"
    sock = open_request(
        gateway,
        "PUT",
        key_path(bucket, key),
        {"Content-Length": str(declared), "Expect": "100-continue"},
        payload_hash=UNSIGNED_PAYLOAD,
    )
    try:
        # The interim answer proves the handler is running (authenticated, about to read the body).
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(4096)
            assert chunk, interim
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        sock.sendall(os.urandom(declared // 2))
        time.sleep(0.2)
    finally:
        abort(sock)

    wait_until_quiet(gateway)
    assert not object_exists(backend, bucket, key)
    check_gateway_serves(gateway, bucket)
    wait_until_quiet(gateway)


# -- queued in its lane ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def narrow_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose backend in-flight window is two tickets: two stalled uploads (each holding its
    current body chunk's ticket) fill it, so the next request queues in its lane. The session gateway's
    window is 16 MiB or more; filling it would take a dozen stalled uploads and would teach its capacity
    estimator that the backend is saturated, for the rest of the session. Same teardown checks as the
    session one."""
    tmp = tmp_path_factory.mktemp("narrow-gateway")
    proc, gw = start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        extra_toml=(
            f'bandwidth = "1000000000"\n\n[scheduler]\ninflight_requests_max = {NARROW_WINDOW_TICKETS}'
            # Uploads must be proxied (and hold their tickets), not absorbed by the spool.
            "\n\n[spool]\nenabled = false"
        ),
    )
    try:
        yield gw
    finally:
        code = stop_gateway(proc)
        text = gw.log_path.read_text(errors="replace")
        assert code == 0, text[-4000:]
        assert "Traceback" not in text, text[-8000:]


@pytest.fixture
def narrow_no_new_traceback(narrow_gateway: Gateway) -> Iterator[None]:
    yield from _no_new_traceback(narrow_gateway.log_path)


def stall_the_window(gw: Gateway, bucket: str) -> list[socket.socket]:
    """Uploads that send 1 MiB of 8 MiB and then nothing, until they hold every ticket the window allows."""
    socks: list[socket.socket] = []
    try:
        while counters(status(gw))["in_flight"] < NARROW_WINDOW_TICKETS:
            assert len(socks) < NARROW_WINDOW_TICKETS, counters(status(gw))
            held = counters(status(gw))["in_flight"]
            socks.append(
                open_request(
                    gw,
                    "PUT",
                    key_path(bucket, f"ckpt/stalled-{len(socks)}.bin"),
                    {"Content-Length": str(UPLOAD_DECLARED_BYTES)},
                    payload_hash=UNSIGNED_PAYLOAD,
                    body=os.urandom(UPLOAD_SENT_BYTES),
                )
            )

            def holding(c: dict[str, int], held: int = held) -> bool:
                return c["in_flight"] > held

            wait_for_status(gw, holding, "stalled upload holding budget")
    except BaseException:
        for sock in socks:
            abort(sock)
        raise
    return socks


def queue_a_get(gw: Gateway, bucket: str) -> socket.socket:
    sock = open_request(gw, "GET", key_path(bucket, "data/small.bin"), {}, payload_hash=EMPTY_SHA256)
    try:
        wait_for_status(gw, lambda c: c["queued_tickets"] == 1 and c["waiting"] == 1, "queued")
    except BaseException:
        abort(sock)
        raise
    return sock


def test_request_abandoned_while_queued_leaves_the_queue_at_once(
    narrow_gateway: Gateway, bucket: str, narrow_no_new_traceback: None
) -> None:
    # aiohttp does not cancel a handler whose client disconnects (the gateway does not turn that on: a
    # cancellation could land inside a spool commit); the queued request notices by itself
    # (LaneDispatcher.acquire's ``gone`` check) and gives its place up.
    gw = narrow_gateway
    stallers = stall_the_window(gw, bucket)
    try:
        abort(queue_a_get(gw, bucket))
        # The stalled uploads still hold the window; only the abandoned ticket should be gone.
        wait_for_status(
            gw,
            lambda c: (
                c["queued_tickets"] == 0 and c["waiting"] == 0 and c["in_flight"] == NARROW_WINDOW_TICKETS
            ),
            "dequeued",
            timeout_s=3.0,
        )
    finally:
        for sock in stallers:
            abort(sock)
        wait_until_quiet(gw)


def test_request_abandoned_while_queued_in_its_lane_leaves_nothing_behind(
    narrow_gateway: Gateway, backend: Any, bucket: str, narrow_no_new_traceback: None
) -> None:
    gw = narrow_gateway
    backend.put_object(Bucket=bucket, Key="data/small.bin", Body=b"x" * 1000)
    stallers = stall_the_window(gw, bucket)
    try:
        abort(queue_a_get(gw, bucket))
    finally:
        for sock in stallers:
            abort(sock)
    # The abandoned GET, once it gets its turn, finds nobody to answer and lets go of its budget.
    wait_until_quiet(gw)
    assert all_keys(backend, bucket) == ["data/small.bin"]
    check_gateway_serves(gw, bucket)
    wait_until_quiet(gw)
