"""The gateway under test as a process of ours: started from a config, ready when its ready file says
so, stopped by its pid (SIGTERM, then SIGKILL after a timeout).

Every benchmark and load test starts ``python -m s3lanes serve --config CFG --ready-file READY`` the same
way: in its own session (a Ctrl-C reaches the harness only, which stops the gateway in order), its output
in a log file, from the directory holding the gateway package to run (by default the code imported here;
another tree to compare, ``python -m gateway`` from a tree of the layout before the package rename), and
waits for the ready file the gateway writes once it listens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import s3lanes
from loadtests.harness.endpoint import Endpoint
from loadtests.harness.errors import BenchError
from loadtests.harness.store import ACCESS_KEY, REGION, SECRET_KEY

# The directory holding the gateway package under test (gateway/ of a checkout, or of an exported tree run
# with PYTHONPATH pointing at this one's loadtests/): `python -m s3lanes` runs from it.
GATEWAY_SOURCE = Path(s3lanes.__file__).resolve().parent.parent


# The import package of the gateway in a tree: `s3lanes` (gateway/s3lanes/), or `gateway` in a tree from
# before the package rename (the package at the tree's root: gateway/__main__.py).
PACKAGE = "s3lanes"
OLD_PACKAGE = "gateway"


def tree_source(tree: Path) -> Path:
    """Where to run the gateway from for a checkout or an exported tree: its gateway/ folder, or the tree
    itself for a tree of the old layout (package `gateway` at its root, run as `python -m gateway`)."""
    if (
        not (tree / "gateway" / PACKAGE / "__main__.py").is_file()
        and (tree / OLD_PACKAGE / "__main__.py").is_file()
    ):
        return tree
    return tree / "gateway"


def gateway_package(source: Path) -> str:
    """The package to run with `python -m` from ``source`` (a :func:`tree_source` directory)."""
    if not (source / PACKAGE / "__main__.py").is_file() and (source / OLD_PACKAGE / "__main__.py").is_file():
        return OLD_PACKAGE
    return PACKAGE


def is_gateway_tree(tree: Path) -> bool:
    source = tree_source(tree)
    return (source / gateway_package(source) / "__main__.py").is_file()


GATEWAY_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
READY_POLL_S = 0.02
SPOOL_DRAIN_CONCURRENCY = 8  # the gateway's default [spool] drain_concurrency, stated in the config


@dataclass(slots=True)
class GatewayProcess:
    """A gateway (or a helper server of a benchmark) running as our subprocess, stopped by its pid."""

    name: str
    popen: subprocess.Popen[bytes]
    pid: int
    endpoint: Endpoint
    log: Path
    config_text: str = ""
    spool_dir: Path | None = None
    exit_code: int | None = None
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.endpoint.netloc}"


def spawn(
    argv: list[str],
    log: Path,
    *,
    cwd: Path | None,
    env: Mapping[str, str] | None = None,
    new_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr in ``log`` (truncated), in its own session unless not
    ``new_session`` (then a Ctrl-C in the terminal reaches it too); ``cwd`` None: ours."""
    # The child gets its own copy of the descriptor; ours is closed at once.
    with open(log, "wb") as log_fh:
        return subprocess.Popen(
            argv,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,  # Ctrl-C reaches the harness only; it stops the process in order
            cwd=cwd,
            env=None if env is None else dict(env),
        )


def wait_ready(
    popen: subprocess.Popen[bytes],
    ready: Path,
    log: Path,
    timeout_s: float,
    what: str,
    *,
    error: type[Exception] = BenchError,
    poll_s: float = READY_POLL_S,
) -> Any:
    """The ready file's document once it exists; ``error`` with the log's tail if the process exits or
    ``timeout_s`` passes first (the process is left running: the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if popen.poll() is not None or time.monotonic() > deadline:
            raise error(f"{what} did not start:\n" + tail(log))
        time.sleep(poll_s)
    return json.loads(ready.read_text())


def http_endpoint(ready_doc: Mapping[str, Any]) -> Endpoint:
    """The plain HTTP listener a gateway's ready file names."""
    return Endpoint.from_url(next(u for u in ready_doc["endpoints"] if u.startswith("http://")))


def start_gateway(
    directory: Path,
    config_text: str,
    *,
    name: str = "gateway",
    source: Path = GATEWAY_SOURCE,
    env: Mapping[str, str] | None = None,
    timeout_s: float = GATEWAY_START_TIMEOUT_S,
    error: type[Exception] = BenchError,
    config_name: str = "s3lanes.toml",
    ready_name: str = "ready.json",
    log_name: str = "gateway.log",
    spool_dir: Path | None = None,
) -> GatewayProcess:
    """Write ``config_text`` into ``directory`` (created if missing), start the gateway of ``source`` on it
    and wait until it is ready. On a failed start the process is stopped and ``error`` raised."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / config_name
    cfg.write_text(config_text)
    ready = directory / ready_name
    log = directory / log_name
    argv = [
        sys.executable,
        "-m",
        gateway_package(source),
        "serve",
        "--config",
        str(cfg),
        "--ready-file",
        str(ready),
    ]
    popen = spawn(argv, log, cwd=source, env=env)
    try:
        what = "the gateway" if name == "gateway" else f"gateway {name}"
        doc = wait_ready(popen, ready, log, timeout_s, what, error=error)
    except BaseException:
        stop_process(popen)
        raise
    return GatewayProcess(
        name, popen, int(doc["pid"]), http_endpoint(doc), log, config_text, spool_dir, ready=doc
    )


def stop_process(popen: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM by pid, SIGKILL after ``timeout_s``; the exit code."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return popen.returncode


def stop_gateway(proc: GatewayProcess, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """:func:`stop_process`, the exit code kept in ``proc.exit_code``."""
    proc.exit_code = stop_process(proc.popen, timeout_s)
    return proc.exit_code


def tail(path: Path | None, n_bytes: int = 4000) -> str:
    """The end of a log file, for an error message."""
    if path is None or not path.exists():
        return "(no log)"
    return path.read_bytes()[-n_bytes:].decode(errors="replace")


def server_toml(
    state_dir: Path, *, log_level: str = "WARNING", shutdown_grace_s: float = 5, listen: str = "127.0.0.1:0"
) -> str:
    """The ``[server]`` section of a gateway under test: one loopback listener (a free port by default),
    no drain on shutdown (the harness flushes when it wants the spool empty)."""
    return f"""[server]
listen = "{listen}"
state_dir = "{state_dir}"
log_level = "{log_level}"
shutdown_grace_s = {shutdown_grace_s:g}
drain_on_shutdown_s = 0
"""


@dataclass(frozen=True, slots=True)
class SpoolGatewaySpec:
    """A spooling gateway under test: the store it fronts, its spool directory, the store's bandwidth as
    the gateway limits it (None: no limit) and lines added to its ``[spool]`` and ``[server]`` sections."""

    backend_url: str
    spool_dir: Path
    bandwidth_bps: float | None = None
    spool_extra: str = ""
    server_extra: str = ""


def spool_gateway_toml(d: Path, spec: SpoolGatewaySpec) -> str:
    """The config of the spooling gateway ``spec`` in ``d``, with the bench credentials."""
    bandwidth = f"bandwidth = {spec.bandwidth_bps:.0f}  # bytes/s\n" if spec.bandwidth_bps else ""
    return f"""{server_toml(d / "state")}{spec.server_extra}

[backend]
endpoint = "{spec.backend_url}"
region = "{REGION}"
{bandwidth}
[spool]
enabled = true
dir = "{spec.spool_dir}"
drain_concurrency = {SPOOL_DRAIN_CONCURRENCY}
{spec.spool_extra}
[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
"""


def start_spool_gateway(
    root: Path, name: str, spec: SpoolGatewaySpec, *, source: Path = GATEWAY_SOURCE
) -> GatewayProcess:
    """The spooling gateway ``spec`` in ``root/gw-<name>``. ``source``: the directory holding the gateway
    package to run (another tree to compare)."""
    d = root / f"gw-{name}"
    d.mkdir()
    text = spool_gateway_toml(d, spec)
    return start_gateway(d, text, name=name, source=source, spool_dir=spec.spool_dir)
