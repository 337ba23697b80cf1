"""The S3 route taken past aiohttp's resolution (s3lanes.http.fastroute): the same handler as aiohttp's
resolution picks, for every path and method, in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import hdrs, web
from aiohttp.test_utils import make_mocked_request

from s3lanes.clock import SystemClock
from s3lanes.config import load_config
from s3lanes.http.app import build_app
from s3lanes.http.fastroute import CATCH_ALL_PATH, install_s3_first
from s3lanes.runtime.backend import Backend

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ADMIN = ("/_s3lanes/healthz", "/_s3lanes/", "/_s3lanes", "/_s3lanes/flush")


def _shaped_app(seen: list[str]) -> web.Application:
    """The gateway's shape: exact admin paths and one catch-all with an Expect handler."""

    def answering(name: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            seen.append(name)
            return web.Response(text=name)

        return handler

    async def expect(request: web.Request) -> web.StreamResponse | None:
        seen.append("expect")
        return web.Response(status=417) if request.headers[hdrs.EXPECT] == "refuse" else None

    app = web.Application()
    for path in ADMIN[:3]:
        app.router.add_get(path, answering(path))
    app.router.add_post(ADMIN[3], answering(ADMIN[3]))
    app.router.add_route("*", CATCH_ALL_PATH, answering("s3"), expect_handler=expect)
    return app


@asynccontextmanager
async def _running(app: web.Application, *, fast: bool = True) -> AsyncIterator[web.AppRunner]:
    """``app`` set up in a runner, with the fast route installed (``fast``) or not."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        assert not fast or install_s3_first(runner)
        yield runner
    finally:
        await runner.cleanup()


async def _served(runner: web.AppRunner, method: str, path: str, **kw: object) -> web.StreamResponse:
    assert runner.server is not None
    request = make_mocked_request(method, path, app=runner.app, **kw)  # type: ignore[arg-type]
    return await runner.server.request_handler(request)


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "POST", "DELETE"])
@pytest.mark.parametrize(
    "path",
    [
        "/bucket/key",
        "/bucket",
        "/",
        "/metrics",
        "/bucket/a/../_s3lanes/healthz",
        "/_s3lanes/%68ealthz",
        "/_s3lanes/healthz?x=1",
        "/_s3lanes/status",
        "/b/_s3lanes/healthz",
        "/bucket/k%2F_s3lanes",
        *ADMIN,
    ],
)
async def test_the_fast_route_picks_the_handler_aiohttps_resolution_picks(method: str, path: str) -> None:
    seen_slow: list[str] = []
    seen_fast: list[str] = []
    async with _running(_shaped_app(seen_slow), fast=False) as slow, _running(_shaped_app(seen_fast)) as fast:
        slow_resp = await _served(slow, method, path)
        fast_resp = await _served(fast, method, path)
    assert (fast_resp.status, seen_fast) == (slow_resp.status, seen_slow)


async def test_an_s3_request_has_the_catch_all_match_and_its_app() -> None:
    seen: list[str] = []
    async with _running(_shaped_app(seen)) as runner:
        request = make_mocked_request("GET", "/bucket/key", app=runner.app)
        assert runner.server is not None
        await runner.server.request_handler(request)
        assert seen == ["s3"]
        assert request.match_info.route.resource is not None
        assert request.match_info.route.resource.canonical == "/{tail}"
        assert request.app is runner.app


async def test_the_expect_handler_runs_first_and_its_answer_is_final() -> None:
    seen: list[str] = []
    async with _running(_shaped_app(seen)) as runner:
        go = await _served(runner, "PUT", "/b/k", headers={hdrs.EXPECT: "100-continue"})
        assert (go.status, seen) == (200, ["expect", "s3"])
        seen.clear()
        refused = await _served(runner, "PUT", "/b/k", headers={hdrs.EXPECT: "refuse"})
        assert (refused.status, seen) == (417, ["expect"])


async def test_an_app_of_another_shape_keeps_aiohttps_resolution() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response()

    @web.middleware
    async def passing(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request)

    with_middleware = _shaped_app([])
    with_middleware.middlewares.append(passing)
    with_dynamic = _shaped_app([])
    with_dynamic.router.add_get("/{bucket}/x", handler)
    without_catch_all = web.Application()
    without_catch_all.router.add_get("/a", handler)
    for app in (with_middleware, with_dynamic, without_catch_all):
        async with _running(app, fast=False) as runner:
            assert runner.server is not None
            before = runner.server.request_handler
            assert not install_s3_first(runner)
            assert runner.server.request_handler == before


async def test_the_gateways_app_has_the_shape() -> None:
    endpoint = "http://127.0.0.1:9"  # never contacted
    cfg = load_config(
        None,
        env={"S3LANES_CREDENTIALS": "AKFASTROUTE:not-a-secret"},
        overrides={"backend": {"endpoint": endpoint}, "spool": {"enabled": False}},
    )
    clock = SystemClock()
    async with _running(build_app(cfg, Backend(cfg.backend, endpoint, clock), clock)):
        pass  # installed: _running asserts it
