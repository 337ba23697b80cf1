"""The client under back-pressure and outages, against a real gateway whose backend can be switched off.

A gateway of its own (``[spool]`` small: 8 MiB, high water 50 %, ``when_full = "slowdown"``) sits in front of
a relay to the session's SeaweedFS. Switching the relay off makes the backend unreachable for the gateway
only; the tests keep checking the backend directly.

* Outage (503 from the gateway for reads it cannot serve): retried until the backend is back, or
  ``RetriesExhausted`` within the policy's bound.
* Spool full (503 SlowDown with Retry-After): retried until the spool drains, or a bounded, clear failure.
* ``wait_durable``: returns only once the objects are on the backend, checked there directly; times out
  with ``NotDurableError`` while the backend is away. A DCP checkpoint acknowledged by the spool loads from
  the backend itself once ``wait_durable`` has returned.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch
from botocore.exceptions import ClientError
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from s3lanes_client import (
    AsyncGatewayClient,
    ClientConfig,
    GatewayClient,
    Lane,
    NotDurableError,
    RetriesExhausted,
    RetryEvent,
    RetryPolicy,
)
from s3lanes_client.torch import S3StorageReader, S3StorageWriter
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.test_client_sync import plain_s3_config

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
RELAY_READ_BYTES = 64 * 1024

# start_plain_gateway puts this inside its [backend] section.
SPOOL_TOML = """
connect_timeout_s = 1
read_timeout_s = 10

[spool]
capacity = "8MiB"
high_water = 0.5
low_water = 0.25
when_full = "slowdown"
retry_after_s = 1
retry_base_s = 0.1
retry_max_s = 0.5
"""


class SwitchableRelay:
    """A TCP relay to the backend that can be switched off. While off it has cut every open connection and
    accepts new ones only to close them at once, so the gateway sees its backend fail."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._on = True
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="switchable-relay", daemon=True)
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def _stop() -> None:
            self._cut()
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def off(self) -> None:
        async def _off() -> None:
            self._on = False
            self._cut()

        asyncio.run_coroutine_threadsafe(_off(), self._loop).result(10)

    def on(self) -> None:
        self._on = True

    def _cut(self) -> None:
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(RELAY_READ_BYTES):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if not self._on:
            c_writer.transport.abort()
            return
        try:
            b_reader, b_writer = await asyncio.open_connection(*self._target)
        except OSError:
            c_writer.transport.abort()
            return
        self._open.update((c_writer, b_writer))
        try:
            await asyncio.gather(self._pipe(c_reader, b_writer), self._pipe(b_reader, c_writer))
        finally:
            self._open.difference_update((c_writer, b_writer))


@pytest.fixture(scope="module")
def switchable(
    seaweed: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, SwitchableRelay]]:
    parts = urlsplit(seaweed.endpoint_url)
    relay = SwitchableRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    tmp: Path = tmp_path_factory.mktemp("spool-gateway")
    try:
        proc, gw = start_plain_gateway(
            tmp, seaweed, backend_endpoint=f"http://127.0.0.1:{relay.port}", extra_toml=SPOOL_TOML
        )
        try:
            yield gw, relay
        finally:
            relay.on()
            stop_gateway(proc)
    finally:
        relay.stop()


@pytest.fixture
def spooled(
    switchable: tuple[Gateway, SwitchableRelay], bucket: str
) -> Iterator[tuple[Gateway, SwitchableRelay]]:
    """The switchable gateway, its backend back on after the test and its spool drained for the bucket
    (so the bucket's teardown, straight on the backend, races no upload)."""
    gw, relay = switchable
    relay.on()
    try:
        yield gw, relay
    finally:
        relay.on()
        with GatewayClient(config_for(gw)) as client:
            client.wait_durable(bucket, "", timeout_s=60)


def config_for(gw: Gateway, **kwargs: Any) -> ClientConfig:
    return ClientConfig(
        endpoint_url=gw.http_url, access_key=gw.access_key, secret_key=gw.secret_key, **kwargs
    )


def switch_on_after(relay: SwitchableRelay, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, relay.on)
    timer.start()
    return timer


def backend_goes_away(gw: Gateway, relay: SwitchableRelay, bucket: str) -> None:
    """Switch the backend off mid-run: one checkpoint write first, while it is up, as a job that has been
    writing does (the gateway has then seen the bucket on the backend)."""
    with GatewayClient(config_for(gw)) as client:
        client.put_bytes(bucket, "warmup/.keep", b"", lane=Lane.CHECKPOINT)
        client.wait_durable(bucket, "warmup/", timeout_s=30)
    relay.off()


def fill_spool_until_slowdown(gw: Gateway, bucket: str) -> dict[str, bytes]:
    """With the backend off, checkpoint writes are spooled until the spool passes its high-water mark; then
    the gateway answers SlowDown. Returns what was acknowledged."""
    acked: dict[str, bytes] = {}
    with GatewayClient(config_for(gw, retry=RetryPolicy.no_retries())) as raw:
        for i in range(16):
            blob = os.urandom(MiB)
            try:
                raw.put_bytes(bucket, f"fill/{i:02d}.bin", blob, lane=Lane.CHECKPOINT)
            except RetriesExhausted as exc:
                assert exc.last_failure.code == "SlowDown", exc
                assert exc.last_failure.retry_after_s == 1.0, exc
                return acked
            acked[f"fill/{i:02d}.bin"] = blob
    pytest.fail(f"the spool acknowledged {len(acked)} MiB and never answered SlowDown")


# --- backend outage: 503 from the gateway ------------------------------------------------------------------


def test_reads_during_a_backend_outage_are_retried_until_it_returns(
    spooled: tuple[Gateway, SwitchableRelay], backend: Any, bucket: str
) -> None:
    gw, relay = spooled
    blob = os.urandom(100_000)
    backend.put_object(Bucket=bucket, Key="data/x.bin", Body=blob)
    events: list[RetryEvent] = []
    relay.off()
    timer = switch_on_after(relay, 2.0)
    try:
        with GatewayClient(
            config_for(gw, retry=RetryPolicy(total_timeout_s=30)), on_retry=events.append
        ) as c:
            started = time.monotonic()
            assert c.get_bytes(bucket, "data/x.bin", lane=Lane.DATASET) == blob
            assert time.monotonic() - started >= 1.5
    finally:
        timer.join()
    assert events, "the outage was never seen"
    assert {e.failure.status for e in events} <= {500, 502, 503, 504}


def test_a_backend_outage_fails_within_the_bounded_time(
    spooled: tuple[Gateway, SwitchableRelay], backend: Any, bucket: str
) -> None:
    gw, relay = spooled
    backend.put_object(Bucket=bucket, Key="data/y.bin", Body=b"y")
    relay.off()
    policy = RetryPolicy(total_timeout_s=2.0, base_delay_s=0.1, max_delay_s=0.5)
    started = time.monotonic()
    with GatewayClient(config_for(gw, retry=policy)) as c, pytest.raises(RetriesExhausted) as info:
        c.get_bytes(bucket, "data/y.bin")
    assert time.monotonic() - started < 2.0 + 10  # the bound plus at most one attempt's own timeout
    assert info.value.attempts >= 2
    assert (info.value.last_failure.status or 0) >= 500  # 503/504 (a 500 here is a gateway bug; retried too)


# --- spool full: 503 SlowDown with Retry-After -------------------------------------------------------------


def test_slowdown_from_a_full_spool_is_retried_until_it_drains(
    spooled: tuple[Gateway, SwitchableRelay], backend: Any, bucket: str
) -> None:
    gw, relay = spooled
    backend_goes_away(gw, relay, bucket)
    acked = fill_spool_until_slowdown(gw, bucket)
    events: list[RetryEvent] = []
    blob = os.urandom(MiB)
    timer = switch_on_after(relay, 2.5)
    # Bounded by time, not by attempts: a drain upload the relay cut after its whole body was sent leaves
    # its key in doubt (the store may still apply it), and the key's entry waits [backend] read_timeout_s
    # (10 s here) before it is sent again and as long again for its fence before its space is freed. Which
    # uploads are cut that way is a race with the relay, so room may come back after 20 s or more.
    policy = RetryPolicy(max_attempts=1000, total_timeout_s=60)
    try:
        with GatewayClient(config_for(gw, retry=policy), on_retry=events.append) as c:
            started = time.monotonic()
            c.put_bytes(bucket, "after/x.bin", blob, lane=Lane.CHECKPOINT)
            waited_s = time.monotonic() - started
            assert c.wait_durable(bucket, "", timeout_s=60).durable
    finally:
        timer.join()
    assert waited_s >= 2.0
    assert events and all(e.failure.code == "SlowDown" and e.failure.retry_after_s == 1.0 for e in events)
    assert all(e.delay_s >= 1.0 for e in events)  # Retry-After honoured, never undercut
    for key, data in {**acked, "after/x.bin": blob}.items():
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key


def test_slowdown_from_a_full_spool_fails_within_the_bound_with_a_clear_error(
    spooled: tuple[Gateway, SwitchableRelay], bucket: str
) -> None:
    gw, relay = spooled
    backend_goes_away(gw, relay, bucket)
    fill_spool_until_slowdown(gw, bucket)
    policy = RetryPolicy(total_timeout_s=3.0)
    started = time.monotonic()
    with GatewayClient(config_for(gw, retry=policy)) as c, pytest.raises(RetriesExhausted) as info:
        c.put_bytes(bucket, "late/x.bin", os.urandom(MiB), lane=Lane.CHECKPOINT)
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 3.0 + 2
    exc = info.value
    assert exc.last_failure.code == "SlowDown" and exc.attempts >= 2
    assert "SlowDown" in str(exc) and "total time bound" in str(exc)


# --- wait_durable -------------------------------------------------------------------------------------------


async def test_wait_durable_returns_only_after_the_objects_are_on_the_backend(
    spooled: tuple[Gateway, SwitchableRelay], backend: Any, bucket: str
) -> None:
    gw, relay = spooled
    blobs = {f"ckpt/step_1/__0_{i}.distcp": os.urandom(200_000 + i) for i in range(3)}
    backend_goes_away(gw, relay, bucket)
    with GatewayClient(config_for(gw, lane=Lane.CHECKPOINT)) as client:
        for key, blob in blobs.items():
            client.put_bytes(bucket, key, blob)
        assert client.get_bytes(bucket, "ckpt/step_1/__0_1.distcp") == blobs["ckpt/step_1/__0_1.distcp"]
        with pytest.raises(NotDurableError) as info:
            client.wait_durable(bucket, "ckpt/step_1/", timeout_s=1.5)
        assert info.value.status.pending_objects == 3
        assert info.value.status.pending_bytes == sum(map(len, blobs.values()))
        assert info.value.status.gateway
        for key in blobs:  # acknowledged, readable through the gateway, but not on the backend yet
            with pytest.raises(ClientError):
                backend.head_object(Bucket=bucket, Key=key)
        relay.on()
        status = client.wait_durable(bucket, "ckpt/step_1/", timeout_s=60)
        assert status.durable and status.gateway and status.pending_objects == 0
    for key, blob in blobs.items():  # on the backend the moment wait_durable returned
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == blob
    async with AsyncGatewayClient(config_for(gw)) as aclient:
        status = await aclient.wait_durable(bucket, "ckpt/step_1/", timeout_s=10)
        assert status.durable and status.gateway


def test_dcp_checkpoint_acked_by_the_spool_loads_from_the_backend_after_wait_durable(
    spooled: tuple[Gateway, SwitchableRelay], seaweed: Any, backend: Any, bucket: str
) -> None:
    gw, relay = spooled
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    uri = f"s3://{bucket}/ckpt/run1/step_10"
    backend_goes_away(gw, relay, bucket)
    with GatewayClient(config_for(gw)) as client, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp_save({"model": model.state_dict()}, storage_writer=S3StorageWriter(uri, client=client))
        with pytest.raises(ClientError):  # acknowledged by the spool; the store has not seen the manifest
            backend.head_object(Bucket=bucket, Key="ckpt/run1/step_10/.metadata")
        relay.on()
        assert client.wait_durable(bucket, "ckpt/run1/step_10/", timeout_s=60).durable
        # Straight from the store, as a restore on another node would read it.
        restored = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
        with GatewayClient(plain_s3_config(seaweed)) as direct:
            dcp_load(restored, storage_reader=S3StorageReader(uri, client=direct))
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored["model"][name], tensor), name
