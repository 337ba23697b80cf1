"""Pools.request: the one way to call a store through a lane (route, admission, accounting, observation)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from s3lanes.clock import FakeClock
from s3lanes.config import Config, Credential
from s3lanes.core.routing import RouteTable
from s3lanes.core.scheduler import Scheduler
from s3lanes.errors import ServiceUnavailable
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.pools import Pools, StoreCall
from s3lanes.runtime.wiring import scheduler_config

CRED = Credential("client", "secret", "backend", "backend-secret")


class SpyDispatcher(LaneDispatcher):
    def __init__(self) -> None:
        clock = FakeClock(autojump=True)
        super().__init__(Scheduler(replace(scheduler_config(Config(), 10e6)), clock.monotonic()), clock)
        self.costs: list[int] = []
        self.delivered: list[int] = []
        self.observed: list[int] = []

    async def acquire(self, lane: str, cost_bytes: int, **kw: Any) -> int:
        self.costs.append(cost_bytes)
        return await super().acquire(lane, cost_bytes, **kw)

    def observe_delivered(self, lane: str, nbytes: int) -> None:
        self.delivered.append(nbytes)

    def observe_backend(self, lane: str, status: int) -> None:
        self.observed.append(status)


class StubResponse:
    status = 200
    released = False

    def release(self) -> None:
        self.released = True


class StubBackend:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[tuple[Any, ...]] = []

    def target(self, bucket: str | None, key: str | None, raw_query: str) -> tuple[Any, ...]:
        return (self.name, bucket, key, raw_query)

    async def request(self, method: str, target: Any, headers: Any, cred: Any, **kw: Any) -> StubResponse:
        self.calls.append((method, target, kw["lane"], kw["body"]))
        if self.fail:
            raise ServiceUnavailable("down")
        return StubResponse()


def make(fail: bool = False) -> tuple[Pools, dict[str, StubBackend], SpyDispatcher]:
    backends = {"default": StubBackend("default", fail), "cold": StubBackend("cold", fail)}
    d = SpyDispatcher()
    pools = Pools(
        RouteTable([("archive", "cold", "archive-2024")]),
        backends,  # type: ignore[arg-type]
        {"default": d},
        {"default": "default", "cold": "default"},
    )
    return pools, backends, d


def test_a_routed_bucket_goes_to_its_store_under_its_name_there_with_the_body_accounted() -> None:
    pools, backends, d = make()

    async def go() -> None:
        resp = await pools.request(
            StoreCall("dataset", "archive", "k", "PUT", {}, CRED), b"12345", cost=100, account_body=True
        )
        assert resp.status == 200

    asyncio.run(go())
    assert backends["cold"].calls == [("PUT", ("cold", "archive-2024", "k", ""), "dataset", b"12345")]
    assert d.costs == [105] and d.delivered == [5] and d.observed == [200]


def test_not_admitted_and_not_observed_when_asked_so_and_errors_observed_only_when_asked() -> None:
    pools, backends, d = make(fail=True)

    async def go(**kw: Any) -> None:
        with pytest.raises(ServiceUnavailable):
            await pools.request(StoreCall("metadata", None, None, "GET", {}, CRED), backend="cold", **kw)

    asyncio.run(go(cost=None))
    assert d.costs == [] and d.observed == []
    asyncio.run(go(cost=7, observe_errors=True))
    assert d.costs == [7] and d.observed == [503]
    assert backends["cold"].calls[0][1] == ("cold", None, None, "")
