"""The S3 operations the write spool answers itself, and the ordering guards around the ones it does not.

:meth:`SpoolFront.route` runs for every authenticated request before it is proxied (the router,
:mod:`s3lanes.http.router`, asks it first). It returns a response when the spool is involved, or ``None`` to
let the request pass through to the backend:

* PutObject, CreateMultipartUpload and the parts of a spooled upload (upload ids ``s3lanes-...``) in a
  spooled lane are written to local disk and acknowledged once durable (``s3lanes.runtime.spool``).
* GetObject/HeadObject of a spooled key are served from the spool (sendfile); a tombstone answers 404.
* ListObjects/ListObjectsV2/ListObjectVersions over a prefix with spooled keys merge them with the
  backend's listing; ListMultipartUploads adds the spool's open uploads and hides the drain's own.
* A repeated CompleteMultipartUpload of a spooled upload gets its first answer; conditional completions are
  evaluated against the spool's object, else the store's.
* CopyObject from a spooled source copies through the gateway (into the spool, or straight to the backend).
* DeleteObject/DeleteObjects of spooled keys write tombstones, so the delete wins over the pending upload.
* Any other write to a key with spooled data waits until that data is on the backend first (ordering), and
  answers 503 SlowDown if that takes too long.

This module routes, keeps the ordering guards and writes the tombstones of deletes; the operations live in
:mod:`s3lanes.http.spool_writes` (PutObject), :mod:`s3lanes.http.spool_uploads` (multipart),
:mod:`s3lanes.http.spool_copies` (copies), :mod:`s3lanes.http.spool_reads` and
:mod:`s3lanes.http.spool_listings`, on what :mod:`s3lanes.http.spool_common` gives them.
"""

from __future__ import annotations

import email.utils
import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from aiohttp import ClientResponse, web

from s3lanes.core.classify import Decision
from s3lanes.core.listing import NULL_VERSION, continues_our_listing
from s3lanes.core.objectread import (
    check_write_preconditions,
    has_write_preconditions,
    object_attributes_xml,
)
from s3lanes.core.s3docs import delete_objects_targets
from s3lanes.core.s3request import query_names
from s3lanes.core.spool_policy import (
    stored_object,
    tagging_xml,
    writes_key,
)
from s3lanes.errors import NoSuchKey, SlowDown
from s3lanes.http.intake import (
    RequestContext,
    echo_request_id,
    lane_headers,
    request_headers,
)
from s3lanes.http.s3xml import with_request_id
from s3lanes.http.spool_common import KEY_CLEAR_TIMEOUT_S, UPLOAD_ID_PREFIX, SpoolCommon
from s3lanes.http.spool_copies import SpoolCopies
from s3lanes.http.spool_listings import SpoolListings
from s3lanes.http.spool_reads import Moved, SpoolReads
from s3lanes.http.spool_uploads import SpoolUploads
from s3lanes.http.spool_writes import SpoolWrites

log = logging.getLogger("s3lanes.spool")

REROUTE_TRIES = 3  # see Moved


class SpoolFront:
    def __init__(
        self,
        c: SpoolCommon,
        *,
        drain_uploads: Callable[[], AbstractSet[str]] = frozenset,
        drain_creating: Callable[[str], AbstractSet[str]] = lambda bucket: frozenset(),
    ) -> None:
        self._c = c
        self.spool = c.spool
        # The backend upload ids the drain has open: hidden from clients' ListMultipartUploads.
        self._drain_uploads = drain_uploads
        # Per bucket, keys whose drain upload is being created (its id not known yet): hidden likewise.
        self._drain_creating = drain_creating
        self._cfg = c.cfg
        self._reads = SpoolReads(c)
        self._listings = SpoolListings(c, drain_uploads=drain_uploads, drain_creating=drain_creating)
        self._writes = SpoolWrites(self._c)
        self._copies = SpoolCopies(self._c, self._reads)
        self._uploads = SpoolUploads(self._c, self._copies)

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
                if state.has_bucket_prefix(bucket, q.get("prefix", "")) or continues_our_listing(q):
                    return await self._listings.list_objects(ctx, decision, bucket, q)
            elif op == "ListObjectVersions":
                if state.has_bucket_prefix(bucket, q.get("prefix", "")):
                    return await self._listings.list_objects(ctx, decision, bucket, q)
            elif op in ("DeleteObjects", "DeleteBucket") and state.unjournaled(bucket):
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
            return await self._uploads.spooled_upload_op(request, ctx, decision, op, upload_id, q)
        if state.unjournaled(bucket, key) and writes_key(op):
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
            if writes_key(op):  # not modelled by the spool, but ordered after the key's spooled data
                await self._c.wait_clear(bucket, key)
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
            return await self._writes.put(request, ctx, decision, bucket, key)
        if op == "CopyObject":
            return await self._copies.copy(request, ctx, decision, bucket, key)
        if op == "CreateMultipartUpload":
            return await self._uploads.create_upload(request, ctx, decision, bucket, key)
        if op == "DeleteObject":
            if state.has_key(bucket, key):
                return await self._tombstone(request, ctx, decision, bucket, key)
            return None
        if op == "GetObjectTagging" and (entry := state.lookup(bucket, key)) is not None:
            # Answered from the spool (the tags a spooled object will be stored with), not after its drain.
            if entry.kind == "del":
                raise NoSuchKey(Key=key)
            await self._c.authorize_read(ctx, bucket, entry.access_key)
            return self._c.response(
                ctx, decision, body=tagging_xml(dict(entry.meta).get("x-amz-tagging", ""))
            )
        if op == "GetObjectAttributes" and (entry := state.lookup(bucket, key)) is not None:
            if entry.kind == "del":
                raise NoSuchKey(Key=key)
            await self._c.authorize_read(ctx, bucket, entry.access_key)
            storage_class = dict(entry.meta).get("x-amz-storage-class", "STANDARD")
            xml = object_attributes_xml(stored_object(entry), ctx.view.headers, storage_class)
            resp = self._c.response(ctx, decision, body=xml)
            resp.headers["Last-Modified"] = email.utils.formatdate(int(entry.acked_at), usegmt=True)
            return resp
        if op in ("GetObjectTagging", "GetObjectAcl", "GetObjectAttributes") or op.startswith(
            ("Put", "Delete", "Complete", "Restore", "Select", "UploadPart")
        ):
            # Not modelled by the spool: order it after the key's spooled data.
            await self._c.wait_clear(bucket, key)
        return None

    def _journal_out_of_service(self) -> SlowDown:
        return SlowDown(
            "The gateway's spool journal is out of service and this key's last acknowledged write cannot be"
            " ordered against a new one yet; retry later.",
            retry_after_s=self._cfg.spool.retry_after_s,
        )

    def stop_accepting(self) -> None:
        """Shutdown: new writes go to the backend directly (after the key's spooled data, as always);
        uploads already in the spool carry on, and reads still see the spool."""
        self._c.closing = True

    def remember_buckets(self) -> None:
        """After recovery: buckets with spooled data were checked when it was acknowledged."""
        self._c.remember_buckets()

    async def _tombstone(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        key: str,
    ) -> web.StreamResponse:
        rec = self.spool.delete_record(bucket=bucket, key=key, origin=self._c.origin(ctx, decision))
        await self.spool.commit([rec])
        return self._c.response(ctx, decision, status=204)

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
        resp = await self._c.backend_call(ctx, decision.lane, "DELETE", bucket, None, ctx.view.raw_query)
        try:
            data = await resp.read()
        finally:
            resp.release()
        if resp.status == 409 and b"<Code>BucketNotEmpty</Code>" in data:
            await self._flush_bucket(bucket)
            return None
        return self._relayed(resp, data, ctx, decision)

    @staticmethod
    def _relayed(resp: ClientResponse, data: bytes, ctx: RequestContext, decision: Decision) -> web.Response:
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
        body = await self._c.read_xml_body(request, ctx)
        state = self.spool  # the spool answers for its state
        keys: list[str] = []
        for k, version_id in delete_objects_targets(body):
            if version_id is None or (version_id == NULL_VERSION and state.lookup(bucket, k) is not None):
                # A spooled key's one version is "null" (as ListObjectVersions shows it): deleting it
                # deletes the key, as on an unversioned bucket.
                if k not in keys:
                    keys.append(k)
            else:
                await self._c.wait_clear(bucket, k)  # another version: ordered after the key's spooled data
        origin = self._c.origin(ctx, decision)
        records = [
            state.delete_record(bucket=bucket, key=k, origin=origin) for k in keys if state.has_key(bucket, k)
        ]
        if records:
            await self.spool.commit(records)
        # The backend deletes what it has; the tombstones keep an upload in flight from bringing a key back.
        headers = request_headers(ctx, None)
        headers["content-length"] = str(len(body))
        resp = await self._c.backend_call(
            ctx, decision.lane, "POST", bucket, None, ctx.view.raw_query, headers, body
        )
        try:
            data = await resp.read()
        finally:
            resp.release()
        return self._relayed(resp, data, ctx, decision)
