"""Exceptions from botocore/aiobotocore (and aiohttp underneath it) -> :class:`s3lanes_client.retry.Failure`,
or None for an error no retry can fix. No I/O; the one place that knows which errors are transient."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import (
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    ResponseStreamingError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from s3lanes_client.retry import Failure, parse_retry_after

# S3 and AWS-wide error codes that mean "try again later" (the throttling and transient sets of botocore's
# standard retry mode, plus S3's own SlowDown).
RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
        "ProvisionedThroughputExceededException",
        "EC2ThrottledException",
        "TransactionInProgressException",
    }
)
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


def failure_from_exception(exc: BaseException) -> Failure | None:
    """The retryable failure ``exc`` stands for, or None if retrying cannot help (``NoSuchKey``, a bad
    signature, a programming error)."""
    if isinstance(exc, ClientError):
        return _failure_from_client_error(exc)
    if isinstance(exc, SSLError):  # a certificate problem does not go away by trying again
        return None
    if isinstance(exc, BotoConnectionError | HTTPClientError | ResponseStreamingError | IncompleteReadError):
        # Connection refused/reset/closed, connect and read timeouts, a body cut short.
        return Failure(code=type(exc).__name__, message=str(exc))
    if isinstance(exc, ConnectionError | TimeoutError):
        return Failure(code=type(exc).__name__, message=str(exc) or type(exc).__name__)
    aiohttp = sys.modules.get("aiohttp")  # only the async client can raise these, and it imports aiohttp
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return Failure(code=type(exc).__name__, message=str(exc))
    return None


def _failure_from_client_error(exc: ClientError) -> Failure | None:
    response: Mapping[str, Any] = exc.response or {}
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = str(error.get("Code") or "")
    status = meta.get("HTTPStatusCode")
    status = int(status) if status is not None else None
    if code not in RETRYABLE_CODES and status not in RETRYABLE_STATUSES:
        return None
    headers = {str(k).lower(): str(v) for k, v in (meta.get("HTTPHeaders") or {}).items()}
    return Failure(
        code=code or f"HTTP{status}",
        status=status,
        retry_after_s=parse_retry_after(headers.get("retry-after")),
        message=str(error.get("Message") or ""),
    )
