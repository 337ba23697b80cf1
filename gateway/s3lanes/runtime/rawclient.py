"""A lean HTTP/1.1 client for the gateway's GET and HEAD towards the store: no client session in between.

Theory of operation. A small GET through the gateway spent about a third of its CPU in aiohttp's
``ClientSession`` (request object, URL handling, header maps, connector futures, tracing hooks, timers) for a
request whose bytes the gateway already knows exactly. This client writes the request head itself and keeps
only what a response needs: aiohttp's own response protocol (``ResponseHandler``: the C ``llhttp`` parser, the
read timeout, flow control, a body ``StreamReader``), the same parts ``ClientSession`` drives underneath. So
the response body is the same ``StreamReader`` as before (``iter_chunks``, ``read_nowait``, the splice
hand-over of :mod:`s3lanes.http.zerocopy` all work unchanged), with the same parser, limits and errors.

What it is *not*: a general client. It sends bodiless requests only (GET, HEAD) over plain TCP; TLS backends
and every request with a body keep the aiohttp session (:class:`s3lanes.runtime.backend.Backend` decides).

A :class:`RawPool` is one keep-alive pool per source address: connections are taken last-in first-out
(the warmest), at most ``pool_size`` open at once (more wait, as aiohttp's connector makes them wait), and
given back only when their response was read to the end and neither side asked to close; anything else (a
body left unread because the client went away, a parse error, a timeout) closes the connection. A pooled
connection the store closed while it idled fails on its first write or read before any response byte: the
request is idempotent, so it is sent once more on a new connection (aiohttp's session answers 503 there).

Errors are aiohttp's (``ServerTimeoutError`` for a silent store, ``ClientConnectorError``-like ``OSError``
subclasses for a refused one, ``ServerDisconnectedError`` and ``ClientPayloadError`` for a broken one) so that
one translation in the backend maps both paths to the same 503/504.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from dataclasses import dataclass
from typing import Final

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import EmptyStreamReader, StreamReader
from multidict import CIMultiDictProxy

# The parser's read buffer, as the session's ``read_bufsize`` (one StreamReader chunk, the flow-control mark).
READ_BUFSIZE_BYTES: Final = 64 * 1024
# An idle pooled connection older than this is closed instead of reused (aiohttp's keepalive_timeout).
KEEPALIVE_S: Final = 30.0
_EMPTY_BODY_STATUSES: Final = frozenset({204, 304})


class RawConnectError(aiohttp.ClientConnectionError):
    """The store could not be reached (refused, unreachable, no route): 503 at the backend's boundary."""


class RawConnectTimeout(aiohttp.ServerTimeoutError):
    """No connection within ``connect_timeout_s``: 504 at the backend's boundary, as the session's."""


class BadHeaderValue(ValueError):
    """A header name or value that would split the request head (CR or LF): a bug upstream, never sent."""


@dataclass(slots=True)
class RawConnection:
    """One pooled connection: aiohttp's response protocol on a plain TCP transport.

    ``transport`` and ``protocol`` mirror ``aiohttp.connector.Connection`` so that the splice hand-over
    (:func:`s3lanes.http.zerocopy.relay_spliced`) takes a raw response's socket as it takes a session's."""

    protocol: ResponseHandler
    idle_since: float = 0.0

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.protocol.transport


class RawResponse:
    """The store's answer, head parsed, body unread: the subset of ``aiohttp.ClientResponse`` the relay uses.

    ``release()`` gives the connection back to its pool if the body was read to its end, else closes it;
    ``close()`` always closes it. Both are idempotent."""

    __slots__ = ("_conn", "_pool", "content", "content_length", "headers", "reason", "status")

    def __init__(
        self,
        status: int,
        reason: str | None,
        headers: CIMultiDictProxy[str],
        content: StreamReader,
        conn: RawConnection,
        pool: RawPool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content = content
        length = headers.get("Content-Length")
        self.content_length: int | None = int(length) if length is not None and length.isdigit() else None
        self._conn: RawConnection | None = conn
        self._pool = pool

    @property
    def connection(self) -> RawConnection | None:
        return self._conn

    async def read(self) -> bytes:
        """The whole body (small answers only: error documents, renamed listings); releases the connection."""
        try:
            data = await self.content.read()
        except BaseException:
            self.close()
            raise
        self.release()
        return data

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        proto = conn.protocol
        if self.content.is_eof() and not proto.should_close and proto.is_connected():
            self._pool.give_back(conn)
        else:
            self._pool.discard(conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.discard(conn)

    def __del__(self) -> None:
        # A response dropped without release() (a bug elsewhere) must not hold its pool slot for ever; the
        # session's ClientResponse has the same safety net.
        if self._conn is not None:
            self.close()


def request_head(method: str, raw_path: str, raw_query: str, headers: dict[str, str]) -> bytes:
    """The request line and headers, as sent. Names and values were decided (and signed) by the caller."""
    target = f"{raw_path}?{raw_query}" if raw_query else raw_path
    lines = [f"{method} {target} HTTP/1.1"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise BadHeaderValue(f"CR or LF in header {name!r}")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    # The server side decoded the client's header bytes as UTF-8 with surrogate escapes (aiohttp does), so
    # encoding them back the same way relays the exact bytes the client sent (a Range with a stray 0xff
    # byte, say): the store answers them as it would directly, and nothing here turns them into a 500.
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class Dialing:
    """How a :class:`RawPool` opens a connection: to ``host:port``, bound to ``source_address`` (None: the
    kernel picks), connected within ``connect_timeout_s``, with ``recv_buffer_bytes`` of socket receive
    buffer (0: the kernel's default)."""

    host: str
    port: int
    source_address: str | None
    connect_timeout_s: float
    recv_buffer_bytes: int


class RawPool:
    """Keep-alive connections to one ``host:port`` from one source address. Lives on one event loop."""

    def __init__(
        self, dialing: Dialing, *, pool_size: int, read_timeout_s: float, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        self._dialing = dialing
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: deque[RawConnection] = deque()
        self._slots = asyncio.Semaphore(pool_size)
        self._closed = False
        self._expiry: asyncio.TimerHandle | None = None  # closes idle connections past keepalive_s
        self.opened = 0  # connections opened so far (tests and the status page read it)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def request(self, method: str, head: bytes) -> RawResponse:
        """Send a bodiless request (``head`` from :func:`request_head`) and return the parsed response head.

        A reused connection that turns out dead before any byte of the answer is retried once on a new one.
        """
        if self._closed:
            raise RawConnectError("the connection pool is closed")
        await self._slots.acquire()
        try:
            conn = self._take_idle()
            if conn is not None:
                try:
                    return await self._exchange(conn, method, head)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError):
                    pass  # the store closed it while idle: once more, on a fresh connection
            conn = await self._connect()
            return await self._exchange(conn, method, head)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, conn: RawConnection, method: str, head: bytes) -> RawResponse:
        proto = conn.protocol
        try:
            skip_body = method == "HEAD"
            proto.set_response_params(
                skip_payload=skip_body,
                # As the session asks: a 2xx with Content-Length 0 gets a StreamReader of its own (below).
                read_until_eof=True,
                auto_decompress=False,
                read_timeout=self._read_timeout_s,
                read_bufsize=READ_BUFSIZE_BYTES,
            )
            transport = proto.transport
            if transport is None or transport.is_closing():
                raise aiohttp.ServerDisconnectedError()
            transport.write(head)
            proto.start_timeout()
            message, payload = await proto.read()
        except BaseException:
            self._close(conn)
            raise
        if skip_body or message.code in _EMPTY_BODY_STATUSES or isinstance(payload, EmptyStreamReader):
            # Never aiohttp's shared EMPTY_PAYLOAD: its readchunk() keeps state, and once one reader has
            # iterated it, iter_chunks() on it yields (b"", True) forever (a busy loop for the next one).
            payload = EmptyStreamReader()
        return RawResponse(message.code, message.reason, message.headers, payload, conn, self)

    def _take_idle(self) -> RawConnection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the warmest, the least likely to be stale
            if conn.protocol.is_connected() and now - conn.idle_since < self._keepalive_s:
                return conn
            self._close(conn)
        return None

    async def _connect(self) -> RawConnection:
        loop = asyncio.get_running_loop()
        d = self._dialing
        try:
            async with asyncio.timeout(d.connect_timeout_s):
                infos = await loop.getaddrinfo(d.host, d.port, type=socket.SOCK_STREAM)
                last: OSError | None = None
                for family, type_, proto_no, _, addr in infos:
                    sock = socket.socket(family, type_, proto_no)
                    try:
                        sock.setblocking(False)
                        if d.recv_buffer_bytes > 0:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, d.recv_buffer_bytes)
                        if d.source_address:
                            sock.bind((d.source_address, 0))
                        await loop.sock_connect(sock, addr)
                    except OSError as exc:
                        sock.close()
                        last = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    _, protocol = await loop.create_connection(lambda: ResponseHandler(loop), sock=sock)
                    self.opened += 1
                    return RawConnection(protocol)
                raise last or OSError(f"no address for {d.host}")
        except TimeoutError as exc:
            raise RawConnectTimeout(f"connect to {d.host}:{d.port} timed out") from exc
        except OSError as exc:
            raise RawConnectError(f"cannot connect to {d.host}:{d.port}: {exc}") from exc

    def give_back(self, conn: RawConnection) -> None:
        self._slots.release()
        if self._closed:
            conn.protocol.close()
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.append(conn)
        if self._expiry is None:
            self._expiry = loop.call_later(self._keepalive_s, self._expire)

    def _expire(self) -> None:
        """Close the idle connections older than keepalive_s (as aiohttp's connector does), so that an idle
        gateway holds no store connection for long; again later while some are left."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep: deque[RawConnection] = deque()
        while self._idle:
            conn = self._idle.popleft()
            if now - conn.idle_since >= self._keepalive_s or not conn.protocol.is_connected():
                self._close(conn)
            else:
                keep.append(conn)
        self._idle = keep
        if keep:
            oldest = min(c.idle_since for c in keep)
            self._expiry = loop.call_later(max(0.0, oldest + self._keepalive_s - now), self._expire)

    def discard(self, conn: RawConnection) -> None:
        self._slots.release()
        self._close(conn)

    @staticmethod
    def _close(conn: RawConnection) -> None:
        conn.protocol.close()

    async def close(self) -> None:
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        while self._idle:
            self._close(self._idle.pop())
