"""A read or copy routed to a spooled entry whose files are freed before they are opened is routed again.

Between the spool front's lookup of a key and the opening of its files (a thread call), the entry can leave
the spool: its drain finishes and the files are freed, or a newer PUT supersedes it. The request must then
be answered as if it had arrived a moment later (the newer entry, or the store, which has the data now),
never with a 500 (a CopyObject did that in a full fuzz run) and never with an older version than the one
acknowledged (a GET fell back to the store, which may hold nothing yet).

The gateway runs in-process (``build_app`` on aiohttp's test server) against the session's real SeaweedFS,
so that the test can step in at exactly that moment: the spool's "open files on a read thread" helper first
lets the event happen (a drain and flush, or an overwrite through the gateway), waits until the files are
gone from disk, and only then opens them. Drains are held back (the spool state offers no drainable entry)
until the test lets them go.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from s3lanes.clock import SystemClock
from s3lanes.config import load_config
from s3lanes.core.spool_state import Entry
from s3lanes.http.app import FRONT_KEY, SPOOL_KEY, build_app
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.spool import Spool
from tests.e2e.s3raw import sign

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


class InProcess:
    def __init__(self, server: TestServer, spool: Spool, access_key: str, secret_key: str) -> None:
        self.server = server
        self.spool = spool
        self.base = str(server.make_url("")).rstrip("/")
        self._ak, self._sk = access_key, secret_key
        self.session = aiohttp.ClientSession()
        self._drainable = spool.state.drainable

    async def request(
        self, method: str, bucket: str, key: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        target = f"/{bucket}/{key}"
        hdrs = dict(headers or {})
        if method == "PUT":
            hdrs["Content-Length"] = str(len(body))
        signed = sign(
            method,
            self.base,
            target,
            hdrs,
            access_key=self._ak,
            secret_key=self._sk,
            payload_hash=hashlib.sha256(body).hexdigest(),
        )
        async with self.session.request(method, self.base + target, data=body, headers=signed) as resp:
            return resp.status, await resp.read(), dict(resp.headers)

    def hold_drains(self) -> None:
        self.spool.state.drainable = lambda now, limit: []  # type: ignore[method-assign]

    async def release_drains_and_flush(self, bucket: str) -> None:
        self.spool.state.drainable = self._drainable  # type: ignore[method-assign]
        self.spool.drain_wakeup.set()
        result = await self.spool.flush(bucket, "", 30.0)
        assert result.durable

    async def gone(self, entry: Entry) -> None:
        """Until the entry's files are unlinked (freed on a thread after the journal says so)."""
        for _ in range(500):
            if not any(self.spool.file_path(f).exists() for f in entry.files):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the files of entry {entry.seq} were never freed")

    def step_in_before_the_next_open(self, event: Callable[[], Awaitable[None]]) -> list[int]:
        """The next thread call that opens spool files runs ``event`` first. Returns a list that gets one
        item per interception (so the test can tell it happened)."""
        spool, calls = self.spool, []
        original = spool.run_read_io_owned

        async def intercepted(fn: Callable[..., Any], *args: Any, release: Callable[[Any], object]) -> Any:
            spool.run_read_io_owned = original  # type: ignore[method-assign]
            calls.append(1)
            await event()
            return await original(fn, *args, release=release)

        spool.run_read_io_owned = intercepted  # type: ignore[method-assign]
        return calls


@pytest.fixture
async def gw(seaweed: Any, tmp_path: Path) -> AsyncIterator[InProcess]:
    admin = seaweed.admin
    cfg_path = tmp_path / "s3lanes.toml"
    cfg_path.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp_path / "state"}"
domains = ["localhost"]

[backend]
endpoint = "{seaweed.endpoint_url}"
region = "us-east-1"

[spool]
enabled = true

[[credentials]]
access_key = "{admin.access_key}"
secret_key = "{admin.secret_key}"
"""
    )
    cfg = load_config(cfg_path, env={})
    clock = SystemClock()
    app = build_app(cfg, Backend(cfg.backend, seaweed.endpoint_url, clock), clock)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    g = InProcess(server, app[SPOOL_KEY], admin.access_key, admin.secret_key)
    assert app[FRONT_KEY] is not None
    try:
        yield g
    finally:
        g.spool.state.drainable = g._drainable  # type: ignore[method-assign]
        await g.session.close()
        await server.close()


def _entry(g: InProcess, bucket: str, key: str) -> Entry:
    entry = g.spool.state.lookup(bucket, key)
    assert entry is not None and entry.kind == "put"
    return entry


async def test_a_get_whose_entry_drained_before_its_files_opened_is_answered_by_the_store(
    gw: InProcess, bucket: str
) -> None:
    data = os.urandom(MiB + 5)
    gw.hold_drains()
    status, _, headers = await gw.request("PUT", bucket, "ckpt/a", data)
    assert status == 200 and headers.get("x-s3lanes-source") == "spool"
    entry = _entry(gw, bucket, "ckpt/a")

    async def drained() -> None:
        await gw.release_drains_and_flush(bucket)
        await gw.gone(entry)

    stepped = gw.step_in_before_the_next_open(drained)
    status, body, headers = await gw.request("GET", bucket, "ckpt/a")
    assert stepped == [1]
    assert status == 200 and body == data
    assert headers.get("x-s3lanes-source") != "spool"  # the store answered


async def test_a_get_whose_entry_was_superseded_before_its_files_opened_reads_the_newer_version(
    gw: InProcess, bucket: str
) -> None:
    old, new = os.urandom(MiB + 7), os.urandom(MiB + 11)
    gw.hold_drains()  # the store has neither version
    assert (await gw.request("PUT", bucket, "ckpt/b", old))[0] == 200
    entry = _entry(gw, bucket, "ckpt/b")

    async def overwritten() -> None:
        status, _, headers = await gw.request("PUT", bucket, "ckpt/b", new)
        assert status == 200 and headers.get("x-s3lanes-source") == "spool"
        await gw.gone(entry)

    stepped = gw.step_in_before_the_next_open(overwritten)
    status, body, headers = await gw.request("GET", bucket, "ckpt/b")
    assert stepped == [1]
    # Not the store's 404: the overwrite was acknowledged before the answer, and the spool holds it.
    assert status == 200 and body == new
    assert headers.get("x-s3lanes-source") == "spool"


async def test_a_copy_whose_spooled_source_drained_before_its_files_opened_copies_on_the_store(
    gw: InProcess, bucket: str, backend: Any
) -> None:
    data = os.urandom(2 * MiB + 3)
    gw.hold_drains()
    assert (await gw.request("PUT", bucket, "ckpt/src", data))[0] == 200
    entry = _entry(gw, bucket, "ckpt/src")

    async def drained() -> None:
        await gw.release_drains_and_flush(bucket)
        await gw.gone(entry)

    stepped = gw.step_in_before_the_next_open(drained)
    status, body, _ = await gw.request(
        "PUT", bucket, "ckpt/dst", headers={"x-amz-copy-source": f"/{bucket}/ckpt/src"}
    )
    assert stepped == [1]
    assert status == 200, body  # was 500 InternalError (FileNotFoundError)
    assert b"<CopyObjectResult" in body
    status, got, _ = await gw.request("GET", bucket, "ckpt/dst")
    assert status == 200 and got == data
    await gw.release_drains_and_flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="ckpt/dst")["Body"].read() == data
