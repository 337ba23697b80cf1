"""Listings over what the write spool holds: ListObjects (V1, V2) and ListObjectVersions of a prefix with
spooled keys, merged with the store's listing (:mod:`s3lanes.core.listing`), and ListMultipartUploads with the
spool's open uploads added and the drain's own hidden. The spool front (:mod:`s3lanes.http.spool_front`)
routes these requests here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from xml.sax.saxutils import escape

from aiohttp import web

from s3lanes.core.classify import Decision
from s3lanes.core.listing import (
    AnyListRequest,
    BackendCursor,
    ListEntry,
    NotOurToken,
    SpooledObject,
    VersionEntry,
    add_listed_uploads,
    backend_query,
    drop_listed_uploads,
    expand_prefixes,
    iso8601,
    merged_listing_xml,
    parse_backend_page,
    parse_list_request,
    parse_owner,
    parse_versions_request,
    shows_owner,
)
from s3lanes.core.uri import s3_quote
from s3lanes.errors import S3Error, ServiceUnavailable, SlowDown
from s3lanes.http.intake import RequestContext, lane_headers
from s3lanes.http.s3xml import with_request_id
from s3lanes.http.spool_common import SpoolCommon
from s3lanes.runtime.bucket_check import BUCKET_CHECK_TTL_S
from s3lanes.runtime.pools import StoreCall


class SpoolListings:
    def __init__(
        self,
        c: SpoolCommon,
        *,
        drain_uploads: Callable[[], AbstractSet[str]],
        drain_creating: Callable[[str], AbstractSet[str]],
    ) -> None:
        self._c = c
        self.spool = c.spool
        # The backend upload ids the drain has open: hidden from clients' ListMultipartUploads.
        self._drain_uploads = drain_uploads
        # Per bucket, keys whose drain upload is being created (its id not known yet): hidden likewise.
        self._drain_creating = drain_creating
        # (backend, backend access key) -> (Owner ID, DisplayName)
        self._owners: dict[tuple[str, str], tuple[str, str]] = {}
        self._owner_unknown_until: dict[tuple[str, str], float] = {}  # monotonic time of the next try

    async def list_objects(
        self, ctx: RequestContext, decision: Decision, bucket: str, q: Mapping[str, str]
    ) -> web.StreamResponse | None:
        """ListObjects (V1, V2) or ListObjectVersions over a prefix with spooled keys: the backend's whole
        listing of the prefix merged with the spool (s3lanes/core/listing.py). None: a continuation token
        the gateway did not issue, which the backend answers."""
        try:
            req: AnyListRequest = (
                parse_versions_request(q)
                if ctx.target.operation == "ListObjectVersions"
                else parse_list_request(q)
            )
        except NotOurToken:
            return None
        # The spool first, then the backend: an entry that drains meanwhile is then in the spool's snapshot,
        # on the backend, or both (the spool's wins), never in neither (the other order lost such keys).
        snapshot = list(self.spool.live_under(bucket, req.prefix))
        listed = await self._backend_all(ctx, decision, bucket, req, req.prefix, req.delimiter)
        if isinstance(listed, web.Response):
            return listed
        items, prefixes = listed
        spooled: list[SpooledObject] = []
        hidden: set[str] = set()
        for entry in snapshot:
            if entry.kind == "del":
                hidden.add(entry.key)
                continue
            owner = await self._owner(ctx, bucket, entry.access_key) if shows_owner(req) else None
            spooled.append(SpooledObject(entry.key, entry.size, entry.etag, entry.acked_at, owner))
        # A backend common prefix whose keys may all be deleted in the spool: list it out key by key.
        for prefix in expand_prefixes(req, prefixes, hidden):
            expanded = await self._backend_all(ctx, decision, bucket, req, prefix, "")
            if isinstance(expanded, web.Response):
                return expanded
            prefixes.remove(prefix)
            items.extend(expanded[0])
        body = merged_listing_xml(req, bucket, items, prefixes, spooled, hidden)
        return self._c.response(ctx, decision, body=body)

    async def _backend_all(
        self,
        ctx: RequestContext,
        decision: Decision,
        bucket: str,
        req: AnyListRequest,
        prefix: str,
        delimiter: str,
    ) -> tuple[list[ListEntry | VersionEntry], list[str]] | web.Response:
        """The backend's whole listing (or version listing, as ``req`` is) of a prefix, paged with its own
        cursors (its order and StartAfter are not trusted: all of it)."""
        items: list[ListEntry | VersionEntry] = []
        prefixes: list[str] = []
        cursor: BackendCursor | None = None
        limit = self._c.cfg.spool.list_merge_max_keys
        while True:
            params = backend_query(req, prefix, delimiter, cursor)
            raw_query = "&".join(f"{k}={s3_quote(v, safe='')}" for k, v in params)
            resp = await self._c.backend_call(ctx, decision.lane, "GET", bucket, None, raw_query)
            try:
                data = await resp.read()
                status = resp.status
            finally:
                resp.release()
            if status != 200:
                out = web.Response(
                    status=status, body=with_request_id(data, ctx.request_id), content_type="application/xml"
                )
                out.headers["x-amz-request-id"] = ctx.request_id
                return out
            try:
                page, page_prefixes, cursor = parse_backend_page(req, data, cursor)
            except ValueError as exc:
                raise ServiceUnavailable(f"The backend's listing could not be parsed: {exc}") from exc
            items.extend(page)
            prefixes.extend(page_prefixes)
            if len(items) + len(prefixes) > limit:
                raise SlowDown(
                    f"The listing has more than {limit} keys or versions under this prefix and cannot be"
                    " merged with spooled writes; retry after they are uploaded.",
                    retry_after_s=self._c.cfg.spool.retry_after_s,
                )
            if cursor is None:
                return items, prefixes

    async def _owner(
        self, ctx: RequestContext, bucket: str, writer_access_key: str
    ) -> tuple[str, str] | None:
        """The backend's Owner (ID, DisplayName) of the identity that wrote a spooled object, as the store
        will list it once drained (ListBuckets' Owner as that identity; cached). None if unknown."""
        cred = self._c.creds.get(writer_access_key, ctx.credential)
        backend = self._c.pools.backend_for(bucket)
        ident = (backend.name, cred.backend_access_key)
        cached = self._owners.get(ident)
        if cached is not None:
            return cached
        if self._owner_unknown_until.get(ident, 0.0) > self._c.clock.monotonic():
            return None  # asked recently, in vain (an identity without ListBuckets): not on every listing
        owner: tuple[str, str] | None = None
        try:
            resp = await self._c.pools.request(
                StoreCall("metadata", None, None, "GET", {}, cred),
                backend=backend.name,
                cost=None,
                observe=False,
            )
            try:
                data = await resp.read()
                if resp.status == 200:
                    owner = parse_owner(data)
            finally:
                resp.release()
        except S3Error:
            pass
        if owner is None:
            self._owner_unknown_until[ident] = self._c.clock.monotonic() + BUCKET_CHECK_TTL_S
        else:
            self._owners[ident] = owner
        return owner

    async def list_uploads(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, q: Mapping[str, str]
    ) -> web.StreamResponse:
        """The backend's ListMultipartUploads without the drain's own uploads, with the spool's open uploads
        added (prefix honoured).

        Spooled uploads are appended to the first page the backend returns (they are few and short-lived);
        key-marker/upload-id-marker paging applies to the backend's uploads only.
        """
        # The drain's uploads known before the listing and after it: one may end (and its id be forgotten)
        # or be created (and its id learnt) while the store lists it.
        hidden, creating = set(self._drain_uploads()), set(self._drain_creating(bucket))
        resp = await self._c.backend_call(ctx, decision.lane, "GET", bucket, None, ctx.view.raw_query)
        try:
            data = await resp.read()
            status = resp.status
        finally:
            resp.release()
        if status == 200:
            hidden |= self._drain_uploads()
            creating |= self._drain_creating(bucket)
            data = drop_listed_uploads(data, hidden, creating)
        if status != 200 or q.get("key-marker") or q.get("upload-id-marker"):
            out = web.Response(
                status=status, body=with_request_id(data, ctx.request_id), content_type="application/xml"
            )
            out.headers["x-amz-request-id"] = ctx.request_id
            lane_headers(out, decision)
            return out
        prefix = q.get("prefix", "")
        encode = q.get("encoding-type") == "url"
        extra: list[tuple[str, bytes]] = []
        for upload in sorted(self.spool.uploads(), key=lambda u: (u.key, u.created_at)):
            if upload.bucket != bucket or not upload.key.startswith(prefix):
                continue
            key = s3_quote(upload.key, safe="/") if encode else escape(upload.key)
            element = (
                f"<Upload><Key>{key}</Key><UploadId>{upload.upload_id}</UploadId>"
                f"<Initiated>{iso8601(upload.created_at)}</Initiated></Upload>"
            )
            extra.append((upload.key, element.encode()))
        try:
            body = add_listed_uploads(data, extra)
        except ValueError as exc:
            raise ServiceUnavailable(
                "The backend's ListMultipartUploads answer could not be parsed."
            ) from exc
        return self._c.response(ctx, decision, body=body)
