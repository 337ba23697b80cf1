"""Hostile HTTP input against a real gateway: the quick mode of ``loadtests/fuzz_http/``.

Runs ``python -m loadtests.fuzz_http --quick`` (600 cases: broken auth, bad dates, truncated and oversized
bodies, bad aws-chunked framing, invalid ranges, odd keys, bad XML, odd methods, HTTP/1.0, pipelining,
garbage) against a fresh ``s3lanes serve`` with its spool on, in front of the session's SeaweedFS, and
requires every must-be-0 figure to be 0: no crash, no 500, no file outside the spool and state directories,
no partial or missing object on the backend, no multipart upload left open, no read-back that differs, no
desynchronised connection, no traceback in the gateway's log.

The seed is random and printed on failure; ``S3LANES_FUZZ_SEED`` fixes it. Replay one case with
``python -m loadtests.fuzz_http --seed <seed> --only-case <n>`` (it prints every request and answer). The
full run (10,000 cases) and its figures are in ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 150.0


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_hostile_http_input_crashes_nothing_answers_no_500_and_loses_nothing(
    seaweed: Any, tmp_path: Path
) -> None:
    seed = int(os.environ.get("S3LANES_FUZZ_SEED") or secrets.randbelow(2**31))
    out = tmp_path / "fuzz-http.json"
    cmd = [
        sys.executable,
        "-m",
        "loadtests.fuzz_http",
        "--quick",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--tmp-dir",
        str(tmp_path),
        "--backend-endpoint",
        seaweed.endpoint_url,
        "--backend-access-key",
        seaweed.admin.access_key,
    ]
    env = {**os.environ, "FUZZ_HTTP_BACKEND_SECRET_KEY": seaweed.admin.secret_key}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.exists(), (
        f"no results (exit code {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    doc = json.loads(out.read_text())
    report = (
        f"{proc.stdout[-8000:]}\nseed {seed}: replay a case with "
        f"`python -m loadtests.fuzz_http --seed {seed} --only-case N`; results and gateway logs in {tmp_path}"
    )
    assert doc["figures"]["cases_run"] >= 600, report
    assert doc["figures"]["requests"] >= 1500, report
    assert {name: n for name, n in doc["must_be_zero"].items() if n} == {}, report
    assert proc.returncode == 0, report
