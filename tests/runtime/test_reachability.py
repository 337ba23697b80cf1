"""The start-up probe (s3lanes/runtime/reachability.py) against a store that answers garbage: whatever a
probe round fails on counts as "not answered yet", is logged once, and the probe keeps probing; it never
dies (a dead ``backend-probe`` task takes the gateway down at start).

The store is a loopback socket server that answers every request with a long run of bytes that is no HTTP
at all, so the HTTP client fails parsing it (not a connection error, not a timeout)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from s3lanes.clock import SystemClock
from s3lanes.config import BackendConfig
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.reachability import ReachabilityProbe


@pytest.fixture
async def garbage_store() -> AsyncIterator[tuple[str, list[int]]]:
    """The endpoint's URL and the number of requests it got so far (one element, updated in place)."""
    served = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline() not in (b"\r\n", b"\n", b""):
                pass
            served[0] += 1
            writer.write(b"x" * 65536 + b"\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", served
    finally:
        server.close()
        await server.wait_closed()


async def test_a_store_answering_garbage_is_not_answered_yet_and_probed_again(
    garbage_store: tuple[str, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    url, served = garbage_store
    backend = Backend(BackendConfig(endpoint=url), url, SystemClock())
    await backend.start()
    probe = ReachabilityProbe({"default": backend}, interval_s=0.05)
    caplog.set_level(logging.INFO, logger="s3lanes.backend")
    task = asyncio.create_task(probe.run())
    try:
        await asyncio.wait_for(probe.first_round_done.wait(), 10)
        async with asyncio.timeout(10):
            while served[0] < 3:  # probed again after the failed rounds
                assert not task.done(), f"the probe died: {task.exception()!r}"
                await asyncio.sleep(0.01)
        assert not task.done(), f"the probe died: {task.exception()!r}"
        assert probe.never_answered() == ["default"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()
    warnings = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, however many rounds failed
    assert len(warnings[0]) < 1000, "the log quotes the garbage at length"
