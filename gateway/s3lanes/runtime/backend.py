"""The connection to the S3 store behind the gateway: one pooled aiohttp session, re-signing every request.

Requests are sent byte-for-byte as the gateway decides (``yarl.URL(..., encoded=True)``, no automatic headers,
no decompression, no redirects), so what was signed is exactly what goes on the wire. Transport failures are
translated here into S3 errors: a backend that refuses or cannot be reached becomes 503 ServiceUnavailable,
one that stops answering becomes 504 GatewayTimeout. Errors the backend itself answers (4xx/5xx with XML) are
not errors at this level: they are responses, relayed to the client unchanged.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.payload import Payload
from yarl import URL

from s3lanes.clock import Clock
from s3lanes.config import BackendConfig, Credential
from s3lanes.core.s3request import query_names
from s3lanes.core.sigv4 import QUERY_AUTH_PARAMS, UNSIGNED_PAYLOAD, sign_headers
from s3lanes.core.uri import s3_quote
from s3lanes.errors import GatewayTimeout, ServiceUnavailable
from s3lanes.runtime.credentials import ChainCredentials, SigningIdentity
from s3lanes.runtime.rawclient import Dialing, RawConnectError, RawPool, RawResponse, request_head

log = logging.getLogger("s3lanes.backend")

# Query parameters that carry a presigned request's own signature; never forwarded.
PRESIGN_PARAMS = frozenset({*QUERY_AUTH_PARAMS, "X-Amz-Security-Token"})

Body = bytes | AsyncIterable[bytes] | Payload | None
# A read's (GET/HEAD) answer: the session's response or the lean client's (the attributes the relay uses).
BackendResponse = aiohttp.ClientResponse | RawResponse


# Linux's TCP_NOTSENT_LOWAT (socket.TCP_NOTSENT_LOWAT where Python exposes it).
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)


def backend_socket(addr_info: Any, *, recv_buffer_bytes: int) -> socket.socket:
    """A socket for a backend connection (the HTTP client's socket factory), with a small receive buffer
    (0: autotuning), so the store cannot push a response far ahead of the pace the gateway reads it at."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    try:
        if recv_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer_bytes)
    except BaseException:
        sock.close()
        raise
    return sock


class UnsentBound:
    """Bounds what the kernel holds of a request body not yet sent on one store connection
    (``TCP_NOTSENT_LOWAT``), while a body paced under a cap for the reads' sake goes out on it.

    A paced body is handed over piece by piece, but a connection that was idle for a while (between the
    parts of an upload, or in the pool) restarts in slow start: what its congestion window does not let out
    yet piles up in the socket, up to the autotuned send buffer (4 MiB), and leaves in one burst once the
    window has opened, over the lane's cap on the wire. With the bound the socket takes no more while that
    much is unsent: the body waits in the gateway and the pace holds. Bytes in flight are not bounded (no
    cap on throughput), but a writer wakes up once per ``nbytes`` sent: without a cap to keep, the bound is
    lifted (:meth:`set`), and :meth:`close` lifts it before the connection goes back to the pool."""

    __slots__ = ("_nbytes", "_on", "_sock")

    def __init__(self, sock: socket.socket | None, nbytes: int) -> None:
        usable = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) and nbytes > 0
        self._sock = sock if usable else None
        self._nbytes = nbytes
        self._on = False

    def set(self, on: bool) -> None:
        """Bound the unsent bytes (``on``) or lift the bound (the kernel's default), if that changes."""
        if self._sock is None or on == self._on:
            return
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, self._nbytes if on else 0)
        except OSError:  # the connection is gone: nothing to bound
            self._sock = None
            return
        self._on = on

    def close(self) -> None:
        self.set(False)
        self._sock = None


@dataclass(frozen=True, slots=True)
class BackendTarget:
    scheme: str
    host: str
    raw_path: str
    raw_query: str

    @property
    def url(self) -> URL:
        """The session's URL, built on demand: the lean GET/HEAD client needs none (a yarl URL: 3-8 us)."""
        query = f"?{self.raw_query}" if self.raw_query else ""
        return URL(f"{self.scheme}://{self.host}{self.raw_path}{query}", encoded=True)


def forward_query(raw_query: str) -> str:
    """The client's query string without presign parameters, names and values in S3's canonical encoding."""
    out = []
    for part in raw_query.split("&"):
        if not part:
            continue
        name, eq, value = part.partition("=")
        dname = next(iter(query_names(name)), "")
        if dname in PRESIGN_PARAMS:
            continue
        dvalue = query_names(f"x={value}").get("x", "") if eq else ""
        enc_name = s3_quote(dname, safe="")
        out.append(f"{enc_name}={s3_quote(dvalue, safe='')}" if eq else enc_name)
    return "&".join(out)


@dataclass(slots=True)
class BackendHealth:
    """What the gateway has seen of a backend lately (for the status page and operators): transport failures
    and 5xx answers in a row, the last of each kind, totals."""

    requests: int = 0
    failures: int = 0  # transport failures (no answer)
    server_errors: int = 0  # 5xx answers (including 503 SlowDown)
    consecutive_failures: int = 0
    last_ok_at: float | None = None  # wall time of the last answer below 500
    last_failure_at: float | None = None
    last_failure: str | None = None

    def answered(self, now_wall: float, status: int) -> None:
        self.requests += 1
        if status >= 500:
            self.server_errors += 1
            self.consecutive_failures += 1
            self.last_failure_at, self.last_failure = now_wall, f"HTTP {status}"
        else:
            self.consecutive_failures = 0
            self.last_ok_at = now_wall

    def failed(self, now_wall: float, what: str) -> None:
        self.requests += 1
        self.failures += 1
        self.consecutive_failures += 1
        self.last_failure_at, self.last_failure = now_wall, what[:300]

    @property
    def state(self) -> str:
        """``ok``, ``degraded`` (recent failures, still answering) or ``down`` (5+ failures in a row)."""
        if self.consecutive_failures >= 5:
            return "down"
        return "degraded" if self.consecutive_failures else "ok"


class Backend:
    """One S3 endpoint. Not thread-safe; lives on the gateway's event loop."""

    def __init__(self, cfg: BackendConfig, endpoint: str, clock: Clock, *, name: str = "default") -> None:
        self.cfg = cfg
        self.name = name
        self.endpoint = endpoint.rstrip("/")
        parts = urlsplit(self.endpoint)
        self._scheme = parts.scheme
        self._netloc = parts.netloc
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        # Network planes: one pool per lane with its own source address (the rest use the backend's).
        self._lane_sessions: dict[str, aiohttp.ClientSession] = {}
        # The lean GET/HEAD client's pools (plain HTTP only, ``[backend] raw_reads``), likewise per address.
        self._raw: RawPool | None = None
        self._lane_raw: dict[str, RawPool] = {}
        self.health = BackendHealth()
        # This backend's own identity: static keys from the config win; else the AWS chain if asked for;
        # else (both None) each request is signed as the client key's backend identity.
        self._static: SigningIdentity | None = None
        self.chain: ChainCredentials | None = None
        if cfg.access_key is not None and cfg.secret_key is not None:
            self._static = SigningIdentity(cfg.access_key, cfg.secret_key)
        elif cfg.credential_source == "aws":
            self.chain = ChainCredentials(name, cfg.aws_profile, wall=clock.wall)

    async def start(self) -> None:
        if self.chain is not None:  # first: a failure here leaves no session open
            await self.chain.start()
        self._session = self._new_session(self.cfg.source_address)
        by_addr: dict[str, aiohttp.ClientSession] = {}
        for lane, addr in sorted(self.cfg.lane_source_addresses.items()):
            if addr not in by_addr:
                by_addr[addr] = self._new_session(addr)
            self._lane_sessions[lane] = by_addr[addr]
        # Path-style only: a virtual-hosted bucket is its own host name (its own DNS answer, its own pool).
        if self.cfg.raw_reads and self._scheme == "http" and self.cfg.addressing == "path":
            self._raw = self._new_raw_pool(self.cfg.source_address)
            raw_by_addr: dict[str, RawPool] = {}
            for lane, addr in sorted(self.cfg.lane_source_addresses.items()):
                if addr not in raw_by_addr:
                    raw_by_addr[addr] = self._new_raw_pool(addr)
                self._lane_raw[lane] = raw_by_addr[addr]

    def _new_raw_pool(self, source_address: str | None) -> RawPool:
        parts = urlsplit(self.endpoint)
        dialing = Dialing(
            parts.hostname or "localhost",
            parts.port or 80,
            source_address=source_address,
            connect_timeout_s=self.cfg.connect_timeout_s,
            recv_buffer_bytes=self.cfg.recv_buffer_bytes,
        )
        return RawPool(dialing, pool_size=self.cfg.pool_size, read_timeout_s=self.cfg.read_timeout_s)

    @property
    def raw_reads(self) -> bool:
        """Whether GET and HEAD go through the lean client (``raw_reads``, plain HTTP, path-style)."""
        return self._raw is not None

    def _new_session(self, source_address: str | None) -> aiohttp.ClientSession:
        ssl_ctx: ssl.SSLContext | bool
        if self._scheme == "https":
            if not self.cfg.verify_tls:
                ssl_ctx = False
            else:
                ssl_ctx = ssl.create_default_context(
                    cafile=str(self.cfg.ca_file) if self.cfg.ca_file else None
                )
        else:
            ssl_ctx = False
        rcvbuf = self.cfg.recv_buffer_bytes

        def socket_factory(addr_info: Any) -> socket.socket:
            return backend_socket(addr_info, recv_buffer_bytes=rcvbuf)

        connector = aiohttp.TCPConnector(
            socket_factory=socket_factory,
            local_addr=(source_address, 0) if source_address else None,
            limit=self.cfg.pool_size,
            limit_per_host=self.cfg.pool_size,
            ssl=ssl_ctx,
            enable_cleanup_closed=False,
            keepalive_timeout=30,
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=self.cfg.connect_timeout_s,
            sock_read=self.cfg.read_timeout_s,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            read_bufsize=64 * 1024,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self.chain is not None:
            await self.chain.close()
        for session in {id(s): s for s in self._lane_sessions.values()}.values():
            await session.close()
        self._lane_sessions.clear()
        for pool in {id(p): p for p in self._lane_raw.values()}.values():
            await pool.close()
        self._lane_raw.clear()
        if self._raw is not None:
            await self._raw.close()
            self._raw = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def target(self, bucket: str | None, key: str | None, raw_query: str) -> BackendTarget:
        """Where a request for (bucket, key) goes on this backend, in canonical S3 encoding."""
        key_path = "/" + s3_quote(key, safe="/") if key is not None else "/"
        host = self._netloc
        if bucket is None:
            path = "/"
        elif self.cfg.addressing == "virtual":
            host = f"{bucket}.{self._netloc}"
            path = key_path
        else:
            path = "/" + s3_quote(bucket, safe="") + (key_path if key is not None else "")
        query = forward_query(raw_query)
        return BackendTarget(scheme=self._scheme, host=host, raw_path=path, raw_query=query)

    async def request(
        self,
        method: str,
        target: BackendTarget,
        headers: Mapping[str, str],
        cred: Credential,
        *,
        body: Body = None,
        payload_hash: str = UNSIGNED_PAYLOAD,
        lane: str | None = None,
        signed: bool = True,
    ) -> aiohttp.ClientResponse:
        """Sign and send; return the response with its body unread (the caller streams and releases it).

        ``headers`` have lower-case names and must not contain host, authorization or x-amz-date. ``lane``
        picks the connection pool where lanes have their own source address (network planes). The request
        is signed as this backend's own identity if it has one, else as the client key's backend identity;
        ``signed=False`` sends it unsigned (an anonymous client request: the store decides).
        """
        assert self._session is not None, "Backend.start() was not awaited"
        session = self._lane_sessions.get(lane, self._session) if lane is not None else self._session
        out = self._signed_headers(method, target, headers, cred, payload_hash, signed)
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = body
        try:
            resp = await session.request(
                method, target.url, headers=out, allow_redirects=False, compress=None, **kwargs
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            log.warning("backend timeout: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"timeout: {exc!r}")
            raise GatewayTimeout() from exc
        except aiohttp.ClientConnectorError as exc:
            log.warning("backend unreachable: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"unreachable: {exc!r}")
            raise ServiceUnavailable("The backend storage service is unreachable. Please retry.") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # ClientOSError, ServerDisconnectedError, ClientConnectionResetError ("Cannot write to closing
            # transport" when a pooled connection was closed by the store) and the rest of the family.
            log.warning("backend connection failed: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"connection failed: {exc!r}")
            raise ServiceUnavailable("The connection to the backend storage service failed.") from exc
        self.health.answered(self._clock.wall(), resp.status)
        return resp

    def _signed_headers(
        self,
        method: str,
        target: BackendTarget,
        headers: Mapping[str, str],
        cred: Credential,
        payload_hash: str,
        signed: bool,
    ) -> dict[str, str]:
        # Read at signing time: the chain's snapshot may have rotated since the last request.
        if self._static is not None:
            access_key, secret_key, token = self._static
        elif self.chain is not None:
            access_key, secret_key, token = self.chain.current()
        else:
            access_key, secret_key, token = cred.backend_access_key, cred.backend_secret_key, None
        out = dict(headers)
        out["host"] = target.host
        if signed:
            if token:
                out["x-amz-security-token"] = token  # signed with the rest (every x-amz-* header is)
            out.update(
                sign_headers(
                    method,
                    target.raw_path,
                    target.raw_query,
                    out,
                    access_key=access_key,
                    secret_key=secret_key,
                    region=self.cfg.region,
                    payload_hash=payload_hash,
                    now_wall=self._clock.wall(),
                )
            )
        return out

    async def read(
        self,
        method: str,
        target: BackendTarget,
        headers: Mapping[str, str],
        cred: Credential,
        *,
        lane: str | None = None,
        signed: bool = True,
    ) -> BackendResponse:
        """A bodiless GET or HEAD, signed as :meth:`request` signs, through the lean client where this backend
        has one (:attr:`raw_reads`), else through the session. The same failures map to the same errors."""
        pool = self._raw
        if pool is None:
            return await self.request(method, target, headers, cred, lane=lane, signed=signed)
        if lane is not None:
            pool = self._lane_raw.get(lane, pool)
        out = self._signed_headers(method, target, headers, cred, UNSIGNED_PAYLOAD, signed)
        head = request_head(method, target.raw_path, target.raw_query, out)  # CR/LF: a bug, 500
        try:
            resp = await pool.request(method, head)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            log.warning("backend timeout: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"timeout: {exc!r}")
            raise GatewayTimeout() from exc
        except RawConnectError as exc:
            log.warning("backend unreachable: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"unreachable: {exc!r}")
            raise ServiceUnavailable("The backend storage service is unreachable. Please retry.") from exc
        except (aiohttp.ClientError, ConnectionError) as exc:
            log.warning("backend connection failed: %s %s: %r", method, target.url, exc)
            self.health.failed(self._clock.wall(), f"connection failed: {exc!r}")
            raise ServiceUnavailable("The connection to the backend storage service failed.") from exc
        self.health.answered(self._clock.wall(), resp.status)
        return resp
