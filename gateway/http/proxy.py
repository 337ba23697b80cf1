"""The S3 surface: authenticate every request, stream it to the backend, stream the answer back.

Per request: parse the target (bucket, key, operation) -> verify SigV4 (header or presigned) -> answer
``Expect: 100-continue`` ourselves once the signature is good (never the backend's job: SeaweedFS gets the
empty-body case wrong) -> run the body through :class:`~gateway.core.body.UploadBody` (decode aws-chunked,
verify digests, hold back the tail) -> re-sign and send to the backend -> relay status, headers and body.

Bodies are never read whole except small ones (<= ``SMALL_BODY_BYTES``), which are verified completely before
the backend sees a byte: with nothing to hold back, that is the only way a bad small upload stores nothing.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11

from gateway.clock import Clock
from gateway.config import BackendConfig, Config, Credential
from gateway.core.access import TenantPolicy
from gateway.core.body import UploadBody
from gateway.core.checksums import BodyVerifier, is_checksum_value_header, without_aws_chunked
from gateway.core.chunked import AwsChunkedDecoder
from gateway.core.classify import (
    LANE_HINT_HEADER,
    LANE_REASON_RESPONSE_HEADER,
    LANE_RESPONSE_HEADER,
    Classifier,
    Decision,
    RequestFacts,
)
from gateway.core.limits import check_limits
from gateway.core.routing import rename_copy_source, split_copy_source
from gateway.core.s3docs import MAX_XML_BODY_BYTES, complete_multipart_parts, delete_objects_keys
from gateway.core.s3request import S3Target, parse_target, query_names, split_target
from gateway.core.sigv4 import (
    EMPTY_SHA256,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    AuthInfo,
    ChunkSignatureChain,
    RequestView,
    Verified,
    parse_auth,
    verify,
)
from gateway.errors import (
    AccessDenied,
    IncompleteBody,
    InternalError,
    InvalidAccessKeyId,
    InvalidArgument,
    MalformedXML,
    MissingContentLength,
    RequestHeaderSectionTooLarge,
    S3Error,
    SlowDown,
    XAmzContentSHA256Mismatch,
)
from gateway.http.forward import FORWARDED_HEADER, forwarded_request_id, write_hold
from gateway.http.peer import client_gone
from gateway.http.pool_front import PoolFront, names_bucket
from gateway.http.s3xml import MAX_REWRITTEN_ERROR_BYTES, error_xml, with_request_id
from gateway.http.zerocopy import relay_spliced, splice_eligible
from gateway.logsetup import REQUEST_ID
from gateway.metrics import Metrics
from gateway.runtime.dispatcher import LaneDispatcher, StreamBudget
from gateway.runtime.pools import Pools

if TYPE_CHECKING:
    from gateway.http.forward import Forwarder
    from gateway.http.spool_front import SpoolFront
    from gateway.runtime.spool_summary import SummaryWriter

log = logging.getLogger("s3lanes.http")

# Bodies up to this size are read and verified whole before anything is sent to the backend.
SMALL_BODY_BYTES = 256 * 1024
# A body sent with Transfer-Encoding: chunked and no Content-Length is accepted for these (as stores do),
# streamed to the backend with chunked transfer coding, or into the spool; other operations answer 411.
UNKNOWN_LENGTH_OPERATIONS = frozenset({"PutObject", "UploadPart"})
# Socket reads are handed on as they come; aiohttp's StreamReader bounds what it buffers (backpressure).
STREAMING_MODES = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER})

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Request headers the gateway re-creates or consumes itself.
_DROP_REQUEST = _HOP_BY_HOP | {
    "host",
    "authorization",
    "expect",
    "x-amz-date",
    "x-amz-content-sha256",
    "x-amz-decoded-content-length",
    "x-amz-trailer",
    "x-amz-security-token",
    "content-length",
    LANE_HINT_HEADER,
    FORWARDED_HEADER,
}
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length"}
BACKEND_REQUEST_ID_HEADER = "x-s3lanes-backend-request-id"


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    target: S3Target
    view: RequestView
    auth: AuthInfo
    verified: Verified
    credential: Credential
    # An unsigned request let through to the store unsigned ([server] anonymous_reads): the store decides.
    anonymous: bool = False


# Anonymous requests passed on to the store (unsigned) with [server] anonymous_reads: reads of objects and
# of object listings, and HEAD bucket; GET/HEAD only.
ANONYMOUS_READS = frozenset({"GetObject", "HeadObject", "ListObjects", "ListObjectsV2", "HeadBucket"})
# How long an anonymous read waits for spooled data under its key or prefix to reach the store.
ANONYMOUS_SETTLE_TIMEOUT_S = 30.0
_NOBODY = Credential(access_key="", secret_key="", backend_access_key="", backend_secret_key="")


def _anonymous_context(request_id: str, target: S3Target, view: RequestView) -> RequestContext:
    auth = AuthInfo(
        kind="header",
        access_key="",
        scope_date="",
        region="",
        service="s3",
        signed_headers=(),
        signature="",
        amz_date="",
        expires_s=None,
        payload_hash=view.headers.get("x-amz-content-sha256", UNSIGNED_PAYLOAD),
    )
    verified = Verified(auth=auth, signing_key=b"", seed_signature="", scope="")
    return RequestContext(request_id, target, view, auth, verified, _NOBODY, anonymous=True)


# Per-request storage: typed keys where aiohttp has them (it warns about plain strings from 3.13 on).
if hasattr(web, "RequestKey"):
    CTX_KEY: Any = web.RequestKey("s3lanes.ctx", RequestContext)
    RID_KEY: Any = web.RequestKey("s3lanes.rid", str)
else:  # pragma: no cover - older aiohttp
    CTX_KEY = "s3lanes.ctx"
    RID_KEY = "s3lanes.rid"


def new_request_id() -> str:
    return secrets.token_hex(8).upper()


def echo_request_id(out: web.StreamResponse, request_id: str) -> None:
    """Answer with the gateway's request id (the one in its logs); keep the backend's beside it."""
    backend_id = out.headers.getall("x-amz-request-id", [])
    if backend_id:
        del out.headers["x-amz-request-id"]
        out.headers[BACKEND_REQUEST_ID_HEADER] = backend_id[0]
    out.headers["x-amz-request-id"] = request_id


def lower_headers(request: web.Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in request.headers.items():
        key = name.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


# Answers served by the write spool carry this header ("spool"); the request duration metric uses it too.
SOURCE_HEADER = "x-s3lanes-source"
# Operations whose backend time-to-first-byte feeds the read-latency guard.
_READ_OPERATIONS = frozenset({"GetObject"})


class S3Proxy:
    """The request handler. One instance per application; holds no per-request state."""

    def __init__(
        self,
        cfg: Config,
        pools: Pools,
        clock: Clock,
        *,
        classifier: Classifier,
        metrics: Metrics,
        keys: dict[str, Credential] | None = None,
    ) -> None:
        self._cfg = cfg
        self.pools = pools
        self._clock = clock
        self._classifier = classifier
        self._metrics = metrics
        # The keys clients may sign with; ``keys`` is shared and updated in place (credentials file reloads).
        self._creds = keys if keys is not None else {c.access_key: c for c in cfg.credentials}
        self._request_cost = cfg.scheduler.request_cost_bytes
        self._chunk = cfg.scheduler.chunk_bytes
        self._pool_front = PoolFront(self)
        # Set by build_app when the write spool is enabled; it answers the operations it holds data for.
        self.spool_front: SpoolFront | None = None
        # Several workers: a worker without the spool relays what may touch it to the spool's owner
        # (gateway.http.forward); the owner marks the buckets of writes in the shared spool summary.
        self.forwarder: Forwarder | None = None
        self.spool_summary: SummaryWriter | None = None

    # -- authentication ----------------------------------------------------------------------------------

    def authenticate(self, request: web.Request) -> RequestContext:
        existing = request.get(CTX_KEY)
        if isinstance(existing, RequestContext):
            return existing
        raw_path, raw_query = split_target(request.raw_path)
        if len(request.raw_path) > self._cfg.server.max_url_bytes:
            raise InvalidArgument("The request URL is too long.")
        headers = lower_headers(request)
        if sum(len(k) + len(v) + 4 for k, v in headers.items()) > self._cfg.server.max_header_bytes:
            raise RequestHeaderSectionTooLarge()
        target = parse_target(request.method, raw_path, raw_query, headers, self._cfg.server.domains)
        view = RequestView(request.method, raw_path, raw_query, headers)
        auth = parse_auth(view)
        if auth is None:
            if (
                self._cfg.server.anonymous_reads
                and request.method in ("GET", "HEAD")
                and target.bucket is not None
                and target.operation in ANONYMOUS_READS
            ):
                anon = _anonymous_context(request.get(RID_KEY) or new_request_id(), target, view)
                request[CTX_KEY] = anon
                return anon
            raise AccessDenied("Anonymous requests are not accepted by this gateway.")
        cred = self._creds.get(auth.access_key)
        if cred is None:
            raise InvalidAccessKeyId(AWSAccessKeyId=auth.access_key)
        verified = verify(
            view, auth, cred.secret_key, self._clock.wall(), max_skew_s=self._cfg.server.max_skew_s
        )
        ctx = RequestContext(request.get(RID_KEY) or new_request_id(), target, view, auth, verified, cred)
        request[CTX_KEY] = ctx
        return ctx

    async def expect_handler(self, request: web.Request) -> web.StreamResponse | None:
        """Answer ``Expect: 100-continue`` only once the signature checks out, else the final error."""
        request[RID_KEY] = new_request_id()
        REQUEST_ID.set(request[RID_KEY])
        if request.headers.get("Expect", "").lower() != "100-continue":
            return web.Response(status=417, text="Unsupported Expect value")
        try:
            self.authenticate(request)
        except S3Error as err:
            return self.error_response(request, err, request[RID_KEY])
        if request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None

    # -- the handler ---------------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rid = request.get(RID_KEY) or forwarded_request_id(request) or new_request_id()
        request[RID_KEY] = rid
        REQUEST_ID.set(rid)
        try:
            ctx = self.authenticate(request)
        except S3Error as err:
            self._metrics.child(self._metrics.auth_failures, err.code).inc()
            self._metrics.child(self._metrics.requests, "none", "unauthenticated", str(err.status)).inc()
            return self.error_response(request, err, rid)
        facts = RequestFacts.from_request(ctx.target, ctx.view.headers, ctx.auth.access_key)
        decision = self._classifier.classify(facts)
        status = 500
        started = self._clock.monotonic()
        served_by = "backend"
        try:
            check_limits(
                ctx.target.operation, query_names(ctx.view.raw_query), facts.size_bytes, len(request.headers)
            )
            policy = self._cfg.tenant_policies.get(ctx.auth.access_key)
            if policy is not None:
                self._check_access(policy, ctx, facts, decision)
            resp = await self._proxy(request, ctx, decision)
            status = resp.status
            if resp.headers.get(SOURCE_HEADER) == "spool":
                served_by = "spool"
            if 200 <= status < 300:
                self._classifier.note_write_completed(facts, decision)
            return resp
        except S3Error as err:
            status = err.status
            return self._lane_headers(self.error_response(request, err, rid), decision)
        except ConnectionError:  # reset, broken pipe, or aiohttp's bare "Connection lost"
            if not client_gone(request):
                raise
            # Nobody is left to answer. Raising would make aiohttp log "Error handling request" with a
            # traceback; a returned response fails to write and aiohttp drops the connection quietly.
            status = 499  # nginx's "client closed request", for the metrics
            return web.Response(status=status)
        except Exception:
            log.exception("internal error on %s %s", request.method, request.raw_path)
            return self._lane_headers(self.error_response(request, InternalError(), rid), decision)
        finally:
            self._metrics.child(
                self._metrics.requests, decision.lane, ctx.target.operation, str(status)
            ).inc()
            self._metrics.child(
                self._metrics.duration, decision.lane, ctx.target.operation, served_by
            ).observe(self._clock.monotonic() - started)

    @staticmethod
    def _check_access(
        policy: TenantPolicy, ctx: RequestContext, facts: RequestFacts, decision: Decision
    ) -> None:
        """A restricted tenant's grants and lanes (gateway.core.access), before anything reaches a backend."""
        t = ctx.target
        copy_source = None
        if "x-amz-copy-source" in ctx.view.headers:
            src_bucket, rest = split_copy_source(ctx.view.headers["x-amz-copy-source"])
            copy_source = (src_bucket, unquote(rest.lstrip("/").partition("?")[0]))
        policy.check(t.operation, t.bucket, t.key, query_names(ctx.view.raw_query), copy_source=copy_source)
        hinted = facts.hint.strip().lower() if facts.hint else None
        policy.check_lane(decision.lane, hinted=hinted)

    @property
    def request_cost(self) -> int:
        return self._request_cost

    @property
    def chunk_bytes(self) -> int:
        return self._chunk

    def wall(self) -> float:
        return self._clock.wall()

    def finish_headers(self, resp: web.Response, ctx: RequestContext, decision: Decision) -> web.Response:
        """The gateway's own answer: its request id and the lane headers."""
        echo_request_id(resp, ctx.request_id)
        self._lane_headers(resp, decision)
        return resp

    @staticmethod
    def _lane_headers(resp: web.StreamResponse, decision: Decision) -> web.StreamResponse:
        resp.headers[LANE_RESPONSE_HEADER] = decision.lane
        resp.headers[LANE_REASON_RESPONSE_HEADER] = decision.reason
        return resp

    def error_response(self, request: web.Request, err: S3Error, rid: str) -> web.Response:
        resource = split_target(request.raw_path)[0]
        body = b"" if request.method == "HEAD" else error_xml(err, resource=resource, request_id=rid)
        resp = web.Response(status=err.status, body=body, content_type="application/xml")
        resp.headers["x-amz-request-id"] = rid
        size = err.extra.get("ActualObjectSize")
        if err.status == 416 and size is not None and request.method in ("GET", "HEAD"):
            # An unsatisfiable Range of a GET/HEAD names the object's size, as the store (and RFC 9110,
            # section 15.5.17) answers it: ``bytes */size``, also for an empty object.
            resp.headers["Content-Range"] = f"bytes */{size}"
        if err.retry_after_s is not None:
            resp.headers["Retry-After"] = str(err.retry_after_s)
        if request.body_exists and not request.content.is_eof():
            # The body was not consumed: close instead of reading the rest of a rejected upload.
            resp.force_close()
        if err.status >= 500:
            log.warning("%s %s -> %d %s: %s", request.method, resource, err.status, err.code, err.message)
        return resp

    def _upload_body(self, request: web.Request, ctx: RequestContext) -> UploadBody | None:
        h = ctx.view.headers
        if ctx.target.operation == "CompleteMultipartUpload":
            # Its x-amz-checksum-<algorithm> is the checksum of the object being completed (checked by the
            # store, or by the spool for an upload it holds), not of the request's XML document.
            h = {k: v for k, v in h.items() if not is_checksum_value_header(k)}
        payload_hash = ctx.auth.payload_hash
        if not request.body_exists:
            if payload_hash not in (UNSIGNED_PAYLOAD, EMPTY_SHA256) and payload_hash not in STREAMING_MODES:
                raise XAmzContentSHA256Mismatch(
                    ClientComputedContentSHA256=payload_hash, S3ComputedContentSHA256=EMPTY_SHA256
                )
            if payload_hash not in STREAMING_MODES:
                if request.method in ("PUT", "POST"):
                    # No body: digests the request states must still be those of an empty body.
                    BodyVerifier.from_headers(h, payload_hash).finish({})
                return None
        decoder: AwsChunkedDecoder | None = None
        expected: int | None
        if payload_hash in STREAMING_MODES:
            decoded = h.get("x-amz-decoded-content-length")
            if decoded is None:
                raise MissingContentLength(
                    "x-amz-decoded-content-length is required for aws-chunked uploads."
                )
            try:
                expected = int(decoded)
            except ValueError:
                raise InvalidArgument("x-amz-decoded-content-length is not a number.") from None
            if expected < 0:
                raise InvalidArgument("x-amz-decoded-content-length is negative.")
            chain = (
                ChunkSignatureChain(ctx.verified)
                if payload_hash in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)
                else None
            )
            trailer_names = tuple(
                t.strip().lower() for t in h.get("x-amz-trailer", "").split(",") if t.strip()
            )
            decoder = AwsChunkedDecoder(chain=chain, trailer_names=trailer_names, decoded_length=expected)
        else:
            expected = request.content_length
            if expected is None and ctx.target.operation not in UNKNOWN_LENGTH_OPERATIONS:
                raise MissingContentLength()
        verifier = BodyVerifier.from_headers(h, payload_hash)
        return UploadBody(verifier=verifier, decoder=decoder, expected_bytes=expected)

    def _request_headers(self, ctx: RequestContext, upload: UploadBody | None) -> dict[str, str]:
        h = ctx.view.headers
        trailer_checksum = ctx.auth.payload_hash in STREAMING_MODES and "x-amz-trailer" in h
        out: dict[str, str] = {}
        for name, value in h.items():
            if name in _DROP_REQUEST:
                continue
            if name == "content-encoding":
                value = without_aws_chunked(value)
                if not value.strip():
                    continue
            if trailer_checksum and name == "x-amz-sdk-checksum-algorithm":
                # The value came in the trailer, which the gateway verified and does not forward.
                continue
            out[name] = value
        if upload is not None and upload.expected_bytes is not None:
            out["content-length"] = str(upload.expected_bytes)
        # Else (a chunked body of unknown length) aiohttp sends it with chunked transfer coding.
        return out

    async def _proxy(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse:
        if self.forwarder is not None and self.forwarder.wants(ctx.target, ctx.view, decision.lane):
            return await self.forwarder.relay(request, ctx.request_id)
        with write_hold(self.spool_summary, ctx.target.bucket, request.method):
            return await self._answer(request, ctx, decision)

    async def _answer(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse:
        if ctx.anonymous:
            await self._settle_for_anonymous(ctx)
        elif self.spool_front is not None:
            spooled = await self.spool_front.route(request, ctx, decision)
            if spooled is not None:
                return spooled
        lane = decision.lane
        arrived = self._clock.monotonic()
        if self.pools.routed:
            if ctx.target.operation == "ListBuckets":
                return await self._pool_front.list_buckets(request, ctx, decision)
            if "x-amz-copy-source" in ctx.view.headers and self._pool_front.crosses_backends(ctx):
                return await self._pool_front.copy_across(request, ctx, decision)
        upload = self._upload_body(request, ctx)
        headers = self._request_headers(ctx, upload)
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

        try:
            resp = await self.pools.request(
                lane,
                ctx.target.bucket,
                ctx.target.key,
                request.method,
                headers,
                ctx.credential,
                body,
                raw_query=ctx.view.raw_query,
                cost=self._request_cost,
                gone=lambda: client_gone(request),
                account_body=True,
                admitted=admitted,
                payload_hash=backend_hash,
                signed=not ctx.anonymous,
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
            return await self._relay(request, resp, ctx, decision, dispatcher, backend.cfg)
        finally:
            resp.release()

    async def _settle_for_anonymous(self, ctx: RequestContext) -> None:
        """An anonymous read sees what the store holds (the spool cannot evaluate the store's policy or
        ACL): spooled data under its key, or its listing's prefix, is drained first."""
        bucket = ctx.target.bucket
        if self.spool_front is None or bucket is None or ctx.target.operation == "HeadBucket":
            return
        if ctx.target.key is not None:
            prefix = ctx.target.key
        else:
            prefix = query_names(ctx.view.raw_query).get("prefix", "")
        spool = self.spool_front.spool
        if not spool.state.has_bucket_prefix(bucket, prefix):
            return
        result = await spool.flush(bucket, prefix, ANONYMOUS_SETTLE_TIMEOUT_S)
        if not result.durable:
            raise SlowDown(
                "Acknowledged writes under this key are still being uploaded to the store; retry later.",
                retry_after_s=self._cfg.spool.retry_after_s,
            )

    async def _relay(
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        ctx: RequestContext,
        decision: Decision,
        dispatcher: LaneDispatcher,
        backend_cfg: BackendConfig,
    ) -> web.StreamResponse:
        route = self.pools.route(ctx.target.bucket)
        if route is not None and route.renamed and names_bucket(ctx.target.operation, resp):
            return await self._pool_front.relay_renamed(request, resp, ctx, decision, dispatcher, route)
        return await self.relay_stream(request, resp, ctx, decision, dispatcher, backend_cfg=backend_cfg)

    async def relay_stream(
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        ctx: RequestContext,
        decision: Decision,
        dispatcher: LaneDispatcher,
        *,
        backend_cfg: BackendConfig | None = None,
    ) -> web.StreamResponse:
        """The backend's answer to the client as it streams, paced through the lane of its pool. A large
        plain-HTTP GET body is spliced from socket to socket (:mod:`gateway.http.zerocopy`)."""
        lane = decision.lane
        out = web.StreamResponse(status=resp.status, reason=resp.reason)
        for name, value in resp.headers.items():
            if name.lower() not in _DROP_RESPONSE:
                out.headers.add(name, value)
        echo_request_id(out, ctx.request_id)
        if resp.status == 503 and "Retry-After" not in resp.headers:
            # The store's SlowDown/ServiceUnavailable: say when to come back, as the gateway's own 503s do.
            out.headers["Retry-After"] = "1"
        if resp.content_length is not None:
            out.content_length = resp.content_length
        if request.body_exists and not request.content.is_eof():
            out.force_close()
        self._lane_headers(out, decision)
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
            budget = StreamBudget(dispatcher, lane, self._chunk, resp.content_length)
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


async def read_small_body(request: web.Request, upload: UploadBody) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        parts.extend(upload.feed(chunk))
    parts.append(upload.finish())
    return b"".join(parts)


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
