"""Copies whose source is in the write spool, or whose destination is: CopyObject from a spooled source
(into the spool, part for part for a multipart source, or straight to the backend), and UploadPartCopy into
a spooled multipart upload (from a spooled source, or read from the backend). Routed by
:mod:`s3lanes.http.spool_front` and :mod:`s3lanes.http.spool_uploads`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator

from aiohttp import web

from s3lanes.core.checksums import Checksum, new_checksum
from s3lanes.core.classify import Decision
from s3lanes.core.listing import iso8601
from s3lanes.core.objectread import (
    copy_range_span,
    parse_copy_range,
    plan_read,
)
from s3lanes.core.sniff import Written
from s3lanes.core.spool_policy import (
    copy_conditions,
    not_checksum_meta,
    parse_copy_source,
    stored_object,
    upload_meta,
    xml_document,
)
from s3lanes.core.spool_state import Entry, Upload
from s3lanes.errors import (
    InvalidRange,
    InvalidRequest,
    NoSuchKey,
    PreconditionFailed,
    ServiceUnavailable,
)
from s3lanes.http.intake import RequestContext
from s3lanes.http.spool_common import UPLOAD_ID_PREFIX, SpoolCommon
from s3lanes.http.spool_reads import READ_CHUNK_BYTES, Moved, SpoolReads, close_span
from s3lanes.runtime.dispatcher import StreamBudget
from s3lanes.runtime.spool import Reservation, SpoolFileWriter


class SpoolCopies:
    def __init__(self, common: SpoolCommon, reads: SpoolReads) -> None:
        self._c = common
        self.spool = common.spool
        self._pools = common.pools
        self._clock = common.clock
        self._chunk = common.chunk
        self._reads = reads

    async def copy(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        h = ctx.view.headers
        src_bucket, src_key = parse_copy_source(h.get("x-amz-copy-source", ""))
        src = self.spool.lookup(src_bucket, src_key)
        if src is None:
            # The source is on the backend: a server-side copy there, ordered after the destination's data.
            await self._c.wait_clear(bucket, key)
            return None
        if src.kind == "del":
            raise NoSuchKey(Key=src_key)
        await self._c.authorize_read(ctx, src_bucket, src.access_key)
        conditions = copy_conditions(h)
        # A copy-source condition that a GET would answer 304 (If-None-Match, If-Modified-Since) fails the
        # copy with 412, as S3 documents.
        if (
            conditions
            and plan_read(stored_object(src), "HEAD", conditions, {}, self._clock.wall()).status == 304
        ):
            raise PreconditionFailed()
        if h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE":
            meta = self._c.with_content_type(upload_meta(h), Written.COPY)
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
        files = await self._open_spans(src, 0, src.size)
        try:
            if self._c.spoolable(ctx, decision, bucket, key):
                async with self.spool.reserve(src.size) as room:
                    if self._c.admitted(room):
                        await self._c.check_bucket(ctx, bucket)
                        if src.multipart:
                            # Part for part, as the store copies a multipart object: the copy keeps the
                            # source's multipart ETag (and the drain uploads it as the same parts).
                            etag = await self._copy_parts(room, ctx, decision, bucket, key, meta, src, files)
                        else:
                            writer = room.writer()
                            md5 = await self._copy_into(writer, files)
                            rec = self._c.put_record(ctx, decision, bucket, key, writer, md5, meta)
                            await room.commit(writer, rec)
                            etag = f'"{md5}"'
                        return self._c.response(ctx, decision, body=self._copy_result(etag))
            await self._c.wait_clear(bucket, key)
            etag = await self._put_through(ctx, decision, bucket, key, meta, files, src.size)
        finally:
            for fd, _, _ in files:
                os.close(fd)
        return self._c.response(ctx, decision, body=self._copy_result(etag))

    def _copy_result(self, etag: str) -> bytes:
        return xml_document(
            "CopyObjectResult", [("LastModified", iso8601(self._clock.wall())), ("ETag", etag)]
        )

    async def _copy_parts(
        self,
        room: Reservation,
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
        origin = self._c.origin(ctx, decision)
        create = self.spool.create_upload_record(
            bucket=bucket, key=key, origin=origin, upload_id=upload_id, meta=meta
        )
        await self.spool.commit([create])
        try:
            upload = state.upload(upload_id)
            assert upload is not None  # just committed
            spans = iter(files)  # one span per non-empty part, in order
            requested: list[tuple[int, str]] = []
            for number, size in enumerate(src.part_sizes, start=1):
                writer = self.spool.writer(size)
                md5 = await self._copy_into(writer, [next(spans)] if size else [])
                await self._c.commit_part(room, upload, number, writer, md5, None)
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
        resp = await self._c.backend_call(ctx, lane, "PUT", bucket, key, "", headers, body() if size else b"")
        try:
            data = await resp.read()
            if resp.status != 200:
                raise ServiceUnavailable(
                    f"The backend refused the copied object ({resp.status}): {data[:200]!r}"
                )
            return resp.headers.get("ETag", "")
        finally:
            resp.release()

    async def upload_part_copy(
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
            await self._c.authorize_read(ctx, src_bucket, src.access_key)
            conditions = {k: v for k, v in read_headers.items() if k != "range"}
            if plan_read(stored_object(src), "HEAD", conditions, {}, self._clock.wall()).status == 304:
                raise PreconditionFailed()
            start, size = copy_range_span(copy_range, src.size) if copy_range is not None else (0, src.size)
            async with self.spool.reserve(size, must=True) as room:
                self._c.part_room(room)
                files = await self._open_spans(src, start, size)
                writer = room.writer()
                hasher = self._part_hasher(upload, writer)
                try:
                    md5 = await self._copy_into(writer, files)
                finally:
                    for fd, _, _ in files:
                        os.close(fd)
                await self._c.commit_part(room, upload, number, writer, md5, hasher)
        else:
            md5, writer = await self._part_from_backend(
                ctx, decision, upload, number, src_bucket, src_key, read_headers, copy_range
            )
        body = xml_document(
            "CopyPartResult", [("LastModified", iso8601(self._clock.wall())), ("ETag", f'"{md5}"')]
        )
        return self._c.response(ctx, decision, body=body)

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
        resp = await self._c.backend_call(ctx, decision.lane, "GET", src_bucket, src_key, "", read_headers)
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
            async with self.spool.reserve(size, must=True) as room:
                self._c.part_room(room)
                writer = room.writer()
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
                await self._c.commit_part(room, upload, number, writer, md5, hasher)
            return md5, writer
        finally:
            resp.release()

    async def _open_spans(self, src: Entry, start: int, size: int) -> list[tuple[int, int, int]]:
        """The spool files holding ``size`` bytes of ``src`` from ``start``, opened (closed by the caller)."""
        if not size:
            return []
        try:
            return await self.spool.run_read_io_owned(
                self._reads.open_span, src, start, size, release=close_span
            )
        except FileNotFoundError:
            raise Moved() from None

    async def _copy_into(self, writer: SpoolFileWriter, files: list[tuple[int, int, int]]) -> str:
        """Open ``writer``, copy the bytes of ``files`` into it, finish it; its MD5. Discards on error."""
        await writer.open()
        try:
            await self._copy_files(files, writer)
            return await writer.finish()
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
