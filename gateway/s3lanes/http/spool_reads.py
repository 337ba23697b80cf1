"""GET/HEAD of objects the write spool holds, answered from its files: the read's plan
(:func:`~s3lanes.core.objectread.plan_read`: ranges, conditionals, headers), then the bytes with sendfile on
plain HTTP, or read and written chunk by chunk. The spool front (:mod:`s3lanes.http.spool_front`) routes the
reads of spooled keys here, and opens spooled sources for its copies with :meth:`SpoolReads.open_span`.
"""

from __future__ import annotations

import os

from aiohttp import web

from s3lanes.core.classify import Decision
from s3lanes.core.objectread import plan_read
from s3lanes.core.s3request import query_names
from s3lanes.core.spool_policy import stored_object
from s3lanes.core.spool_state import Entry
from s3lanes.http.intake import SOURCE_HEADER, RequestContext, lane_headers
from s3lanes.http.spool_common import SpoolCommon
from s3lanes.runtime.splice import DestinationGone, SourceEnded, plain_socket, send_file

READ_CHUNK_BYTES = 1024 * 1024


class Moved(Exception):
    """The spooled entry a read or copy was routed to left the spool (drained and freed, or superseded and
    freed) between the lookup and the opening of its files. Nothing has been read or written yet: the
    request is routed again, to the key's newer entry, its tombstone or the backend, which has it now."""


def close_span(files: list[tuple[int, int, int]]) -> None:
    for fd, _, _ in files:
        os.close(fd)


class SpoolReads:
    def __init__(self, common: SpoolCommon) -> None:
        self._c = common
        self.spool = common.spool

    async def serve(
        self, request: web.Request, ctx: RequestContext, decision: Decision, entry: Entry
    ) -> web.StreamResponse | None:
        # The reader may see the writer's object (same backend identity), else the bucket is checked for it.
        await self._c.authorize_read(ctx, entry.bucket, entry.access_key)
        query = query_names(ctx.view.raw_query)
        plan = plan_read(stored_object(entry), request.method, ctx.view.headers, query, self._c.clock.wall())
        files: list[tuple[int, int, int]] = []  # (fd, offset in file, count)
        if request.method == "GET" and plan.length:
            try:
                files = await self.spool.run_read_io_owned(
                    self.open_span, entry, plan.start, plan.length, release=close_span
                )
            except FileNotFoundError:
                raise Moved() from None
        try:
            resp = web.StreamResponse(status=plan.status)
            for name, value in plan.headers:
                if name.lower() == "content-length":
                    continue
                resp.headers[name] = value
            resp.content_length = plan.length if plan.status != 304 else None
            resp.headers["x-amz-request-id"] = ctx.request_id
            resp.headers[SOURCE_HEADER] = "spool"
            lane_headers(resp, decision)
            await resp.prepare(request)
            for fd, offset, count in files:
                await self._send_file(request, resp, fd, offset, count, decision.lane)
            await resp.write_eof()
            return resp
        finally:
            for fd, _, _ in files:
                os.close(fd)

    def open_span(self, entry: Entry, start: int, length: int) -> list[tuple[int, int, int]]:
        sizes = entry.part_sizes or (entry.size,)
        out: list[tuple[int, int, int]] = []
        pos = 0
        end = start + length
        try:
            for file_id, size in zip(entry.files, sizes, strict=True):
                lo, hi = max(start, pos), min(end, pos + size)
                if lo < hi:
                    out.append((os.open(self.spool.file_path(file_id), os.O_RDONLY), lo - pos, hi - lo))
                pos += size
        except BaseException:
            for fd, _, _ in out:
                os.close(fd)
            raise
        return out

    async def _send_file(
        self, request: web.Request, resp: web.StreamResponse, fd: int, offset: int, count: int, lane: str
    ) -> None:
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("Connection lost")
        sock = plain_socket(transport) if self._c.cfg.server.zero_copy_min_bytes > 0 else None
        # Zero-copy over plain TCP once everything written before (the headers) has left the transport.
        if sock is not None and transport.get_write_buffer_size() == 0:
            try:
                await send_file(sock.fileno(), fd, offset, count, self.spool.run_read_io)
            except DestinationGone as exc:
                transport.abort()
                raise ConnectionResetError(str(exc)) from None
            except SourceEnded:
                transport.abort()
                raise ConnectionResetError("spool file ended early") from None
            self._c.metrics.zero_copy_bytes.labels(lane).inc(count)
            return
        while count > 0:
            chunk = await self.spool.run_read_io(os.pread, fd, min(READ_CHUNK_BYTES, count), offset)
            if not chunk:
                raise ConnectionResetError("spool file ended early")
            await resp.write(chunk)
            offset += len(chunk)
            count -= len(chunk)
