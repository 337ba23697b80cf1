"""A small signed S3 client over aiohttp, and the object bytes it sends: what the contention benchmark's
clients and the checkpoint save benchmark use.

Requests are SigV4-signed with the project's :func:`s3lanes.core.sigv4.sign_headers` (``UNSIGNED-PAYLOAD``
over plain HTTP) and sent with aiohttp. Object data are views into one random 8 MiB block at seed-dependent
offsets (:func:`pieces`): nothing compressible, nothing on disk. :func:`retrying` retries 5xx answers and
transport errors with capped exponential backoff, as training clients do.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from loadtests.harness.stats import MIB
from loadtests.harness.store import REGION
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD, sign_headers

BLOCK_BYTES = 8 * MIB
PIECE_BYTES = 1 * MIB
REQUEST_TIMEOUT_S = 300.0
WRITE_RETRIES = 5
RETRY_BASE_S = 0.5

_BLOCK = memoryview(os.urandom(BLOCK_BYTES))


class WorkloadError(RuntimeError):
    """A request got an answer the benchmark cannot go on from (``status``: the HTTP status, if any)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def pieces(size_bytes: int, seed: int) -> list[memoryview]:
    """The bytes of object ``seed`` of ``size_bytes``: views into one random block, no copies."""
    out = []
    offset = (seed * 1_048_573) % BLOCK_BYTES
    left = size_bytes
    while left > 0:
        n = min(PIECE_BYTES, left, BLOCK_BYTES - offset)
        out.append(_BLOCK[offset : offset + n])
        offset = (offset + n) % BLOCK_BYTES
        left -= n
    return out


def request_kind(method: str, query: str) -> str:
    """What a checkpoint request is, for the save's timings: create, part, complete, or METHOD (a PUT)."""
    if query == "uploads=":
        return "create"
    if "partNumber=" in query:
        return "part"
    if "uploadId=" in query:
        return "complete"
    return method


async def _body(views: list[memoryview]) -> AsyncIterator[memoryview]:
    for v in views:
        yield v


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    body_bytes: int


class S3:
    """Path-style S3 over one aiohttp session, every request SigV4-signed as ``access_key``."""

    def __init__(
        self,
        endpoint_url: str,
        session: aiohttp.ClientSession,
        *,
        access_key: str,
        secret_key: str,
    ) -> None:
        self.endpoint = endpoint_url.rstrip("/")
        self.netloc = URL(self.endpoint).raw_authority
        self.session = session
        self.access_key = access_key
        self.secret_key = secret_key
        # When set: milliseconds of every request, by request_kind() (the trainer times its saves' requests).
        self.timings: dict[str, list[float]] | None = None

    async def request(
        self,
        method: str,
        path: str,
        query: str = "",
        *,
        body: list[memoryview] | bytes | None = None,
        headers: dict[str, str] | None = None,
        keep_body: bool = True,
    ) -> Answer:
        hdrs = {"host": self.netloc, **(headers or {})}
        size = 0 if body is None else (len(body) if isinstance(body, bytes) else sum(len(v) for v in body))
        if body is not None:
            hdrs["content-length"] = str(size)
            hdrs.setdefault("content-type", "application/octet-stream")
        hdrs.update(
            sign_headers(
                method,
                path,
                query,
                hdrs,
                access_key=self.access_key,
                secret_key=self.secret_key,
                region=REGION,
                payload_hash=UNSIGNED_PAYLOAD,
                now_wall=time.time(),
            )
        )
        started = time.monotonic()
        url = URL(f"{self.endpoint}{path}" + (f"?{query}" if query else ""), encoded=True)
        data: Any = None
        if isinstance(body, bytes):
            data = body
        elif body is not None:
            data = _body(body)
        async with self.session.request(
            method, url, headers=hdrs, data=data, skip_auto_headers=("Content-Type",)
        ) as resp:
            if keep_body or resp.status >= 300:
                raw = await resp.read()
                n = len(raw)
            else:
                raw = b""
                n = 0
                async for chunk in resp.content.iter_chunked(256 * 1024):
                    n += len(chunk)
            if self.timings is not None:
                ms = (time.monotonic() - started) * 1000.0
                self.timings.setdefault(request_kind(method, query), []).append(ms)
            return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw, n)

    @staticmethod
    def path(bucket: str, key: str = "") -> str:
        return f"/{bucket}/" + quote(key, safe="/~") if key else f"/{bucket}"

    async def get_range(self, bucket: str, key: str, start: int, length: int) -> int:
        a = await self.request(
            "GET",
            self.path(bucket, key),
            headers={"range": f"bytes={start}-{start + length - 1}"},
            keep_body=False,
        )
        if a.status not in (200, 206) or a.body_bytes != length:
            raise WorkloadError(
                f"GET {key} range: {a.status}, {a.body_bytes} bytes {a.body[:200]!r}", a.status
            )
        return a.body_bytes

    async def put(self, bucket: str, key: str, body: list[memoryview] | bytes) -> None:
        a = await self.request("PUT", self.path(bucket, key), body=body)
        if a.status != 200:
            raise WorkloadError(f"PUT {key}: {a.status} {a.body[:300]!r}", a.status)

    async def create_upload(self, bucket: str, key: str) -> str:
        a = await self.request("POST", self.path(bucket, key), "uploads=", body=b"")
        m = re.search(rb"<UploadId>([^<]+)</UploadId>", a.body)
        if a.status != 200 or m is None:
            raise WorkloadError(f"CreateMultipartUpload {key}: {a.status} {a.body[:300]!r}", a.status)
        return m.group(1).decode()

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, number: int, body: list[memoryview]
    ) -> str:
        q = f"partNumber={number}&uploadId={quote(upload_id, safe='')}"
        a = await self.request("PUT", self.path(bucket, key), q, body=body)
        if a.status != 200 or "etag" not in a.headers:
            raise WorkloadError(f"UploadPart {key} #{number}: {a.status} {a.body[:300]!r}", a.status)
        return a.headers["etag"]

    async def complete_upload(self, bucket: str, key: str, upload_id: str, etags: list[str]) -> None:
        parts = "".join(
            f"<Part><PartNumber>{i}</PartNumber><ETag>{e}</ETag></Part>" for i, e in enumerate(etags, 1)
        )
        xml = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        q = f"uploadId={quote(upload_id, safe='')}"
        a = await self.request(
            "POST", self.path(bucket, key), q, body=xml, headers={"content-type": "application/xml"}
        )
        if a.status != 200 or b"<Error>" in a.body:
            raise WorkloadError(f"CompleteMultipartUpload {key}: {a.status} {a.body[:300]!r}", a.status)


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=REQUEST_TIMEOUT_S),
        auto_decompress=False,
    )


async def retrying(what: str, attempt: Any, counters: dict[str, int]) -> Any:
    """Run ``attempt()`` with capped exponential backoff on 5xx answers and transport errors, as training
    clients do (a gateway under pressure may answer 503 SlowDown)."""
    for i in range(WRITE_RETRIES + 1):
        try:
            return await attempt()
        except (WorkloadError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            status = exc.status if isinstance(exc, WorkloadError) else None
            if i == WRITE_RETRIES or (status is not None and status < 500):
                raise WorkloadError(f"{what}: gave up after {i + 1} attempts: {exc}") from exc
            counters["retries"] = counters.get("retries", 0) + 1
            await asyncio.sleep(RETRY_BASE_S * 2**i)
    raise AssertionError("unreachable")
