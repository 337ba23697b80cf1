"""Multipart uploads held by the write spool (upload ids ``s3lanes-...``): CreateMultipartUpload, UploadPart,
CompleteMultipartUpload (a repeated one gets its first answer; a conditional one is checked against the object
a client sees at the key now), AbortMultipartUpload and ListParts. UploadPartCopy is
:mod:`s3lanes.http.spool_copies`'. Routed by :mod:`s3lanes.http.spool_front`.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

from aiohttp import web

from s3lanes.core.checksums import (
    CHECKSUM_HEADER_PREFIX,
    Checksum,
    header_for,
    is_checksum_value_header,
    new_checksum,
    upload_checksum,
)
from s3lanes.core.classify import Decision
from s3lanes.core.journal_records import Complete
from s3lanes.core.listing import iso8601, list_parts_page
from s3lanes.core.objectread import check_write_preconditions, has_write_preconditions
from s3lanes.core.s3docs import complete_multipart_checksums, complete_multipart_parts
from s3lanes.core.sniff import Written
from s3lanes.core.spool_policy import upload_meta, xml_document
from s3lanes.core.spool_state import MAX_PARTS, Upload
from s3lanes.core.uri import s3_quote
from s3lanes.errors import (
    InvalidArgument,
    InvalidRequest,
    NoSuchUpload,
)
from s3lanes.http.intake import RequestContext, upload_body
from s3lanes.http.spool_common import UPLOAD_ID_PREFIX, SpoolCommon
from s3lanes.http.spool_copies import SpoolCopies

# Spooled multipart uploads remembered after their completion, so that a repeated CompleteMultipartUpload
# (a client retrying after a lost answer) gets the same answer, as from the store.
COMPLETED_UPLOADS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class _Completed:
    """A spooled multipart upload's completion: what a repeated CompleteMultipartUpload answers."""

    upload_id: str
    bucket: str
    key: str
    etag: str  # quoted
    seq: int  # the spool entry it made
    access_key: str  # the identity that wrote it
    checksum_fields: tuple[tuple[str, str], ...] = ()  # ChecksumCRC32 etc. of the completed object


class SpoolUploads:
    def __init__(self, common: SpoolCommon, copies: SpoolCopies) -> None:
        self._c = common
        self.spool = common.spool
        self._clock = common.clock
        self._copies = copies
        self._completed: OrderedDict[str, _Completed] = OrderedDict()  # upload id -> its completion

    async def create_upload(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        if not self._c.spoolable(ctx, decision, bucket, key):
            return None
        async with self.spool.reserve(0) as room:  # no room for now, but the spool must take writes
            if not self._c.admitted(room):
                return None
        h = ctx.view.headers
        algo = upload_checksum(h.get("x-amz-checksum-algorithm"), h.get("x-amz-checksum-type"))
        await self._c.check_bucket(ctx, bucket)
        upload_id = UPLOAD_ID_PREFIX + secrets.token_hex(20)
        meta = self._c.with_content_type(upload_meta(h), Written.MULTIPART)
        if algo is not None:  # kept with the upload, and sent with the drain's CreateMultipartUpload
            meta = sorted([*meta, ("x-amz-checksum-algorithm", algo[0]), ("x-amz-checksum-type", algo[1])])
        rec = self.spool.create_upload_record(
            bucket=bucket, key=key, origin=self._c.origin(ctx, decision), upload_id=upload_id, meta=meta
        )
        await self.spool.commit([rec])
        body = xml_document(
            "InitiateMultipartUploadResult", [("Bucket", bucket), ("Key", key), ("UploadId", upload_id)]
        )
        resp = self._c.response(ctx, decision, body=body)
        if algo is not None:
            resp.headers["x-amz-checksum-algorithm"] = algo[0]
            resp.headers["x-amz-checksum-type"] = algo[1]
        return resp

    async def spooled_upload_op(
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
                return await self._completed_upload_op(request, ctx, decision, op, done)
            if op == "AbortMultipartUpload":
                # The store answers 204 to an abort of an upload id it issued but no longer knows (aborted
                # or completed before), so a repeated abort of a spooled upload answers the same.
                return self._c.response(ctx, decision, status=204)
        if upload is None or upload.bucket != ctx.target.bucket or upload.key != ctx.target.key:
            raise NoSuchUpload(UploadId=upload_id)
        await self._c.authorize_read(ctx, upload.bucket, upload.access_key)
        if op in ("UploadPart", "UploadPartCopy"):
            return await self._upload_part(request, ctx, decision, upload, q, copy=op == "UploadPartCopy")
        if op == "CompleteMultipartUpload":
            return await self._complete(request, ctx, decision, upload)
        if op == "AbortMultipartUpload":
            await self.spool.commit([self.spool.abort_record(upload_id)])
            return self._c.response(ctx, decision, status=204)
        if op == "ListParts":
            return self._list_parts(ctx, decision, upload, q)
        raise InvalidRequest(f"{op} is not supported on a multipart upload held by the gateway's spool.")

    async def _completed_upload_op(
        self,
        request: web.Request,
        ctx: RequestContext,
        decision: Decision,
        op: str,
        done: _Completed,
    ) -> web.StreamResponse:
        """A request naming a spooled upload that was completed, answered as the store answers it: a
        repeated CompleteMultipartUpload gets the same result while the object at the key is still the one
        it made (in the spool, or drained to the store), an AbortMultipartUpload 204 with nothing done; the
        rest NoSuchUpload."""
        await self._c.authorize_read(ctx, done.bucket, done.access_key)
        if op == "CompleteMultipartUpload":
            await self._c.read_xml_body(request, ctx)  # the store answers the first result whatever it names
        if op == "AbortMultipartUpload":
            return self._c.response(ctx, decision, status=204)
        if op == "CompleteMultipartUpload":
            entry = self.spool.lookup(done.bucket, done.key)
            if entry is not None:
                current = entry.seq == done.seq
            else:
                current = await self._c.store_etag(ctx, done.bucket, done.key) == done.etag
            if current:
                xml = self._complete_xml(request, done.bucket, done.key, done.etag, done.checksum_fields)
                return self._c.response(ctx, decision, body=xml)
        raise NoSuchUpload(UploadId=done.upload_id)

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
            return await self._copies.upload_part_copy(request, ctx, decision, upload, number)
        body = upload_body(request, ctx)
        declared = body.expected_bytes if body is not None else 0
        size = declared or 0
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
        async with self.spool.reserve(size, must=True) as room:
            self._c.part_room(room)
            writer = room.writer()
            grows = room if declared is None else None
            md5 = await self._c.write_body(request, body, writer, extra, room=grows)
            checksum = ""
            if algo is not None:
                verified = body.verified_checksum if body is not None else None
                checksum = verified[1] if verified is not None else extra.digest_b64() if extra else ""
            await self._c.commit_part(room, upload, number, writer, md5, checksum)
        resp = self._c.acked(ctx, decision, writer, md5, body)
        if algo is not None and checksum:
            resp.headers[header_for(algo[0])] = checksum
        return resp

    async def _complete(
        self, request: web.Request, ctx: RequestContext, decision: Decision, upload: Upload
    ) -> web.StreamResponse:
        doc = await self._c.read_xml_body(request, ctx)
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
            async with self._c.key_lock(upload.bucket, upload.key):
                check_write_preconditions(await self._c.current_etag(ctx, upload.bucket, upload.key), headers)
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
            upload.upload_id, upload.bucket, upload.key, rec.etag, rec.seq, upload.access_key, tuple(fields)
        )
        while len(self._completed) > COMPLETED_UPLOADS_KEPT:
            self._completed.popitem(last=False)
        return self._c.response(
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
        return self._c.response(ctx, decision, body=body)
