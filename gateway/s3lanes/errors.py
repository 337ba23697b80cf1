"""The gateway's exception tree. Every error a client sees is an :class:`S3Error` with S3's code and status.

::

    GatewayError                       base of everything the gateway raises on purpose
    ├── ConfigError                    bad configuration, reported once at start
    ├── StartupError                   the gateway cannot start (port in use, unreadable TLS key, no
    │                                  backend credentials): one line on stderr, exit code 2
    └── S3Error(code, status, msg)     rendered as S3 error XML in exactly one place (s3lanes.http.s3xml)
        ├── AuthError                  403 family: signature, key, expiry, skew
        │   ├── SignatureDoesNotMatch
        │   ├── InvalidAccessKeyId
        │   ├── AccessDenied
        │   └── RequestTimeTooSkewed
        ├── BodyError                  the body disagrees with what the request promised (400)
        │   ├── XAmzContentSHA256Mismatch
        │   ├── BadDigest              Content-MD5 or x-amz-checksum-* mismatch
        │   ├── InvalidDigest          Content-MD5 / checksum header that is not well formed
        │   ├── IncompleteBody         fewer bytes than Content-Length / decoded length, or bad framing
        │   ├── InvalidChunkSizeError
        │   └── MalformedTrailerError  aws-chunked trailer section missing, unannounced or not well formed
        ├── InvalidRequest, InvalidArgument, AuthorizationHeaderMalformed, AuthorizationQueryParametersError,
        │   MissingContentLength, MissingSecurityHeader, InvalidBucketName, InvalidURI, MethodNotAllowed,
        │   EntityTooLarge, RequestHeaderSectionTooLarge, NotImplemented (501), NoSuchKey, NoSuchBucket, ...
        ├── ServiceUnavailable / SlowDown  (503) and GatewayTimeout (504): backend unreachable or too slow
        └── InternalError              (500) only for bugs; the traceback is logged

Anything else that escapes a handler is a bug: it is logged with its traceback and answered 500 InternalError.
Cores raise these directly (they are plain data, no I/O), so the HTTP layer only has to render them.
"""

from __future__ import annotations

from typing import TypeVar, overload


class GatewayError(Exception):
    """Base of every deliberate gateway error."""


class ConfigError(GatewayError):
    """The configuration is invalid. The message names every problem found, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class StartupError(GatewayError):
    """The gateway cannot start as configured; the message is one line that says what to fix."""


class S3Error(GatewayError):
    """An error a client sees as S3 error XML."""

    code: str = "InternalError"
    status: int = 500
    default_message: str = "We encountered an internal error. Please try again."

    def __init__(self, message: str | None = None, **extra: str) -> None:
        self.message = message or self.default_message
        # Extra elements rendered into the <Error> document (e.g. StringToSign, MaxSizeAllowed).
        self.extra = extra
        super().__init__(f"{self.code}: {self.message}")

    @property
    def retry_after_s(self) -> int | None:
        return None


_E = TypeVar("_E", bound=S3Error)


@overload
def _error(code: str, status: int, message: str) -> type[S3Error]: ...
@overload
def _error(code: str, status: int, message: str, base: type[_E]) -> type[_E]: ...
def _error(code: str, status: int, message: str, base: type[S3Error] = S3Error) -> type[S3Error]:
    """An error class that differs from its base only by its code, status and default message."""
    return type(code, (base,), {"code": code, "status": status, "default_message": message})


class AuthError(S3Error):
    status = 403


SignatureDoesNotMatch = _error(
    "SignatureDoesNotMatch",
    403,
    "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method.",
    AuthError,
)
InvalidAccessKeyId = _error(
    "InvalidAccessKeyId", 403, "The AWS Access Key Id you provided does not exist in our records.", AuthError
)
AccessDenied = _error("AccessDenied", 403, "Access Denied", AuthError)
RequestTimeTooSkewed = _error(
    "RequestTimeTooSkewed",
    403,
    "The difference between the request time and the current time is too large.",
    AuthError,
)


class BodyError(S3Error):
    status = 400


XAmzContentSHA256Mismatch = _error(
    "XAmzContentSHA256Mismatch",
    400,
    "The provided 'x-amz-content-sha256' header does not match what was computed.",
    BodyError,
)
BadDigest = _error(
    "BadDigest",
    400,
    "The Content-MD5 or checksum value that you specified did not match what the server received.",
    BodyError,
)
InvalidDigest = _error(
    "InvalidDigest", 400, "The Content-MD5 or checksum value that you specified is not valid.", BodyError
)
IncompleteBody = _error(
    "IncompleteBody",
    400,
    "You did not provide the number of bytes specified by the Content-Length HTTP header.",
    BodyError,
)
InvalidChunkSizeError = _error(
    "InvalidChunkSizeError",
    400,
    "Only the last chunk is allowed to have a size less than 8192 bytes.",
    BodyError,
)
MalformedTrailerError = _error(
    "MalformedTrailerError",
    400,
    "The request contained trailing data that was not well-formed "
    "or did not conform to our published schema.",
    BodyError,
)

InvalidRequest = _error("InvalidRequest", 400, "Invalid Request")
InvalidArgument = _error("InvalidArgument", 400, "Invalid Argument")
AuthorizationHeaderMalformed = _error(
    "AuthorizationHeaderMalformed", 400, "The authorization header that you provided is not valid."
)
AuthorizationQueryParametersError = _error(
    "AuthorizationQueryParametersError", 400, "Error parsing the X-Amz-Credential parameter."
)
MissingContentLength = _error("MissingContentLength", 411, "You must provide the Content-Length HTTP header.")
MissingSecurityHeader = _error("MissingSecurityHeader", 400, "Your request is missing a required header.")
InvalidBucketName = _error("InvalidBucketName", 400, "The specified bucket is not valid.")
InvalidURI = _error("InvalidURI", 400, "Couldn't parse the specified URI.")
MethodNotAllowed = _error(
    "MethodNotAllowed", 405, "The specified method is not allowed against this resource."
)
EntityTooLarge = _error(
    "EntityTooLarge", 400, "Your proposed upload exceeds the maximum allowed object size."
)
RequestHeaderSectionTooLarge = _error(
    "RequestHeaderSectionTooLarge", 400, "Your request header section exceeds the maximum allowed size."
)
NotImplementedS3 = _error(
    "NotImplemented", 501, "A header you provided implies functionality that is not implemented."
)
InternalError = _error("InternalError", 500, "We encountered an internal error. Please try again.")
NoSuchKey = _error("NoSuchKey", 404, "The specified key does not exist.")
NoSuchBucket = _error("NoSuchBucket", 404, "The specified bucket does not exist.")
NoSuchUpload = _error(
    "NoSuchUpload",
    404,
    "The specified multipart upload does not exist. The upload ID might not be valid, or the multipart upload"
    " might have been aborted or completed.",
)
PreconditionFailed = _error(
    "PreconditionFailed", 412, "At least one of the pre-conditions you specified did not hold"
)
InvalidRange = _error("InvalidRange", 416, "The requested range is not satisfiable")
InvalidPart = _error(
    "InvalidPart",
    400,
    "One or more of the specified parts could not be found. The part might not have been uploaded, or the"
    " specified entity tag might not have matched the part's entity tag.",
)
InvalidPartOrder = _error(
    "InvalidPartOrder",
    400,
    "The list of parts was not in ascending order. Parts must be ordered by part number.",
)
EntityTooSmall = _error(
    "EntityTooSmall", 400, "Your proposed upload is smaller than the minimum allowed object size."
)
MalformedXML = _error(
    "MalformedXML",
    400,
    "The XML you provided was not well-formed or did not validate against our published schema.",
)


class ServiceUnavailable(S3Error):
    code = "ServiceUnavailable"
    status = 503
    default_message = "The backend storage service is unavailable. Please retry."

    def __init__(self, message: str | None = None, retry_after_s: int = 1, **extra: str) -> None:
        super().__init__(message, **extra)
        self._retry_after_s = retry_after_s

    @property
    def retry_after_s(self) -> int | None:
        return self._retry_after_s


class SlowDown(ServiceUnavailable):
    code = "SlowDown"
    default_message = "Please reduce your request rate."


class GatewayTimeout(S3Error):
    code = "GatewayTimeout"
    status = 504
    default_message = "The backend storage service did not answer in time."
