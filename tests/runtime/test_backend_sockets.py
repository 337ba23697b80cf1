"""A store connection's unsent bytes, bounded on real loopback sockets (UnsentBound, TCP_NOTSENT_LOWAT): with
the bound a socket takes little more than it of a body its peer's window does not let out (without, it takes
megabytes that would later leave in one burst); the bound does not stall a body the peer takes; lifting it
gives the socket back its default; the backend's connections keep their small receive buffer."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

from s3lanes.runtime.backend import TCP_NOTSENT_LOWAT, UnsentBound, backend_socket

KiB = 1024
MiB = 1024 * KiB
LOWAT = 64 * KiB


@contextlib.contextmanager
def stalled_peer() -> Iterator[tuple[socket.socket, tuple[str, int]]]:
    """A loopback listener whose accepted connection reads nothing until told (a small receive window):
    what a sender writes beyond that window stays in the sender's socket, not yet sent."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)  # inherited by the accepted socket
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    try:
        yield lst, lst.getsockname()
    finally:
        lst.close()


def connected(addr: tuple[str, int]) -> socket.socket:
    sock = backend_socket(socket.getaddrinfo(*addr, type=socket.SOCK_STREAM)[0], recv_buffer_bytes=0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)  # what autotuning gives a busy connection
    sock.connect(addr)
    return sock


def fill(sock: socket.socket) -> int:
    """Bytes a non-blocking socket takes before it refuses more."""
    sock.setblocking(False)
    total, block = 0, b"x" * (64 * KiB)
    while total < 64 * MiB:
        try:
            total += sock.send(block)
        except BlockingIOError:
            return total
    raise AssertionError("the socket never refused more")


def accepted_before_full(bounded: bool) -> int:
    with stalled_peer() as (lst, addr), connected(addr) as sock:
        peer, _ = lst.accept()
        with peer:
            bound = UnsentBound(sock, LOWAT)
            bound.set(bounded)
            return fill(sock)


def test_the_bound_keeps_a_body_the_peer_cannot_take_yet_in_the_gateway() -> None:
    unbounded = accepted_before_full(False)
    bounded = accepted_before_full(True)
    # Without the bound the socket takes megabytes the peer's window does not let out (they would leave in
    # one burst once it opens); with it, the peer's small window plus about the bound.
    assert unbounded > 2 * MiB, unbounded
    assert bounded < LOWAT + 512 * KiB, bounded


def test_set_and_close_move_the_option_and_a_non_tcp_socket_or_no_bound_is_left_alone() -> None:
    with stalled_peer() as (lst, addr), connected(addr) as sock:
        peer, _ = lst.accept()
        with peer:
            bound = UnsentBound(sock, LOWAT)
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT
            bound.set(True)
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == LOWAT
            bound.set(False)
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT
            bound.set(True)
            bound.close()  # before the connection goes back to the pool
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT
            UnsentBound(sock, 0).set(True)  # 0: no bound
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT
    a, b = socket.socketpair()
    with a, b:
        UnsentBound(a, LOWAT).set(True)  # a unix socket: nothing to bound, no error
        UnsentBound(None, LOWAT).set(True)


def test_the_backend_socket_keeps_its_small_receive_buffer() -> None:
    info = socket.getaddrinfo("127.0.0.1", 9, type=socket.SOCK_STREAM)[0]
    with backend_socket(info, recv_buffer_bytes=128 * KiB) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 128 * KiB  # the kernel doubles


async def test_a_bounded_socket_still_sends_a_large_body_whole_to_a_peer_that_reads() -> None:
    # The writer waits for room while the unsent part is over the bound; the socket must report it
    # writable again as the peer drains it (no stall), and every byte arrives.
    loop = asyncio.get_running_loop()
    body = bytes(range(256)) * (16 * MiB // 256)
    got = bytearray()
    with stalled_peer() as (lst, addr), connected(addr) as sock:

        def read_all() -> None:
            peer, _ = lst.accept()
            with peer:
                while len(got) < len(body):
                    chunk = peer.recv(256 * KiB)
                    if not chunk:
                        return
                    got.extend(chunk)

        reader = threading.Thread(target=read_all)
        reader.start()
        try:
            UnsentBound(sock, LOWAT).set(True)
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_sendall(sock, body), 30)
        finally:
            reader.join(30)
    assert bytes(got) == body
