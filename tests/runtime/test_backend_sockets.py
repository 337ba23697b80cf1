"""Backend connections on real loopback sockets: the socket factory bounds what the kernel holds of a request
body not yet sent (TCP_NOTSENT_LOWAT), so a paced body cannot pile up megabytes in the socket and leave them
in one burst; the bound does not stall a body the store takes; the session's connections carry it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from s3lanes.clock import SystemClock
from s3lanes.config import BackendConfig, Credential
from s3lanes.runtime.backend import TCP_NOTSENT_LOWAT, Backend, backend_socket

KiB = 1024
MiB = 1024 * KiB
LOWAT = 64 * KiB
CRED = Credential("client", "secret", "backend", "backend-secret")


@contextlib.contextmanager
def stalled_peer() -> Iterator[tuple[socket.socket, tuple[str, int]]]:
    """A loopback listener whose accepted connection reads nothing (a small receive window): what a
    sender writes beyond that window stays in the sender's socket, not yet sent."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)  # inherited by the accepted socket
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    try:
        yield lst, lst.getsockname()
    finally:
        lst.close()


def accepted_before_full(notsent_lowat_bytes: int) -> int:
    """Bytes a non-blocking socket from the factory takes before it refuses more, towards a peer that reads
    nothing, with a 4 MiB send buffer (what the kernel autotunes a busy connection's to)."""
    with stalled_peer() as (lst, addr):
        info = socket.getaddrinfo(*addr, type=socket.SOCK_STREAM)[0]
        sock = backend_socket(info, recv_buffer_bytes=0, notsent_lowat_bytes=notsent_lowat_bytes)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
            sock.connect(addr)
            peer, _ = lst.accept()
            try:
                sock.setblocking(False)
                total, block = 0, b"x" * (64 * KiB)
                while total < 64 * MiB:
                    try:
                        total += sock.send(block)
                    except BlockingIOError:
                        return total
                raise AssertionError("the socket never refused more")
            finally:
                peer.close()
        finally:
            sock.close()


def test_the_socket_holds_little_more_than_the_bound_of_a_body_not_yet_sent() -> None:
    unbounded = accepted_before_full(0)
    bounded = accepted_before_full(LOWAT)
    # Without the bound the socket takes megabytes the peer's window does not let out (they would leave in
    # one burst once it opens); with it, the peer's small window plus about the bound.
    assert unbounded > 2 * MiB, unbounded
    assert bounded < LOWAT + 512 * KiB, bounded


def test_the_factory_sets_both_buffers_and_zero_leaves_the_kernels_defaults() -> None:
    info = socket.getaddrinfo("127.0.0.1", 9, type=socket.SOCK_STREAM)[0]
    with backend_socket(info, recv_buffer_bytes=128 * KiB, notsent_lowat_bytes=LOWAT) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == LOWAT
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 128 * KiB  # the kernel doubles
    with backend_socket(info, recv_buffer_bytes=0, notsent_lowat_bytes=0) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT


async def test_a_bounded_socket_still_sends_a_large_body_whole_to_a_peer_that_reads() -> None:
    # The writer waits for room while the unsent part is over the bound; the socket must report it
    # writable again as the peer drains it (no stall), and every byte arrives.
    loop = asyncio.get_running_loop()
    body = bytes(range(256)) * (16 * MiB // 256)
    with stalled_peer() as (lst, addr):
        info = socket.getaddrinfo(*addr, type=socket.SOCK_STREAM)[0]
        sock = backend_socket(info, recv_buffer_bytes=0, notsent_lowat_bytes=LOWAT)
        got = bytearray()

        def read_all() -> None:
            peer, _ = lst.accept()
            with peer:
                while len(got) < len(body):
                    chunk = peer.recv(256 * KiB)
                    if not chunk:
                        return
                    got.extend(chunk)

        reader = threading.Thread(target=read_all)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, addr)
            reader.start()
            await asyncio.wait_for(loop.sock_sendall(sock, body), 30)
        finally:
            sock.close()
            reader.join(30)
    assert bytes(got) == body


@pytest.fixture
async def store() -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback HTTP server that reads a PUT body and answers 200; records each body's length."""
    lengths: list[int] = []

    async def put(request: web.Request) -> web.Response:
        lengths.append(len(await request.read()))
        # A body larger than the client reads ahead: the connection stays with the response until read.
        return web.Response(status=200, body=b"z" * (4 * MiB))

    app = web.Application(client_max_size=64 * MiB)
    app.router.add_route("PUT", "/{tail:.*}", put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", lengths
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("lowat", [LOWAT, 0])
async def test_the_backends_connections_carry_the_configured_bound(
    store: tuple[str, list[int]], lowat: int
) -> None:
    url, lengths = store
    backend = Backend(BackendConfig(endpoint=url, notsent_lowat_bytes=lowat), url, SystemClock())
    await backend.start()
    try:
        resp = await backend.request(
            "PUT", backend.target("bucket", "key", ""), {}, CRED, body=b"y" * (4 * MiB), lane="checkpoint"
        )
        try:
            assert resp.status == 200
            assert resp.connection is not None and resp.connection.transport is not None
            sock = resp.connection.transport.get_extra_info("socket")
            value = sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT)
        finally:
            resp.release()
    finally:
        await backend.close()
    assert lengths == [4 * MiB]
    assert (value == LOWAT) if lowat else (value != LOWAT)
