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
from typing import Any, TypeVar

import aioboto3
import aiohttp
from botocore.exceptions import ClientError

from s3lanes_client._core import ClientCore, Listing, Pause, get_params, head_info, is_not_found, plan_call
from s3lanes_client._signing import signed_headers
from s3lanes_client.config import ClientConfig
from s3lanes_client.durability import POLL_S, Pending, Transient, flush_url, interpret
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.retry import RetryPolicy

T = TypeVar("T")


class AsyncGatewayClient(ClientCore):
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
        super().__init__(config, on_retry, clock, rng)
        self._sleep = sleep
        self._session = aioboto3.Session(**self.config.session_kwargs())
        self._client_cm: Any = None
        self._s3: Any = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def s3(self) -> Any:
        """The aiobotocore S3 client (hooks installed, botocore retries off)."""
        if self._s3 is None:
            raise RuntimeError("use AsyncGatewayClient as 'async with AsyncGatewayClient(...) as client'")
        return self._s3

    async def __aenter__(self) -> AsyncGatewayClient:
        self._client_cm = self._session.client("s3", **self._s3_client_kwargs())
        s3 = await self._client_cm.__aenter__()
        self._install_hooks(s3.meta.events)
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
        attempts = self._attempts(what, policy)
        while True:
            try:
                return await attempt()
            except Exception as exc:
                await self._pause(attempts.failed(exc, self._clock()))
                if before_retry is not None:
                    before_retry()

    async def _pause(self, pause: Pause) -> None:
        delay_s = self._delay_s(pause)
        if delay_s > 0:
            await self._sleep(delay_s)

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
        plan = plan_call(params, lane=lane, write_through=write_through, policy=policy)

        async def attempt() -> dict[str, Any]:
            result: dict[str, Any] = await method(**plan.params)
            return result

        return await self.retrying(operation, attempt, policy=plan.policy, before_retry=plan.before_retry)

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
        params = get_params(bucket, key, start=start, end=end, lane=lane)
        if params is None:
            return b""

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
            if is_not_found(exc):
                return None
            raise
        return head_info(key, r)

    async def list_objects(
        self, bucket: str, prefix: str = "", *, lane: str | None = UNSET, page_size: int = 1000
    ) -> AsyncIterator[ObjectInfo]:
        listing = Listing(bucket, prefix, page_size)
        while (params := listing.next_params()) is not None:
            for info in listing.objects(await self.call("list_objects_v2", lane=lane, **params)):
                yield info

    async def delete(self, bucket: str, key: str, *, lane: str | None = UNSET) -> None:
        await self.call("delete_object", Bucket=bucket, Key=key, lane=lane)

    # -- durability --------------------------------------------------------------------------------------

    async def wait_durable(
        self, bucket: str, prefix: str = "", timeout_s: float = 300.0, *, raise_on_timeout: bool = True
    ) -> DurabilityStatus:
        """See :meth:`s3lanes_client.sync.GatewayClient.wait_durable`."""
        wait = self._flush_wait(bucket, prefix, timeout_s, raise_on_timeout)
        while wait.status is None:
            try:
                outcome = await self._flush_once(bucket, prefix, wait.request_timeout_s(self._clock()))
            except Exception as exc:
                await self._pause(wait.failed(exc, self._clock()))
            else:
                await self._pause(wait.answered(outcome, self._clock()))
        return wait.status

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
