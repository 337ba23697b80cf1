"""The S3 operations the write spool answers itself, and the ordering guards around the ones it does not.

:meth:`SpoolFront.route` runs for every authenticated request before it is proxied (the router,
:mod:`gateway.http.router`, asks it first). It returns a response when the spool is involved, or ``None`` to
let the request pass through to the backend:

* PutObject, CreateMultipartUpload and the parts of a spooled upload (upload ids ``s3lanes-...``) in a
  spooled lane are written to local disk and acknowledged once durable (``gateway.runtime.spool``).
* GetObject/HeadObject of a spooled key are served from the spool (sendfile); a tombstone answers 404.
* ListObjects/ListObjectsV2/ListObjectVersions over a prefix with spooled keys merge them with the
  backend's listing; ListMultipartUploads adds the spool's open uploads and hides the drain's own.
* A repeated CompleteMultipartUpload of a spooled upload gets its first answer; conditional completions are
  evaluated against the spool's object, else the store's.
* CopyObject from a spooled source copies through the gateway (into the spool, or straight to the backend).
* DeleteObject/DeleteObjects of spooled keys write tombstones, so the delete wins over the pending upload.
* Any other write to a key with spooled data waits until that data is on the backend first (ordering), and
  answers 503 SlowDown if that takes too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web

from gateway.clock import Clock
from gateway.config import Config, Credential
from gateway.core.body import UploadBody
from gateway.core.checksums import (
    ALGORITHMS,
    CHECKSUM_HEADER_PREFIX,
    Checksum,
    check_content_md5,
    header_for,
    is_checksum_value_header,
    new_checksum,
    upload_checksum,
)
from gateway.core.classify import Decision
from gateway.core.journal_records import Complete, CreateUpload, Put, Record
from gateway.core.listing import (
    NULL_VERSION,
    NotOurToken,
    decode_token,
    iso8601,
    list_parts_page,
)
from gateway.core.objectread import (
    check_write_preconditions,
    copy_range_span,
    has_write_preconditions,
    object_attributes_xml,
    parse_copy_range,
    plan_read,
)
from gateway.core.s3docs import (
    MAX_XML_BODY_BYTES,
    complete_multipart_checksums,
    complete_multipart_parts,
    delete_objects_targets,
)
from gateway.core.s3request import query_names
from gateway.core.sniff import SNIFF_BYTES, Written, default_content_type
from gateway.core.spool_policy import (
    WRITE_THROUGH_ONLY,
    copy_conditions,
    not_checksum_meta,
    parse_copy_source,
    stored_object,
    tagging_xml,
    upload_meta,
    write_through_reason,
    xml_document,
)
from gateway.core.spool_state import MAX_PARTS, Admission, Entry, Upload
from gateway.core.uri import s3_quote
from gateway.errors import (
    IncompleteBody,
    InvalidArgument,
    InvalidRange,
    InvalidRequest,
    MalformedXML,
    NoSuchKey,
    NoSuchUpload,
    PreconditionFailed,
    ServiceUnavailable,
    SlowDown,
)
from gateway.http.intake import (
    SOURCE_HEADER,
    RequestContext,
    echo_request_id,
    lane_headers,
    read_small_body,
    request_headers,
    upload_body,
)
from gateway.http.s3xml import with_request_id
from gateway.http.spool_listings import SpoolListings
from gateway.http.spool_reads import READ_CHUNK_BYTES, Moved, SpoolReads, close_span
from gateway.metrics import Metrics
from gateway.runtime.bucket_check import BucketCheck
from gateway.runtime.dispatcher import StreamBudget
from gateway.runtime.pools import Pools
from gateway.runtime.spool import JournalAppendFailed, Spool, SpoolFileWriter

log = logging.getLogger("s3lanes.spool")

UPLOAD_ID_PREFIX = "s3lanes-"
# How long a write-through operation waits for a key's spooled data to reach the backend before 503.
KEY_CLEAR_TIMEOUT_S = 30.0
REROUTE_TRIES = 3  # see Moved
# Spooled multipart uploads remembered after their completion, so that a repeated CompleteMultipartUpload
# (a client retrying after a lost answer) gets the same answer, as from the store.
COMPLETED_UPLOADS_KEPT = 4096
ROOM_STEP_BYTES = 8 * 1024 * 1024  # see _Room


@dataclass(frozen=True, slots=True)
class _Completed:
    """A spooled multipart upload's completion: what a repeated CompleteMultipartUpload answers."""

    bucket: str
    key: str
    etag: str  # quoted
    seq: int  # the spool entry it made
    access_key: str  # the identity that wrote it
    checksum_fields: tuple[tuple[str, str], ...] = ()  # ChecksumCRC32 etc. of the completed object


def _our_token(q: Mapping[str, str]) -> bool:
    token = q.get("continuation-token")
    if q.get("list-type") != "2" or not token:
        return False
    try:
        decode_token(token)
    except NotOurToken:
        return False
    return True


def _writes_key(op: str) -> bool:
    """Operations that change an object (its data, tags, ACL, or whether it exists)."""
    return op in ("PutObject", "CopyObject", "CreateMultipartUpload", "DeleteObject", "RestoreObject") or (
        op.startswith(("Put", "Delete", "Complete", "UploadPart"))
    )


class _Room:
    """Room in the spool for a body of unknown length (chunked, no Content-Length), reserved as it arrives,
    ROOM_STEP_BYTES at a time; 503 SlowDown once the spool cannot hold more. The caller releases
    :attr:`reserved` when the write ends."""

    def __init__(self, space: Spool, retry_after_s: int) -> None:
        self._space = space
        self._retry_after_s = retry_after_s
        self.reserved = 0

    def need(self, nbytes: int) -> None:
        while nbytes > self.reserved:
            if self._space.admit(ROOM_STEP_BYTES, must=True) is not Admission.SPOOL:
                raise SlowDown(
                    "The gateway's write spool cannot hold this body of unknown length now; retry later.",
                    retry_after_s=self._retry_after_s,
                )
            self.reserved += ROOM_STEP_BYTES


class SpoolFront:
    def __init__(
        self,
        spool: Spool,
        cfg: Config,
        pools: Pools,
        clock: Clock,
        metrics: Metrics,
        *,
        drain_uploads: Callable[[], AbstractSet[str]] = frozenset,
        drain_creating: Callable[[str], AbstractSet[str]] = lambda bucket: frozenset(),
        keys: dict[str, Credential] | None = None,
    ) -> None:
        self.spool = spool
        # The backend upload ids the drain has open: hidden from clients' ListMultipartUploads.
        self._drain_uploads = drain_uploads
        # Per bucket, keys whose drain upload is being created (its id not known yet): hidden likewise.
        self._drain_creating = drain_creating
        self._cfg = cfg
        self._pools = pools
        self._clock = clock
        self._metrics = metrics
        self._lanes = frozenset(cfg.spool.lanes)
        # Every key that wrote (live and removed ones); shared, updated in place by credentials file reloads.
        self._creds = keys if keys is not None else {c.access_key: c for c in cfg.credentials}
        self._buckets = BucketCheck(spool, clock, self._head_status)
        self._reads = SpoolReads(spool, cfg, clock, metrics, authorize_read=self._authorize_read)
        self._listings = SpoolListings(
            spool,
            cfg,
            pools,
            clock,
            self._creds,
            backend_call=self._backend_call,
            response=self._response,
            drain_uploads=drain_uploads,
            drain_creating=drain_creating,
        )
        self._request_cost = cfg.scheduler.request_cost_bytes
        self._chunk = cfg.scheduler.chunk_bytes
        self._closing = False
        self._completed: OrderedDict[str, _Completed] = OrderedDict()  # upload id -> its completion
        # Conditional completions of a key, one at a time: the check and the commit are not interleaved.
        self._key_locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}  # lock, users

    # -- routing ---------------------------------------------------------------------------------------------

    async def route(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse | None:
        """The spool's answer to the request, or None: the backend answers it (as proxied)."""
        for _ in range(REROUTE_TRIES):
            try:
                return await self._route(request, ctx, decision)
            except Moved:
                continue
        raise SlowDown(
            "The object is being moved from the gateway's spool to the store; retry.",
            retry_after_s=self._cfg.spool.retry_after_s,
        )

    async def _route(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse | None:
        target = ctx.target
        bucket, key, op = target.bucket, target.key, target.operation
        if bucket is None:
            return None
        state = self.spool  # the spool answers for its state
        q = query_names(ctx.view.raw_query)
        if key is None:
            if op in ("ListObjects", "ListObjectsV2"):
                # Merged while the prefix has spooled keys, and for every page after one of our tokens
                # (the backend cannot continue a listing from a token it did not issue).
                if state.has_bucket_prefix(bucket, q.get("prefix", "")) or _our_token(q):
                    return await self._listings.list_objects(ctx, decision, bucket, q)
            elif op == "ListObjectVersions":
                if state.has_bucket_prefix(bucket, q.get("prefix", "")):
                    return await self._listings.list_objects(ctx, decision, bucket, q)
            elif op in ("DeleteObjects", "DeleteBucket") and any(
                b == bucket for b, _ in self.spool.unjournaled_keys
            ):
                raise self._journal_out_of_service()
            elif op == "DeleteObjects" and state.has_bucket_prefix(bucket, ""):
                return await self._delete_objects(request, ctx, decision, bucket)
            elif op == "ListMultipartUploads" and (
                any(u.bucket == bucket for u in state.uploads())
                or self._drain_uploads()
                or self._drain_creating(bucket)
            ):
                return await self._listings.list_uploads(request, ctx, decision, bucket, q)
            elif op == "DeleteBucket" and any(
                e.bucket == bucket and e.kind == "put" for e in state.entries()
            ):
                # Spooled objects are objects of the bucket: drain them first, then the backend answers
                # BucketNotEmpty as S3 would (deleting the bucket under them would strand them).
                await self._flush_bucket(bucket)
            elif op == "DeleteBucket" and any(e.bucket == bucket for e in state.entries()):
                return await self._delete_bucket_with_spooled_deletes(ctx, decision, bucket)
            return None
        upload_id = q.get("uploadId")
        if upload_id is not None and upload_id.startswith(UPLOAD_ID_PREFIX):
            return await self._spooled_upload_op(request, ctx, decision, op, upload_id, q)
        if (bucket, key) in self.spool.unjournaled_keys and _writes_key(op):
            raise self._journal_out_of_service()
        if (
            op == "DeleteObject"
            and q.get("versionId") == NULL_VERSION
            and state.lookup(bucket, key) is not None
        ):
            # The spool models an unversioned bucket: a spooled key's one version is "null" (as listed).
            # The store answers it without an x-amz-version-id on an unversioned bucket, as this does.
            return await self._tombstone(request, ctx, decision, bucket, key)
        if "versionId" in q:
            if _writes_key(op):  # not modelled by the spool, but ordered after the key's spooled data
                await self._wait_clear(bucket, key)
            return None
        if op in ("GetObject", "HeadObject"):
            entry = state.lookup(bucket, key)
            if entry is None:
                return None
            if entry.kind == "del":
                raise NoSuchKey(Key=key)
            return await self._reads.serve(request, ctx, decision, entry)
        if op in ("PutObject", "CompleteMultipartUpload") and has_write_preconditions(ctx.view.headers):
            # A conditional write goes to the store (which evaluates it) once the key's spooled data is
            # there; if the spool's latest write of the key already fails the condition, answer now.
            entry = state.lookup(bucket, key)
            if entry is not None:
                check_write_preconditions(entry.etag if entry.kind == "put" else None, ctx.view.headers)
        if op == "PutObject":
            return await self._put(request, ctx, decision, bucket, key)
        if op == "CopyObject":
            return await self._copy(request, ctx, decision, bucket, key)
        if op == "CreateMultipartUpload":
            return await self._create_upload(request, ctx, decision, bucket, key)
        if op == "DeleteObject":
            if state.has_key(bucket, key):
                return await self._tombstone(request, ctx, decision, bucket, key)
            return None
        if op == "GetObjectTagging" and (entry := state.lookup(bucket, key)) is not None:
            # Answered from the spool (the tags a spooled object will be stored with), not after its drain.
            if entry.kind == "del":
                raise NoSuchKey(Key=key)
            await self._authorize_read(ctx, bucket, entry.access_key)
            return self._response(ctx, decision, body=tagging_xml(dict(entry.meta).get("x-amz-tagging", "")))
        if op == "GetObjectAttributes" and (entry := state.lookup(bucket, key)) is not None:
            if entry.kind == "del":
                raise NoSuchKey(Key=key)
            await self._authorize_read(ctx, bucket, entry.access_key)
            storage_class = dict(entry.meta).get("x-amz-storage-class", "STANDARD")
            xml = object_attributes_xml(stored_object(entry), ctx.view.headers, storage_class)
            resp = self._response(ctx, decision, body=xml)
            resp.headers["Last-Modified"] = email.utils.formatdate(int(entry.acked_at), usegmt=True)
            return resp
        if op in ("GetObjectTagging", "GetObjectAcl", "GetObjectAttributes") or op.startswith(
            ("Put", "Delete", "Complete", "Restore", "Select", "UploadPart")
        ):
            # Not modelled by the spool: order it after the key's spooled data.
            await self._wait_clear(bucket, key)
        return None

    def _journal_out_of_service(self) -> SlowDown:
        return SlowDown(
            "The gateway's spool journal is out of service and this key's last acknowledged write cannot be"
            " ordered against a new one yet; retry later.",
            retry_after_s=self._cfg.spool.retry_after_s,
        )

    def _response(
        self, ctx: RequestContext, decision: Decision, status: int = 200, body: bytes = b""
    ) -> web.Response:
        resp = web.Response(status=status, body=body)
        if body:
            resp.content_type = "application/xml"
        resp.headers["x-amz-request-id"] = ctx.request_id
        resp.headers[SOURCE_HEADER] = "spool"
        lane_headers(resp, decision)
        return resp

    def stop_accepting(self) -> None:
        """Shutdown: new writes go to the backend directly (after the key's spooled data, as always);
        uploads already in the spool carry on, and reads still see the spool."""
        self._closing = True

    def _spoolable(self, ctx: RequestContext, decision: Decision, bucket: str, key: str) -> bool:
        """Whether this write may be spooled. One that would be, but for a reason goes to the backend, is
        counted in ``s3lanes_spool_write_through_total{reason}`` (called once per write)."""
        if decision.lane not in self._lanes and not self.spool.has_key(bucket, key):
            return False  # not a spooled lane: not a write-through either
        reason = self._write_through_reason(ctx, bucket, key)
        if reason is not None:
            self._metrics.spool_write_through.labels(reason).inc()
        return reason is None

    def _write_through_reason(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        h = ctx.view.headers
        if self.spool.degraded is not None:
            return "degraded"
        if self._closing:
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

    async def _wait_clear(self, bucket: str, key: str) -> None:
        if not self.spool.has_key(bucket, key):
            return
        if not await self.spool.wait_key_clear(bucket, key, KEY_CLEAR_TIMEOUT_S):
            raise SlowDown(
                "Acknowledged writes of this key are still being uploaded to the backend; retry later.",
                retry_after_s=self._cfg.spool.retry_after_s,
            )

    def _admit(self, nbytes: int, *, must: bool = False) -> Admission:
        """Room for a write that may be spooled; one that gets none goes to the backend (counted), or is
        answered 503 SlowDown (``when_full = "slowdown"``)."""
        adm = self.spool.admit(nbytes, must=must)
        if adm is Admission.FULL and self._cfg.spool.when_full == "slowdown":
            raise SlowDown(
                "The gateway's write spool is full; retry later.", retry_after_s=self._cfg.spool.retry_after_s
            )
        if adm is not Admission.SPOOL:
            self._metrics.spool_write_through.labels(adm.value).inc()
        return adm

    # -- backend helpers -------------------------------------------------------------------------------------

    async def _backend_call(
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
            sent = self._clock.monotonic()

        resp = await self._pools.request(
            lane,
            bucket,
            key,
            method,
            headers or {},
            ctx.credential,
            body,
            raw_query=raw_query,
            cost=self._request_cost,
            admitted=admitted,
        )
        self._metrics.backend_latency.labels(lane).observe(self._clock.monotonic() - sent)
        return resp

    async def _check_bucket(self, ctx: RequestContext, bucket: str) -> None:
        """The bucket exists and this identity may use it (HEAD bucket, cached); required before an ack."""
        await self._buckets.check(ctx, bucket)

    async def _head_status(self, ctx: RequestContext, bucket: str) -> int:
        resp = await self._backend_call(ctx, "metadata", "HEAD", bucket, None, "")
        resp.release()
        return resp.status

    def remember_buckets(self) -> None:
        """After recovery: buckets with spooled data were checked when it was acknowledged."""
        for entry in self.spool.entries():
            cred = self._creds.get(entry.access_key)
            if cred is not None:
                self._buckets.remember(cred.backend_access_key, entry.bucket)

    async def _authorize_read(self, ctx: RequestContext, bucket: str, writer_access_key: str) -> None:
        writer = self._creds.get(writer_access_key)
        if writer is not None and writer.backend_access_key == ctx.credential.backend_access_key:
            return
        await self._check_bucket(ctx, bucket)

    # -- body intake -----------------------------------------------------------------------------------------

    async def _write_body(
        self,
        request: web.Request,
        upload: UploadBody | None,
        writer: SpoolFileWriter,
        extra: Checksum | None = None,
        *,
        room: _Room | None = None,
        head: bytearray | None = None,
    ) -> str:
        """Stream the decoded, verified request body into a spool file; return its MD5. Discards on error.

        The writer hashes every byte with MD5 for the ETag, so a ``Content-MD5`` is checked against that
        hash, not against a second one computed on the event loop; the request's other promises (a signed
        payload's SHA-256, an ``x-amz-checksum-*``) are hashed by the writer too, on its I/O thread with the
        MD5, and checked once it has written the last byte, before anything is acknowledged. ``extra``: one
        more checksum the writer feeds (a part's, in its upload's algorithm, when the request sent none).
        ``room``: a body of unknown length reserves its room in the spool as it arrives. ``head``: filled with
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
                        if room is not None:
                            room.need(upload.seen_bytes)
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

    async def _read_xml_body(self, request: web.Request, ctx: RequestContext) -> bytes:
        upload = upload_body(request, ctx)
        if upload is None:
            return b""
        if (upload.expected_bytes or 0) > MAX_XML_BODY_BYTES:
            raise MalformedXML("The request body is too large.")
        return await read_small_body(request, upload)

    # -- PutObject -------------------------------------------------------------------------------------------

    async def _put(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        if not self._spoolable(ctx, decision, bucket, key):
            await self._wait_clear(bucket, key)
            return None
        upload = upload_body(request, ctx)
        declared = upload.expected_bytes if upload is not None else 0
        size = declared or 0
        adm = self._admit(size)
        if adm is not Admission.SPOOL:
            await self._wait_clear(bucket, key)
            return None
        room = _Room(self.spool, self._cfg.spool.retry_after_s) if declared is None else None
        try:
            await self._check_bucket(ctx, bucket)
            writer = self.spool.writer(size)
            head = bytearray()
            computed = self._unpromised_checksum(ctx, upload)
            md5 = await self._write_body(request, upload, writer, computed, room=room, head=head)
            meta = self._with_content_type(upload_meta(ctx.view.headers), Written.PUT, bytes(head))
            checksum = upload.verified_checksum if upload is not None else None
            if computed is not None:
                checksum = (header_for(computed.algorithm), computed.digest_b64())
            if checksum is not None:
                meta = sorted([*meta, checksum])  # kept, and sent with the drain's PUT

            def record() -> Put:
                return self._put_record(ctx, decision, bucket, key, writer, md5, meta)

            if has_write_preconditions(ctx.view.headers):
                # If-Match / If-None-Match against the object a client sees at the key now (the spool's
                # newest write, else the store's), checked and committed under the key's lock, as for a
                # conditional CompleteMultipartUpload: answered at once, without waiting for the drain.
                async with self._key_lock(bucket, key):
                    try:
                        current = await self._current_etag(ctx, bucket, key)
                        check_write_preconditions(current, ctx.view.headers)
                    except BaseException:
                        await writer.discard()
                        raise
                    await self._commit_or_discard(writer, record())
            else:
                await self._commit_or_discard(writer, record())
        finally:
            self.spool.release(size + (room.reserved if room is not None else 0))
        resp = self._acked(ctx, decision, writer, md5, upload)
        if computed is not None and checksum is not None:
            resp.headers[checksum[0]] = checksum[1]
        return resp

    @staticmethod
    def _unpromised_checksum(ctx: RequestContext, upload: UploadBody | None) -> Checksum | None:
        """An ``x-amz-sdk-checksum-algorithm`` without a checksum value (header or trailer): the store
        computes that checksum and keeps it, so the spool computes it as it writes (None otherwise)."""
        algorithm = ctx.view.headers.get("x-amz-sdk-checksum-algorithm", "").strip().upper()
        if algorithm not in ALGORITHMS or (upload is not None and upload.checksum_algorithm is not None):
            return None
        return new_checksum(algorithm)

    def _with_content_type(
        self, meta: list[tuple[str, str]], written: Written, head: bytes = b""
    ) -> list[tuple[str, str]]:
        """``meta`` with a Content-Type: the request's, else the default the store would give (kept with the
        object and sent by the drain, so that it answers the same before and after)."""
        if any(k == "content-type" for k, _ in meta):
            return meta
        default = default_content_type(self._cfg.spool.default_content_type, written, head)
        return sorted([*meta, ("content-type", default)])

    # -- GET / HEAD ------------------------------------------------------------------------------------------

    # -- deletes ---------------------------------------------------------------------------------------------

    async def _tombstone(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
    ) -> web.StreamResponse:
        rec = self.spool.delete_record(
            bucket=bucket,
            key=key,
            access_key=ctx.auth.access_key,
            lane=decision.lane,
            now_wall=self._clock.wall(),
        )
        await self.spool.commit([rec])
        return self._response(ctx, decision, status=204)

    async def _flush_bucket(self, bucket: str) -> None:
        result = await self.spool.flush(bucket, "", KEY_CLEAR_TIMEOUT_S)
        if not result.durable:
            raise SlowDown(
                "The bucket has acknowledged writes still being uploaded; retry later.",
                retry_after_s=self._cfg.spool.retry_after_s,
            )

    async def _delete_bucket_with_spooled_deletes(
        self, ctx: RequestContext, decision: Decision, bucket: str
    ) -> web.StreamResponse | None:
        """DeleteBucket while only deletes of the bucket are spooled. They do not hold it up when the store
        has none of their keys (its answer stands, and once the bucket is gone their drain finds nothing to
        delete). But a key drained before its delete was acknowledged is still on the store until that
        delete drains, and the store would answer BucketNotEmpty for a bucket the client has emptied: on
        that answer the spooled deletes are drained first and the store asked again (None: proxied)."""
        resp = await self._backend_call(ctx, decision.lane, "DELETE", bucket, None, ctx.view.raw_query)
        try:
            data = await resp.read()
        finally:
            resp.release()
        if resp.status == 409 and b"<Code>BucketNotEmpty</Code>" in data:
            await self._flush_bucket(bucket)
            return None
        return self._relayed(resp, data, ctx, decision)

    @staticmethod
    def _relayed(
        resp: aiohttp.ClientResponse, data: bytes, ctx: RequestContext, decision: Decision
    ) -> web.Response:
        """The store's answer (read whole) as this request's, with the gateway's request id."""
        out = web.Response(status=resp.status, body=with_request_id(data, ctx.request_id) if data else None)
        for name in ("Content-Type", "x-amz-request-id"):
            if name in resp.headers:
                out.headers[name] = resp.headers[name]
        echo_request_id(out, ctx.request_id)
        lane_headers(out, decision)
        return out

    async def _delete_objects(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str
    ) -> web.StreamResponse:
        body = await self._read_xml_body(request, ctx)
        state = self.spool  # the spool answers for its state
        keys: list[str] = []
        for k, version_id in delete_objects_targets(body):
            if version_id is None or (version_id == NULL_VERSION and state.lookup(bucket, k) is not None):
                # A spooled key's one version is "null" (as ListObjectVersions shows it): deleting it
                # deletes the key, as on an unversioned bucket.
                if k not in keys:
                    keys.append(k)
            else:
                await self._wait_clear(bucket, k)  # another version: ordered after the key's spooled data
        records = [
            state.delete_record(
                bucket=bucket,
                key=k,
                access_key=ctx.auth.access_key,
                lane=decision.lane,
                now_wall=self._clock.wall(),
            )
            for k in keys
            if state.has_key(bucket, k)
        ]
        if records:
            await self.spool.commit(records)
        # The backend deletes what it has; the tombstones keep an upload in flight from bringing a key back.
        headers = request_headers(ctx, None)
        headers["content-length"] = str(len(body))
        resp = await self._backend_call(
            ctx, decision.lane, "POST", bucket, None, ctx.view.raw_query, headers, body
        )
        try:
            data = await resp.read()
            out = web.Response(status=resp.status, body=with_request_id(data, ctx.request_id))
            for name in ("Content-Type", "x-amz-request-id"):
                if name in resp.headers:
                    out.headers[name] = resp.headers[name]
            echo_request_id(out, ctx.request_id)
            lane_headers(out, decision)
            return out
        finally:
            resp.release()

    # -- CopyObject ------------------------------------------------------------------------------------------

    async def _copy(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        h = ctx.view.headers
        src_bucket, src_key = parse_copy_source(h.get("x-amz-copy-source", ""))
        src = self.spool.lookup(src_bucket, src_key)
        if src is None:
            # The source is on the backend: a server-side copy there, ordered after the destination's data.
            await self._wait_clear(bucket, key)
            return None
        if src.kind == "del":
            raise NoSuchKey(Key=src_key)
        await self._authorize_read(ctx, src_bucket, src.access_key)
        conditions = copy_conditions(h)
        # A copy-source condition that a GET would answer 304 (If-None-Match, If-Modified-Since) fails the
        # copy with 412, as S3 documents.
        if (
            conditions
            and plan_read(stored_object(src), "HEAD", conditions, {}, self._clock.wall()).status == 304
        ):
            raise PreconditionFailed()
        if h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE":
            meta = self._with_content_type(upload_meta(h), Written.COPY)
        else:
            if src_bucket == bucket and src_key == key:
                raise InvalidRequest(
                    "This copy request is illegal because it is trying to copy an object to itself without"
                    " changing the object's metadata, storage class, website redirect location or"
                    " encryption attributes."
                )
            meta = [(k, v) for k, v in not_checksum_meta(list(src.meta)) if k != "x-amz-tagging"]
            meta += [
                (k, v) for k, v in upload_meta(h) if not k.startswith("x-amz-meta-") and k != "content-type"
            ]
        tagging = dict(src.meta).get("x-amz-tagging")
        if h.get("x-amz-tagging-directive", "COPY").upper() == "REPLACE":
            tagging = h.get("x-amz-tagging")
        meta = [(k, v) for k, v in meta if k != "x-amz-tagging"]
        if tagging:
            meta.append(("x-amz-tagging", tagging))
        if not src.multipart:  # the copy keeps the source's checksum, whatever the directive (as the store)
            meta += [kv for kv in src.checksum if kv not in meta]
        meta.sort()
        try:
            files = (
                await self.spool.run_read_io_owned(
                    self._reads.open_span, src, 0, src.size, release=close_span
                )
                if src.size
                else []
            )
        except FileNotFoundError:
            raise Moved() from None
        try:
            if self._spoolable(ctx, decision, bucket, key) and self._admit(src.size) is Admission.SPOOL:
                try:
                    await self._check_bucket(ctx, bucket)
                    if src.multipart:
                        # Part for part, as the store copies a multipart object: the copy keeps the source's
                        # multipart ETag (and the drain uploads it as the same parts).
                        etag = await self._copy_parts(ctx, decision, bucket, key, meta, src, files)
                        return self._response(ctx, decision, body=self._copy_result(etag))
                    writer = self.spool.writer(src.size)
                    await writer.open()
                    try:
                        await self._copy_files(files, writer)
                        md5 = await writer.finish()
                        rec = self._put_record(ctx, decision, bucket, key, writer, md5, meta)
                        await self.spool.commit([rec])
                    except BaseException:
                        await writer.discard()
                        raise
                finally:
                    self.spool.release(src.size)
                etag = f'"{md5}"'
            else:
                await self._wait_clear(bucket, key)
                etag = await self._put_through(ctx, decision, bucket, key, meta, files, src.size)
        finally:
            for fd, _, _ in files:
                os.close(fd)
        return self._response(ctx, decision, body=self._copy_result(etag))

    def _put_record(
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
            file=writer.file_id,
            size=writer.size,
            md5=md5,
            meta=meta,
            access_key=ctx.auth.access_key,
            lane=decision.lane,
            now_wall=self._clock.wall(),
        )

    def _create_upload_record(
        self,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
        upload_id: str,
        meta: Sequence[tuple[str, str]],
    ) -> CreateUpload:
        """The journal record of a new spooled multipart upload, stamped now."""
        return self.spool.create_upload_record(
            upload_id=upload_id,
            bucket=bucket,
            key=key,
            meta=meta,
            access_key=ctx.auth.access_key,
            lane=decision.lane,
            now_wall=self._clock.wall(),
        )

    def _copy_result(self, etag: str) -> bytes:
        return xml_document(
            "CopyObjectResult", [("LastModified", iso8601(self._clock.wall())), ("ETag", etag)]
        )

    async def _copy_parts(
        self,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
        meta: list[tuple[str, str]],
        src: Entry,
        files: list[tuple[int, int, int]],
    ) -> str:
        """Copy a spooled multipart object into the spool with its part layout: a spooled multipart upload
        of the same parts, completed at once (the records a client's upload would journal). Its ETag."""
        state = self.spool  # the spool answers for its state
        upload_id = UPLOAD_ID_PREFIX + secrets.token_hex(20)
        await self.spool.commit([self._create_upload_record(ctx, decision, bucket, key, upload_id, meta)])
        try:
            upload = state.upload(upload_id)
            assert upload is not None  # just committed
            spans = iter(files)  # one span per non-empty part, in order
            requested: list[tuple[int, str]] = []
            for number, size in enumerate(src.part_sizes, start=1):
                writer = self.spool.writer(size)
                await writer.open()
                try:
                    if size:
                        await self._copy_files([next(spans)], writer)
                    md5 = await writer.finish()
                except BaseException:
                    await writer.discard()
                    raise
                await self._commit_part(upload, number, writer, md5, None)
                requested.append((number, md5))
            rec = state.complete_record(upload, requested, self._clock.wall())
            await self.spool.commit([rec])
        except BaseException:
            if state.upload(upload_id) is not None:
                with contextlib.suppress(Exception):
                    await self.spool.commit([state.abort_record(upload_id)])
            raise
        return rec.etag

    async def _put_through(
        self,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
        meta: list[tuple[str, str]],
        files: list[tuple[int, int, int]],
        size: int,
    ) -> str:
        """PUT bytes read from spool files straight to the backend, paced through the lane."""
        lane = decision.lane

        async def body() -> AsyncIterator[bytes]:
            budget = StreamBudget(self._pools.dispatcher_for(bucket), lane, self._chunk, size)
            try:
                for fd, offset, count in files:
                    while count > 0:
                        n = min(READ_CHUNK_BYTES, count)
                        await budget.take(n)
                        chunk = await self.spool.run_read_io(os.pread, fd, n, offset)
                        offset += len(chunk)
                        count -= len(chunk)
                        yield chunk
            finally:
                budget.close()

        headers = dict(meta)
        headers["content-length"] = str(size)
        resp = await self._backend_call(ctx, lane, "PUT", bucket, key, "", headers, body() if size else b"")
        try:
            data = await resp.read()
            if resp.status != 200:
                raise ServiceUnavailable(
                    f"The backend refused the copied object ({resp.status}): {data[:200]!r}"
                )
            return resp.headers.get("ETag", "")
        finally:
            resp.release()

    # -- multipart in the spool ------------------------------------------------------------------------------

    async def _create_upload(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        if not self._spoolable(ctx, decision, bucket, key) or self._admit(0) is not Admission.SPOOL:
            return None
        self.spool.release(0)
        h = ctx.view.headers
        algo = upload_checksum(h.get("x-amz-checksum-algorithm"), h.get("x-amz-checksum-type"))
        await self._check_bucket(ctx, bucket)
        upload_id = UPLOAD_ID_PREFIX + secrets.token_hex(20)
        meta = self._with_content_type(upload_meta(h), Written.MULTIPART)
        if algo is not None:  # kept with the upload, and sent with the drain's CreateMultipartUpload
            meta = sorted([*meta, ("x-amz-checksum-algorithm", algo[0]), ("x-amz-checksum-type", algo[1])])
        rec = self._create_upload_record(ctx, decision, bucket, key, upload_id, meta)
        await self.spool.commit([rec])
        body = xml_document(
            "InitiateMultipartUploadResult", [("Bucket", bucket), ("Key", key), ("UploadId", upload_id)]
        )
        resp = self._response(ctx, decision, body=body)
        if algo is not None:
            resp.headers["x-amz-checksum-algorithm"] = algo[0]
            resp.headers["x-amz-checksum-type"] = algo[1]
        return resp

    async def _spooled_upload_op(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        op: str,
        upload_id: str,
        q: Mapping[str, str],
    ) -> web.StreamResponse:
        upload = self.spool.upload(upload_id)
        if upload is None:
            done = self._completed.get(upload_id)
            if done is not None and (done.bucket, done.key) == (ctx.target.bucket, ctx.target.key):
                return await self._completed_upload_op(request, ctx, decision, op, upload_id, done)
            if op == "AbortMultipartUpload":
                # The store answers 204 to an abort of an upload id it issued but no longer knows (aborted
                # or completed before), so a repeated abort of a spooled upload answers the same.
                return self._response(ctx, decision, status=204)
        if upload is None or upload.bucket != ctx.target.bucket or upload.key != ctx.target.key:
            raise NoSuchUpload(UploadId=upload_id)
        await self._authorize_read(ctx, upload.bucket, upload.access_key)
        if op in ("UploadPart", "UploadPartCopy"):
            return await self._upload_part(request, ctx, decision, upload, q, copy=op == "UploadPartCopy")
        if op == "CompleteMultipartUpload":
            return await self._complete(request, ctx, decision, upload)
        if op == "AbortMultipartUpload":
            await self.spool.commit([self.spool.abort_record(upload_id)])
            return self._response(ctx, decision, status=204)
        if op == "ListParts":
            return self._list_parts(ctx, decision, upload, q)
        raise InvalidRequest(f"{op} is not supported on a multipart upload held by the gateway's spool.")

    async def _completed_upload_op(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        op: str,
        upload_id: str,
        done: _Completed,
    ) -> web.StreamResponse:
        """A request naming a spooled upload that was completed, answered as the store answers it: a
        repeated CompleteMultipartUpload gets the same result while the object at the key is still the one
        it made (in the spool, or drained to the store), an AbortMultipartUpload 204 with nothing done; the
        rest NoSuchUpload."""
        await self._authorize_read(ctx, done.bucket, done.access_key)
        if op == "CompleteMultipartUpload":
            await self._read_xml_body(request, ctx)  # the store answers the first result whatever it names
        if op == "AbortMultipartUpload":
            return self._response(ctx, decision, status=204)
        if op == "CompleteMultipartUpload":
            entry = self.spool.lookup(done.bucket, done.key)
            if entry is not None:
                current = entry.seq == done.seq
            else:
                current = await self._store_etag(ctx, done.bucket, done.key) == done.etag
            if current:
                xml = self._complete_xml(request, done.bucket, done.key, done.etag, done.checksum_fields)
                return self._response(ctx, decision, body=xml)
        raise NoSuchUpload(UploadId=upload_id)

    async def _store_etag(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        """The ETag of the object the store holds at the key, None if it has none (HEAD)."""
        resp = await self._backend_call(ctx, "metadata", "HEAD", bucket, key, "")
        status = resp.status
        etag = resp.headers.get("ETag")
        resp.release()
        if status == 404:
            return None
        if status != 200:
            raise ServiceUnavailable(f"The backend answered {status} to a HEAD of the object.")
        return etag or '""'

    async def _current_etag(self, ctx: RequestContext, bucket: str, key: str) -> str | None:
        """The ETag of the object a client sees at the key now (the spool's latest write, else the
        store's)."""
        entry = self.spool.lookup(bucket, key)
        if entry is not None:
            return entry.etag if entry.kind == "put" else None
        return await self._store_etag(ctx, bucket, key)

    @contextlib.asynccontextmanager
    async def _key_lock(self, bucket: str, key: str) -> AsyncIterator[None]:
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

    def _complete_xml(
        self,
        request: web.Request,
        bucket: str,
        key: str,
        etag: str,
        checksum_fields: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        # An absolute URL of the object at this endpoint, path-style, as the store answers it.
        location = f"{request.scheme}://{request.host}/{bucket}/{s3_quote(key, safe='/')}"
        return xml_document(
            "CompleteMultipartUploadResult",
            [("Location", location), ("Bucket", bucket), ("Key", key), ("ETag", etag), *checksum_fields],
        )

    async def _upload_part(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        upload: Upload,
        q: Mapping[str, str],
        *,
        copy: bool,
    ) -> web.StreamResponse:
        raw_number = q.get("partNumber", "")
        if not (raw_number.isascii() and raw_number.isdigit()) or not 1 <= int(raw_number) <= MAX_PARTS:
            raise InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive.",
                ArgumentName="partNumber",
                ArgumentValue=raw_number[:64],
            )
        number = int(raw_number)
        if copy:
            return await self._upload_part_copy(request, ctx, decision, upload, number)
        body = upload_body(request, ctx)
        declared = body.expected_bytes if body is not None else 0
        size = declared or 0
        room = _Room(self.spool, self._cfg.spool.retry_after_s) if declared is None else None
        algo = upload.checksum_algorithm
        extra: Checksum | None = None
        if algo is not None:
            promised = body.checksum_algorithm if body is not None else None
            if promised is not None and promised != algo[0]:
                raise InvalidRequest(
                    f"Checksum Type mismatch occurred, expected checksum Type: {algo[0].lower()},"
                    f" actual checksum Type: {promised.lower()}"
                )
            if promised is None:  # computed here, as the store does for a part sent without one
                extra = new_checksum(algo[0])
        if self.spool.admit(size, must=True) is not Admission.SPOOL:
            raise SlowDown(
                "The gateway's write spool cannot hold this part now; retry later.",
                retry_after_s=self._cfg.spool.retry_after_s,
            )
        try:
            writer = self.spool.writer(size)
            md5 = await self._write_body(request, body, writer, extra, room=room)
            checksum = ""
            if algo is not None:
                verified = body.verified_checksum if body is not None else None
                checksum = verified[1] if verified is not None else extra.digest_b64() if extra else ""
            rec = self.spool.part_record(
                upload_id=upload.upload_id,
                number=number,
                file=writer.file_id,
                size=writer.size,
                md5=md5,
                checksum=checksum,
            )
            await self._commit_or_discard(writer, rec)
        finally:
            self.spool.release(size + (room.reserved if room is not None else 0))
        resp = self._acked(ctx, decision, writer, md5, body)
        if algo is not None and checksum:
            resp.headers[header_for(algo[0])] = checksum
        return resp

    async def _upload_part_copy(
        self, request: web.Request, ctx: RequestContext, decision: Decision, upload: Upload, number: int
    ) -> web.StreamResponse:
        h = ctx.view.headers
        src_bucket, src_key = parse_copy_source(h.get("x-amz-copy-source", ""))
        read_headers = copy_conditions(h)
        copy_range = h.get("x-amz-copy-source-range")
        if copy_range is not None:
            parse_copy_range(copy_range)  # the form first; whether it fits the source, below
            read_headers["range"] = copy_range.strip()
        src = self.spool.lookup(src_bucket, src_key)
        if src is not None and src.kind == "del":
            raise NoSuchKey(Key=src_key)
        writer: SpoolFileWriter
        if src is not None:
            await self._authorize_read(ctx, src_bucket, src.access_key)
            conditions = {k: v for k, v in read_headers.items() if k != "range"}
            if plan_read(stored_object(src), "HEAD", conditions, {}, self._clock.wall()).status == 304:
                raise PreconditionFailed()
            start, size = copy_range_span(copy_range, src.size) if copy_range is not None else (0, src.size)
            if self.spool.admit(size, must=True) is not Admission.SPOOL:
                raise SlowDown(
                    "The gateway's write spool cannot hold this part now; retry later.",
                    retry_after_s=self._cfg.spool.retry_after_s,
                )
            try:
                try:
                    files = (
                        await self.spool.run_read_io_owned(
                            self._reads.open_span, src, start, size, release=close_span
                        )
                        if size
                        else []
                    )
                except FileNotFoundError:
                    raise Moved() from None
                writer = self.spool.writer(size)
                hasher = self._part_hasher(upload, writer)
                await writer.open()
                try:
                    await self._copy_files(files, writer)
                    md5 = await writer.finish()
                except BaseException:
                    await writer.discard()
                    raise
                finally:
                    for fd, _, _ in files:
                        os.close(fd)
                await self._commit_part(upload, number, writer, md5, hasher)
            finally:
                self.spool.release(size)
        else:
            md5, writer = await self._part_from_backend(
                ctx, decision, upload, number, src_bucket, src_key, read_headers, copy_range
            )
        body = xml_document(
            "CopyPartResult", [("LastModified", iso8601(self._clock.wall())), ("ETag", f'"{md5}"')]
        )
        return self._response(ctx, decision, body=body)

    async def _part_from_backend(
        self,
        ctx: RequestContext,
        decision: Decision,
        upload: Upload,
        number: int,
        src_bucket: str,
        src_key: str,
        read_headers: dict[str, str],
        copy_range: str | None,
    ) -> tuple[str, SpoolFileWriter]:
        resp = await self._backend_call(ctx, decision.lane, "GET", src_bucket, src_key, "", read_headers)
        try:
            if copy_range is not None and resp.status in (200, 206):
                # A GET clamps a range that reaches past the end; a copy range is refused instead.
                total = resp.headers.get("Content-Range", "").rpartition("/")[2]
                size_s = total if total.isdigit() else str(resp.content_length or 0)
                copy_range_span(copy_range, int(size_s))
            if resp.status == 304:
                raise PreconditionFailed()
            if resp.status not in (200, 206):
                data = await resp.read()
                if resp.status == 404:
                    raise NoSuchKey(Key=src_key)
                if resp.status == 412:
                    raise PreconditionFailed()
                if resp.status == 416:
                    raise InvalidRange(RangeRequested=copy_range or "")
                raise ServiceUnavailable(
                    f"The backend answered {resp.status} reading the copy source: {data[:200]!r}"
                )
            size = resp.content_length or 0
            if self.spool.admit(size, must=True) is not Admission.SPOOL:
                raise SlowDown(
                    "The gateway's write spool cannot hold this part now; retry later.",
                    retry_after_s=self._cfg.spool.retry_after_s,
                )
            try:
                writer = self.spool.writer(size)
                hasher = self._part_hasher(upload, writer)
                await writer.open()
                try:
                    budget = StreamBudget(
                        self._pools.dispatcher_for(src_bucket), decision.lane, self._chunk, size
                    )
                    try:
                        async for chunk, _ in resp.content.iter_chunks():
                            await budget.take(len(chunk))
                            await writer.write(chunk)
                    finally:
                        budget.close()
                    md5 = await writer.finish()
                except BaseException:
                    await writer.discard()
                    raise
                await self._commit_part(upload, number, writer, md5, hasher)
            finally:
                self.spool.release(size)
            return md5, writer
        finally:
            resp.release()

    def _acked(
        self,
        ctx: RequestContext,
        decision: Decision,
        writer: SpoolFileWriter,
        md5: str,
        body: UploadBody | None,
    ) -> web.Response:
        self._metrics.spool_acked.labels(decision.lane).inc(writer.size)
        resp = self._response(ctx, decision)
        resp.headers["ETag"] = f'"{md5}"'
        if body is not None and body.verified_checksum is not None:
            name, value = body.verified_checksum
            resp.headers[name] = value
        return resp

    async def _commit_or_discard(self, writer: SpoolFileWriter, rec: Record) -> None:
        try:
            await self.spool.commit([rec])
        except JournalAppendFailed:
            # The record may have reached the journal: its data must stay for recovery (which removes the
            # file as an orphan if the record did not survive).
            raise
        except BaseException:
            await writer.discard()
            raise

    async def _copy_files(self, files: list[tuple[int, int, int]], writer: SpoolFileWriter) -> None:
        for fd, offset, count in files:
            while count > 0:
                chunk = await self.spool.run_read_io(os.pread, fd, min(READ_CHUNK_BYTES, count), offset)
                await writer.write(chunk)
                offset += len(chunk)
                count -= len(chunk)

    @staticmethod
    def _part_hasher(upload: Upload, writer: SpoolFileWriter) -> Checksum | None:
        """A copied part's checksum in its upload's algorithm (None without one), fed by ``writer``."""
        algo = upload.checksum_algorithm
        if algo is None:
            return None
        hasher = new_checksum(algo[0])
        writer.extra_hashers += (hasher,)
        return hasher

    async def _commit_part(
        self, upload: Upload, number: int, writer: SpoolFileWriter, md5: str, hasher: Checksum | None
    ) -> None:
        rec = self.spool.part_record(
            upload_id=upload.upload_id,
            number=number,
            file=writer.file_id,
            size=writer.size,
            md5=md5,
            checksum=hasher.digest_b64() if hasher is not None else "",
        )
        await self._commit_or_discard(writer, rec)

    async def _complete(
        self, request: web.Request, ctx: RequestContext, decision: Decision, upload: Upload
    ) -> web.StreamResponse:
        doc = await self._read_xml_body(request, ctx)
        parts = complete_multipart_parts(doc)
        headers = ctx.view.headers
        # The request's own x-amz-checksum-<algorithm> is the checksum of the object, not of this document.
        named = [
            (name[len(CHECKSUM_HEADER_PREFIX) :].upper(), value)
            for name, value in headers.items()
            if is_checksum_value_header(name)
        ]
        part_checksums = complete_multipart_checksums(doc)

        def record() -> Complete:
            return self.spool.complete_record(
                upload,
                parts,
                self._clock.wall(),
                part_checksums=part_checksums,
                object_checksum=named[0] if named else None,
            )

        if has_write_preconditions(headers):
            # If-Match / If-None-Match against the object a client sees at the key now (the spool's, else
            # the store's), checked and committed under the key's lock so that two conditional completions
            # cannot both pass.
            async with self._key_lock(upload.bucket, upload.key):
                check_write_preconditions(await self._current_etag(ctx, upload.bucket, upload.key), headers)
                if self.spool.upload(upload.upload_id) is None:
                    raise NoSuchUpload(UploadId=upload.upload_id)
                rec = record()
                await self.spool.commit([rec])
        else:
            rec = record()
            await self.spool.commit([rec])
        fields: list[tuple[str, str]] = []
        completed = self.spool.lookup(upload.bucket, upload.key)
        if completed is not None and completed.seq == rec.seq:
            for name, value in completed.checksum:
                field = (
                    "ChecksumType"
                    if name == "x-amz-checksum-type"
                    else "Checksum" + name[len(CHECKSUM_HEADER_PREFIX) :].upper()
                )
                fields.append((field, value))
        self._completed[upload.upload_id] = _Completed(
            upload.bucket, upload.key, rec.etag, rec.seq, upload.access_key, tuple(fields)
        )
        while len(self._completed) > COMPLETED_UPLOADS_KEPT:
            self._completed.popitem(last=False)
        return self._response(
            ctx, decision, body=self._complete_xml(request, upload.bucket, upload.key, rec.etag, fields)
        )

    def _list_parts(
        self, ctx: RequestContext, decision: Decision, upload: Upload, q: Mapping[str, str]
    ) -> web.StreamResponse:
        """ListParts of a spooled upload, answered as the store (SeaweedFS) answers it: MaxParts 10000 when
        not given, a max-parts that is not a positive integer echoed (0 if not a number) and not limiting,
        NextPartNumberMarker only on a truncated page."""
        try:
            marker = int(q.get("part-number-marker", "0") or 0)
        except ValueError:
            raise InvalidArgument("part-number-marker must be an integer.") from None
        page = list_parts_page(sorted(upload.parts), marker, q.get("max-parts"))
        fields = [
            ("Bucket", upload.bucket),
            ("Key", upload.key),
            ("UploadId", upload.upload_id),
            ("PartNumberMarker", str(marker)),
        ]
        if page.is_truncated:
            fields.append(("NextPartNumberMarker", str(page.parts[-1])))
        fields.append(("MaxParts", str(page.max_parts)))
        fields.append(("IsTruncated", "true" if page.is_truncated else "false"))
        inner = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in fields)
        for n in page.parts:
            part = upload.parts[n]
            inner += (
                f"<Part><PartNumber>{n}</PartNumber><LastModified>{iso8601(upload.created_at)}</LastModified>"
                f"<ETag>&quot;{part.md5}&quot;</ETag><Size>{part.size}</Size></Part>"
            )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<ListPartsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{inner}'
            "<StorageClass>STANDARD</StorageClass></ListPartsResult>"
        ).encode()
        return self._response(ctx, decision, body=body)
