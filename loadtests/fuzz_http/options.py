"""The run's settings (:class:`Options`), the store to use (:class:`BackendSpec`), the constants."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import s3lanes

QUICK_CASES = 600
FULL_CASES = 10_000
REGION = "us-east-1"
ACCESS_KEY = "FUZZHTTPACCESSKEY001"
UNKNOWN_ACCESS_KEY = "FUZZHTTPUNKNOWNKEY01"
GATEWAY_SOURCE = Path(s3lanes.__file__).resolve().parent.parent
GATEWAY_START_TIMEOUT_S = 30.0
GATEWAY_STOP_TIMEOUT_S = 30.0
# One answer. Hostile input is answered in milliseconds, but a write to a key whose spooled data is still
# draining may wait up to 30 s (s3lanes.http.spool_common.KEY_CLEAR_TIMEOUT_S) before its answer.
READ_TIMEOUT_S = 45.0
CONNECT_TIMEOUT_S = 5.0
FLUSH_TIMEOUT_S = 300.0
FLUSH_WINDOW_S = 4.0  # one flush call; the drain retries a failed upload within 2 s (retry_max_s below)
FLUSH_STALL_WINDOWS = 3  # pending count not falling for this many windows: the drain is stuck
MAX_ANSWER_HEAD_BYTES = 256 * 1024
MAX_ANSWER_BODY_BYTES = 64 * 1024 * 1024
SMALL_BODY_BYTES = 256 * 1024  # bodies up to this size are verified whole (s3lanes.http.intake)
MIN_PART_BYTES = 5 * 1024 * 1024
MAX_EXAMPLES_PER_FINDING = 3
MAX_RESTARTS = 25
EXCERPT_BYTES = 1500
WRITE_THROUGH = ("x-s3lanes-write-through", "true")
# weed makes one unix socket per gRPC server in /tmp with no flag to move it (s3lanes.seaweed).
_WEED_SOCKET_RE = re.compile(r"^seaweedfs-\w+-grpc-\d+\.sock$")
# What a spool directory may hold: its lock file, the journal (and its compaction tmp), data files.
_SPOOL_LAYOUT_RE = re.compile(r"^(lock|journal|journal\.tmp|data|data/[0-9a-f]{32})$")
_TRACEBACK = "Traceback (most recent call last)"
S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


T = TypeVar("T")


class FuzzError(RuntimeError):
    """The harness could not run (SeaweedFS or the gateway did not start, the bucket is missing)."""


# --------------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """An S3 store that is already running (the test suite's SeaweedFS), instead of starting one."""

    endpoint_url: str
    access_key: str
    secret_key: str


@dataclass(frozen=True, slots=True)
class Options:
    cases: int
    seed: int
    quick: bool
    out: Path | None
    concurrency: int
    tmp_dir: Path | None
    keep: bool
    backend: BackendSpec | None
    only_cases: tuple[int, ...]
    verbose: bool
    command: str
    gateway_source: Path = GATEWAY_SOURCE
    kinds: tuple[str, ...] = ()  # only these case kinds (all when empty)
