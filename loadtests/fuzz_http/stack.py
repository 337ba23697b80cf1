"""The stack: SeaweedFS, the gateway, and the directories a hostile key must not escape."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.fuzz_http.options import (
    _SPOOL_LAYOUT_RE,
    ACCESS_KEY,
    GATEWAY_SOURCE,
    GATEWAY_START_TIMEOUT_S,
    GATEWAY_STOP_TIMEOUT_S,
    REGION,
    BackendSpec,
    FuzzError,
)
from loadtests.harness.gateway import http_endpoint, server_toml, spawn, stop_process, wait_ready
from s3lanes.seaweed.process import SeaweedProcess

# --------------------------------------------------------------------------------------------------------
# The stack: SeaweedFS, the gateway, and the directories a hostile key must not escape


@dataclass(slots=True)
class Stack:
    root: Path
    backend: BackendSpec
    weed: SeaweedProcess | None = None
    state_dir: Path = Path()
    spool_dir: Path = Path()
    run_dir: Path = Path()  # the harness's own: config, ready file, log
    gateway_cwd: Path = Path()
    gateway_tmp: Path = Path()
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = Path()
    host: str = "127.0.0.1"
    port: int = 0
    exit_code: int | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)
    gateway_source: Path = GATEWAY_SOURCE

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def gateway_toml(stack: Stack) -> str:
    b = stack.backend
    return f"""
{server_toml(stack.state_dir, log_level="INFO")}domains = ["localhost"]

[backend]
endpoint = "{b.endpoint_url}"
region = "{REGION}"
connect_timeout_s = 2
read_timeout_s = 30

[spool]
enabled = true
dir = "{stack.spool_dir}"
retry_base_s = 0.2
retry_max_s = 2

[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{b.secret_key}"
backend_access_key = "{b.access_key}"
backend_secret_key = "{b.secret_key}"
"""


def start_gateway(stack: Stack) -> None:
    for d in (stack.run_dir, stack.gateway_cwd, stack.gateway_tmp):
        d.mkdir(parents=True, exist_ok=True)
    cfg = stack.run_dir / "s3lanes.toml"
    cfg.write_text(gateway_toml(stack))
    stack.starts += 1
    ready = stack.run_dir / f"ready-{stack.starts}.json"
    stack.log_path = stack.run_dir / f"gateway-{stack.starts}.log"
    stack.logs.append(stack.log_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3LANES_"))}
    env["TMPDIR"] = str(stack.gateway_tmp)
    env["PYTHONPATH"] = str(stack.gateway_source)
    argv = [sys.executable, "-m", "s3lanes", "serve", "--config", str(cfg), "--ready-file", str(ready)]
    # In its own session: a Ctrl-C reaches this script only; it stops the gateway itself.
    stack.proc = spawn(argv, stack.log_path, cwd=stack.gateway_cwd, env=env)
    doc = wait_ready(
        stack.proc, ready, stack.log_path, GATEWAY_START_TIMEOUT_S, "the gateway", error=FuzzError
    )
    stack.port = http_endpoint(doc).port


def stop_gateway(stack: Stack) -> None:
    if stack.proc is not None:
        stack.exit_code = stop_process(stack.proc, GATEWAY_STOP_TIMEOUT_S)


def s3_client(backend: BackendSpec) -> Any:
    import boto3
    from botocore.config import Config

    cfg = Config(
        region_name=REGION,
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
    )
    return boto3.client(
        "s3",
        endpoint_url=backend.endpoint_url,
        aws_access_key_id=backend.access_key,
        aws_secret_access_key=backend.secret_key,
        config=cfg,
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What exists where a hostile key could make the gateway write (see the module doc)."""

    run_tree: frozenset[str]  # under the temporary directory, outside spool, state and harness directories
    marked: frozenset[str]  # anything anywhere scanned whose name carries the run's marker
    tmp_top: frozenset[str]
    cwd_top: frozenset[str]


def _walk(root: Path, skip: Sequence[Path]) -> Iterator[Path]:
    if not root.exists():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in dirnames + filenames:
            yield here / name


def snapshot(stack: Stack, marker: str) -> Snapshot:
    tmp = Path(tempfile.gettempdir())
    skip = [p for p in (stack.state_dir, stack.run_dir, stack.root / "seaweedfs") if p != Path()]
    run_tree = {str(p) for p in _walk(stack.root, skip)}
    marked = {p for p in run_tree if marker in Path(p).name}
    marked |= {str(p) for p in _walk(stack.state_dir, []) if marker in p.name}
    tmp_top = {p.name for p in tmp.iterdir()} if tmp.exists() else set()
    tmp_top |= {p.name for p in Path("/tmp").iterdir()}
    cwd_top = {p.name for p in Path.cwd().iterdir()}
    for name in tmp_top:
        if marker in name:
            marked.add(str(tmp / name))
    for name in cwd_top:
        if marker in name:
            marked.add(str(Path.cwd() / name))
    # Traversals may have made directories on the way (tmp/<marker>... under the spool or the cwd).
    for base in (tmp, Path("/tmp"), Path.cwd()):
        for p in base.glob(f"*/{marker}*"):
            marked.add(str(p))
    return Snapshot(frozenset(run_tree), frozenset(marked), frozenset(tmp_top), frozenset(cwd_top))


def spool_layout_violations(stack: Stack) -> list[str]:
    out = []
    for p in _walk(stack.spool_dir, []):
        rel = p.relative_to(stack.spool_dir).as_posix()
        if not _SPOOL_LAYOUT_RE.match(rel):
            out.append(str(p))
    return out
