"""What the write spool's S3 front modules share: the spool's own answers, calls to the backend, bucket
checks, whether a write may be spooled (and the wait that orders one that may not after the key's spooled
data), body intake into spool files, journal records stamped now, and the object a client sees at a key now.

Used by :mod:`s3lanes.http.spool_front` (routing, ordering guards, deletes), :mod:`s3lanes.http.spool_writes`
(PutObject), :mod:`s3lanes.http.spool_uploads` (multipart) and :mod:`s3lanes.http.spool_copies` (copies).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from s3lanes.clock import Clock
from s3lanes.config import Config, Credential
from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import Checksum, check_content_md5
from s3lanes.core.classify import Decision
from s3lanes.core.journal_records import Put
from s3lanes.core.objectread import has_write_preconditions
from s3lanes.core.s3docs import MAX_XML_BODY_BYTES
from s3lanes.core.sniff import SNIFF_BYTES, Written, default_content_type
from s3lanes.core.spool_policy import WRITE_THROUGH_ONLY, write_through_reason
from s3lanes.core.spool_state import Admission, Origin, Upload
from s3lanes.errors import (
    IncompleteBody,
    MalformedXML,
    ServiceUnavailable,
    SlowDown,
)
from s3lanes.http.intake import (
    SOURCE_HEADER,
    RequestContext,
    lane_headers,
    read_small_body,
    upload_body,
)
from s3lanes.metrics import Metrics
from s3lanes.runtime.bucket_check import BucketCheck
from s3lanes.runtime.pools import Pools, StoreCall
from s3lanes.runtime.spool import Reservation, Spool, SpoolFileWriter

UPLOAD_ID_PREFIX = "s3lanes-"
# How long a write-through operation waits for a key's spooled data to reach the backend before 503.
KEY_CLEAR_TIMEOUT_S = 30.0


@dataclass(eq=False)
class SpoolCommon:
    spool: Spool
    cfg: Config
    pools: Pools
    clock: Clock
    metrics: Metrics
    # Every key that wrote (live and removed ones); shared, updated in place by credentials file reloads.
    creds: dict[str, Credential]
    closing: bool = field(default=False, init=False)
    # Conditional writes of a key, one at a time: the check and the commit are not interleaved.
    _key_locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = field(
        default_factory=dict, init=False, repr=False
    )  # lock, users

    def __post_init__(self) -> None:
        self._lanes = frozenset(self.cfg.spool.lanes)
        self._buckets = BucketCheck(self.spool, self.clock, self._head_status)
        self._request_cost = self.cfg.scheduler.request_cost_bytes
        self.chunk = self.cfg.scheduler.chunk_bytes

    def response(
        self, ctx: RequestContext, decision: Decision, status: int = 200, body: bytes = b""
    ) -> web.Response:
        resp = web.Response(status=status, body=body)
        if body:
            resp.content_type = "application/xml"
        resp.headers["x-amz-request-id"] = ctx.request_id
        resp.headers[SOURCE_HEADER] = "spool"
        lane_headers(resp, decision)
        return resp

    def spoolable(self, ctx: RequestContext, decision: Decision, bucket: str, key: str) -> bool:
        """Whether this write may be spooled. One that would be, but for a reason goes to the backend, is
        counted in ``s3lanes_spool_write_through_total{reason}`` (called once per write)."""
        if decision.lane not in self._lanes and not self.spool.has_key(bucket, key):
            return False  # not a spooled lane: not a write-through either
        reason = self._write_through_reason(ctx, bucket, key)
        if reason is not None:
            self.metrics.spool_write_through.labels(reason).inc()
        return reason is None

    def _write_through_reason(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        h = ctx.view.headers
        if self.spool.degraded is not None:
            return "degraded"
        if self.closing:
            return "shutdown"
        reason = write_through_reason(key, h)
        if reason is not None:
            return reason
        if any(name in h for name in WRITE_THROUGH_ONLY):
            # A conditional write of a key the spool holds is evaluated against the spool's newest write of
            # it and spooled (see _put); of any other key the store evaluates it.
            spooled_put = ctx.target.operation == "PutObject" and self.spool.lookup(bucket, key) is not None
            if not (spooled_put and has_write_preconditions(h)):
                return "conditional"
        return None

    async def wait_clear(self, bucket: str, key: str) -> None:
        if not self.spool.has_key(bucket, key):
            return
        if not await self.spool.wait_key_clear(bucket, key, KEY_CLEAR_TIMEOUT_S):
            raise SlowDown(
                "Acknowledged writes of this key are still being uploaded to the backend; retry later.",
                retry_after_s=self.cfg.spool.retry_after_s,
            )

    def admitted(self, room: Reservation) -> bool:
        """Whether a write that may be spooled got its room; one that got none goes to the backend (counted),
        or is answered 503 SlowDown (``when_full = "slowdown"``)."""
        adm = room.admission
        if adm is Admission.FULL and self.cfg.spool.when_full == "slowdown":
            raise SlowDown(
                "The gateway's write spool is full; retry later.", retry_after_s=self.cfg.spool.retry_after_s
            )
        if adm is not Admission.SPOOL:
            self.metrics.spool_write_through.labels(adm.value).inc()
        return adm is Admission.SPOOL

    def part_room(self, room: Reservation) -> None:
        """A part of a spooled upload (its upload is in the spool, so it must be too) got its room, or 503."""
        if not room.admitted:
            raise SlowDown(
                "The gateway's write spool cannot hold this part now; retry later.",
                retry_after_s=self.cfg.spool.retry_after_s,
            )

    async def backend_call(
        self,
        ctx: RequestContext,
        lane: str,
        method: str,
        bucket: str | None,
        key: str | None,
        raw_query: str,
        headers: dict[str, str] | None = None,
        body: bytes | AsyncIterator[bytes] | None = None,
    ) -> aiohttp.ClientResponse:
        sent = 0.0

        def admitted() -> None:
            nonlocal sent
            sent = self.clock.monotonic()

        resp = await self.pools.request(
            StoreCall(lane, bucket, key, method, headers or {}, ctx.credential, raw_query),
            body,
            cost=self._request_cost,
            admitted=admitted,
        )
        self.metrics.backend_latency.labels(lane).observe(self.clock.monotonic() - sent)
        return resp

    async def check_bucket(self, ctx: RequestContext, bucket: str) -> None:
        """The bucket exists and this identity may use it (HEAD bucket, cached); required before an ack."""
        await self._buckets.check(ctx, bucket)

    async def _head_status(self, ctx: RequestContext, bucket: str) -> int:
        resp = await self.backend_call(ctx, "metadata", "HEAD", bucket, None, "")
        resp.release()
        return resp.status

    def remember_buckets(self) -> None:
        """After recovery: buckets with spooled data were checked when it was acknowledged."""
        for entry in self.spool.entries():
            cred = self.creds.get(entry.access_key)
            if cred is not None:
                self._buckets.remember(cred.backend_access_key, entry.bucket)

    async def authorize_read(self, ctx: RequestContext, bucket: str, writer_access_key: str) -> None:
        writer = self.creds.get(writer_access_key)
        if writer is not None and writer.backend_access_key == ctx.credential.backend_access_key:
            return
        await self.check_bucket(ctx, bucket)

    async def write_body(
        self,
        request: web.Request,
        upload: UploadBody | None,
        writer: SpoolFileWriter,
        extra: Checksum | None = None,
        *,
        room: Reservation | None = None,
        head: bytearray | None = None,
    ) -> str:
        """Stream the decoded, verified request body into a spool file; return its MD5. Discards on error.

        The writer hashes every byte with MD5 for the ETag, so a ``Content-MD5`` is checked against that
        hash, not against a second one computed on the event loop; the request's other promises (a signed
        payload's SHA-256, an ``x-amz-checksum-*``) are hashed by the writer too, on its I/O thread with the
        MD5, and checked once it has written the last byte, before anything is acknowledged. ``extra``: one
        more checksum the writer feeds (a part's, in its upload's algorithm, when the request sent none).
        ``room``: a body of unknown length grows its room in the spool as it arrives. ``head``: filled with
        the body's first :data:`SNIFF_BYTES` (to sniff its Content-Type)."""
        expected_md5 = upload.take_md5_check() if upload is not None else None
        if upload is not None:
            writer.extra_hashers = tuple(upload.delegate_hashing())
        if extra is not None:
            writer.extra_hashers += (extra,)
        await writer.open()
        try:
            if upload is not None:
                content = request.content
                try:
                    while True:
                        chunk, end_of_http_chunk = await content.readchunk()
                        if not chunk:
                            if end_of_http_chunk:
                                continue
                            break
                        pieces = upload.feed(chunk)
                        if room is not None and not room.grow(upload.seen_bytes):
                            raise SlowDown(
                                "The gateway's write spool cannot hold this body of unknown length now;"
                                " retry later.",
                                retry_after_s=self.cfg.spool.retry_after_s,
                            )
                        for piece in pieces:
                            if head is not None and len(head) < SNIFF_BYTES:
                                head += piece[: SNIFF_BYTES - len(head)]
                            await writer.write(piece)
                except (aiohttp.ClientPayloadError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
                    raise IncompleteBody(
                        "The client closed the connection before sending the whole body."
                    ) from exc
                tail = upload.finish()
                if tail:
                    if head is not None and len(head) < SNIFF_BYTES:
                        head += tail[: SNIFF_BYTES - len(head)]
                    await writer.write(tail)
            md5 = await writer.finish()
            if upload is not None:
                upload.verify()
            if expected_md5 is not None:
                check_content_md5(expected_md5, bytes.fromhex(md5))
            return md5
        except BaseException:
            await writer.discard()
            raise

    async def read_xml_body(self, request: web.Request, ctx: RequestContext) -> bytes:
        upload = upload_body(request, ctx)
        if upload is None:
            return b""
        if (upload.expected_bytes or 0) > MAX_XML_BODY_BYTES:
            raise MalformedXML("The request body is too large.")
        return await read_small_body(request, upload)

    def with_content_type(
        self, meta: list[tuple[str, str]], written: Written, head: bytes = b""
    ) -> list[tuple[str, str]]:
        """``meta`` with a Content-Type: the request's, else the default the store would give (kept with the
        object and sent by the drain, so that it answers the same before and after)."""
        if any(k == "content-type" for k, _ in meta):
            return meta
        default = default_content_type(self.cfg.spool.default_content_type, written, head)
        return sorted([*meta, ("content-type", default)])

    def origin(self, ctx: RequestContext, decision: Decision) -> Origin:
        """Who makes this request, in which lane, stamped now: what its journal record carries."""
        return Origin(ctx.auth.access_key, decision.lane, self.clock.wall())

    def put_record(
        self,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
        writer: SpoolFileWriter,
        md5: str,
        meta: Sequence[tuple[str, str]],
    ) -> Put:
        """The journal record of a PUT whose body ``writer`` holds, stamped now."""
        return self.spool.put_record(
            bucket=bucket,
            key=key,
            origin=self.origin(ctx, decision),
            file=writer.file_id,
            size=writer.size,
            md5=md5,
            meta=meta,
        )

    async def commit_part(
        self,
        room: Reservation,
        upload: Upload,
        number: int,
        writer: SpoolFileWriter,
        md5: str,
        checksum: str | Checksum | None,
    ) -> None:
        """Journal a part of a spooled upload whose bytes ``writer`` holds; ``checksum``: its value in the
        upload's checksum algorithm, or the hasher that computed it ("" or None: none)."""
        value = checksum.digest_b64() if isinstance(checksum, Checksum) else checksum or ""
        rec = self.spool.part_record(
            upload_id=upload.upload_id,
            number=number,
            file=writer.file_id,
            size=writer.size,
            md5=md5,
            checksum=value,
        )
        await room.commit(writer, rec)

    def acked(
        self,
        ctx: RequestContext,
        decision: Decision,
        writer: SpoolFileWriter,
        md5: str,
        body: UploadBody | None,
    ) -> web.Response:
        self.metrics.spool_acked.labels(decision.lane).inc(writer.size)
        resp = self.response(ctx, decision)
        resp.headers["ETag"] = f'"{md5}"'
        if body is not None and body.verified_checksum is not None:
            name, value = body.verified_checksum
            resp.headers[name] = value
        return resp

    async def store_etag(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        """The ETag of the object the store holds at the key, None if it has none (HEAD)."""
        resp = await self.backend_call(ctx, "metadata", "HEAD", bucket, key, "")
        status = resp.status
        etag = resp.headers.get("ETag")
        resp.release()
        if status == 404:
            return None
        if status != 200:
            raise ServiceUnavailable(f"The backend answered {status} to a HEAD of the object.")
        return etag or '""'

    async def current_etag(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        """The ETag of the object a client sees at the key now (the spool's latest write, else the
        store's)."""
        entry = self.spool.lookup(bucket, key)
        if entry is not None:
            return entry.etag if entry.kind == "put" else None
        return await self.store_etag(ctx, bucket, key)

    @contextlib.asynccontextmanager
    async def key_lock(self, bucket: str, key: str) -> AsyncIterator[None]:
        """One conditional write of a key at a time (the lock is dropped when nobody holds or awaits it)."""
        ident = (bucket, key)
        held = self._key_locks.get(ident)
        if held is None:
            held = self._key_locks[ident] = (asyncio.Lock(), [0])
        lock, users = held
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._key_locks[ident]
