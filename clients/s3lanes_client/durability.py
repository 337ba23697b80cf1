"""``wait_durable``: the request to the gateway's flush API and the reading of its answer. Pure: the clients
send the request and sleep; this module only builds URLs and interprets responses.

The gateway acknowledges checkpoint-lane writes once they are durable on its local disk and uploads them to
the backend later. ``POST /_s3lanes/flush?bucket=B&prefix=P&timeout=S`` (SigV4-signed like any S3 request)
waits up to ``S`` seconds for everything spooled under the prefix to reach the backend and answers JSON with
the header ``x-s3lanes-flush: 1``: 200 when durable, 504 when the timeout expired with data still pending.

A long wait is split into polls of at most ``POLL_S`` seconds each, so no single HTTP request outlives an idle
timeout somewhere on the path, and a gateway that caps the timeout it grants still gets asked again until the
caller's deadline.

How an answer is read (:func:`interpret`):

* ``x-s3lanes-flush`` present: the gateway's JSON, 200 -> durable, 504 -> still pending (poll again),
  404 -> the bucket does not exist on the backend and nothing of it is pending ->
  :class:`~s3lanes_client.errors.BucketNotFound`.
* absent, with a retryable status (429/5xx): a transient failure, retried under the client's retry policy.
* absent, but other ``x-s3lanes-*`` headers present: an s3lanes gateway without the flush API ->
  :class:`~s3lanes_client.errors.FlushUnsupported` (durability cannot be confirmed, so we do not pretend).
* absent otherwise: plain S3, where an acknowledged write is already durable -> durable at once, with
  ``gateway=False``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from s3lanes_client._failures import RETRYABLE_STATUSES
from s3lanes_client.errors import BucketNotFound, FlushUnsupported
from s3lanes_client.model import DurabilityStatus
from s3lanes_client.retry import Failure, parse_retry_after

FLUSH_PATH = "/_s3lanes/flush"
FLUSH_HEADER = "x-s3lanes-flush"
GATEWAY_HEADER_PREFIX = "x-s3lanes-"
POLL_S = 60  # longest single flush request; longer waits poll again
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@dataclass(frozen=True, slots=True)
class Pending:
    """The poll timed out with data still pending; ask again if time is left."""

    status: DurabilityStatus


@dataclass(frozen=True, slots=True)
class Transient:
    """A retryable failure of the flush request itself (503 SlowDown, 500, ...)."""

    failure: Failure


FlushOutcome = DurabilityStatus | Pending | Transient


def flush_url(endpoint_url: str, bucket: str, prefix: str, timeout_s: int) -> str:
    query = urlencode(
        {"bucket": bucket, "prefix": prefix, "timeout": str(timeout_s)}, quote_via=quote, safe=""
    )
    return f"{endpoint_url.rstrip('/')}{FLUSH_PATH}?{query}"


def poll_timeout_s(remaining_s: float) -> int:
    """The ``timeout`` of the next poll: whole seconds, at most :data:`POLL_S`, 0 = answer at once."""
    return max(0, min(POLL_S, int(remaining_s)))


def interpret(
    status: int, headers: Mapping[str, str], body: bytes, *, bucket: str, prefix: str
) -> FlushOutcome:
    """Read one flush response (``headers`` with lower-case names)."""
    if FLUSH_HEADER not in headers:
        if status in RETRYABLE_STATUSES:
            return Transient(
                Failure(
                    code=_error_code(body) or f"HTTP{status}",
                    status=status,
                    retry_after_s=parse_retry_after(headers.get("retry-after")),
                    message="flush request",
                )
            )
        if any(name.startswith(GATEWAY_HEADER_PREFIX) for name in headers):
            raise FlushUnsupported(
                f"the s3lanes gateway answered the flush request with HTTP {status} and without "
                f"{FLUSH_HEADER}: it has no durability API, or refused the request ({_snippet(body)})"
            )
        return DurabilityStatus(durable=True, bucket=bucket, prefix=prefix, gateway=False)
    if status == 404:
        raise BucketNotFound(bucket, _not_found_detail(body))
    if status not in (200, 504):
        if status in RETRYABLE_STATUSES:
            return Transient(
                Failure(
                    code=f"HTTP{status}",
                    status=status,
                    retry_after_s=parse_retry_after(headers.get("retry-after")),
                    message=_snippet(body),
                )
            )
        raise FlushUnsupported(f"the gateway refused the flush request: HTTP {status}: {_snippet(body)}")
    doc = _parse_json(body)
    result = DurabilityStatus(
        durable=bool(doc.get("durable")) and status == 200,
        bucket=str(doc.get("bucket", bucket)),
        prefix=str(doc.get("prefix", prefix)),
        gateway=True,
        pending_objects=int(doc.get("pending_objects") or 0),
        pending_bytes=int(doc.get("pending_bytes") or 0),
        oldest_pending_age_s=_opt_float(doc.get("oldest_pending_age_s")),
        waited_s=float(doc.get("waited_s") or 0.0),
    )
    return result if result.durable else Pending(result)


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        raise FlushUnsupported(f"the gateway's flush answer is not a JSON object: {_snippet(body)}")
    return doc


def _not_found_detail(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    return str(error) if error else ""


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _error_code(body: bytes) -> str | None:
    start, end = body.find(b"<Code>"), body.find(b"</Code>")
    if 0 <= start < end:
        return body[start + len(b"<Code>") : end].decode("utf-8", "replace")
    return None


def _snippet(body: bytes, limit: int = 300) -> str:
    text = body[:limit].decode("utf-8", "replace").strip()
    return text or "empty body"
