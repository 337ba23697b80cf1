"""Client keys from ``[server] credentials_file``, rotated while the gateway runs: the Kubernetes
Secret-as-volume layout (the file is a symlink through ``..data`` to a timestamped directory, and an update
swaps ``..data`` atomically), against a real ``s3lanes serve`` and SeaweedFS."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e


def publish(secret_dir: Path, version: str, content: str) -> None:
    """What the kubelet does: write the new version in its own directory, then swap the ``..data`` link."""
    target = secret_dir / f"..{version}"
    target.mkdir()
    (target / "credentials").write_text(content)
    tmp_link = secret_dir / "..data_tmp"
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, secret_dir / "..data")
    link = secret_dir / "credentials"
    if not link.is_symlink():
        link.symlink_to("..data/credentials")


def test_rotated_keys_in_a_mounted_secret_apply_without_a_restart(
    seaweed: Any, unique_bucket: str, tmp_path: Path
) -> None:
    admin = seaweed.admin
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    publish(secret_dir, "v1", f"# job keys\njob-a:secret-a:{admin.access_key}:{admin.secret_key}\n")
    server_toml = f'credentials_file = "{secret_dir / "credentials"}"'
    proc, gw = start_plain_gateway(
        tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, server_toml=server_toml
    )
    try:
        a = gw.client(access_key="job-a", secret="secret-a")
        b = gw.client(access_key="job-b", secret="secret-b")
        try:
            a.put_object(Bucket=unique_bucket, Key="from-a", Body=b"a")
            with pytest.raises(ClientError) as caught:
                b.head_bucket(Bucket=unique_bucket)
            assert caught.value.response["Error"]["Code"] in ("InvalidAccessKeyId", "403")

            publish(secret_dir, "v2", f"job-b:secret-b:{admin.access_key}:{admin.secret_key}\n")
            deadline = time.monotonic() + 15
            while True:
                try:
                    b.put_object(Bucket=unique_bucket, Key="from-b", Body=b"b")
                    break
                except ClientError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            with pytest.raises(ClientError) as caught:
                a.put_object(Bucket=unique_bucket, Key="from-a-again", Body=b"a")
            assert caught.value.response["Error"]["Code"] == "InvalidAccessKeyId"
            assert b.get_object(Bucket=unique_bucket, Key="from-a")["Body"].read() == b"a"

            publish(secret_dir, "v3", "this is not a key pair\n")  # a typo: the previous keys stay
            time.sleep(5)
            b.head_object(Bucket=unique_bucket, Key="from-b")
        finally:
            a.close()
            b.close()
        assert proc.poll() is None  # the same process all along
        log = gw.log_path.read_text(errors="replace")
        assert "reloaded: 1 keys (added job-b; removed job-a; changed none)" in log, log[-3000:]
        assert "not applied (keeping the previous keys)" in log
    finally:
        stop_and_check(proc, gw)
