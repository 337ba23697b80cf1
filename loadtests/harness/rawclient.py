"""A lean signed HTTP/1.1 client (one ``asyncio.BufferedProtocol`` a connection) and an aiohttp one
for cross-checks; requests signed with the project's own :func:`s3lanes.core.sigv4.sign_headers`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Protocol, cast

import aiohttp
from yarl import URL

from loadtests.harness.endpoint import Endpoint
from loadtests.harness.errors import BenchError
from loadtests.harness.payload import payload_pieces, payload_sha256
from loadtests.harness.stats import MIB
from loadtests.harness.store import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD, sign_headers

# The client's receive buffer: one recv_into() per event, up to this much. uvloop reads 256 KiB at most
# per event anyway; a larger buffer just means fewer partial fills.
RECV_BUFFER_BYTES = 1 * MIB
WRITE_HIGH_WATER_BYTES = 4 * MIB
MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body_bytes: int
    body: bytes  # kept only for errors and when asked for


def signed_head(
    ep: Endpoint, method: str, raw_path: str, payload_hash: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    headers = {"host": ep.netloc, **(extra or {})}
    headers.update(
        sign_headers(
            method,
            raw_path,
            "",
            headers,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            payload_hash=payload_hash,
            now_wall=time.time(),
        )
    )
    return headers


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection. Body bytes land in one reused buffer and are counted, not kept."""

    def __init__(self) -> None:
        self._buf = bytearray(RECV_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._waiter: asyncio.Future[Reply] | None = None
        self._write_ok: asyncio.Event = asyncio.Event()
        self._write_ok.set()
        self._head = bytearray()
        self._in_body = False
        self._status = 0
        self._remaining = 0  # -1: until the connection closes
        self._count = 0
        self._keep = False
        self._kept = bytearray()
        self._want_body = False
        self._method = "GET"

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            return
        if self._in_body:
            self._take_body(self._view[:nbytes])
            return
        self._head += self._view[:nbytes]
        self._parse_head()

    def pause_writing(self) -> None:
        self._write_ok.clear()

    def resume_writing(self) -> None:
        self._write_ok.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._write_ok.set()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._in_body and self._remaining == -1:
                self._finish()
            else:
                waiter.set_exception(ConnectionError(f"connection closed mid-response: {exc!r}"))

    # parsing
    def _parse_head(self) -> None:
        while True:
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    self._fail(BenchError("response head too large"))
                return
            lines = bytes(self._head[:end]).split(b"\r\n")
            rest = bytes(self._head[end + 4 :])
            self._head = bytearray()
            parts = lines[0].split(b" ", 2)
            status = int(parts[1])
            if status == 100:
                self._head = bytearray(rest)
                continue
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if headers.get(b"connection", b"").lower() == b"close":
                self.reusable = False
            self._status = status
            self._keep = self._want_body or not 200 <= status < 300
            if b"content-length" in headers:
                self._remaining = int(headers[b"content-length"])
            elif b"transfer-encoding" in headers:
                self._fail(BenchError(f"status {status}: chunked responses are not supported by this client"))
                return
            elif self._method == "HEAD" or status in (204, 304):
                self._remaining = 0
            else:
                self._remaining = -1
                self.reusable = False
            if self._method == "HEAD":
                self._remaining = 0
            self._in_body = True
            if self._remaining == 0:
                self._finish()
            elif rest:
                self._take_body(memoryview(rest))
            return

    def _take_body(self, data: memoryview) -> None:
        n = len(data)
        if self._keep:
            self._kept += data
        self._count += n
        if self._remaining >= 0:
            self._remaining -= n
            if self._remaining <= 0:
                if self._remaining < 0:
                    self.reusable = False
                self._finish()

    def _finish(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self._status, self._count, bytes(self._kept)))

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    # the request: RawHttp.call's, on this connection
    async def request(
        self,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: Iterator[memoryview] | None,
        want_body: bool,
    ) -> Reply:
        assert self.transport is not None and self.reusable
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Reply] = loop.create_future()
        self._waiter = waiter
        self._method = method
        self._head = bytearray()
        self._in_body = False
        self._count = 0
        self._kept = bytearray()
        self._want_body = want_body
        head = [f"{method} {raw_path} HTTP/1.1"]
        head.extend(f"{k}: {v}" for k, v in headers.items())
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if body is not None:
            for piece in body:
                if waiter.done() or self.closed:
                    self.reusable = False  # answered before the body was complete
                    break
                self.transport.write(piece)
                if not self._write_ok.is_set():
                    await self._write_ok.wait()
        try:
            return await waiter
        except BaseException:
            self.reusable = False
            raise
        finally:
            self._waiter = None


class Client(Protocol):
    """What the phases need from a client; both implementations sign every request themselves."""

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply: ...

    async def put(
        self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool
    ) -> Reply: ...

    async def close(self) -> None: ...


class RawHttp:
    """The lean client: a pool of :class:`_Conn` per endpoint."""

    def __init__(self) -> None:
        self._idle: dict[Endpoint, list[_Conn]] = {}
        self._closed = False

    async def _acquire(self, ep: Endpoint) -> _Conn:
        idle = self._idle.setdefault(ep, [])
        while idle:
            conn = idle.pop()
            if conn.reusable and not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, ep.host, ep.port)
        return conn

    def _release(self, ep: Endpoint, conn: _Conn) -> None:
        if conn.reusable and not conn.closed and not self._closed:
            self._idle.setdefault(ep, []).append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    async def call(
        self,
        ep: Endpoint,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: Iterator[memoryview] | None = None,
        *,
        want_body: bool = False,
    ) -> Reply:
        conn = await self._acquire(ep)
        try:
            return await conn.request(method, raw_path, headers, body, want_body)
        finally:
            self._release(ep, conn)

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply:
        path = f"/{BUCKET}/{key}"
        return await self.call(
            ep, "GET", path, signed_head(ep, "GET", path, UNSIGNED_PAYLOAD), want_body=want_body
        )

    async def put(self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool) -> Reply:
        path = f"/{BUCKET}/{key}"
        payload_hash = payload_sha256(size_bytes, seed) if signed_payload else UNSIGNED_PAYLOAD
        headers = signed_head(ep, "PUT", path, payload_hash)
        headers["content-length"] = str(size_bytes)
        return await self.call(ep, "PUT", path, headers, payload_pieces(size_bytes, seed))

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


class AiohttpClient:
    """The cross-check client: aiohttp's own, configured for throughput (big read buffer, no extras)."""

    def __init__(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, enable_cleanup_closed=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=60),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            read_bufsize=RECV_BUFFER_BYTES,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def get(self, ep: Endpoint, key: str, *, want_body: bool = False) -> Reply:
        path = f"/{BUCKET}/{key}"
        headers = signed_head(ep, "GET", path, UNSIGNED_PAYLOAD)
        url = URL(f"http://{ep.netloc}{path}", encoded=True)
        async with self._session.get(url, headers=headers, allow_redirects=False) as resp:
            n = 0
            kept: list[bytes] = []
            keep = want_body or resp.status >= 300
            async for chunk in resp.content.iter_any():
                n += len(chunk)
                if keep:
                    kept.append(chunk)
            return Reply(resp.status, n, b"".join(kept))

    async def put(self, ep: Endpoint, key: str, size_bytes: int, seed: int, *, signed_payload: bool) -> Reply:
        path = f"/{BUCKET}/{key}"
        payload_hash = payload_sha256(size_bytes, seed) if signed_payload else UNSIGNED_PAYLOAD
        headers = signed_head(ep, "PUT", path, payload_hash)
        headers["content-length"] = str(size_bytes)
        url = URL(f"http://{ep.netloc}{path}", encoded=True)

        async def body() -> AsyncIterator[memoryview]:
            for piece in payload_pieces(size_bytes, seed):
                yield piece

        async with self._session.put(url, data=body(), headers=headers, allow_redirects=False) as resp:
            text = await resp.read()
            return Reply(resp.status, len(text), text)

    async def close(self) -> None:
        await self._session.close()


def expect(reply: Reply, status: int, what: str, body_bytes: int | None = None) -> None:
    if reply.status != status or (body_bytes is not None and reply.body_bytes != body_bytes):
        raise BenchError(
            f"{what}: expected {status}"
            + (f" with {body_bytes} bytes" if body_bytes is not None else "")
            + f", got {reply.status} with {reply.body_bytes} bytes: {reply.body[:600]!r}"
        )
