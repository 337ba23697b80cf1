"""The client's exception tree.

::

    S3LanesClientError                 base of everything this package raises on purpose
    ├── InvalidS3URI (also ValueError)  not an ``s3://bucket/key`` URI
    ├── RetriesExhausted               a retryable failure (SlowDown, 503, timeout, reset) outlasted the
    │                                  retry policy: too many attempts or the total time bound
    ├── NotDurableError                ``wait_durable`` timed out with data still pending on the gateway
    ├── FlushUnsupported               an s3lanes gateway answered, but without the flush API
    ├── BucketNotFound (also LookupError)  ``wait_durable`` on a bucket the gateway's store does not have
    └── UploadFailed                   a streamed multipart upload failed and was aborted

Errors S3 reports that no retry can fix (``NoSuchKey``, ``AccessDenied``, ...) are *not* wrapped: they are
botocore's own ``ClientError``, raised unchanged at the first attempt, so ``except ClientError`` code written
for boto3 keeps working.
"""

from __future__ import annotations

from s3lanes_client.model import DurabilityStatus
from s3lanes_client.retry import Failure


class S3LanesClientError(Exception):
    """Base of every deliberate error of the client."""


class InvalidS3URI(S3LanesClientError, ValueError):
    """A string that is not an ``s3://bucket[/key]`` URI."""


class RetriesExhausted(S3LanesClientError):
    """The retry policy gave up on an operation whose failures were all retryable.

    ``attempts`` requests were made in ``elapsed_s`` seconds; ``last_failure`` is the last of them (its S3
    code, HTTP status and any ``Retry-After``); the botocore exception is chained as ``__cause__``.
    """

    def __init__(
        self, operation: str, *, attempts: int, elapsed_s: float, last_failure: Failure, reason: str
    ) -> None:
        self.operation = operation
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_failure = last_failure
        self.reason = reason
        super().__init__(
            f"{operation}: gave up after {attempts} attempt(s) in {elapsed_s:.1f}s ({reason}); "
            f"last error: {last_failure.describe()}"
        )


class NotDurableError(S3LanesClientError):
    """``wait_durable`` reached its timeout while the gateway still held data under the prefix that is not on
    the backend yet. ``status`` is the gateway's last answer (pending objects and bytes, oldest age)."""

    def __init__(self, status: DurabilityStatus) -> None:
        self.status = status
        age = status.oldest_pending_age_s
        super().__init__(
            f"s3://{status.bucket}/{status.prefix}: not durable after {status.waited_s:.1f}s: "
            f"{status.pending_objects} object(s), {status.pending_bytes} byte(s) still pending"
            + (f", oldest {age:.1f}s old" if age is not None else "")
        )


class FlushUnsupported(S3LanesClientError):
    """The endpoint is an s3lanes gateway (its responses carry ``x-s3lanes-*`` headers) but it did not answer
    the flush request as one: it predates the durability API, or the request was refused. Durability cannot be
    confirmed, so this is an error rather than a silent "durable"."""


class BucketNotFound(S3LanesClientError, LookupError):
    """``wait_durable`` named a bucket that does not exist on the gateway's backend (and the gateway holds
    nothing for it): there is nothing that could become durable, so this is neither "durable" nor a timeout.
    ``bucket`` is the name asked for; the S3 code is ``NoSuchBucket`` as for any other request."""

    code = "NoSuchBucket"

    def __init__(self, bucket: str, detail: str = "") -> None:
        self.bucket = bucket
        self.detail = detail
        super().__init__(
            f"s3://{bucket}: no such bucket on the gateway's backend (NoSuchBucket): nothing to wait for"
        )


class UploadFailed(S3LanesClientError):
    """A streamed upload (:class:`s3lanes_client.multipart.MultipartWriter`) failed. The multipart upload was
    aborted, so no partial object is left behind; the cause is chained."""
