"""Real clients other than boto3 through the gateway, byte-exact: aioboto3, s3fs and the AWS CLI.

Each is used as its users use it (defaults apart from path-style addressing and the test CA), over HTTPS
where that is what makes it send aws-chunked uploads.
"""

from __future__ import annotations

import filecmp
import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aioboto3
import pytest
import s3fs
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig

from tests.e2e.conftest import Gateway
from tests.e2e.s3raw import all_keys

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
CLI_TIMEOUT_S = 120
AWS_CLI = str(Path(sys.executable).parent / "aws")  # the one installed in this environment


# --- aioboto3 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
async def test_aioboto3_put_get_list_and_multipart_upload_fileobj(
    gateway: Gateway, backend: Any, bucket: str, https: bool
) -> None:
    session = aioboto3.Session(
        aws_access_key_id=gateway.access_key,
        aws_secret_access_key=gateway.secret_key,
        region_name="us-east-1",
    )
    small = os.urandom(300 * KiB)
    big = os.urandom(11 * MiB)
    async with session.client(
        "s3",
        endpoint_url=gateway.https_url if https else gateway.http_url,
        verify=gateway.ca_bundle if https else None,
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    ) as s3:
        put = await s3.put_object(Bucket=bucket, Key="aio/small ü.bin", Body=small)
        assert put["ETag"] == f'"{hashlib.md5(small).hexdigest()}"'
        got = await s3.get_object(Bucket=bucket, Key="aio/small ü.bin")
        async with got["Body"] as stream:
            assert await stream.read() == small

        await s3.upload_fileobj(
            io.BytesIO(big),
            bucket,
            "aio/big.bin",
            Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
        )
        head = await s3.head_object(Bucket=bucket, Key="aio/big.bin")
        assert head["ContentLength"] == len(big)
        assert head["ETag"].endswith('-3"')  # 5 + 5 + 1 MiB: multipart was used
        got = await s3.get_object(Bucket=bucket, Key="aio/big.bin")
        async with got["Body"] as stream:
            assert await stream.read() == big

        listed = await s3.list_objects_v2(Bucket=bucket, Prefix="aio/")
        assert {o["Key"] for o in listed["Contents"]} == {"aio/small ü.bin", "aio/big.bin"}
        ranged = await s3.get_object(Bucket=bucket, Key="aio/big.bin", Range="bytes=5242870-5242889")
        async with ranged["Body"] as stream:
            assert await stream.read() == big[5242870:5242890]

    assert backend.get_object(Bucket=bucket, Key="aio/big.bin")["Body"].read() == big


# --- s3fs --------------------------------------------------------------------------------------------------


@pytest.fixture
def fs(gateway: Gateway) -> Any:
    return s3fs.S3FileSystem(
        key=gateway.access_key,
        secret=gateway.secret_key,
        endpoint_url=gateway.https_url,
        client_kwargs={"region_name": "us-east-1", "verify": gateway.ca_bundle},
        config_kwargs={"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def test_s3fs_write_read_ls_rm(fs: Any, backend: Any, bucket: str) -> None:
    files = {
        f"{bucket}/fs/a.bin": os.urandom(1000),
        f"{bucket}/fs/sub dir/b ü.bin": os.urandom(300 * KiB),
        f"{bucket}/fs/empty": b"",
    }
    for path, data in files.items():
        with fs.open(path, "wb") as fh:
            fh.write(data)
    for path, data in files.items():
        with fs.open(path, "rb") as fh:
            assert fh.read() == data
        assert fs.cat_file(path) == data
        assert fs.info(path)["size"] == len(data)
    # A ranged read through s3fs' block cache.
    with fs.open(f"{bucket}/fs/sub dir/b ü.bin", "rb", block_size=64 * KiB) as fh:
        fh.seek(100_000)
        assert fh.read(70_000) == files[f"{bucket}/fs/sub dir/b ü.bin"][100_000:170_000]

    assert set(fs.ls(f"{bucket}/fs", detail=False)) == {
        f"{bucket}/fs/a.bin",
        f"{bucket}/fs/empty",
        f"{bucket}/fs/sub dir",
    }
    assert set(fs.find(f"{bucket}/fs")) == set(files)

    fs.rm(f"{bucket}/fs/a.bin")
    assert not fs.exists(f"{bucket}/fs/a.bin")
    assert set(all_keys(backend, bucket)) == {"fs/sub dir/b ü.bin", "fs/empty"}
    fs.rm(f"{bucket}/fs", recursive=True)
    assert all_keys(backend, bucket) == []


def test_s3fs_multipart_write(fs: Any, backend: Any, bucket: str) -> None:
    data = os.urandom(12 * MiB + 3)
    with fs.open(f"{bucket}/fs/big.bin", "wb", block_size=5 * MiB) as fh:
        for start in range(0, len(data), MiB):
            fh.write(data[start : start + MiB])
    head = backend.head_object(Bucket=bucket, Key="fs/big.bin")
    assert head["ContentLength"] == len(data)
    assert "-" in head["ETag"]  # s3fs flushed 5 MiB blocks as parts
    assert backend.get_object(Bucket=bucket, Key="fs/big.bin")["Body"].read() == data
    assert fs.cat_file(f"{bucket}/fs/big.bin") == data


# --- AWS CLI -----------------------------------------------------------------------------------------------


def aws(gateway: Gateway, *args: str, https: bool = True) -> str:
    endpoint = gateway.https_url if https else gateway.http_url
    proc = subprocess.run(
        [AWS_CLI, "--endpoint-url", endpoint, *args],
        env=gateway.env(),
        capture_output=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return proc.stdout.decode()


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_aws_cli_cp_multipart_up_and_down(
    gateway: Gateway, backend: Any, bucket: str, tmp_path: Path, https: bool
) -> None:
    data = os.urandom(20 * MiB + 11)
    src, dst = tmp_path / "up.bin", tmp_path / "down.bin"
    src.write_bytes(data)

    aws(gateway, "s3", "cp", str(src), f"s3://{bucket}/cli/big file.bin", https=https)
    head = backend.head_object(Bucket=bucket, Key="cli/big file.bin")
    assert head["ContentLength"] == len(data)
    assert "-" in head["ETag"]  # above the CLI's 8 MiB threshold: multipart
    aws(gateway, "s3", "cp", f"s3://{bucket}/cli/big file.bin", str(dst), https=https)
    assert dst.read_bytes() == data


def test_aws_cli_sync_and_ls(gateway: Gateway, backend: Any, bucket: str, tmp_path: Path) -> None:
    tree = {
        "top.txt": b"top level\n",
        "empty.bin": b"",
        "sub/one.bin": os.urandom(1000),
        "sub/deeper/two ü.bin": os.urandom(300 * KiB),
        "other/three+plus.bin": os.urandom(9 * MiB),
    }
    up = tmp_path / "up"
    for rel, data in tree.items():
        (up / rel).parent.mkdir(parents=True, exist_ok=True)
        (up / rel).write_bytes(data)
        # S3's LastModified has whole seconds: a file written in the same second as its upload would look
        # newer than its copy to the second sync. Date the tree a minute back.
        past = time.time() - 60
        os.utime(up / rel, (past, past))

    aws(gateway, "s3", "sync", str(up), f"s3://{bucket}/synced")
    assert set(all_keys(backend, bucket)) == {f"synced/{rel}" for rel in tree}
    for rel, data in tree.items():
        assert backend.get_object(Bucket=bucket, Key=f"synced/{rel}")["Body"].read() == data

    listing = aws(gateway, "s3", "ls", f"s3://{bucket}/synced/")
    names = {line.split()[-1] for line in listing.splitlines() if line.strip()}
    assert names == {"sub/", "other/", "top.txt", "empty.bin"}
    recursive = aws(gateway, "s3", "ls", "--recursive", f"s3://{bucket}/synced/")
    assert "synced/sub/deeper/two ü.bin" in recursive
    assert len([line for line in recursive.splitlines() if line.strip()]) == len(tree)

    # A second sync uploads nothing; syncing down reproduces the tree.
    assert aws(gateway, "s3", "sync", str(up), f"s3://{bucket}/synced").strip() == ""
    down = tmp_path / "down"
    aws(gateway, "s3", "sync", f"s3://{bucket}/synced", str(down))
    for rel, data in tree.items():
        assert (down / rel).read_bytes() == data
    assert not filecmp.dircmp(up, down).diff_files
