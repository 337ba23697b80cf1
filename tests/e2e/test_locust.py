"""The Locust load test (loadtests/) against the real gateway: data prep, a compressed training run in
distributed mode, the phase statistics, and proof that requests are signed.

Locust runs as a subprocess (``python -m locust``), as users run it: importing it here would monkey-patch
the test process with gevent.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
DATASET = ["--dataset-prefix", "ds/", "--dataset-objects", "8", "--dataset-object-size", "1MiB"]


def _env(gw: Gateway, *, secret: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=gw.access_key,
        AWS_SECRET_ACCESS_KEY=secret or gw.secret_key,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    return env


def _run(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _stats_row(rows: list[dict[str, str]], rtype: str, name: str) -> dict[str, str]:
    found = [r for r in rows if r["Type"] == rtype and r["Name"] == name]
    assert found, f"no {rtype} {name!r} row in {[(r['Type'], r['Name']) for r in rows]}"
    return found[0]


def _dataprep(gw: Gateway, bucket: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loadtests.dataprep", "--host", gw.http_url, "--bucket", bucket]
    cmd += ["--prefix", "ds/", "--objects", "8", "--size", "1MiB", "--concurrency", "4", "--quiet"]
    return _run(cmd, _env(gw), timeout_s=60)


def test_dataprep_creates_the_dataset_once(spool_gateway: Gateway, bucket: str, backend: Any) -> None:
    first = _dataprep(spool_gateway, bucket)
    assert first.returncode == 0, first.stderr
    assert "wrote 8 " in first.stdout
    listed = backend.list_objects_v2(Bucket=bucket, Prefix="ds/")["Contents"]  # write-through: on the store
    assert [(o["Key"], o["Size"]) for o in listed] == [(f"ds/train-{i:06d}.tar", MIB) for i in range(8)]

    again = _dataprep(spool_gateway, bucket)
    assert again.returncode == 0, again.stderr
    assert "wrote 0 " in again.stdout and "8 already present" in again.stdout


def test_training_run_reads_writes_bursts_and_reports_phases(
    spool_gateway: Gateway, bucket: str, backend: Any, tmp_path: Path
) -> None:
    gw = spool_gateway
    assert _dataprep(gw, bucket).returncode == 0
    prefix = tmp_path / "run"
    cmd = [sys.executable, "-m", "locust", "-f", "loadtests/locustfile_training.py", "--headless"]
    cmd += ["--host", gw.http_url, "-t", "15s", "-r", "50", "--csv", str(prefix), "--processes", "2"]
    cmd += ["--s3-bucket", bucket, *DATASET, "--read-size", "64KiB", "--read-rate", "25", "--readers", "4"]
    # the training shape compressed: a 24 MiB burst (two writers, 12 MiB each) every 4 s after 2 s
    cmd += ["--ckpt-writers", "2", "--ckpt-size", "24MiB", "--ckpt-part-size", "5MiB", "--ckpt-period-s", "4"]
    cmd += ["--ckpt-warmup-s", "2", "--ckpt-prefix", "ckpt/", "--ckpt-keep", "0", "--s3-lane-hints"]
    cmd += ["--lister-users", "1", "--lister-wait-s", "1", "--lister-heads", "3", "--phase-slot-s", "0.1"]
    done = _run(cmd, _env(gw), timeout_s=45)
    assert done.returncode == 0, done.stderr[-4000:]

    for suffix in ("stats", "stats_history", "failures", "exceptions", "phases", "bursts"):
        assert (tmp_path / f"run_{suffix}.csv").is_file(), suffix
    stats = _rows(tmp_path / "run_stats.csv")
    reads = _stats_row(stats, "GET", "GET dataset range")
    assert int(reads["Request Count"]) > 50 and reads["Failure Count"] == "0"
    for rtype, name in (
        ("POST", "POST create multipart"),
        ("PUT", "PUT part"),
        ("POST", "POST complete multipart"),
    ):
        row = _stats_row(stats, rtype, name)
        assert int(row["Request Count"]) > 0 and row["Failure Count"] == "0", row
    assert int(_stats_row(stats, "GET", "LIST dataset page")["Request Count"]) > 0
    assert int(_stats_row(stats, "HEAD", "HEAD dataset object")["Request Count"]) > 0
    shares = _stats_row(stats, "BURST", "checkpoint share (one writer)")
    assert int(shares["Request Count"]) >= 2 and shares["Failure Count"] == "0"

    # per-phase statistics (merged on the master from both workers' reports)
    phases = _rows(tmp_path / "run_phases.csv")
    read_phases = {r["Phase"]: r for r in phases if r["Name"] == "GET dataset range"}
    assert set(read_phases) == {"in_burst", "outside_burst"}, phases
    for row in read_phases.values():
        assert int(row["Request Count"]) > 0 and row["Failure Count"] == "0", row
        assert float(row["50%"]) <= float(row["99%"]) <= float(row["Max Response Time"]), row
    # Both come from the same worker reports, but Locust writes its CSV every second, and the workers'
    # last report may arrive after its last write: the phases can only have more.
    total = sum(int(r["Request Count"]) for r in read_phases.values())
    assert int(reads["Request Count"]) <= total <= 1.1 * int(reads["Request Count"])
    bursts = [b for b in _rows(tmp_path / "run_bursts.csv") if b["Open"] == "0"]
    assert len(bursts) >= 1 and all(b["Writers"] == "2" for b in bursts), bursts

    # the checkpoints: complete through the gateway, and on the store once flushed
    completes = int(_stats_row(stats, "POST", "POST complete multipart")["Request Count"])
    through_gw = gw.client().list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", [])
    assert len(through_gw) >= completes >= 2
    assert {o["Size"] for o in through_gw} == {12 * MIB}
    assert len({o["Key"].rsplit("__", 1)[1] for o in through_gw}) == 2  # one object per writer and burst
    gw.flush(bucket, "ckpt/")
    on_store = backend.list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", [])
    assert sorted(o["Key"] for o in on_store) == sorted(o["Key"] for o in through_gw)


def test_requests_are_signed_a_wrong_secret_fails_with_403(
    gateway: Gateway, bucket: str, tmp_path: Path
) -> None:
    prefix = tmp_path / "bad"
    cmd = [sys.executable, "-m", "locust", "-f", "loadtests/locustfile.py", "--headless", "--host"]
    cmd += [gateway.http_url, "-u", "2", "-r", "10", "-t", "3s", "--csv", str(prefix), "--s3-bucket", bucket]
    cmd += [*DATASET, "--ckpt-writers", "0", "--lister-users", "1", "--lister-wait-s", "0.5"]
    done = _run(cmd, _env(gateway, secret="not-the-secret"), timeout_s=30)
    assert done.returncode == 1, done.stderr[-4000:]  # Locust's exit code when requests failed

    stats = _rows(tmp_path / "bad_stats.csv")
    reads = _stats_row(stats, "GET", "GET dataset range")
    assert int(reads["Request Count"]) > 0 and reads["Failure Count"] == reads["Request Count"]
    failures = _rows(tmp_path / "bad_failures.csv")
    assert failures and all("HTTP 403 SignatureDoesNotMatch" in f["Error"] for f in failures), failures
    phases = _rows(tmp_path / "bad_phases.csv")  # no burst: everything is outside
    outside = [r for r in phases if r["Phase"] == "outside_burst" and r["Name"] == "GET dataset range"]
    assert outside and outside[0]["Failure Count"] == outside[0]["Request Count"]
