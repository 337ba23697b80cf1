"""``GatewayClient``: boto3 with lane hints, one retry loop that honours SlowDown/Retry-After within a bounded
time, and ``wait_durable``. Thread-safe (boto3 clients are); create one per process, not per call.

What this is not: a replacement for boto3. ``client.s3`` is the boto3 client itself (hooks installed, botocore
retries off) for anything the helpers below do not cover; ``client.call(name, ...)`` runs any boto3 operation
through the retry loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import boto3
from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError
from botocore.httpsession import URLLib3Session

from s3lanes_client._core import ClientCore, Listing, Pause, get_params, head_info, is_not_found, plan_call
from s3lanes_client._core import hint_params as hint_params  # re-exported: imported from here too
from s3lanes_client._core import range_header as range_header
from s3lanes_client._signing import signed_headers
from s3lanes_client.config import ClientConfig, MiB
from s3lanes_client.durability import POLL_S, Pending, Transient, flush_url, interpret
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.multipart import MultipartWriter
from s3lanes_client.reader import ObjectReader
from s3lanes_client.retry import RetryPolicy

T = TypeVar("T")


class GatewayClient(ClientCore):
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
        super().__init__(config, on_retry, clock, rng)
        self._sleep = sleep
        self._session = boto3.session.Session(**self.config.session_kwargs())
        self.s3: Any = self._session.client("s3", **self._s3_client_kwargs())
        self._install_hooks(self.s3.meta.events)
        self._http: URLLib3Session | None = None

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
        attempts = self._attempts(what, policy)
        while True:
            try:
                return attempt()
            except Exception as exc:
                self._pause(attempts.failed(exc, self._clock()))
                if before_retry is not None:
                    before_retry()

    def _pause(self, pause: Pause) -> None:
        delay_s = self._delay_s(pause)
        if delay_s > 0:
            self._sleep(delay_s)

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
        plan = plan_call(params, lane=lane, write_through=write_through, policy=policy)
        result: dict[str, Any] = self.retrying(
            operation, lambda: method(**plan.params), policy=plan.policy, before_retry=plan.before_retry
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
        params = get_params(bucket, key, start=start, end=end, lane=lane)
        if params is None:
            return b""

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
            if is_not_found(exc):
                return None
            raise
        return head_info(key, r)

    def list_objects(
        self, bucket: str, prefix: str = "", *, lane: str | None = UNSET, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` in key order (ListObjectsV2, each page retried on its own)."""
        listing = Listing(bucket, prefix, page_size)
        while (params := listing.next_params()) is not None:
            yield from listing.objects(self.call("list_objects_v2", lane=lane, **params))

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
        wait = self._flush_wait(bucket, prefix, timeout_s, raise_on_timeout)
        while wait.status is None:
            try:
                outcome = self._flush_once(bucket, prefix, wait.request_timeout_s(self._clock()))
            except Exception as exc:
                self._pause(wait.failed(exc, self._clock()))
            else:
                self._pause(wait.answered(outcome, self._clock()))
        return wait.status

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
