"""examples/train_loop.py and examples/restore.py run as users run them: through the gateway, and the restore
also straight from the backend (plain S3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 120


def run(script: str, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_train_loop_checkpoints_and_restore_resumes(
    gateway: Gateway, seaweed: Any, backend: Any, bucket: str
) -> None:
    env = gateway.env() | {"S3LANES_ENDPOINT_URL": gateway.http_url}
    out = run(
        "train_loop.py",
        env,
        *("--bucket", bucket, "--make-dataset", "64", "--steps", "4", "--every", "2"),
        *("--batch-size", "16", "--workers", "2"),
    )
    assert "step 2:" in out and "step 4:" in out and "checkpoints durable on the store: True" in out
    keys = {o["Key"] for o in backend.list_objects_v2(Bucket=bucket, Prefix="ckpt/")["Contents"]}
    assert {"ckpt/example-run/latest", "ckpt/example-run/step_4/.metadata"} <= keys
    assert "restored s3://" in run("restore.py", env, "--bucket", bucket)
    direct = env | {"S3LANES_ENDPOINT_URL": seaweed.endpoint_url}
    assert "step 4," in run("restore.py", direct, "--bucket", bucket)
