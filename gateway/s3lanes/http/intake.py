"""Request intake, shared by the S3 fronts (:mod:`s3lanes.http.proxy`, :mod:`s3lanes.http.spool_front`,
:mod:`s3lanes.http.pool_front`), which import it and never each other.

What every front needs from a request and for its answer: the request's id and context (target, signature,
credential: :class:`Intake` authenticates, and answers ``Expect: 100-continue``), the body's intake and
verification (:func:`upload_body`, :func:`read_small_body`), the headers forwarded to a store
(:func:`request_headers`), the decoration of the gateway's answers (request id, lane headers) and the S3 error
answer (:func:`error_response`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11

from s3lanes.clock import Clock
from s3lanes.config import Config, Credential
from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import BodyVerifier, is_checksum_value_header, without_aws_chunked
from s3lanes.core.chunked import AwsChunkedDecoder
from s3lanes.core.classify import (
    LANE_HINT_HEADER,
    LANE_REASON_RESPONSE_HEADER,
    LANE_RESPONSE_HEADER,
    Decision,
)
from s3lanes.core.s3request import S3Target, parse_target, split_target
from s3lanes.core.sigv4 import (
    EMPTY_SHA256,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    AuthInfo,
    ChunkSignatureChain,
    RequestCredential,
    RequestView,
    Verified,
    parse_auth,
    verify,
)
from s3lanes.errors import (
    AccessDenied,
    InvalidAccessKeyId,
    InvalidArgument,
    MissingContentLength,
    RequestHeaderSectionTooLarge,
    S3Error,
    XAmzContentSHA256Mismatch,
)
from s3lanes.http.forward import FORWARDED_HEADER
from s3lanes.http.s3xml import error_xml
from s3lanes.logsetup import REQUEST_ID

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
DROP_RESPONSE = _HOP_BY_HOP | {"content-length"}
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
_NOBODY = Credential(access_key="", secret_key="", backend_access_key="", backend_secret_key="")


def _anonymous_context(request_id: str, target: S3Target, view: RequestView) -> RequestContext:
    auth = AuthInfo(
        kind="header",
        credential=RequestCredential(access_key="", scope_date="", region="", service="s3"),
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


def stored(request: web.Request, key: Any) -> Any:
    """``request.get(key)``, without the KeyError ``Mapping.get`` raises and catches for a key the request
    does not hold (most requests hold none when asked): the request's few keys are compared instead."""
    for held in request:
        if held == key:
            return request[key]
    return None


def new_request_id() -> str:
    return os.urandom(8).hex().upper()  # secrets.token_hex's bytes, without its two layers of calls


def relayed_headers(backend: Mapping[str, str], request_id: str) -> list[tuple[str, str]]:
    """The store's response headers as the gateway answers with them, in one pass and one list (for one
    ``extend`` of the answer's headers): hop-by-hop headers and the length dropped, the store's request id
    kept as :data:`BACKEND_REQUEST_ID_HEADER`, the gateway's own last (what :func:`echo_request_id` does to
    headers already in an answer)."""
    pairs: list[tuple[str, str]] = []
    backend_id: str | None = None
    for name, value in backend.items():
        low = name.lower()
        if low in DROP_RESPONSE:
            continue
        if low == "x-amz-request-id":
            if backend_id is None:
                backend_id = value
            continue
        pairs.append((name, value))
    if backend_id is not None:
        pairs.append((BACKEND_REQUEST_ID_HEADER, backend_id))
    pairs.append(("x-amz-request-id", request_id))
    return pairs


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


class Intake:
    """Authentication: the request's context from its target and signature. One instance per application."""

    def __init__(self, cfg: Config, clock: Clock, *, keys: dict[str, Credential] | None = None) -> None:
        self._cfg = cfg
        self._clock = clock
        # The keys clients may sign with; ``keys`` is shared and updated in place (credentials file reloads).
        self._creds = keys if keys is not None else {c.access_key: c for c in cfg.credentials}

    def authenticate(self, request: web.Request) -> RequestContext:
        existing = stored(request, CTX_KEY)
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
                anon = _anonymous_context(stored(request, RID_KEY) or new_request_id(), target, view)
                request[CTX_KEY] = anon
                return anon
            raise AccessDenied("Anonymous requests are not accepted by this gateway.")
        cred = self._creds.get(auth.access_key)
        if cred is None:
            raise InvalidAccessKeyId(AWSAccessKeyId=auth.access_key)
        verified = verify(
            view, auth, cred.secret_key, self._clock.wall(), max_skew_s=self._cfg.server.max_skew_s
        )
        ctx = RequestContext(stored(request, RID_KEY) or new_request_id(), target, view, auth, verified, cred)
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
            return error_response(request, err, request[RID_KEY])
        if request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None


def finish_headers(resp: web.Response, ctx: RequestContext, decision: Decision) -> web.Response:
    """The gateway's own answer: its request id and the lane headers."""
    echo_request_id(resp, ctx.request_id)
    lane_headers(resp, decision)
    return resp


def lane_headers(resp: web.StreamResponse, decision: Decision) -> web.StreamResponse:
    resp.headers[LANE_RESPONSE_HEADER] = decision.lane
    resp.headers[LANE_REASON_RESPONSE_HEADER] = decision.reason
    return resp


def error_response(request: web.Request, err: S3Error, rid: str) -> web.Response:
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


def upload_body(request: web.Request, ctx: RequestContext) -> UploadBody | None:
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
            raise MissingContentLength("x-amz-decoded-content-length is required for aws-chunked uploads.")
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
        trailer_names = tuple(t.strip().lower() for t in h.get("x-amz-trailer", "").split(",") if t.strip())
        decoder = AwsChunkedDecoder(chain=chain, trailer_names=trailer_names, decoded_length=expected)
    else:
        expected = request.content_length
        if expected is None and ctx.target.operation not in UNKNOWN_LENGTH_OPERATIONS:
            raise MissingContentLength()
    verifier = BodyVerifier.from_headers(h, payload_hash)
    return UploadBody(verifier=verifier, decoder=decoder, expected_bytes=expected)


def request_headers(ctx: RequestContext, upload: UploadBody | None) -> dict[str, str]:
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


async def read_small_body(request: web.Request, upload: UploadBody) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        parts.extend(upload.feed(chunk))
    parts.append(upload.finish())
    return b"".join(parts)
