"""What storage pools change in the S3 surface: one namespace over several stores (docs/pools.md).

With ``[[routes]]`` configured, :class:`~s3lanes.http.proxy.S3Proxy` sends each request to its bucket's
backend (:class:`~s3lanes.runtime.pools.Pools`); the router (:mod:`s3lanes.http.router`) and the proxy ask
this module for the few operations that span stores or name buckets:

- ListBuckets asks every backend with client-visible buckets and answers the merged list.
- Answers that name a renamed bucket (``<Name>``, ``<Bucket>``, ``<BucketName>``, ``Location``) are rewritten
  to the client's name; those answers are small XML documents, read whole.
- CopyObject between buckets on different backends is streamed through the gateway: read from the source's
  store in the request's lane of the source pool, written to the destination's store in the same lane of
  its pool, with the source's MD5 sent as Content-MD5 (single-part sources) or the stream's MD5 checked
  against the destination's ETag. UploadPartCopy across backends is refused with 501 NotImplemented.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from s3lanes.clock import Clock
from s3lanes.config import Config
from s3lanes.core.classify import Decision
from s3lanes.core.listing import iso8601
from s3lanes.core.objectread import CONTENT_HEADERS
from s3lanes.core.routing import DEFAULT_BACKEND, rename_in_xml, rename_location, split_copy_source
from s3lanes.core.s3request import query_names
from s3lanes.errors import (
    BadDigest,
    InvalidRequest,
    NotImplementedS3,
    PreconditionFailed,
    ServiceUnavailable,
)
from s3lanes.http.intake import RequestContext, finish_headers
from s3lanes.http.peer import client_gone
from s3lanes.http.proxy import StoreAnswer
from s3lanes.runtime.backend import BackendResponse
from s3lanes.runtime.dispatcher import LaneDispatcher, StreamBudget
from s3lanes.runtime.pools import Pools, StoreCall

log = logging.getLogger("s3lanes.pools")

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Operations whose answers carry the bucket's name (errors of any operation do too).
_NAMING_OPERATIONS = frozenset(
    {
        "ListObjects",
        "ListObjectsV2",
        "ListObjectVersions",
        "CreateMultipartUpload",
        "CompleteMultipartUpload",
        "ListParts",
        "ListMultipartUploads",
        "CreateBucket",
    }
)
MAX_RENAMED_BODY_BYTES = 16 * 1024 * 1024
MAX_COPY_BYTES = 5 * 1024**3  # S3's limit for CopyObject
# Headers of the source object that CopyObject carries over with x-amz-metadata-directive: COPY.
_COPIED_HEADERS = CONTENT_HEADERS
# Request headers that describe the source, not the new object: never forwarded to the destination.
_SOURCE_ONLY = ("x-amz-copy-source", "x-amz-metadata-directive", "x-amz-tagging-directive")


def names_bucket(operation: str, resp: BackendResponse) -> bool:
    """Whether the answer may carry the backend's bucket name (then it is rewritten for the client)."""
    if "Location" in resp.headers:
        return True
    return operation in _NAMING_OPERATIONS or resp.status >= 300


class PoolFront:
    def __init__(self, cfg: Config, pools: Pools, clock: Clock) -> None:
        self._pools = pools
        self._clock = clock
        self._request_cost = cfg.scheduler.request_cost_bytes
        self._chunk = cfg.scheduler.chunk_bytes

    # -- answers naming a renamed bucket ------------------------------------------------------------------

    async def relay_renamed(self, answer: StoreAnswer) -> web.StreamResponse | None:
        """The answer with the backend's bucket name rewritten to the client's, or None: it is relayed as it
        streams (the bucket is not renamed, the answer names no bucket, or it is too large to rewrite)."""
        request, resp, ctx, decision = answer.request, answer.resp, answer.ctx, answer.decision
        route = self._pools.route(ctx.target.bucket)
        if route is None or not route.renamed or not names_bucket(ctx.target.operation, resp):
            return None
        if resp.content_length is not None and resp.content_length > MAX_RENAMED_BODY_BYTES:
            return None
        body = b"" if request.method == "HEAD" else await resp.read()
        if len(body) > MAX_RENAMED_BODY_BYTES:
            raise ServiceUnavailable("The backend's answer is too large to rewrite; retry.")
        body = rename_in_xml(body, route.backend_bucket, route.bucket)
        out = web.Response(status=resp.status, reason=resp.reason, body=body or None)
        for name, value in resp.headers.items():
            lname = name.lower()
            if lname in ("content-length", "transfer-encoding", "connection", "keep-alive"):
                continue
            if lname == "location":
                value = rename_location(value, route.backend_bucket, route.bucket)
            out.headers.add(name, value)
        if request.method == "HEAD" and resp.content_length is not None:
            out.headers["Content-Length"] = str(resp.content_length)
        finish_headers(out, ctx, decision)
        if body:
            answer.dispatcher.observe_delivered(decision.lane, len(body))
        return out

    # -- ListBuckets across stores --------------------------------------------------------------------------

    async def list_buckets(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.Response:
        per_backend: dict[str, list[tuple[str, str]]] = {}
        owner: ET.Element | None = None
        for name in self._pools.table.backends_to_list():
            dispatcher = self._pools.dispatcher_of(name)
            resp = await self._pools.request(
                StoreCall(decision.lane, None, None, "GET", {}, ctx.credential),
                backend=name,
                cost=self._request_cost,
                gone=lambda: client_gone(request),
                observe=False,  # once the listing is read
            )
            async with resp:
                data = await resp.read()
            dispatcher.observe_backend(decision.lane, resp.status)
            if resp.status != 200:
                if name == DEFAULT_BACKEND:
                    return finish_headers(
                        web.Response(status=resp.status, body=data, content_type="application/xml"),
                        ctx,
                        decision,
                    )
                log.warning("ListBuckets: backend %s answered %d: %r", name, resp.status, data[:200])
                raise ServiceUnavailable(f"The backend {name!r} did not list its buckets; retry.")
            root = ET.fromstring(data)
            if owner is None or name == DEFAULT_BACKEND:
                owner = _find(root, "Owner")
            per_backend[name] = [
                (_text(b, "Name"), _text(b, "CreationDate")) for b in root.iter(f"{{{S3_NS}}}Bucket")
            ] + [(_text(b, "Name"), _text(b, "CreationDate")) for b in root.iter("Bucket")]
        buckets = self._pools.table.merge_bucket_lists(per_backend)
        doc = ET.Element("ListAllMyBucketsResult", xmlns=S3_NS)
        if owner is not None:
            out_owner = ET.SubElement(doc, "Owner")
            for child in owner:
                ET.SubElement(out_owner, child.tag.removeprefix(f"{{{S3_NS}}}")).text = child.text
        holder = ET.SubElement(doc, "Buckets")
        for name, created in buckets:
            b = ET.SubElement(holder, "Bucket")
            ET.SubElement(b, "Name").text = name
            ET.SubElement(b, "CreationDate").text = created
        body = b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(doc)
        return finish_headers(
            web.Response(status=200, body=body, content_type="application/xml"), ctx, decision
        )

    # -- copies between stores -------------------------------------------------------------------------------

    def crosses_backends(self, ctx: RequestContext) -> bool:
        src_bucket = split_copy_source(ctx.view.headers["x-amz-copy-source"])[0]
        dest = self._pools.route(ctx.target.bucket)
        src = self._pools.route(src_bucket)
        return dest is not None and src is not None and dest.backend != src.backend

    async def copy_across(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.Response:
        if ctx.target.operation != "CopyObject":
            raise NotImplementedS3(
                f"{ctx.target.operation} between buckets on different backends is not supported by this"
                " gateway; use CopyObject, or upload the part's data.",
            )
        h = ctx.view.headers
        lane = decision.lane
        src_value = h["x-amz-copy-source"]
        src_bucket, rest = split_copy_source(src_value)
        src_key_raw, _, src_query = rest.lstrip("/").partition("?")
        src_key = unquote(src_key_raw)
        version = query_names(src_query).get("versionId")
        read_headers = {
            name.removeprefix("x-amz-copy-source-"): value
            for name, value in h.items()
            if name.startswith("x-amz-copy-source-if-")
        }
        src_dispatcher = self._pools.dispatcher_for(src_bucket)
        src_query = f"versionId={version}" if version else ""
        src = await self._pools.request(
            StoreCall(lane, src_bucket, src_key, "GET", read_headers, ctx.credential, src_query),
            cost=self._request_cost,
            gone=lambda: client_gone(request),
        )
        try:
            if src.status in (304, 412):
                raise PreconditionFailed()
            if src.status != 200:
                data = await src.read()
                return finish_headers(
                    web.Response(status=src.status, body=data, content_type="application/xml"), ctx, decision
                )
            size = src.content_length
            if size is None:
                raise ServiceUnavailable("The source's store did not say the object's size; retry.")
            if size > MAX_COPY_BYTES:
                raise InvalidRequest(
                    "The specified copy source is larger than the maximum allowable size for a copy source:"
                    f" {MAX_COPY_BYTES}"
                )
            headers = self._dest_headers(h, src)
            headers["content-length"] = str(size)
            src_etag = src.headers.get("ETag", "").strip('"')
            single_part = len(src_etag) == 32 and "-" not in src_etag
            if single_part:
                headers["content-md5"] = base64.b64encode(bytes.fromhex(src_etag)).decode()
            dest_dispatcher = self._pools.dispatcher_for(ctx.target.bucket)
            md5 = hashlib.md5()
            body = self._paced(src, src_dispatcher, dest_dispatcher, lane, size, md5)
            put = await self._pools.request(
                StoreCall(lane, ctx.target.bucket, ctx.target.key, "PUT", headers, ctx.credential),
                body,
                cost=self._request_cost,
                gone=lambda: client_gone(request),
                observe=False,  # once the answer is read
            )
        finally:
            src.release()
        async with put:
            data = await put.read()
        dest_dispatcher.observe_backend(lane, put.status)
        if put.status != 200:
            return finish_headers(
                web.Response(status=put.status, body=data, content_type="application/xml"), ctx, decision
            )
        etag = put.headers.get("ETag", "").strip('"')
        if etag and "-" not in etag and etag != md5.hexdigest():
            raise BadDigest("The copied object's checksum on the destination does not match the source.")
        result = ET.Element("CopyObjectResult", xmlns=S3_NS)
        ET.SubElement(result, "LastModified").text = iso8601(self._clock.wall())
        ET.SubElement(result, "ETag").text = f'"{etag or md5.hexdigest()}"'
        out = web.Response(
            status=200,
            body=b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(result),
            content_type="application/xml",
        )
        if version:
            out.headers["x-amz-copy-source-version-id"] = version
        if "x-amz-version-id" in put.headers:
            out.headers["x-amz-version-id"] = put.headers["x-amz-version-id"]
        return finish_headers(out, ctx, decision)

    def _dest_headers(self, h: Mapping[str, str], src: aiohttp.ClientResponse) -> dict[str, str]:
        """The new object's headers: the source's content headers and metadata (directive COPY, the
        default) or the request's (REPLACE); the request's storage, encryption, ACL and tagging headers."""
        out: dict[str, str] = {}
        replace = h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
        if replace:
            for name, value in h.items():
                if name in _COPIED_HEADERS or name.startswith("x-amz-meta-"):
                    out[name] = value
        else:
            for name, value in src.headers.items():
                lname = name.lower()
                if lname in _COPIED_HEADERS or lname.startswith("x-amz-meta-"):
                    out[lname] = value
        for name, value in h.items():
            if name.startswith("x-amz-copy-source") or name in _SOURCE_ONLY:
                continue
            if name.startswith(
                ("x-amz-storage-class", "x-amz-server-side-encryption", "x-amz-grant-")
            ) or name in (
                "x-amz-acl",
                "x-amz-tagging",
            ):
                out[name] = value
        return out

    async def _paced(
        self,
        src: aiohttp.ClientResponse,
        src_dispatcher: LaneDispatcher,
        dest_dispatcher: LaneDispatcher,
        lane: str,
        size: int,
        md5: hashlib._Hash,
    ) -> AsyncIterator[bytes]:
        """The source's bytes, paced through the lane of both pools (read there, written here)."""
        chunk = self._chunk
        read_budget = StreamBudget(src_dispatcher, lane, chunk, size)
        write_budget = StreamBudget(dest_dispatcher, lane, chunk, size)
        try:
            async for data, _ in src.content.iter_chunks():
                await read_budget.take(len(data))
                await write_budget.take(len(data))
                md5.update(data)
                yield data
        finally:
            read_budget.close()
            write_budget.close()


def _find(root: ET.Element, tag: str) -> ET.Element | None:
    found = root.find(f"{{{S3_NS}}}{tag}")
    return found if found is not None else root.find(tag)


def _text(el: ET.Element, tag: str) -> str:
    found = _find(el, tag)
    return (found.text or "") if found is not None else ""
