"""The store's front: stream a request to its bucket's store, stream the answer back.

The router (:mod:`s3lanes.http.router`) hands over the requests no other front answers, authenticated
(:mod:`s3lanes.http.intake`). Here: run the body through :class:`~s3lanes.core.body.UploadBody` (decode
aws-chunked, verify digests, hold back the tail) -> queue in the request's lane -> re-sign and send to the
backend -> relay status, headers and body.

Bodies are never read whole except small ones (<= ``SMALL_BODY_BYTES``), which are verified completely before
the backend sees a byte: with nothing to hold back, that is the only way a bad small upload stores nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from s3lanes.clock import Clock
from s3lanes.config import BackendConfig, Config
from s3lanes.core.body import UploadBody
from s3lanes.core.classify import Decision
from s3lanes.core.routing import rename_copy_source, split_copy_source
from s3lanes.core.s3docs import MAX_XML_BODY_BYTES, complete_multipart_parts, delete_objects_keys
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD
from s3lanes.errors import IncompleteBody, MalformedXML, S3Error
from s3lanes.http.intake import (
    SMALL_BODY_BYTES,
    RequestContext,
    lane_headers,
    read_small_body,
    relayed_headers,
    request_headers,
    upload_body,
)
from s3lanes.http.peer import client_gone
from s3lanes.http.s3xml import MAX_REWRITTEN_ERROR_BYTES, with_request_id
from s3lanes.http.zerocopy import relay_spliced, splice_eligible
from s3lanes.metrics import Metrics
from s3lanes.runtime.backend import BackendResponse
from s3lanes.runtime.dispatcher import LaneDispatcher, StreamBudget
from s3lanes.runtime.pools import Pools, StoreCall

log = logging.getLogger("s3lanes.http")

# Operations whose backend time-to-first-byte feeds the read-latency guard.
_READ_OPERATIONS = frozenset({"GetObject"})
# A 2xx GET body up to this size is read whole and sent with its head in one write: about one socket read
# (aiohttp's 64 KiB), so there is nothing to overlap. A larger one is relayed as it comes: read whole, a
# 1 MiB body cut the benchmark's req/s by a third (store and client no longer overlapped).
WHOLE_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class StoreAnswer:
    """A store's answer on its way back to the client: the request it answers (with its context and lane),
    and the dispatcher of the store's bottleneck, which paces and counts what is relayed."""

    request: web.Request
    resp: BackendResponse
    ctx: RequestContext
    decision: Decision
    dispatcher: LaneDispatcher


# The answer of a store that names a renamed bucket, rewritten for the client (storage pools), or None: the
# answer is relayed as it streams.
RenamedRelay = Callable[[StoreAnswer], Awaitable[web.StreamResponse | None]]


class S3Proxy:
    """Proxies requests to the stores. One instance per application; holds no per-request state."""

    def __init__(
        self,
        cfg: Config,
        pools: Pools,
        clock: Clock,
        *,
        metrics: Metrics,
        renamed: RenamedRelay | None = None,
    ) -> None:
        self._cfg = cfg
        self.pools = pools
        self._clock = clock
        self._metrics = metrics
        self._request_cost = cfg.scheduler.request_cost_bytes
        self._chunk = cfg.scheduler.chunk_bytes
        self._renamed = renamed

    async def forward(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse:
        """Send the request to its bucket's store in its lane, and relay the answer."""
        lane = decision.lane
        arrived = self._clock.monotonic()
        upload = upload_body(request, ctx)
        headers = request_headers(ctx, upload)
        payload_hash = ctx.auth.payload_hash
        backend_hash = payload_hash if len(payload_hash) == 64 else UNSIGNED_PAYLOAD
        backend = self.pools.backend_for(ctx.target.bucket)
        dispatcher = self.pools.dispatcher_of(backend.name)
        if "x-amz-copy-source" in headers:
            src_route = self.pools.route(split_copy_source(headers["x-amz-copy-source"])[0])
            if src_route is not None and src_route.renamed:
                headers["x-amz-copy-source"] = rename_copy_source(
                    headers["x-amz-copy-source"], src_route.backend_bucket
                )

        body: bytes | AsyncIterator[bytes] | None = None
        pipe: _BodyStream | None = None
        if ctx.target.operation in ("DeleteObjects", "CompleteMultipartUpload"):
            # Checked here as S3 checks it: a store may delete the keys of a DeleteObjects document S3
            # refuses, or complete an upload from a CompleteMultipartUpload document S3 refuses.
            if upload is not None and (upload.expected_bytes or 0) > MAX_XML_BODY_BYTES:
                raise MalformedXML("The request body is too large.")
            body = await read_small_body(request, upload) if upload is not None else b""
            if ctx.target.operation == "DeleteObjects":
                delete_objects_keys(body)
            else:
                complete_multipart_parts(body)
            arrived = self._clock.monotonic()
        elif upload is not None:
            if upload.expected_bytes is not None and upload.expected_bytes <= SMALL_BODY_BYTES:
                body = await read_small_body(request, upload)
                if upload.checksum_in_trailer and upload.verified_checksum is not None:
                    # The trailing checksum, verified, goes to the store as a header (the store keeps it,
                    # as it keeps one sent in a trailer); a streamed body's trailer is verified only.
                    name, value = upload.verified_checksum
                    headers[name] = value
                arrived = self._clock.monotonic()
            else:
                budget = StreamBudget(dispatcher, lane, self._chunk, upload.expected_bytes)
                budget.narrow_receive_buffer(request.transport)  # paced: the body waits client-side
                pipe = _BodyStream(request, upload, budget)
                body = pipe.iterate()
        # Here requests queue in their lane, in the order the scheduler picks, for the request's own cost
        # and a whole body's bytes.
        sent = wait_s = 0.0

        def admitted() -> None:
            nonlocal sent, wait_s
            sent = self._clock.monotonic()
            wait_s = sent - arrived
            self._metrics.child(self._metrics.wait, lane).observe(wait_s)
            if isinstance(body, bytes) and body:
                self._metrics.child(self._metrics.bytes, lane, "up").inc(len(body))

        resp: BackendResponse
        try:
            call = StoreCall(
                lane,
                ctx.target.bucket,
                ctx.target.key,
                request.method,
                headers,
                ctx.credential,
                ctx.view.raw_query,
            )
            signed = not ctx.anonymous
            if body is None and request.method in ("GET", "HEAD"):
                resp = await self.pools.read(
                    call,
                    cost=self._request_cost,
                    gone=lambda: client_gone(request),
                    admitted=admitted,
                    signed=signed,
                )
            else:
                resp = await self.pools.request(
                    call,
                    body,
                    cost=self._request_cost,
                    gone=lambda: client_gone(request),
                    account_body=True,
                    admitted=admitted,
                    payload_hash=backend_hash,
                    signed=signed,
                )
        except S3Error as err:
            if pipe is not None and pipe.failure is not None:
                raise pipe.failure from None
            self._metrics.child(self._metrics.backend_errors, lane, err.code).inc()
            dispatcher.observe_backend(lane, err.status)
            raise
        except Exception:
            if pipe is not None and pipe.failure is not None:
                raise pipe.failure from None
            raise
        finally:
            if pipe is not None:
                pipe.close()
                if pipe.sent_bytes:
                    self._metrics.child(self._metrics.bytes, lane, "up").inc(pipe.sent_bytes)
        try:
            ttfb_s = self._clock.monotonic() - sent
            self._metrics.child(self._metrics.backend_latency, lane).observe(ttfb_s)
            if resp.status >= 500:
                self._metrics.child(self._metrics.backend_errors, lane, str(resp.status)).inc()
            if ctx.target.operation in _READ_OPERATIONS:
                dispatcher.observe_read(lane, wait_s, ttfb_s)
            if pipe is not None and pipe.failure is not None:
                raise pipe.failure
            answer = StoreAnswer(request, resp, ctx, decision, dispatcher)
            if self._renamed is not None:
                renamed = await self._renamed(answer)
                if renamed is not None:
                    return renamed
            return await self.relay_stream(answer, backend_cfg=backend.cfg)
        finally:
            resp.release()

    async def relay_stream(
        self, answer: StoreAnswer, *, backend_cfg: BackendConfig | None = None
    ) -> web.StreamResponse:
        """The backend's answer to the client as it streams, paced through the lane of its pool. A large
        plain-HTTP GET body is spliced from socket to socket (:mod:`s3lanes.http.zerocopy`)."""
        request, resp, ctx, decision = answer.request, answer.resp, answer.ctx, answer.decision
        lane = decision.lane
        length = resp.content_length
        # A small body of a 2xx GET is read whole and sent with its head in one write (a web.Response holds
        # its head back until its body; a StreamResponse sends it on prepare), if it is one lane piece at
        # most (a paced lane's smaller pieces are relayed one by one, below).
        whole = (
            length is not None
            and 0 < length <= WHOLE_ANSWER_BYTES
            and 200 <= resp.status < 300
            and resp.status != 204
            and request.method == "GET"
            and not 0 < self._cfg.server.zero_copy_min_bytes <= length  # else it may be spliced
            and length <= answer.dispatcher.scheduler.piece_bytes(lane, self._chunk)
        )
        out = (
            web.Response(status=resp.status, reason=resp.reason)
            if whole
            else web.StreamResponse(status=resp.status, reason=resp.reason)
        )
        out.headers.extend(relayed_headers(resp.headers, ctx.request_id))
        if resp.status == 503 and "Retry-After" not in resp.headers:
            # The store's SlowDown/ServiceUnavailable: say when to come back, as the gateway's own 503s do.
            out.headers["Retry-After"] = "1"
        if length is not None:  # set as a header: a web.Response would set it from its body otherwise
            out.headers["Content-Length"] = str(length)
        if request.body_exists and not request.content.is_eof():
            out.force_close()
        lane_headers(out, decision)
        if isinstance(out, web.Response):  # whole
            return await self._relay_whole(answer, out)
        if (
            resp.status >= 300
            and request.method != "HEAD"
            and resp.content_length is not None
            and 0 < resp.content_length <= MAX_REWRITTEN_ERROR_BYTES
        ):
            # A store's error document: its RequestId becomes the gateway's, as in the header.
            data = with_request_id(await resp.read(), ctx.request_id)
            out.content_length = len(data)
            await out.prepare(request)
            await out.write(data)
            await out.write_eof()
            return out
        spliced = splice_eligible(request, resp, self._cfg.server.zero_copy_min_bytes)
        await out.prepare(request)
        if request.method != "HEAD" and resp.status not in (204, 304):
            budget = StreamBudget(answer.dispatcher, lane, self._chunk, resp.content_length)
            moved = 0
            try:
                if spliced:
                    outcome = await relay_spliced(
                        request, resp, budget, self._chunk, backend_cfg or self._cfg.backend, ctx.target.key
                    )
                    if outcome is not None:
                        moved, completed = outcome
                        self._metrics.child(self._metrics.zero_copy_bytes, lane).inc(moved)
                        if not completed:
                            return out
                        await out.write_eof()
                        return out
                # One buffered piece at a time: iter_any() joins what is buffered (a copy of every byte).
                async for chunk, _ in resp.content.iter_chunks():
                    await budget.take(len(chunk))
                    moved += len(chunk)
                    await out.write(chunk)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
                if isinstance(exc, ConnectionError) and client_gone(request):
                    resp.close()  # our write failed because the client went away: not the backend's doing
                    raise
                # Headers are gone already; the only honest signal left is to cut the connection.
                log.warning("backend body failed mid-stream for %s: %r", ctx.target.key, exc)
                if request.transport is not None:
                    request.transport.abort()
                resp.close()
                return out
            finally:
                budget.close()
                if moved:
                    self._metrics.child(self._metrics.bytes, lane, "down").inc(moved)
        await out.write_eof()
        return out

    async def _relay_whole(self, answer: StoreAnswer, out: web.Response) -> web.StreamResponse:
        """A small body (one lane piece at most) read whole, charged to the lane in one take (the ticket of
        the chunk-by-chunk relay), then sent with its head in one write. A store that fails mid-body: the
        head and what it sent, then the connection cut, as the relay does; a client gone: raised, as the
        relay does."""
        request, resp, lane = answer.request, answer.resp, answer.decision.lane
        pieces: list[bytes] = []
        failure: Exception | None = None
        try:
            async for chunk, _ in resp.content.iter_chunks():
                pieces.append(chunk)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            failure = exc  # what the store sent goes out first, then the cut (below)
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        budget = StreamBudget(answer.dispatcher, lane, self._chunk, resp.content_length)
        try:
            await budget.take(len(data))
            out.body = data
            await out.prepare(request)
            await out.write_eof()
        except ConnectionError as exc:
            if client_gone(request):
                resp.close()  # our write failed because the client went away: not the backend's doing
                raise
            failure = exc
        finally:
            budget.close()
            if data:
                self._metrics.child(self._metrics.bytes, lane, "down").inc(len(data))
        if failure is not None:
            # The head is gone already; the only honest signal left is to cut the connection.
            log.warning("backend body failed mid-stream for %s: %r", answer.ctx.target.key, failure)
            if request.transport is not None:
                request.transport.abort()
            resp.close()
        return out


class _BodyStream:
    """Feeds the request body through the pipeline while aiohttp's client sends what comes out."""

    def __init__(self, request: web.Request, upload: UploadBody, budget: StreamBudget) -> None:
        self._request = request
        self._upload = upload
        self._budget = budget
        self.failure: S3Error | None = None
        self.sent_bytes = 0

    def close(self) -> None:
        self._budget.close()

    async def iterate(self) -> AsyncIterator[bytes]:
        try:
            content = self._request.content
            while True:
                try:
                    # One buffered piece at a time: readany() joins what is buffered (a copy of every byte).
                    chunk, end_of_http_chunk = await content.readchunk()
                except aiohttp.EofStream:  # pragma: no cover - readchunk returns b"" at EOF
                    break
                if not chunk:
                    if end_of_http_chunk:  # a Transfer-Encoding: chunked boundary, not the end
                        continue
                    break
                for piece in self._upload.feed(chunk):
                    await self._budget.take(len(piece))
                    self.sent_bytes += len(piece)
                    yield piece
            tail = self._upload.finish()
            if tail:
                await self._budget.take(len(tail))
                self.sent_bytes += len(tail)
                yield tail
        except S3Error as err:
            self.failure = err
            raise
        except (aiohttp.ClientPayloadError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
            self.failure = IncompleteBody("The client closed the connection before sending the whole body.")
            raise self.failure from exc
