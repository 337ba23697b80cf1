"""In-process A/B micro-benchmarks of the small-GET steps, old and new interleaved, best and median.

``route``: the dispatch of an S3 request to its handler, aiohttp's route resolution
(``Application._handle``) against :func:`s3lanes.http.fastroute.install_s3_first`, on an application of the
gateway's shape (its admin paths and the catch-all), a trivial handler, fresh requests.

``state``: the request's id and the lookups of what the request holds (its id, then its context) at the
start of :meth:`s3lanes.http.router.Router.handle` and :meth:`s3lanes.http.intake.Intake.authenticate`:
``request.get`` and ``secrets.token_hex`` against :func:`s3lanes.http.intake.stored` and ``os.urandom``.

``answer``: a 16 KiB answer written by an aiohttp server on uvloop to a keep-alive client on loopback, both
in this process: ``prepare`` + ``write`` + ``write_eof`` of a ``StreamResponse`` (the per-chunk relay)
against one ``web.Response`` (head and body in one go); CPU of the process per request (server and client).

    PYTHONPATH=. .venv/bin/python -m loadtests.bench_small_get route --rounds 7
    PYTHONPATH=. .venv/bin/python -m loadtests.bench_small_get state --rounds 7
    PYTHONPATH=. .venv/bin/python -m loadtests.bench_small_get answer --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import uvloop
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from s3lanes.http.admin import (
    ADMIN_METRICS_PATH,
    DRAIN_PATH,
    FLUSH_PATH,
    HEALTH_PATH,
    READY_PATH,
    STATUS_PATH,
)
from s3lanes.http.fastroute import CATCH_ALL_PATH, install_s3_first
from s3lanes.http.intake import CTX_KEY, RID_KEY, new_request_id, stored
from s3lanes.http.status_page import BARE_PATH, PAGE_PATH

Round = Callable[[], Awaitable[float]]


def cpu_s() -> float:
    return time.process_time()


async def _ok(request: web.Request) -> web.StreamResponse:
    return web.Response()


def _shaped_app() -> web.Application:
    app = web.Application()
    for path in (HEALTH_PATH, READY_PATH, STATUS_PATH, ADMIN_METRICS_PATH, PAGE_PATH, BARE_PATH):
        app.router.add_get(path, _ok)
    app.router.add_post(FLUSH_PATH, _ok)
    app.router.add_post(DRAIN_PATH, _ok)
    app.router.add_route("*", CATCH_ALL_PATH, _ok)
    return app


async def route_sides(count: int) -> dict[str, Round]:
    sides: dict[str, Round] = {}
    for name, fast in (("aiohttp resolution", False), ("s3 first", True)):
        runner = web.AppRunner(_shaped_app())
        await runner.setup()
        if fast:
            assert install_s3_first(runner)
        server = runner.server
        assert server is not None

        async def one(server: web.Server = server, app: web.Application = runner.app) -> float:
            requests = [
                make_mocked_request("GET", f"/bench/dataset/part-{i:05d}.bin", app=app) for i in range(count)
            ]
            handle = server.request_handler
            start = time.thread_time()
            for request in requests:
                await handle(request)
            return (time.thread_time() - start) / count * 1e6

        sides[name] = one
    return sides


async def state_sides(count: int) -> dict[str, Round]:
    def old_way(request: web.Request) -> object:
        request[RID_KEY] = request.get(RID_KEY) or secrets.token_hex(8).upper()
        return request.get(CTX_KEY)

    def new_way(request: web.Request) -> object:
        request[RID_KEY] = stored(request, RID_KEY) or new_request_id()
        return stored(request, CTX_KEY)

    sides: dict[str, Round] = {}
    for name, way in (("request.get, token_hex", old_way), ("stored, urandom", new_way)):

        async def one(way: Callable[[web.Request], object] = way) -> float:
            requests = [make_mocked_request("GET", "/bench/k") for _ in range(count)]
            start = time.thread_time()
            for request in requests:
                way(request)
            return (time.thread_time() - start) / count * 1e6

        sides[name] = one
    return sides


BODY = os.urandom(16 * 1024)


HEADERS = (("ETag", '"0123456789abcdef"'), ("Last-Modified", "Mon, 07 Dec 2026 05:00:00 GMT"))


async def _prepared(request: web.Request) -> web.StreamResponse:
    out = web.StreamResponse(status=200)
    out.headers.extend(HEADERS)
    out.content_length = len(BODY)
    await out.prepare(request)  # a StreamResponse sends its head here
    return out


async def _streamed(request: web.Request) -> web.StreamResponse:
    out = await _prepared(request)
    await out.write(BODY)
    await out.write_eof()
    return out


async def _prepare_write_eof(request: web.Request) -> web.StreamResponse:
    out = await _prepared(request)
    await out.write_eof(BODY)
    return out


async def _one_go(request: web.Request) -> web.StreamResponse:
    out = web.Response(status=200, body=BODY)
    out.headers.extend(HEADERS)
    return out


async def _client(port: int, count: int, concurrency: int) -> None:
    head = b"GET /b/k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    left = count

    async def worker() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while left > 0:
                left -= 1
                writer.write(head)
                length = 0
                while True:
                    line = await reader.readline()
                    if line == b"\r\n":
                        break
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def answer_sides(count: int) -> dict[str, Round]:
    sides: dict[str, Round] = {}
    for name, handler in (
        ("prepare+write+write_eof", _streamed),
        ("prepare+write_eof(body)", _prepare_write_eof),
        ("one web.Response", _one_go),
    ):
        app = web.Application()
        app.router.add_get("/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]

        async def one(port: int = port) -> float:
            start = cpu_s()
            await _client(port, count, 8)
            return (cpu_s() - start) / count * 1e6

        sides[name] = one
    return sides


async def main(opts: argparse.Namespace) -> None:
    sides = await {"route": route_sides, "state": state_sides, "answer": answer_sides}[opts.what](opts.count)
    results: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(opts.rounds):
        for name, one in sides.items() if r % 2 == 0 else reversed(sides.items()):
            results[name].append(await one())
    print(f"load average {os.getloadavg()}")
    for name, us in results.items():
        print(
            f"{name:>26}: best {min(us):6.2f} us, median {statistics.median(us):6.2f} us  "
            f"({', '.join(f'{u:.1f}' for u in us)})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=("route", "state", "answer"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=3000)
    uvloop.run(main(parser.parse_args()))
