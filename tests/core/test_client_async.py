"""``AsyncGatewayClient``'s retry loop and flush polling in virtual time (aiobotocore's stubber, no
network)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aiobotocore.stub import AioStubber  # type: ignore[import-untyped]
from botocore.exceptions import ClientError

from s3lanes_client import (
    AsyncGatewayClient,
    ClientConfig,
    NotDurableError,
    RetriesExhausted,
    RetryEvent,
    RetryPolicy,
)
from s3lanes_client.durability import Pending
from s3lanes_client.model import DurabilityStatus
from tests.core.test_client_core import Pipe


class FakeTime:
    def __init__(self) -> None:
        self.now = 50.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_client(fake: FakeTime, events: list[RetryEvent], **config: Any) -> AsyncGatewayClient:
    return AsyncGatewayClient(
        ClientConfig(endpoint_url="http://127.0.0.1:9", access_key="AK", secret_key="SK", **config),
        on_retry=events.append,
        sleep=fake.sleep,
        clock=fake.clock,
        rng=random.Random(3),
    )


def add_slowdown(stubber: AioStubber, method: str) -> None:
    stubber.add_client_error(
        method,
        service_error_code="SlowDown",
        http_status_code=503,
        response_meta={"HTTPHeaders": {"retry-after": "2"}},
    )


async def test_async_client_honours_retry_after_then_succeeds() -> None:
    fake, events = FakeTime(), list[RetryEvent]()
    async with make_client(fake, events) as client:
        with AioStubber(client.s3) as stubber:
            add_slowdown(stubber, "put_object")
            stubber.add_response("put_object", {"ETag": '"e"'})
            result = await client.put_bytes("b", "k", b"x", lane="checkpoint")
    assert result["ETag"] == '"e"'
    assert len(fake.sleeps) == 1 and 2.0 <= fake.sleeps[0] <= 2.4
    assert [(e.attempt, e.failure.code) for e in events] == [(2, "SlowDown")]


async def test_async_client_gives_up_within_the_bound() -> None:
    fake, events = FakeTime(), list[RetryEvent]()
    async with make_client(fake, events, retry=RetryPolicy(total_timeout_s=5.0)) as client:
        with AioStubber(client.s3) as stubber:
            for _ in range(5):
                add_slowdown(stubber, "put_object")
            with pytest.raises(RetriesExhausted) as info:
                await client.put_bytes("b", "k", b"x")
    assert info.value.last_failure.code == "SlowDown"
    assert sum(fake.sleeps) <= 5.0 and info.value.attempts == 3  # 2 + 2.x s of waits fit, a third does not


async def test_async_client_raises_permanent_errors_unwrapped() -> None:
    fake, events = FakeTime(), list[RetryEvent]()
    async with make_client(fake, events) as client:
        with AioStubber(client.s3) as stubber:
            stubber.add_client_error("head_object", service_error_code="403", http_status_code=403)
            with pytest.raises(ClientError):
                await client.head("b", "k")
    assert fake.sleeps == [] and events == []


async def test_async_wait_durable_polls_then_raises_at_the_deadline() -> None:
    fake, events = FakeTime(), list[RetryEvent]()
    async with make_client(fake, events) as client:
        asked: list[int] = []
        durable_at_poll = 2

        async def flush_once(bucket: str, prefix: str, wait_s: int) -> Any:
            asked.append(wait_s)
            fake.now += wait_s
            if len(asked) == durable_at_poll:
                return DurabilityStatus(durable=True, bucket=bucket, prefix=prefix)
            return Pending(DurabilityStatus(durable=False, bucket=bucket, prefix=prefix, pending_objects=1))

        client._flush_once = flush_once  # type: ignore[method-assign]
        status = await client.wait_durable("b", "p/", timeout_s=100)
        assert status.durable and asked == [60, 40]
        asked.clear()
        durable_at_poll = 0  # never
        with pytest.raises(NotDurableError):
            await client.wait_durable("b", "p/", timeout_s=0.5)
        assert asked == [0, 0, 0]  # under a second left: immediate polls 0.25 s apart until the deadline


async def test_async_client_gives_a_body_that_cannot_seek_a_single_attempt() -> None:
    fake, events = FakeTime(), list[RetryEvent]()
    async with make_client(fake, events) as client:
        with AioStubber(client.s3) as stubber:
            add_slowdown(stubber, "put_object")
            stubber.add_response("put_object", {"ETag": '"e"'})  # what a retry would have got
            with pytest.raises(RetriesExhausted) as info:
                await client.call("put_object", Bucket="b", Key="k", Body=Pipe())
    assert info.value.attempts == 1 and fake.sleeps == [] and events == []
