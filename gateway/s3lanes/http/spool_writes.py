"""PutObject into the write spool: the body streamed into a spool file and acknowledged once durable,
conditional writes checked against the object a client sees at the key now. Routed by
:mod:`s3lanes.http.spool_front`; a write the spool does not take is proxied (after the key's spooled data).
"""

from __future__ import annotations

from aiohttp import web

from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import (
    ALGORITHMS,
    Checksum,
    header_for,
    new_checksum,
)
from s3lanes.core.classify import Decision
from s3lanes.core.journal_records import Put
from s3lanes.core.objectread import check_write_preconditions, has_write_preconditions
from s3lanes.core.sniff import Written
from s3lanes.core.spool_policy import upload_meta
from s3lanes.http.intake import RequestContext, upload_body
from s3lanes.http.spool_common import SpoolCommon


class SpoolWrites:
    def __init__(self, common: SpoolCommon) -> None:
        self._c = common
        self.spool = common.spool

    async def put(
        self, request: web.Request, ctx: RequestContext, decision: Decision, bucket: str, key: str
    ) -> web.StreamResponse | None:
        if not self._c.spoolable(ctx, decision, bucket, key):
            await self._c.wait_clear(bucket, key)
            return None
        upload = upload_body(request, ctx)
        declared = upload.expected_bytes if upload is not None else 0
        size = declared or 0
        async with self.spool.reserve(size) as room:
            if not self._c.admitted(room):
                await self._c.wait_clear(bucket, key)
                return None
            await self._c.check_bucket(ctx, bucket)
            writer = room.writer()
            head = bytearray()
            computed = self._unpromised_checksum(ctx, upload)
            grows = room if declared is None else None
            md5 = await self._c.write_body(request, upload, writer, computed, room=grows, head=head)
            meta = self._c.with_content_type(upload_meta(ctx.view.headers), Written.PUT, bytes(head))
            checksum = upload.verified_checksum if upload is not None else None
            if computed is not None:
                checksum = (header_for(computed.algorithm), computed.digest_b64())
            if checksum is not None:
                meta = sorted([*meta, checksum])  # kept, and sent with the drain's PUT

            def record() -> Put:
                return self._c.put_record(ctx, decision, bucket, key, writer, md5, meta)

            if has_write_preconditions(ctx.view.headers):
                # If-Match / If-None-Match against the object a client sees at the key now (the spool's
                # newest write, else the store's), checked and committed under the key's lock, as for a
                # conditional CompleteMultipartUpload: answered at once, without waiting for the drain.
                async with self._c.key_lock(bucket, key):
                    try:
                        current = await self._c.current_etag(ctx, bucket, key)
                        check_write_preconditions(current, ctx.view.headers)
                    except BaseException:
                        await writer.discard()
                        raise
                    await room.commit(writer, record())
            else:
                await room.commit(writer, record())
        resp = self._c.acked(ctx, decision, writer, md5, upload)
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
