"""A paced upload's body waits on the client's side, and its answer comes soon after its last byte.

The gateway paces a checkpoint upload to its lane's budget. If its kernel took the body in as fast as the
client sends it, the client would hand over most of a part at once and then wait, with nothing moving on
its connection, while the gateway paced it out (on the root testbed, whose links have a real round trip,
the buffers grew to megabytes and botocore writers waited up to 40 s for an answer). The gateway shrinks the
receive buffer of a paced upload's connection to one piece, so the client's own sends block instead, in
short pauses, and the answer follows the last byte within what the buffers on the way hold. On loopback the
kernel grows a slowly read socket's buffer little (here 0.4-0.6 s of answer wait without the narrowing,
0.35-0.45 s with it): this test holds the bound end to end; tests/runtime/test_dispatcher.py checks that
the buffer is narrowed and restored.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.s3raw import key_path, request_bytes, sign

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
RATE_BPS = 2_000_000  # the store's configured bandwidth: the gateway paces every body to it
BODY_BYTES = 22 * MiB  # the first 16 MiB at once (the burst), the rest in 3.1 s at that rate
CLIENT_SNDBUF = 32 * KiB  # the client's own send buffer, small, so what the test sees is the gateway's
# What may still be on the way when the client's last send returns: the gateway's receive buffer (one 64
# KiB piece, doubled by the kernel), aiohttp's read buffer (128 KiB) and the client's send buffer: ~0.2 s
# at 2 MB/s, and the scheduler's window on a loaded machine.
MAX_ANSWER_WAIT_S = 1.0
BURST_BYTES = 16 * MiB  # the first 16 MiB go at once: the receive buffer autotunes up meanwhile


@pytest.fixture(scope="module")
def paced_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("paced-gateway")
    proc, gw = start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        extra_toml=(
            f'bandwidth = "{RATE_BPS}"\n\n[scheduler]\nrequest_cost_bytes = "4KiB"\nchunk_bytes = "128KiB"'
            f'\nburst_bytes = "{BURST_BYTES // MiB}MiB"'
            "\n\n[spool]\nenabled = false"  # proxied and paced, not absorbed by the spool
        ),
    )
    try:
        yield gw
    finally:
        code = stop_gateway(proc)
        text = gw.log_path.read_text(errors="replace")
        assert code == 0, text[-4000:]
        assert "Traceback" not in text, text[-8000:]


def test_a_paced_upload_is_answered_soon_after_its_last_byte(
    paced_gateway: Gateway, bucket: str, backend: Any
) -> None:
    gw = paced_gateway
    body = hashlib.sha256(b"paced").digest() * (BODY_BYTES // 32)
    target = key_path(bucket, "ckpt/step-1/model.pt")
    signed = sign(
        "PUT",
        gw.http_url,
        target,
        {"Content-Length": str(len(body))},
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        payload_hash=hashlib.sha256(body).hexdigest(),
    )
    parts = urlsplit(gw.http_url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SNDBUF)
    sock.settimeout(30)
    sock.connect((parts.hostname, parts.port))
    try:
        started = time.monotonic()
        sock.sendall(request_bytes("PUT", target, signed))
        view = memoryview(body)
        for off in range(0, len(body), 64 * KiB):
            sock.sendall(view[off : off + 64 * KiB])
        last_byte = time.monotonic()
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(64 * KiB)
            assert chunk, f"closed before the answer: {head!r}"
            head += chunk
        answered = time.monotonic()
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    # Paced: the body took about its time at the configured rate ...
    assert answered - started >= 0.7 * (len(body) - BURST_BYTES) / RATE_BPS, answered - started
    # ... and most of that time was spent sending it, not waiting for the answer.
    assert answered - last_byte <= MAX_ANSWER_WAIT_S, (answered - last_byte, answered - started)
    stored = backend.head_object(Bucket=bucket, Key="ckpt/step-1/model.pt")
    assert stored["ContentLength"] == len(body)
