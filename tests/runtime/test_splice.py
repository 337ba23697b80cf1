"""SpliceRelay and send_file on real loopback TCP sockets: exact byte counts, no over-read, every way a side
can fail.

The relay is the kernel half of the zero-copy GET (``s3lanes.http.zerocopy``); the end-to-end behaviour
through the gateway is in ``tests/e2e/test_zero_copy.py``. Here each test builds two TCP connections on
127.0.0.1 ("store" -> relay -> "client"), both relay-side sockets non-blocking as the loop's transports
leave them, and drives :class:`SpliceRelay` directly.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from s3lanes.runtime import splice
from s3lanes.runtime.splice import DestinationGone, SourceEnded, SourceTimeout, SpliceRelay

KiB = 1024
MiB = 1024 * KiB


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(far end, relay end) of one loopback TCP connection; the relay end non-blocking."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        far = socket.create_connection(listener.getsockname())
        near, _ = listener.accept()
    near.setblocking(False)
    return far, near


class Link:
    """store_far -> [store_near  relay  client_near] -> client_far"""

    def __init__(self) -> None:
        self.store_far, self.store_near = tcp_pair()
        self.client_far, self.client_near = tcp_pair()

    def close(self) -> None:
        for s in (self.store_far, self.store_near, self.client_far, self.client_near):
            s.close()


@pytest.fixture
def link() -> Iterator[Link]:
    ln = Link()
    try:
        yield ln
    finally:
        ln.close()


async def feed(sock: socket.socket, data: bytes) -> None:
    """Write ``data`` from a thread (the far ends are blocking sockets)."""
    await asyncio.to_thread(sock.sendall, data)


async def drain(sock: socket.socket, n: int, *, delay_s: float = 0.0, piece: int = 256 * KiB) -> bytes:
    def run() -> bytes:
        if delay_s:
            time.sleep(delay_s)
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(min(piece, n - len(out)))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    return await asyncio.to_thread(run)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_moves_exactly_what_is_asked_and_leaves_the_rest_in_the_source(link: Link) -> None:
    body = os.urandom(5 * MiB + 333)
    after = b"NEXT-RESPONSE-BYTES"
    prefix = body[:70_000]
    rest = body[len(prefix) :]
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=10)
    try:
        writer = asyncio.create_task(feed(link.store_far, rest + after))
        reader = asyncio.create_task(drain(link.client_far, len(body)))
        await relay.send(prefix)
        moved = len(prefix)
        for n in (1, 4095, 1 * MiB, 3 * MiB, len(rest) - 1 - 4095 - 4 * MiB):
            await relay.move(n)
            moved += n
            assert relay.delivered == moved
        assert moved == len(body)
        await writer
        assert await reader == body
    finally:
        relay.close()
    # Nothing past the body was taken from the source: the next answer on that connection is intact.
    link.store_near.setblocking(True)
    assert link.store_near.recv(100) == after


async def test_a_slow_reader_is_waited_for(link: Link) -> None:
    link.client_far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * KiB)
    body = os.urandom(6 * MiB)
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=10)
    try:
        writer = asyncio.create_task(feed(link.store_far, body))
        reader = asyncio.create_task(drain(link.client_far, len(body), delay_s=0.3, piece=16 * KiB))
        await relay.move(len(body))
        await writer
        assert await reader == body
    finally:
        relay.close()


async def test_a_source_closing_early_is_source_ended(link: Link) -> None:
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=10)
    try:
        await feed(link.store_far, b"a" * 300_000)
        link.store_far.close()
        reader = asyncio.create_task(drain(link.client_far, 300_000))
        with pytest.raises(SourceEnded, match="short"):
            await relay.move(1 * MiB)
        assert relay.delivered == 300_000
        assert await reader == b"a" * 300_000
    finally:
        relay.close()


async def test_a_silent_source_times_out(link: Link) -> None:
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=0.3)
    try:
        await feed(link.store_far, b"b" * 1000)
        started = time.monotonic()
        with pytest.raises(SourceTimeout):
            await relay.move(2000)
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5, waited
        assert relay.delivered == 1000
    finally:
        relay.close()


async def test_a_client_that_left_is_destination_gone(link: Link) -> None:
    # SO_LINGER 0: the close sends RST, as a client killed mid-download does.
    link.client_far.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    link.client_far.close()
    await asyncio.sleep(0.05)
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=5)
    try:
        writer = asyncio.create_task(feed(link.store_far, os.urandom(4 * MiB)))
        with pytest.raises(DestinationGone):
            await relay.move(4 * MiB)
        with pytest.raises(DestinationGone):
            await relay.send(b"more")
        link.store_far.shutdown(socket.SHUT_RDWR)
        await asyncio.gather(writer, return_exceptions=True)
    finally:
        relay.close()


async def test_close_releases_its_descriptors_and_only_those(link: Link) -> None:
    before = fd_count()
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=5)
    assert fd_count() == before + 4  # two duplicates and a pipe
    relay.close()
    relay.close()  # idempotent
    assert fd_count() == before
    # The originals are untouched and still work.
    link.store_far.sendall(b"ping")
    await asyncio.sleep(0.05)
    assert link.store_near.recv(4) == b"ping"


async def test_works_with_the_default_pipe_size(link: Link, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fcntl.fcntl

    def no_resize(fd: int, cmd: int, arg: Any = 0) -> Any:
        if cmd == splice._F_SETPIPE_SZ:
            raise PermissionError(1, "pipe-max-size")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", no_resize)
    body = os.urandom(3 * MiB + 17)
    relay = SpliceRelay(link.store_near.fileno(), link.client_near.fileno(), read_timeout_s=10)
    try:
        assert relay._cap < splice.PIPE_BYTES
        writer = asyncio.create_task(feed(link.store_far, body))
        reader = asyncio.create_task(drain(link.client_far, len(body)))
        await relay.move(len(body))
        await writer
        assert await reader == body
    finally:
        relay.close()


# -- send_file: a spool file into a client socket -----------------------------------------------------------


async def in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@pytest.fixture
def data_file(tmp_path: Any) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(7 * MiB + 11)
    path = tmp_path / "piece"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, data
    finally:
        os.close(fd)


async def test_send_file_sends_exactly_the_span_asked_for(link: Link, data_file: tuple[int, bytes]) -> None:
    fd, data = data_file
    before = fd_count()
    span = (123_457, 5 * MiB + 3)
    reader = asyncio.create_task(drain(link.client_far, span[1]))
    await splice.send_file(link.client_near.fileno(), fd, span[0], span[1], in_thread)
    assert await reader == data[span[0] : span[0] + span[1]]
    assert fd_count() == before  # the duplicate is closed
    # Nothing more was sent: the next bytes on the connection are whatever comes next.
    link.client_near.send(b"NEXT")
    assert link.client_far.recv(4) == b"NEXT"


async def test_send_file_waits_for_a_slow_reader(link: Link, data_file: tuple[int, bytes]) -> None:
    fd, data = data_file
    link.client_far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * KiB)
    reader = asyncio.create_task(drain(link.client_far, len(data), delay_s=0.3, piece=16 * KiB))
    await splice.send_file(link.client_near.fileno(), fd, 0, len(data), in_thread)
    assert await reader == data


async def test_send_file_to_a_client_that_left_is_destination_gone(
    link: Link, data_file: tuple[int, bytes]
) -> None:
    fd, data = data_file
    link.client_far.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    link.client_far.close()
    await asyncio.sleep(0.05)
    before = fd_count()
    with pytest.raises(DestinationGone):
        await splice.send_file(link.client_near.fileno(), fd, 0, len(data), in_thread)
    assert fd_count() == before


async def test_send_file_from_a_short_file_is_source_ended(link: Link, data_file: tuple[int, bytes]) -> None:
    fd, data = data_file
    reader = asyncio.create_task(drain(link.client_far, 1000))
    with pytest.raises(SourceEnded):
        await splice.send_file(link.client_near.fileno(), fd, len(data) - 1000, 5000, in_thread)
    assert await reader == data[-1000:]
