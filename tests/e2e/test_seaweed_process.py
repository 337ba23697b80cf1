"""A real ``weed mini`` under SeaweedProcess: it enforces SigV4, serves pre-created buckets at once, stops
for good, reports its death, survives a lost port race and keeps its data across restarts.

Each test runs its own weed (about 1 s to start, 2-4 s to stop on the dev machine), except the last, which
checks the session fixture that the rest of the suite uses.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import signal
import socket
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from s3lanes.seaweed import command as seaweed_command
from s3lanes.seaweed import process as seaweed_process
from s3lanes.seaweed.command import SeaweedPorts
from s3lanes.seaweed.options import SeaweedError, SeaweedIdentity, SeaweedOptions, SeaweedStartError
from s3lanes.seaweed.process import SeaweedProcess
from tests.conftest import Backend, s3_client

pytestmark = pytest.mark.e2e

ADMIN = SeaweedIdentity("admin", "AK-e2e-admin", secrets.token_urlsafe(24))


def client(url: str, access_key: str, secret_key: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def error_code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    response = exc.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def assert_gone(pid: int) -> None:
    """``pid`` no longer exists (it was reaped, so the kernel has forgotten it)."""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def leftover_grpc_sockets(ports: SeaweedPorts) -> list[Path]:
    """weed's /tmp/seaweedfs-<component>-grpc-<port>.sock files that belong to these ports."""
    grpc = {ports.master_grpc, ports.volume_grpc, ports.filer_grpc, ports.s3_grpc, ports.admin_grpc}
    return [p for p in Path("/tmp").glob("seaweedfs-*-grpc-*.sock") if int(p.stem.rsplit("-", 1)[1]) in grpc]


@pytest.fixture
def opts(tmp_path: Path) -> SeaweedOptions:
    return SeaweedOptions(
        state_dir=tmp_path / "weed", identities=(ADMIN,), buckets=("pre-made", "pre.made.2")
    )


@pytest.fixture
def weed(opts: SeaweedOptions) -> Iterator[SeaweedProcess]:
    proc = SeaweedProcess(opts)
    try:
        yield proc
    finally:
        proc.stop()


def test_weed_enforces_sigv4_serves_pre_created_buckets_and_stops_for_good(
    weed: SeaweedProcess, opts: SeaweedOptions
) -> None:
    weed.start()
    pid = weed.pid
    assert pid is not None
    assert weed.endpoint_url == f"http://127.0.0.1:{weed.ports.s3}"
    assert stat.S_IMODE(opts.s3_config_path.stat().st_mode) == 0o600
    assert opts.pid_file.read_text().strip() == str(pid)

    good = client(weed.endpoint_url, ADMIN.access_key, ADMIN.secret_key)
    wrong_secret = client(weed.endpoint_url, ADMIN.access_key, "not-the-secret")
    unknown_key = client(weed.endpoint_url, "AK-nobody", ADMIN.secret_key)
    try:
        # start() returned, so the pre-created buckets must already be there (weed makes them async).
        for bucket in opts.buckets:
            good.head_bucket(Bucket=bucket)
        good.put_object(Bucket="pre-made", Key="a/b.txt", Body=b"hello")
        assert good.get_object(Bucket="pre-made", Key="a/b.txt")["Body"].read() == b"hello"

        with pytest.raises(ClientError) as bad_sig:
            wrong_secret.get_object(Bucket="pre-made", Key="a/b.txt")
        assert error_code(bad_sig) == (403, "SignatureDoesNotMatch")
        with pytest.raises(ClientError) as bad_key:
            unknown_key.list_buckets()
        assert error_code(bad_key) == (403, "InvalidAccessKeyId")
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{weed.endpoint_url}/pre-made/a/b.txt", timeout=5)
        assert anonymous.value.code == 403
        anonymous.value.close()
        # S3-like semantics were asked for: no implicit buckets, no deleting non-empty ones.
        with pytest.raises(ClientError) as no_bucket:
            good.put_object(Bucket="never-created", Key="k", Body=b"x")
        assert error_code(no_bucket)[1] == "NoSuchBucket"
        with pytest.raises(ClientError) as not_empty:
            good.delete_bucket(Bucket="pre-made")
        assert error_code(not_empty) == (409, "BucketNotEmpty")
    finally:
        for c in (good, wrong_secret, unknown_key):
            c.close()

    weed.stop()
    assert weed.returncode is not None
    assert_gone(pid)
    assert not opts.pid_file.exists()
    assert not leftover_grpc_sockets(weed.ports)
    weed.stop()  # idempotent


async def test_astart_astop_and_wait_exit_see_a_clean_shutdown(opts: SeaweedOptions) -> None:
    weed = SeaweedProcess(opts)
    try:
        await weed.astart()
        pid = weed.pid
        assert pid is not None
        exited = asyncio.create_task(weed.wait_exit())
        await asyncio.sleep(0.2)
        assert not exited.done()
        await weed.astop()
        assert await asyncio.wait_for(exited, 5) == 0
        assert_gone(pid)
    finally:
        await weed.astop()


async def test_wait_exit_reports_an_unexpected_death(opts: SeaweedOptions) -> None:
    weed = SeaweedProcess(opts)
    try:
        await weed.astart()
        assert weed.pid is not None
        os.kill(weed.pid, signal.SIGKILL)
        assert await asyncio.wait_for(weed.wait_exit(), 5) == -signal.SIGKILL
    finally:
        await weed.astop()
    assert not leftover_grpc_sockets(weed.ports)  # weed could not clean up after itself; stop() did


async def test_cancelling_astart_leaves_no_weed_behind(opts: SeaweedOptions) -> None:
    weed = SeaweedProcess(opts)
    task = asyncio.create_task(weed.astart())
    # No event to wait on: the spawn happens inside astart.
    while weed.pid is None:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert weed.returncode is not None
    assert_gone(weed.pid)


def test_a_failed_start_raises_with_weeds_own_words_and_leaves_nothing_running(tmp_path: Path) -> None:
    opts = SeaweedOptions(state_dir=tmp_path / "weed", identities=(ADMIN,), extra_args=("-no.such.flag=1",))
    weed = SeaweedProcess(opts)
    with pytest.raises(SeaweedStartError, match="exited with code") as failure:
        weed.start()
    assert "flag provided but not defined: -no.such.flag" in str(failure.value)
    assert weed.pid is not None
    assert_gone(weed.pid)


def test_a_lost_port_race_is_retried_once_with_fresh_ports(
    weed: SeaweedProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_choose = seaweed_command.choose_ports  # process.py calls it by this name: patched there below
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    calls: list[SeaweedPorts] = []

    def choose_then_lose_the_race(ip: str, s3_port: int = 0) -> SeaweedPorts:
        ports = real_choose(ip, s3_port)
        if not calls:  # someone grabs the master port between our choice and weed's bind
            ports = SeaweedPorts(*(squatter.getsockname()[1], *ports.as_tuple()[1:]))
        calls.append(ports)
        return ports

    monkeypatch.setattr(seaweed_process, "choose_ports", choose_then_lose_the_race)
    try:
        weed.start()
    finally:
        squatter.close()
    assert weed.start_attempts == 2
    assert weed.ports == calls[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{weed.ports.master}/dir/status", timeout=5) as resp:
        assert resp.status == 200


def test_restart_on_the_same_state_dir_keeps_data_and_refuses_a_second_weed(
    weed: SeaweedProcess, opts: SeaweedOptions
) -> None:
    weed.start()
    c = client(weed.endpoint_url, ADMIN.access_key, ADMIN.secret_key)
    c.put_object(Bucket="pre-made", Key="kept", Body=b"still here")
    c.close()

    with pytest.raises(SeaweedError, match=f"another weed \\(pid {weed.pid}\\) is still serving"):
        SeaweedProcess(opts).start()

    weed.stop()
    weed.start()  # same object, fresh ports, same data
    c = client(weed.endpoint_url, ADMIN.access_key, ADMIN.secret_key)
    try:
        assert c.get_object(Bucket="pre-made", Key="kept")["Body"].read() == b"still here"
    finally:
        c.close()


def test_an_s3_port_already_in_use_is_refused_before_spawning(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = SeaweedOptions(state_dir=tmp_path / "weed", identities=(ADMIN,), s3_port=port)
        weed = SeaweedProcess(opts)
        with pytest.raises(SeaweedError, match=f"127.0.0.1:{port}") as failure:
            weed.start()
    assert weed.pid is None
    assert isinstance(failure.value.__cause__, OSError)
    assert failure.value.__cause__.errno == errno.EADDRINUSE


def test_session_backend_serves_both_identities(seaweed: Backend, unique_bucket: str) -> None:
    admin, user2 = s3_client(seaweed), s3_client(seaweed, seaweed.user2)
    try:
        admin.put_object(Bucket=unique_bucket, Key="empty", Body=b"")
        admin.put_object(Bucket=unique_bucket, Key="dir/x", Body=b"x")  # after an empty PUT: no 60 s stall
        assert user2.get_object(Bucket=unique_bucket, Key="dir/x")["Body"].read() == b"x"
        keys = {o["Key"] for o in user2.list_objects_v2(Bucket=unique_bucket)["Contents"]}
        assert keys == {"empty", "dir/x"}
    finally:
        admin.close()
        user2.close()
