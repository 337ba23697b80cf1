"""A fault-injecting HTTP proxy for tests: sits between the gateway and SeaweedFS on loopback.

Unlike :mod:`tests.e2e.relay` (bytes only), it understands HTTP, so it can play a misbehaving S3 store
request by request. Modes, switchable at run time from the test's thread:

* :meth:`FaultyBackend.pass_through`: forward everything unchanged;
* :meth:`FaultyBackend.slow`: hold every request ``delay_s`` before forwarding it (a slow store: each
  answer comes ``delay_s`` later);
* :meth:`FaultyBackend.errors`: answer a fraction ``p`` of the requests (optionally only those ``match``
  selects) with ``500 InternalError`` or ``503 SlowDown`` and S3's error XML, without forwarding them;
* :meth:`FaultyBackend.down` / :meth:`FaultyBackend.up`: stop listening (connections are refused) and abort
  every open connection; listen again on the same port.
* :meth:`FaultyBackend.stall` / :meth:`FaultyBackend.unstall`: hold the requests ``match`` selects (after
  reading their bodies) until unstalled, then forward them (a store that is slow to answer one request).

Modes combine: a slow store can also answer errors. Every request is recorded (:meth:`FaultyBackend.seen`),
with whether its answer was injected, so a test can tell the store's errors from the gateway's own.

Request bodies are read whole before anything else (they are small in tests), so a connection stays usable
after an injected error; response bodies are streamed. Requests are forwarded byte for byte as far as SigV4
cares: path and query as received, the ``Host`` header kept, no headers added. It runs its own event loop
in a thread, so synchronous clients (boto3) can drive the gateway at the same time.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web
from yarl import URL

RELAY_CHUNK_BYTES = 64 * 1024
# Headers of one hop only (RFC 9110 7.6.1); Content-Length is recomputed from the buffered body.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
FAULT_REQUEST_ID_PREFIX = "FAULTY"

ErrorKind = Literal["internal", "slowdown"]
_ERRORS: dict[ErrorKind, tuple[int, str, str]] = {
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
}


@dataclass(frozen=True, slots=True)
class Seen:
    """One request the proxy received and how it was answered."""

    at: float  # time.monotonic() when it arrived
    method: str
    path: str  # raw path, query string included
    status: int  # what the proxy answered (0: the connection failed before an answer)
    injected: bool  # the answer was made up here, not the store's
    request_id: str  # x-amz-request-id of the answer


@dataclass(frozen=True, slots=True)
class _Mode:
    delay_s: float = 0.0
    error: ErrorKind | None = None
    p: float = 0.0
    match: Callable[[str, str], bool] | None = None  # (method, raw path) -> may be faulted


class FaultyBackend:
    def __init__(self, target_url: str, *, seed: int = 0) -> None:
        self._target = target_url.rstrip("/")
        self._mode = _Mode()  # replaced whole (one atomic assignment) from the test's thread
        self._stall: Callable[[str, str], bool] | None = None
        self._stalled = 0  # requests being held (read from the test's thread)
        self._unstalled: asyncio.Event | None = None  # created and used on the proxy's loop
        self._rng = random.Random(seed)  # used on the proxy's loop only
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._injected = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faulty-backend", daemon=True)
        self._web: web.Server | None = None
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    # -- lifecycle (called from the test's thread) -----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> None:
        """Listen on ``port`` (0: a free one; see :attr:`port`)."""
        self._thread.start()
        self._call(self._start(port))

    async def _start(self, port: int) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._web = web.Server(self._handle, handler_cancellation=True, auto_decompress=False)
        await self._listen(port)

    async def _listen(self, port: int) -> None:
        assert self._web is not None
        self._server = await self._loop.create_server(self._web, "127.0.0.1", port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def _stop() -> None:
            self._close_listener()
            if self._web is not None:
                await self._web.shutdown(1.0)
            if self._session is not None:
                await self._session.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        self._call(_stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- modes -----------------------------------------------------------------------------------------------

    def pass_through(self) -> None:
        self._mode = _Mode()

    def slow(self, delay_s: float) -> None:
        """Every request is held ``delay_s`` before it is forwarded (or answered with an injected error)."""
        self._mode = _Mode(delay_s=delay_s, error=self._mode.error, p=self._mode.p, match=self._mode.match)

    def errors(self, kind: ErrorKind, p: float, match: Callable[[str, str], bool] | None = None) -> None:
        """Answer a fraction ``p`` of the requests ``match`` accepts (all, if None) with ``kind``'s error."""
        self._mode = _Mode(delay_s=self._mode.delay_s, error=kind, p=p, match=match)

    def stall(self, match: Callable[[str, str], bool]) -> None:
        """Hold every request ``match`` accepts until :meth:`unstall`."""

        async def _stall() -> None:
            self._unstalled = asyncio.Event()
            self._stall = match

        self._call(_stall())

    def unstall(self) -> None:
        async def _unstall() -> None:
            self._stall = None
            if self._unstalled is not None:
                self._unstalled.set()

        self._call(_unstall())

    @property
    def stalled(self) -> int:
        with self._lock:
            return self._stalled

    def down(self) -> None:
        """The store goes away: refuse new connections and abort the open ones (requests in flight fail)."""

        async def _down() -> None:
            self._close_listener()
            if self._web is not None:
                for conn in list(self._web.connections):
                    if conn.transport is not None:
                        conn.transport.abort()

        self._call(_down())

    def up(self) -> None:
        """The store is back: listen again on the same port."""
        self._call(self._listen(self.port))

    def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- what happened ---------------------------------------------------------------------------------------

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    @property
    def injected(self) -> int:
        with self._lock:
            return self._injected

    # -- the proxy -------------------------------------------------------------------------------------------

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)
            self._injected += seen.injected

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await request.content.read()  # not request.read(): that one caps bodies at 1 MiB
        stall, unstalled = self._stall, self._unstalled
        if stall is not None and unstalled is not None and stall(request.method, request.raw_path):
            with self._lock:
                self._stalled += 1
            try:
                await unstalled.wait()
            finally:
                with self._lock:
                    self._stalled -= 1
        mode = self._mode
        if mode.delay_s > 0:
            await asyncio.sleep(mode.delay_s)
        if (
            mode.error is not None
            and (mode.match is None or mode.match(request.method, request.raw_path))
            and self._rng.random() < mode.p
        ):
            resp = self._error(request, mode.error)
            self._record(
                Seen(
                    arrived,
                    request.method,
                    request.raw_path,
                    resp.status,
                    True,
                    resp.headers["x-amz-request-id"],
                )
            )
            return resp
        return await self._forward(request, body, arrived)

    def _error(self, request: web.BaseRequest, kind: ErrorKind) -> web.Response:
        status, code, message = _ERRORS[kind]
        request_id = f"{FAULT_REQUEST_ID_PREFIX}{self._rng.getrandbits(48):012X}"
        resource = request.raw_path.partition("?")[0]
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        headers = {
            "x-amz-request-id": request_id,
            "x-amz-id-2": request_id,
            "Content-Type": "application/xml",
        }
        if request.method == "HEAD":  # S3 answers HEAD errors without a body
            return web.Response(status=status, headers={**headers, "Content-Length": "0"})
        return web.Response(status=status, body=xml, headers=headers)

    async def _forward(self, request: web.BaseRequest, body: bytes, arrived: float) -> web.StreamResponse:
        assert self._session is not None
        # Content-Length is kept as sent (it may be signed); a chunked body gets one for its buffered size.
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        if "transfer-encoding" in {k.lower() for k in request.headers}:
            headers["Content-Length"] = str(len(body))
        try:
            upstream = await self._session.request(
                request.method,
                URL(self._target + request.raw_path, encoded=True),
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
                compress=None,
            )
        except aiohttp.ClientError as exc:
            self._record(Seen(arrived, request.method, request.raw_path, 502, True, ""))
            return web.Response(status=502, text=f"faulty backend: store unreachable: {exc!r}\n")
        async with upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    out.headers.add(name, value)
            self._record(
                Seen(
                    arrived,
                    request.method,
                    request.raw_path,
                    upstream.status,
                    False,
                    upstream.headers.get("x-amz-request-id", ""),
                )
            )
            try:
                await out.prepare(request)
                if request.method != "HEAD":
                    async for chunk in upstream.content.iter_chunked(RELAY_CHUNK_BYTES):
                        await out.write(chunk)
                await out.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the gateway went away mid-answer (or down() cut it): nothing left to tell anyone
            return out
