"""AWS Signature Version 4, verified and produced exactly as S3 does it.

Theory of operation
-------------------
A request is authenticated in three steps, all pure functions of their arguments:

1. :func:`parse_auth` reads *what the client claims*: access key, credential scope, signed headers,
   signature, request time and payload hash, from the ``Authorization`` header or from the
   ``X-Amz-*`` query parameters of a presigned URL. It only checks form, never a secret, and returns
   ``None`` for an anonymous request. It raises the S3 error S3 would raise for a malformed claim.
2. The HTTP layer looks the access key up (``InvalidAccessKeyId`` is its business, not ours).
3. :func:`verify` checks the claim against the secret key and the wall clock it is *given*
   (``now_wall``; this module never reads a clock): time skew or expiry, the signed-header rules,
   then the HMAC. It returns a :class:`Verified`, whose signing key and seed signature start the
   per-chunk signature chain (:class:`ChunkSignatureChain`) of a ``STREAMING-AWS4-HMAC-SHA256-*`` body.

Canonicalisation follows S3, which is *not* generic SigV4: the path is never normalised (no ``.``/``..``
removal, no slash merging) and never double-encoded. We rebuild the canonical URI from the raw path by
percent-decoding each segment and re-encoding it with S3's rules, and if that does not match we also try
the path exactly as sent, because some clients encode differently (e.g. leave ``!`` or ``$`` raw). The
query gets the same treatment (S3 rules with ``+`` as a literal plus, then with ``+`` as a space as HTML
forms and Go's ``url.ParseQuery`` have it, then the raw pairs as botocore does). Every candidate is a
genuine HMAC over what the client sent, so trying more than one does not weaken the check; the cost is
only paid on a mismatch. Comparisons use :func:`hmac.compare_digest`.

What this module is *not*: it does not know users or secrets, does not decide permissions, does not
check that the scope's region or service is the gateway's own (the HMAC already binds them; the HTTP
layer may insist on ``service == "s3"``), and does not hash bodies (see ``s3lanes.core.checksums``).

:func:`sign_headers` is the mirror image, for re-signing a request towards the backend, and
:class:`ChunkSigner` signs aws-chunked bodies (tests and our own clients).
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal
from urllib.parse import quote_from_bytes, unquote_to_bytes

from s3lanes.errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    S3Error,
    SignatureDoesNotMatch,
)

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

#: Literal ``x-amz-content-sha256`` values that are not a hex digest of the body.
PAYLOAD_LITERALS: frozenset[str] = frozenset(
    {UNSIGNED_PAYLOAD, STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER}
)
#: Payload modes whose body is aws-chunked with per-chunk signatures.
SIGNED_STREAMING: frozenset[str] = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER})

MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600  # 604800, S3's limit for X-Amz-Expires
DEFAULT_MAX_SKEW_S = 15 * 60.0

# Headers that need not appear in SignedHeaders although they start with x-amz-: both values are bound
# by the signature anyway (the payload hash is the last line of the canonical request, the date is in
# the string to sign), so leaving them unsigned gives an attacker nothing.
_UNSIGNED_OK = frozenset({"x-amz-content-sha256", "x-amz-date"})

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_SCOPE_DATE = re.compile(r"[0-9]{8}")
_DIGITS = re.compile(r"-?[0-9]{1,12}")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
# A path of unreserved characters and slashes is its own canonical form.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~/]*")
_EXCLUDE_SIGNATURE = frozenset({"X-Amz-Signature"})

_MSG_NO_DATE = "AWS authentication requires a valid Date or x-amz-date header"
_MSG_NOT_SIGNED = "There were headers present in the request which were not signed"
_MSG_V4_ONLY = "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
_MSG_HDR_COMPONENTS = (
    "The authorization header is malformed; the authorization header requires three components: "
    "Credential, SignedHeaders, and Signature."
)
_MSG_CREDENTIAL = (
    'the Credential is mal-formed; expecting "<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".'
)
_MSG_QUERY_REQUIRED = (
    "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, "
    "X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters."
)
_MSG_BAD_PAYLOAD_HASH = (
    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid sha256 value."
)
# The query parameters every presigned request carries (its own signature among them).
QUERY_AUTH_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)


@dataclass(frozen=True, slots=True)
class RequestView:
    """The parts of a wire request that SigV4 covers, built by the HTTP layer.

    ``raw_path`` and ``raw_query`` are exactly as on the wire (still percent-encoded, query without
    ``?``); ``headers`` has lower-case names, repeated headers already joined with ``","``.
    """

    method: str
    raw_path: str
    raw_query: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class RequestCredential:
    """The credential a signature names (``AKID/YYYYMMDD/region/service/aws4_request``): whose key signed,
    and the scope its signing key is derived for."""

    access_key: str
    scope_date: str  # YYYYMMDD
    region: str
    service: str

    @property
    def scope(self) -> str:
        return f"{self.scope_date}/{self.region}/{self.service}/aws4_request"


@dataclass(frozen=True, slots=True)
class AuthInfo:
    """What a request claims about its signature. Parsed, not yet verified."""

    kind: Literal["header", "query"]
    credential: RequestCredential
    signed_headers: tuple[str, ...]
    signature: str  # lower-case hex
    amz_date: str  # YYYYMMDDTHHMMSSZ
    expires_s: int | None  # query auth only
    payload_hash: str  # x-amz-content-sha256, or UNSIGNED-PAYLOAD for a presigned URL without it

    @property
    def access_key(self) -> str:
        return self.credential.access_key

    @property
    def scope(self) -> str:
        return self.credential.scope


@dataclass(frozen=True, slots=True)
class Verified:
    """A request whose signature matched. Carries what the chunk signature chain needs."""

    auth: AuthInfo
    signing_key: bytes
    seed_signature: str
    scope: str  # "YYYYMMDD/region/service/aws4_request"


# --------------------------------------------------------------------------------------------------
# Parsing


def parse_auth(req: RequestView) -> AuthInfo | None:
    """Read the SigV4 claim of a request; ``None`` if it is anonymous.

    Raises the S3 error S3 gives for a malformed claim. Never looks at a secret or a clock.
    """
    headers = _lower_keys(req.headers)
    authorization = headers.get("authorization")
    params = _query_params(req.raw_query)
    names = {name for name, _ in params}
    if authorization is not None and "X-Amz-Algorithm" in names:
        raise InvalidArgument(
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query "
            "string parameter or the Authorization header should be specified",
            ArgumentName="Authorization",
            ArgumentValue=authorization,
        )
    if authorization is not None:
        return _parse_header_auth(authorization, headers)
    if "X-Amz-Algorithm" in names:
        return _parse_query_auth(params, headers)
    if "AWSAccessKeyId" in names and "Signature" in names:
        raise InvalidRequest(_MSG_V4_ONLY)  # a SigV2 presigned URL
    return None


def _parse_header_auth(authorization: str, headers: Mapping[str, str]) -> AuthInfo:
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme != ALGORITHM:
        if scheme in ("AWS", "AWS4-ECDSA-P256-SHA256"):  # SigV2 and SigV4a: real S3, not supported here
            raise InvalidRequest(_MSG_V4_ONLY)
        raise InvalidArgument(
            "Unsupported Authorization Type", ArgumentName="Authorization", ArgumentValue=authorization
        )
    fields: dict[str, str] = {}
    for component in rest.split(","):
        key, eq, value = component.strip().partition("=")
        if not eq or key not in ("Credential", "SignedHeaders", "Signature") or key in fields:
            raise AuthorizationHeaderMalformed(_MSG_HDR_COMPONENTS)
        fields[key] = value.strip()
    if len(fields) != 3:
        raise AuthorizationHeaderMalformed(_MSG_HDR_COMPONENTS)

    credential = _parse_credential(fields["Credential"])
    if credential is None:
        raise AuthorizationHeaderMalformed("The authorization header is malformed; " + _MSG_CREDENTIAL)
    signature = fields["Signature"]
    signed_headers = _signed_headers(
        fields["SignedHeaders"],
        signature,
        AuthorizationHeaderMalformed,
        "The authorization header is malformed; ",
        ("SignedHeaders", "the Signature"),
    )

    payload_hash = headers.get("x-amz-content-sha256")
    if payload_hash is None:
        raise InvalidRequest("Missing required header for this request: x-amz-content-sha256")
    _check_payload_hash(payload_hash)

    amz_date = _request_amz_date(headers)
    return _auth_info("header", credential, signed_headers, signature, amz_date, None, payload_hash)


def _parse_query_auth(params: list[tuple[str, str]], headers: Mapping[str, str]) -> AuthInfo:
    found: dict[str, str] = {}
    for name, value in params:
        if name in QUERY_AUTH_PARAMS:
            if name in found:
                raise AuthorizationQueryParametersError(f"{name} must be given only once.")
            found[name] = value
    if found["X-Amz-Algorithm"] != ALGORITHM:
        raise AuthorizationQueryParametersError('X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
    if len(found) != len(QUERY_AUTH_PARAMS):
        raise AuthorizationQueryParametersError(_MSG_QUERY_REQUIRED)

    credential = _parse_credential(found["X-Amz-Credential"])
    if credential is None:
        raise AuthorizationQueryParametersError(
            "Error parsing the X-Amz-Credential parameter; " + _MSG_CREDENTIAL
        )
    amz_date = found["X-Amz-Date"]
    if _amz_date_epoch(amz_date) is None:
        raise AuthorizationQueryParametersError(
            "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""
        )
    expires_text = found["X-Amz-Expires"]
    if not _DIGITS.fullmatch(expires_text):
        raise AuthorizationQueryParametersError("X-Amz-Expires should be a number")
    expires_s = int(expires_text)
    if expires_s < 0:
        raise AuthorizationQueryParametersError("X-Amz-Expires must be non-negative")
    if expires_s > MAX_PRESIGN_EXPIRES_S:
        raise AuthorizationQueryParametersError(
            "X-Amz-Expires must be less than a week (in seconds) that is; "
            f"the maximum expires is {MAX_PRESIGN_EXPIRES_S} seconds"
        )
    signature = found["X-Amz-Signature"]
    signed_headers = _signed_headers(
        found["X-Amz-SignedHeaders"],
        signature,
        AuthorizationQueryParametersError,
        "",
        ("X-Amz-SignedHeaders", "X-Amz-Signature"),
    )

    payload_hash = headers.get("x-amz-content-sha256", UNSIGNED_PAYLOAD)
    _check_payload_hash(payload_hash)
    return _auth_info("query", credential, signed_headers, signature, amz_date, expires_s, payload_hash)


def _signed_headers(
    text: str, signature: str, error: type[S3Error], where: str, names: tuple[str, str]
) -> tuple[str, ...]:
    """The signed header names ``text`` lists. Raises ``error`` (its message: ``where``, then the field's
    name from ``names``) if they are not a list of lower-case header names or the signature is not 64 hex
    digits."""
    signed_headers = _parse_signed_headers(text)
    if signed_headers is None:
        raise error(f"{where}{names[0]} is not a list of lower-case header names.")
    if not _HEX64.fullmatch(signature):
        raise error(f"{where}{names[1]} is not 64 hexadecimal digits.")
    return signed_headers


def _auth_info(
    kind: Literal["header", "query"],
    credential: RequestCredential,
    signed_headers: tuple[str, ...],
    signature: str,
    amz_date: str,
    expires_s: int | None,
    payload_hash: str,
) -> AuthInfo:
    return AuthInfo(
        kind=kind,
        credential=credential,
        signed_headers=signed_headers,
        signature=signature.lower(),
        amz_date=amz_date,
        expires_s=expires_s,
        payload_hash=payload_hash,
    )


@functools.lru_cache(maxsize=256)  # one text per key, day and region: requests of a day share it
def _parse_credential(text: str) -> RequestCredential | None:
    """``AKID/YYYYMMDD/region/service/aws4_request`` -> its parts; ``None`` if malformed."""
    parts = text.rsplit("/", 4)
    if len(parts) != 5:
        return None
    access_key, scope_date, region, service, terminator = parts
    if not access_key or not region or not service or terminator != "aws4_request":
        return None
    if not _SCOPE_DATE.fullmatch(scope_date) or _amz_date_epoch(scope_date + "T000000Z") is None:
        return None
    return RequestCredential(access_key=access_key, scope_date=scope_date, region=region, service=service)


@functools.lru_cache(maxsize=256)  # a client signs the same few header sets over and over
def _parse_signed_headers(text: str) -> tuple[str, ...] | None:
    names = tuple(text.split(";"))
    if not all(_HEADER_NAME.fullmatch(name) for name in names):
        return None
    return names


def _check_payload_hash(value: str) -> None:
    if value not in PAYLOAD_LITERALS and not _HEX64.fullmatch(value):
        raise InvalidArgument(_MSG_BAD_PAYLOAD_HASH, ArgumentName="x-amz-content-sha256", ArgumentValue=value)


def _request_amz_date(headers: Mapping[str, str]) -> str:
    """The request time of header auth: ``x-amz-date``, else ``Date`` converted to the SigV4 format."""
    amz_date = headers.get("x-amz-date")
    if amz_date is not None:
        if _amz_date_epoch(amz_date) is None:
            raise AccessDenied(_MSG_NO_DATE)
        return amz_date
    date = headers.get("date")
    if date is None:
        raise AccessDenied(_MSG_NO_DATE)
    try:
        parsed = parsedate_to_datetime(date)
    except (TypeError, ValueError, IndexError, OverflowError):
        raise AccessDenied(_MSG_NO_DATE) from None
    if parsed.tzinfo is None:
        raise AccessDenied(_MSG_NO_DATE)
    return parsed.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


# --------------------------------------------------------------------------------------------------
# Verification


def verify(
    req: RequestView,
    auth: AuthInfo,
    secret_key: str,
    now_wall: float,
    *,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> Verified:
    """Check ``auth`` against ``secret_key`` at wall-clock time ``now_wall`` (Unix seconds).

    Order of checks: scope date, time (skew for header auth, expiry for query auth), signed-header
    rules, then the HMAC. Raises the S3 error S3 gives for each.
    """
    request_time = _amz_date_epoch(auth.amz_date)
    if request_time is None:
        raise AccessDenied(_MSG_NO_DATE)
    if auth.credential.scope_date != auth.amz_date[:8]:
        message = "Invalid credential date. Date is not the same as X-Amz-Date."
        if auth.kind == "query":
            raise AuthorizationQueryParametersError(message)
        raise AuthorizationHeaderMalformed("The authorization header is malformed; " + message)

    if auth.kind == "query":
        expires_s = auth.expires_s or 0
        if now_wall > request_time + expires_s:
            raise AccessDenied(
                "Request has expired",
                **{
                    "X-Amz-Expires": str(expires_s),
                    "Expires": _iso8601(request_time + expires_s),
                    "ServerTime": _iso8601(now_wall),
                },
            )
        if request_time - now_wall > max_skew_s:
            raise AccessDenied("Request is not valid yet", ServerTime=_iso8601(now_wall))
    elif abs(request_time - now_wall) > max_skew_s:
        raise RequestTimeTooSkewed(
            RequestTime=auth.amz_date,
            ServerTime=_iso8601(now_wall),
            MaxAllowedSkewMilliseconds=str(int(max_skew_s * 1000)),
        )

    headers = _lower_keys(req.headers)
    signed = set(auth.signed_headers)
    if "host" not in signed:
        raise AccessDenied(_MSG_NOT_SIGNED, HeadersNotSigned="host")
    allowed = signed | _UNSIGNED_OK
    unsigned = sorted(name for name in headers if name.startswith("x-amz-") and name not in allowed)
    if unsigned:
        raise AccessDenied(_MSG_NOT_SIGNED, HeadersNotSigned=", ".join(unsigned))

    credential = auth.credential
    key = signing_key(secret_key, credential.scope_date, credential.region, credential.service)
    scope = auth.scope
    exclude = _EXCLUDE_SIGNATURE if auth.kind == "query" else frozenset()
    provided = _utf8(auth.signature)
    # The canonical form first: the one every SDK signs. The other forms are built only on a mismatch.
    uri0 = canonical_uri(req.raw_path)
    query0 = canonical_query(req.raw_query, exclude=exclude)
    creq = _canonical_request(req.method, uri0, query0, headers, auth.signed_headers, auth.payload_hash)
    sts = _string_to_sign(auth.amz_date, scope, creq)
    if hmac.compare_digest(_hmac_hex(key, sts).encode("ascii"), provided):
        return Verified(auth=auth, signing_key=key, seed_signature=auth.signature, scope=scope)
    first = (creq, sts)
    uris = _unique([uri0, req.raw_path or "/"])
    queries = _unique(
        [
            query0,
            # HTML-form style: '+' meant a space (what Go's url.ParseQuery, and so SeaweedFS, assume).
            canonical_query(req.raw_query.replace("+", "%20"), exclude=exclude),
            _raw_query(req.raw_query, exclude),
        ]
    )
    for uri in uris:
        for query in queries:
            if uri == uri0 and query == query0:
                continue
            creq = _canonical_request(req.method, uri, query, headers, auth.signed_headers, auth.payload_hash)
            sts = _string_to_sign(auth.amz_date, scope, creq)
            if hmac.compare_digest(_hmac_hex(key, sts).encode("ascii"), provided):
                return Verified(auth=auth, signing_key=key, seed_signature=auth.signature, scope=scope)
    creq, sts = first
    raise SignatureDoesNotMatch(
        AWSAccessKeyId=auth.access_key,
        StringToSign=sts,
        SignatureProvided=auth.signature,
        StringToSignBytes=_spaced_hex(sts),
        CanonicalRequest=creq,
        CanonicalRequestBytes=_spaced_hex(creq),
    )


# --------------------------------------------------------------------------------------------------
# Signing


def sign_headers(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    region: str,
    payload_hash: str,
    now_wall: float,
    service: str = "s3",
) -> dict[str, str]:
    """Sign a request towards the backend; returns the headers to SET on it.

    ``headers`` (lower-case names) must include ``host``. Signed: ``host``, every ``x-amz-*`` header,
    ``content-md5`` and ``content-type`` when present, plus the ``x-amz-date`` and
    ``x-amz-content-sha256`` this function sets. ``raw_path``/``raw_query`` are sent as given, so they
    are canonicalised exactly as :func:`verify` tries first: a literal ``+`` in the query is a plus. A
    backend that reads ``+`` as a space (Go's ``url.ParseQuery``) disagrees, so forward a query whose
    pluses are encoded (``%2B``), as botocore and the AWS SDKs send it anyway.
    """
    amz_date = _format_amz_date(now_wall)
    hdrs = {k: v for k, v in _lower_keys(headers).items() if k != "authorization"}
    if "host" not in hdrs:
        raise ValueError("sign_headers needs a 'host' header")
    hdrs["x-amz-date"] = amz_date
    hdrs["x-amz-content-sha256"] = payload_hash
    signed = tuple(sorted(name for name in hdrs if _signed_towards_backend(name)))
    scope_date = amz_date[:8]
    scope = f"{scope_date}/{region}/{service}/aws4_request"
    creq = _canonical_request(
        method, canonical_uri(raw_path), canonical_query(raw_query), hdrs, signed, payload_hash
    )
    key = signing_key(secret_key, scope_date, region, service)
    signature = _hmac_hex(key, _string_to_sign(amz_date, scope, creq))
    authorization = (
        f"{ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(signed)}, Signature={signature}"
    )
    return {"authorization": authorization, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}


def _signed_towards_backend(name: str) -> bool:
    return name == "host" or name.startswith("x-amz-") or name in ("content-md5", "content-type")


@functools.lru_cache(maxsize=64)  # one derivation per key, day and region: halves SigV4 cost per request
def signing_key(secret_key: str, scope_date: str, region: str, service: str) -> bytes:
    """The SigV4 signing key: HMAC chain over date, region, service and ``aws4_request``."""
    key = hmac.digest(_utf8("AWS4" + secret_key), _utf8(scope_date), "sha256")
    for part in (region, service, "aws4_request"):
        key = hmac.digest(key, _utf8(part), "sha256")
    return key


# --------------------------------------------------------------------------------------------------
# Streaming (aws-chunked) signatures


def chunk_string_to_sign(amz_date: str, scope: str, previous_signature: str, chunk_sha256_hex: str) -> str:
    return (
        f"{ALGORITHM}-PAYLOAD\n{amz_date}\n{scope}\n{previous_signature}\n{EMPTY_SHA256}\n{chunk_sha256_hex}"
    )


def trailer_string_to_sign(
    amz_date: str, scope: str, previous_signature: str, trailer_canonical: bytes
) -> str:
    digest = hashlib.sha256(trailer_canonical).hexdigest()
    return f"{ALGORITHM}-TRAILER\n{amz_date}\n{scope}\n{previous_signature}\n{digest}"


class ChunkSignatureChain:
    """Verifies the per-chunk signatures of ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD(-TRAILER)`` bodies.

    Each chunk's signature signs the previous signature (the seed is the request's own signature),
    so chunks cannot be dropped, reordered or replayed. Feed it every chunk in order, including the
    final empty one; then, in trailer mode, the trailer. It does not parse framing (see
    ``s3lanes.core.chunked``).
    """

    __slots__ = ("_amz_date", "_key", "_previous", "_scope")

    def __init__(self, verified: Verified) -> None:
        self._key = verified.signing_key
        self._amz_date = verified.auth.amz_date
        self._scope = verified.scope
        self._previous = verified.seed_signature

    @property
    def previous_signature(self) -> str:
        return self._previous

    def verify_chunk(self, chunk_sha256_hex: str, signature: str) -> None:
        """Check the next chunk's signature; raises :class:`SignatureDoesNotMatch`."""
        sts = chunk_string_to_sign(self._amz_date, self._scope, self._previous, chunk_sha256_hex)
        if not hmac.compare_digest(_hmac_hex(self._key, sts).encode("ascii"), _utf8(signature.lower())):
            raise SignatureDoesNotMatch(StringToSign=sts, SignatureProvided=signature)
        self._previous = signature.lower()

    def trailer_signature_matches(self, trailer_canonical: bytes, signature: str) -> bool:
        sts = trailer_string_to_sign(self._amz_date, self._scope, self._previous, trailer_canonical)
        return hmac.compare_digest(_hmac_hex(self._key, sts).encode("ascii"), _utf8(signature.lower()))

    def verify_trailer(self, trailer_canonical: bytes, signature: str) -> None:
        """Check the ``x-amz-trailer-signature`` over the trailer lines (``name:value\\n`` each)."""
        if not self.trailer_signature_matches(trailer_canonical, signature):
            sts = trailer_string_to_sign(self._amz_date, self._scope, self._previous, trailer_canonical)
            raise SignatureDoesNotMatch(StringToSign=sts, SignatureProvided=signature)


class ChunkSigner:
    """The client side of :class:`ChunkSignatureChain`: signs chunks in order. For tests and our clients."""

    __slots__ = ("_amz_date", "_key", "_previous", "_scope")

    def __init__(self, *, signing_key: bytes, amz_date: str, scope: str, seed_signature: str) -> None:
        self._key = signing_key
        self._amz_date = amz_date
        self._scope = scope
        self._previous = seed_signature

    @classmethod
    def for_request(
        cls, *, secret_key: str, amz_date: str, region: str, seed_signature: str, service: str = "s3"
    ) -> ChunkSigner:
        """A signer for a request signed at ``amz_date`` whose own signature is ``seed_signature``."""
        scope_date = amz_date[:8]
        return cls(
            signing_key=signing_key(secret_key, scope_date, region, service),
            amz_date=amz_date,
            scope=f"{scope_date}/{region}/{service}/aws4_request",
            seed_signature=seed_signature,
        )

    def sign_chunk(self, data: bytes) -> str:
        """Signature of the next chunk (``b""`` for the final one); advances the chain."""
        digest = hashlib.sha256(data).hexdigest()
        sts = chunk_string_to_sign(self._amz_date, self._scope, self._previous, digest)
        self._previous = _hmac_hex(self._key, sts)
        return self._previous

    def sign_trailer(self, trailer_canonical: bytes) -> str:
        """Signature of the trailer lines (``name:value\\n`` each), after the final chunk."""
        sts = trailer_string_to_sign(self._amz_date, self._scope, self._previous, trailer_canonical)
        return _hmac_hex(self._key, sts)


# --------------------------------------------------------------------------------------------------
# Canonical forms


def canonical_uri(raw_path: str) -> str:
    """S3's canonical URI of a wire path: each segment percent-decoded once and re-encoded.

    Everything but ``A-Za-z0-9-._~`` is encoded; ``/`` separates segments and stays, while an encoded
    ``%2F`` inside a segment stays encoded. No dot-segment removal, no slash merging: S3 does neither.
    """
    if not raw_path:
        return "/"
    if _PLAIN_PATH.fullmatch(raw_path):  # nothing to decode or encode: the common case, kept cheap
        return raw_path
    return "/".join(_reencode(segment) for segment in raw_path.split("/"))


def canonical_query(raw_query: str, *, exclude: Iterable[str] = ()) -> str:
    """The canonical query string: each name and value decoded and re-encoded, sorted by name then value.

    A pair without ``=`` has an empty value; empty pairs (``a=1&&b=2``) are dropped; names in
    ``exclude`` (compared decoded, e.g. ``X-Amz-Signature``) are left out.
    """
    if not raw_query:  # a plain GET or HEAD of an object
        return ""
    skip = frozenset(exclude)
    pairs: list[tuple[str, str]] = []
    for part in raw_query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name_bytes = unquote_to_bytes(_utf8(name))
        if skip and name_bytes.decode("utf-8", "replace") in skip:
            continue
        pairs.append((quote_from_bytes(name_bytes, safe=""), _reencode(value)))
    pairs.sort()
    return "&".join(f"{name}={value}" for name, value in pairs)


def _raw_query(raw_query: str, exclude: frozenset[str]) -> str:
    """The query as botocore canonicalises a URL it built itself: raw pairs, sorted, not re-encoded."""
    pairs: list[tuple[str, str]] = []
    for part in raw_query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        if exclude and unquote_to_bytes(_utf8(name)).decode("utf-8", "replace") in exclude:
            continue
        pairs.append((name, value))
    pairs.sort()
    return "&".join(f"{name}={value}" for name, value in pairs)


def _canonical_request(
    method: str,
    uri: str,
    query: str,
    headers: Mapping[str, str],
    signed_headers: Sequence[str],
    payload_hash: str,
) -> str:
    # Header values: trimmed, inner runs of whitespace collapsed to one space (as botocore does); a
    # repeated header arrives already joined with ",". A signed header that is absent counts as empty.
    lines = "".join(f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed_headers)
    return f"{method}\n{uri}\n{query}\n{lines}\n{';'.join(signed_headers)}\n{payload_hash}"


def _string_to_sign(amz_date: str, scope: str, canonical_request: str) -> str:
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(_utf8(canonical_request)).hexdigest()}"


# --------------------------------------------------------------------------------------------------
# Small helpers


def _reencode(component: str) -> str:
    return quote_from_bytes(unquote_to_bytes(_utf8(component)), safe="")


def _query_params(raw_query: str) -> list[tuple[str, str]]:
    """Decoded (name, value) pairs, for reading the X-Amz-* parameters. ``+`` stays ``+``."""
    params: list[tuple[str, str]] = []
    if not raw_query:
        return params
    for part in raw_query.split("&"):
        if part:
            name, _, value = part.partition("=")
            params.append((_unquote(name), _unquote(value)))
    return params


def _unquote(text: str) -> str:
    return unquote_to_bytes(_utf8(text)).decode("utf-8", "replace")


def _utf8(text: str) -> bytes:
    """UTF-8 of a string that may carry surrogates (undecodable wire bytes)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _lower_keys(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _hmac_hex(key: bytes, message: str) -> str:
    return hmac.digest(key, _utf8(message), "sha256").hex()  # one-shot: no HMAC object built


def _spaced_hex(text: str) -> str:
    return " ".join(f"{byte:02x}" for byte in _utf8(text))


@functools.lru_cache(maxsize=64)  # strptime is slow and requests within a second share their date
def _amz_date_epoch(amz_date: str) -> float | None:
    """``YYYYMMDDTHHMMSSZ`` -> Unix seconds; ``None`` if malformed or not a real date."""
    if not _AMZ_DATE.fullmatch(amz_date):
        return None
    try:
        parsed = time.strptime(amz_date, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return None
    return float(calendar.timegm(parsed))


def _format_amz_date(now_wall: float) -> str:
    return _format_amz_second(int(now_wall // 1))  # floor, as gmtime() rounds


@functools.lru_cache(maxsize=4)  # strftime costs microseconds and requests within a second share their date
def _format_amz_second(epoch_s: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_s))


def _iso8601(epoch_s: float) -> str:
    try:
        return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(epoch_s)
