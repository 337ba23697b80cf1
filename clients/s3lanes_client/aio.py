"""``AsyncGatewayClient``: the asyncio twin of :class:`s3lanes_client.sync.GatewayClient`, on aioboto3.

Same hints, same retry policy (the loop sleeps with ``asyncio.sleep``), same ``wait_durable``. Use it as an
async context manager; it owns its aiobotocore client and, once ``wait_durable`` is called, one small aiohttp
client session for the gateway's flush API.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import aioboto3
import aiohttp
import botocore.handlers
from botocore.exceptions import ClientError

from s3lanes_client._failures import failure_from_exception
from s3lanes_client._signing import signed_headers
from s3lanes_client.config import ClientConfig
from s3lanes_client.durability import (
    POLL_S,
    Pending,
    Transient,
    flush_url,
    interpret,
    poll_timeout_s,
)
from s3lanes_client.errors import NotDurableError, RetriesExhausted
from s3lanes_client.hints import HintHooks
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.retry import Failure, GiveUp, RetryPolicy, RetryState
from s3lanes_client.sync import hint_params, range_header

T = TypeVar("T")


class AsyncGatewayClient:
    """``async with AsyncGatewayClient(config) as client: await client.get_bytes(...)``."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        on_retry: Callable[[RetryEvent], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config if config is not None else ClientConfig.from_env()
        self._on_retry = on_retry
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._session = aioboto3.Session(**self.config.session_kwargs())
        self._client_cm: Any = None
        self._s3: Any = None
        self._http: aiohttp.ClientSession | None = None
        self.retries = 0

    @property
    def s3(self) -> Any:
        """The aiobotocore S3 client (hooks installed, botocore retries off)."""
        if self._s3 is None:
            raise RuntimeError("use AsyncGatewayClient as 'async with AsyncGatewayClient(...) as client'")
        return self._s3

    async def __aenter__(self) -> AsyncGatewayClient:
        self._client_cm = self._session.client(
            "s3",
            endpoint_url=self.config.endpoint_url,
            config=self.config.botocore_config(),
            verify=self.config.verify,
        )
        s3 = await self._client_cm.__aenter__()
        HintHooks(self.config.lane).register(s3.meta.events)
        if not self.config.expect_100_continue:
            s3.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
        self._s3 = s3
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            if self._client_cm is not None:
                cm, self._client_cm, self._s3 = self._client_cm, None, None
                await cm.__aexit__(None, None, None)
        finally:
            if self._http is not None:
                http, self._http = self._http, None
                await http.close()

    # -- the retry loop ----------------------------------------------------------------------------------

    async def retrying(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        policy: RetryPolicy | None = None,
        before_retry: Callable[[], None] | None = None,
    ) -> T:
        state = RetryState(policy or self.config.retry, started_at=self._clock(), rng=self._rng)
        while True:
            try:
                return await attempt()
            except Exception as exc:
                failure = failure_from_exception(exc)
                if failure is None:
                    raise
                await self._after_failure(what, state, failure, exc)
                if before_retry is not None:
                    before_retry()

    async def _after_failure(
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
        await self._sleep(decision.delay_s)

    # -- operations --------------------------------------------------------------------------------------

    async def call(
        self,
        operation: str,
        /,
        *,
        lane: str | None = UNSET,
        write_through: bool = False,
        policy: RetryPolicy | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """Any S3 operation by its method name, retried under the policy (see ``GatewayClient.call``)."""
        method = getattr(self.s3, operation)
        params.update(hint_params(lane, write_through))
        body = params.get("Body")
        before_retry = None
        if body is not None and hasattr(body, "read"):
            if hasattr(body, "seek") and hasattr(body, "tell"):
                position = body.tell()

                def before_retry() -> None:
                    body.seek(position)
            else:
                policy = RetryPolicy.no_retries()

        async def attempt() -> dict[str, Any]:
            result: dict[str, Any] = await method(**params)
            return result

        return await self.retrying(operation, attempt, policy=policy, before_retry=before_retry)

    async def get_bytes(
        self,
        bucket: str,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        lane: str | None = UNSET,
    ) -> bytes:
        """Bytes ``[start, end)`` of the object (all by default), the body read inside the retry loop."""
        if start is not None and end is not None and end == start:
            return b""
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, **hint_params(lane, False)}
        rng = range_header(start, end)
        if rng is not None:
            params["Range"] = rng

        async def attempt() -> bytes:
            response = await self.s3.get_object(**params)
            async with response["Body"] as stream:
                data: bytes = await stream.read()
            return data

        return await self.retrying(f"get_object s3://{bucket}/{key}", attempt)

    async def put_bytes(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        lane: str | None = UNSET,
        write_through: bool = False,
        **params: Any,
    ) -> dict[str, Any]:
        body = data if isinstance(data, bytes) else bytes(data)
        return await self.call(
            "put_object", Bucket=bucket, Key=key, Body=body, lane=lane, write_through=write_through, **params
        )

    async def head(self, bucket: str, key: str, *, lane: str | None = UNSET) -> ObjectInfo | None:
        try:
            r = await self.call("head_object", Bucket=bucket, Key=key, lane=lane)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        return ObjectInfo(key=key, size=int(r["ContentLength"]), etag=str(r.get("ETag", "")).strip('"'))

    async def list_objects(
        self, bucket: str, prefix: str = "", *, lane: str | None = UNSET, page_size: int = 1000
    ) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
            if token:
                params["ContinuationToken"] = token
            page = await self.call("list_objects_v2", lane=lane, **params)
            for obj in page.get("Contents", []):
                yield ObjectInfo(
                    key=obj["Key"], size=int(obj["Size"]), etag=str(obj.get("ETag", "")).strip('"')
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    async def delete(self, bucket: str, key: str, *, lane: str | None = UNSET) -> None:
        await self.call("delete_object", Bucket=bucket, Key=key, lane=lane)

    # -- durability --------------------------------------------------------------------------------------

    async def wait_durable(
        self, bucket: str, prefix: str = "", timeout_s: float = 300.0, *, raise_on_timeout: bool = True
    ) -> DurabilityStatus:
        """See :meth:`s3lanes_client.sync.GatewayClient.wait_durable`."""
        if self.config.endpoint_url is None:
            return DurabilityStatus(durable=True, bucket=bucket, prefix=prefix, gateway=False)
        started = self._clock()
        deadline = started + timeout_s
        state = RetryState(replace(self.config.retry, total_timeout_s=timeout_s), started, rng=self._rng)
        what = f"flush s3://{bucket}/{prefix}"
        last: DurabilityStatus | None = None
        while True:
            wait_s = poll_timeout_s(deadline - self._clock())
            try:
                outcome = await self._flush_once(bucket, prefix, wait_s)
            except Exception as exc:
                failure = failure_from_exception(exc)
                if failure is None:
                    raise
                await self._after_failure(what, state, failure, exc)
                continue
            if isinstance(outcome, DurabilityStatus):
                return replace(outcome, waited_s=self._clock() - started)
            if isinstance(outcome, Transient):
                await self._after_failure(what, state, outcome.failure, None)
                continue
            assert isinstance(outcome, Pending)
            last = outcome.status
            now = self._clock()
            if now >= deadline or (wait_s == 0 and deadline - now < 0.05):
                break
            if wait_s == 0:
                await self._sleep(min(0.25, deadline - now))
        status = replace(last, waited_s=self._clock() - started)
        if raise_on_timeout:
            raise NotDurableError(status)
        return status

    async def _flush_once(
        self, bucket: str, prefix: str, wait_s: int
    ) -> DurabilityStatus | Pending | Transient:
        assert self.config.endpoint_url is not None
        url = flush_url(self.config.endpoint_url, bucket, prefix, wait_s)
        credentials = await self._session.get_credentials()
        frozen = await credentials.get_frozen_credentials() if credentials is not None else None
        headers = signed_headers("POST", url, frozen, self.config.region)
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.config.connect_timeout_s,
                    sock_read=POLL_S + self.config.read_timeout_s,
                ),
            )
        async with self._http.post(
            url,
            data=b"",
            headers=headers,
            ssl=_ssl_arg(self.config.verify),
            skip_auto_headers=("Content-Type",),
        ) as response:
            body = await response.read()
            return interpret(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                body,
                bucket=bucket,
                prefix=prefix,
            )


def _ssl_arg(verify: bool | str) -> ssl.SSLContext | bool:
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return bool(verify)
