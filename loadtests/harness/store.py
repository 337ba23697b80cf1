"""The store the benchmarks run against: a SeaweedFS of their own, with one identity and one bucket."""

from __future__ import annotations

from pathlib import Path

from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess

BUCKET = "bench"
REGION = "us-east-1"
ACCESS_KEY = "BENCHACCESSKEY000001"
SECRET_KEY = "bench-secret-key-not-a-real-one-0000000"


def seaweed(
    state_dir: Path, name: str, access_key: str, secret_key: str, buckets: tuple[str, ...]
) -> SeaweedProcess:
    """A SeaweedFS (not started yet) in ``state_dir`` with one identity and ``buckets`` made at start."""
    return SeaweedProcess(
        SeaweedOptions(
            state_dir=state_dir,
            identities=(SeaweedIdentity(name, access_key, secret_key),),
            buckets=buckets,
        )
    )


def new_weed(tmp: Path) -> SeaweedProcess:
    """The benchmarks' SeaweedFS (not started yet) under ``tmp/seaweedfs``: the bench identity and bucket."""
    return seaweed(tmp / "seaweedfs", "bench", ACCESS_KEY, SECRET_KEY, (BUCKET,))
