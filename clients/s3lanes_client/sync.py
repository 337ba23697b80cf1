"""``GatewayClient``: boto3 with lane hints, one retry loop that honours SlowDown/Retry-After within a bounded
time, and ``wait_durable``. Thread-safe (boto3 clients are); create one per process, not per call.

What this is not: a replacement for boto3. ``client.s3`` is the boto3 client itself (hooks installed, botocore
retries off) for anything the helpers below do not cover; ``client.call(name, ...)`` runs any boto3 operation
through the retry loop.
"""

from __future__ import annotations

import io
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import boto3
import botocore.handlers
from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError
from botocore.httpsession import URLLib3Session

from s3lanes_client._failures import failure_from_exception
from s3lanes_client._signing import signed_headers
from s3lanes_client.config import ClientConfig, MiB
from s3lanes_client.durability import (
    POLL_S,
    Pending,
    Transient,
    flush_url,
    interpret,
    poll_timeout_s,
)
from s3lanes_client.errors import NotDurableError, RetriesExhausted
from s3lanes_client.hints import LANE_PARAM, WRITE_THROUGH_PARAM, HintHooks, check_lane
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.multipart import MultipartWriter
from s3lanes_client.reader import ObjectReader
from s3lanes_client.retry import Failure, GiveUp, RetryPolicy, RetryState

T = TypeVar("T")


def range_header(start: int | None, end: int | None) -> str | None:
    """The ``Range`` header for bytes ``[start, end)`` (``end`` exclusive, None = to the end)."""
    if start is None and end is None:
        return None
    first = start or 0
    if end is None:
        return f"bytes={first}-"
    if end <= first:
        raise ValueError(f"empty or negative range [{first}, {end})")
    return f"bytes={first}-{end - 1}"


def hint_params(lane: Any, write_through: bool) -> dict[str, Any]:
    """The extra API parameters the hint hooks turn into headers (``lane=UNSET``: the client default)."""
    params: dict[str, Any] = {}
    if lane is not UNSET:
        params[LANE_PARAM] = check_lane(lane) or ""
    if write_through:
        params[WRITE_THROUGH_PARAM] = True
    return params


class GatewayClient:
    """A synchronous S3 client for s3lanes (or any S3 endpoint).

    ``on_retry`` is called before every retry sleep; ``sleep``, ``clock`` and ``rng`` are injectable so tests
    run the retry loop in virtual time.
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        on_retry: Callable[[RetryEvent], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config if config is not None else ClientConfig.from_env()
        self._on_retry = on_retry
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._session = boto3.session.Session(**self.config.session_kwargs())
        self.s3: Any = self._session.client(
            "s3",
            endpoint_url=self.config.endpoint_url,
            config=self.config.botocore_config(),
            verify=self.config.verify,
        )
        HintHooks(self.config.lane).register(self.s3.meta.events)
        if not self.config.expect_100_continue:
            self.s3.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
        self._http: URLLib3Session | None = None
        self.retries = 0  # retries made by this client (all operations, for metrics and tests)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a GatewayClient holds connections and cannot be pickled; pass its ClientConfig instead "
            "(datasets and checkpoint helpers create their clients lazily in each process)"
        )

    def close(self) -> None:
        self.s3.close()
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the retry loop ----------------------------------------------------------------------------------

    def retrying(
        self,
        what: str,
        attempt: Callable[[], T],
        *,
        policy: RetryPolicy | None = None,
        before_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run ``attempt`` until it succeeds, fails with a non-retryable error (raised unchanged) or the
        policy gives up (:class:`RetriesExhausted`, the last error chained)."""
        state = RetryState(policy or self.config.retry, started_at=self._clock(), rng=self._rng)
        while True:
            try:
                return attempt()
            except Exception as exc:
                failure = failure_from_exception(exc)
                if failure is None:
                    raise
                self._after_failure(what, state, failure, exc)
                if before_retry is not None:
                    before_retry()

    def _after_failure(
        self, what: str, state: RetryState, failure: Failure, exc: BaseException | None
    ) -> None:
        now = self._clock()
        decision = state.on_failure(failure, now)
        if isinstance(decision, GiveUp):
            raise RetriesExhausted(
                what,
                attempts=state.attempts,
                elapsed_s=state.elapsed_s(now),
                last_failure=failure,
                reason=decision.reason,
            ) from exc
        self.retries += 1
        if self._on_retry is not None:
            self._on_retry(RetryEvent(what, decision.attempt, decision.delay_s, failure))
        self._sleep(decision.delay_s)

    # -- operations --------------------------------------------------------------------------------------

    def call(
        self,
        operation: str,
        /,
        *,
        lane: str | None = UNSET,
        write_through: bool = False,
        policy: RetryPolicy | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """Any boto3 S3 operation by its method name (``"put_object"``), retried under the policy.

        ``lane`` overrides the client's hint for this call (``None`` or ``""``: send none). A file-like
        ``Body`` is rewound before each retry; one that cannot seek gets a single attempt.
        """
        method = getattr(self.s3, operation)
        params.update(hint_params(lane, write_through))
        before_retry = None
        body = params.get("Body")
        if body is not None and hasattr(body, "read"):
            if _seekable(body):
                position = body.tell()

                def before_retry() -> None:
                    body.seek(position)
            else:
                policy = RetryPolicy.no_retries()
        result: dict[str, Any] = self.retrying(
            operation, lambda: method(**params), policy=policy, before_retry=before_retry
        )
        return result

    def get_bytes(
        self,
        bucket: str,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        lane: str | None = UNSET,
    ) -> bytes:
        """The object's bytes ``[start, end)`` (the whole object by default). The body is read inside the
        retry loop, so a connection cut mid-body is retried too."""
        if start is not None and end is not None and end == start:
            return b""
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, **hint_params(lane, False)}
        rng = range_header(start, end)
        if rng is not None:
            params["Range"] = rng

        def attempt() -> bytes:
            response = self.s3.get_object(**params)
            with response["Body"] as stream:
                data: bytes = stream.read()
            return data

        return self.retrying(f"get_object s3://{bucket}/{key}", attempt)

    def put_bytes(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        lane: str | None = UNSET,
        write_through: bool = False,
        **params: Any,
    ) -> dict[str, Any]:
        """PutObject of ``data`` (extra boto3 parameters such as ``ContentType`` pass through)."""
        body = data if isinstance(data, bytes) else bytes(data)
        return self.call(
            "put_object", Bucket=bucket, Key=key, Body=body, lane=lane, write_through=write_through, **params
        )

    def head(self, bucket: str, key: str, *, lane: str | None = UNSET) -> ObjectInfo | None:
        """HeadObject; None if there is no such object."""
        try:
            r = self.call("head_object", Bucket=bucket, Key=key, lane=lane)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        return ObjectInfo(key=key, size=int(r["ContentLength"]), etag=str(r.get("ETag", "")).strip('"'))

    def list_objects(
        self, bucket: str, prefix: str = "", *, lane: str | None = UNSET, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` in key order (ListObjectsV2, each page retried on its own)."""
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
            if token:
                params["ContinuationToken"] = token
            page = self.call("list_objects_v2", lane=lane, **params)
            for obj in page.get("Contents", []):
                yield ObjectInfo(
                    key=obj["Key"], size=int(obj["Size"]), etag=str(obj.get("ETag", "")).strip('"')
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, bucket: str, key: str, *, lane: str | None = UNSET) -> None:
        self.call("delete_object", Bucket=bucket, Key=key, lane=lane)

    def open_writer(
        self,
        bucket: str,
        key: str,
        *,
        part_size_bytes: int = 16 * MiB,
        max_inflight_parts: int = 4,
        lane: str | None = "checkpoint",
        write_through: bool = False,
        extra_args: dict[str, Any] | None = None,
    ) -> MultipartWriter:
        """A write-only stream that uploads as it goes (parallel multipart, bounded memory); see
        :class:`s3lanes_client.multipart.MultipartWriter`. ``close()`` commits, ``abort()`` or an exception in
        a ``with`` block leaves nothing."""
        return MultipartWriter(
            self,
            bucket,
            key,
            part_size_bytes=part_size_bytes,
            max_inflight_parts=max_inflight_parts,
            lane=lane,
            write_through=write_through,
            extra_args=extra_args,
        )

    def open_reader(
        self,
        bucket: str,
        key: str,
        *,
        lane: str | None = "restore",
        block_bytes: int = 8 * MiB,
        size: int | None = None,
        start: int = 0,
        end: int | None = None,
    ) -> ObjectReader:
        """A seekable read-only stream over one object (or its bytes ``[start, end)``), fetched lazily with
        ranged GETs of ``block_bytes``; see :class:`s3lanes_client.reader.ObjectReader`."""
        return ObjectReader(
            self, bucket, key, lane=lane, block_bytes=block_bytes, size=size, start=start, end=end
        )

    # -- durability --------------------------------------------------------------------------------------

    def wait_durable(
        self, bucket: str, prefix: str = "", timeout_s: float = 300.0, *, raise_on_timeout: bool = True
    ) -> DurabilityStatus:
        """Block until every object the gateway acknowledged under ``s3://bucket/prefix`` is on the backend.

        Against plain S3 (no gateway answers the flush API) this returns at once with ``gateway=False``.
        When ``timeout_s`` passes first: :class:`NotDurableError` (or, with ``raise_on_timeout=False``, the
        last status with ``durable=False``). Transient failures of the flush request itself are retried with
        the client's backoff, within the same ``timeout_s``.
        """
        if self.config.endpoint_url is None:  # AWS S3 itself: nothing stands between us and the store
            return DurabilityStatus(durable=True, bucket=bucket, prefix=prefix, gateway=False)
        started = self._clock()
        deadline = started + timeout_s
        state = RetryState(replace(self.config.retry, total_timeout_s=timeout_s), started, rng=self._rng)
        last: DurabilityStatus | None = None
        while True:
            wait_s = poll_timeout_s(deadline - self._clock())
            try:
                outcome = self._flush_once(bucket, prefix, wait_s)
            except Exception as exc:
                failure = failure_from_exception(exc)
                if failure is None:
                    raise
                self._after_failure(f"flush s3://{bucket}/{prefix}", state, failure, exc)
                continue
            if isinstance(outcome, DurabilityStatus):
                return replace(outcome, waited_s=self._clock() - started)
            if isinstance(outcome, Transient):
                self._after_failure(f"flush s3://{bucket}/{prefix}", state, outcome.failure, None)
                continue
            assert isinstance(outcome, Pending)
            last = outcome.status
            now = self._clock()
            if now >= deadline or (wait_s == 0 and deadline - now < 0.05):
                break
            if wait_s == 0:  # under a second left: the gateway answered at once, do not spin
                self._sleep(min(0.25, deadline - now))
        status = replace(last, waited_s=self._clock() - started)
        if raise_on_timeout:
            raise NotDurableError(status)
        return status

    def _flush_once(self, bucket: str, prefix: str, wait_s: int) -> DurabilityStatus | Pending | Transient:
        assert self.config.endpoint_url is not None
        url = flush_url(self.config.endpoint_url, bucket, prefix, wait_s)
        credentials = self._session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials is not None else None
        headers = signed_headers("POST", url, frozen, self.config.region)
        if self._http is None:
            self._http = URLLib3Session(
                verify=self.config.verify,
                timeout=(self.config.connect_timeout_s, POLL_S + self.config.read_timeout_s),
                max_pool_connections=4,
            )
        response = self._http.send(AWSRequest(method="POST", url=url, data=b"", headers=headers).prepare())
        return interpret(
            response.status_code,
            {str(k).lower(): str(v) for k, v in response.headers.items()},
            response.content,
            bucket=bucket,
            prefix=prefix,
        )


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable()) if hasattr(stream, "seekable") else isinstance(stream, io.IOBase)
    except (OSError, ValueError):
        return False
