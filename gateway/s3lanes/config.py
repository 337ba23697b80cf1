"""Configuration: frozen dataclasses, parsed and validated once at start.

Sources, later ones winning: built-in defaults < TOML file (``--config``) < environment (``S3LANES_*``)
< CLI flags.
Every problem found is collected and reported together in one :class:`~s3lanes.errors.ConfigError`, so a user
fixes a config file in one round instead of one error per start.

Environment overrides use ``S3LANES_<SECTION>_<KEY>`` for scalar settings (``S3LANES_BACKEND_ENDPOINT``,
``S3LANES_SERVER_LISTEN``...) and ``S3LANES_CREDENTIALS`` for the key table, a comma-separated list of
``access_key:secret_key[:backend_access_key:backend_secret_key]``. Containers get their secrets this way.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from s3lanes.core.access import TenantPolicy
from s3lanes.core.classify import Rule
from s3lanes.core.lanes_config import (
    default_lanes,
    parse_lanes,
    parse_rules,
    parse_tenant_policies,
    parse_tenants,
)
from s3lanes.core.scheduler import DEFAULT_CAP_HEADROOM, LaneSpec
from s3lanes.core.sniff import valid_default_content_type
from s3lanes.core.spool_deadline import DEFAULT_MAX_AGE_S
from s3lanes.errors import ConfigError

Addressing = Literal["path", "virtual"]

DEFAULT_HTTP_LISTEN = "127.0.0.1:9000"


@dataclass(frozen=True, slots=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: Listen | None = field(default_factory=lambda: Listen("127.0.0.1", 9000))
    https_listen: Listen | None = None
    # A separate plain-HTTP listener for /metrics and /_s3lanes/* (status, probes, page, drain); when set, the
    # S3 listeners no longer serve them, except the signed durability API POST /_s3lanes/flush. None = the
    # admin endpoints share the S3 listeners.
    admin_listen: Listen | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Virtual-hosted-style requests: Host "bucket.<domain>" for any of these domains.
    domains: tuple[str, ...] = ("localhost",)
    max_skew_s: float = 900.0
    # Largest request header section and URL we accept (S3 answers 400 beyond these).
    max_header_bytes: int = 8 * 1024
    max_url_bytes: int = 8 * 1024
    state_dir: Path = Path(".s3lanes")
    log_level: str = "INFO"
    # Seconds in-flight requests get to finish on shutdown.
    shutdown_grace_s: float = 30.0
    # Serve /metrics and /_s3lanes/status to every peer, not only loopback ones.
    admin_open: bool = False
    # Admin endpoints also answer peers sending "Authorization: Bearer <admin_token>" (None = loopback only).
    admin_token: str | None = field(default=None, repr=False)
    # "text" (human) or "json" (one object per line, for log pipelines).
    log_format: str = "text"
    # On SIGTERM: seconds to keep draining the spool after in-flight requests finish (0 = stop at once;
    # recovery on the next start resumes what is left).
    drain_on_shutdown_s: float = 60.0
    # GET bodies from the store at least this large are spliced from socket to socket in the kernel instead
    # of copied through the gateway (plain HTTP on both sides, Linux). The store connection is closed after
    # each, so small bodies keep their pooled connection. GETs from the spool use sendfile at any size.
    # 0 = never zero-copy (neither).
    zero_copy_min_bytes: int = 8 * 1024 * 1024
    # Unsigned (anonymous) GET/HEAD of objects, object listings and HEAD bucket are passed to the store
    # unsigned, so that the store's bucket policy or ACL decides (public-read buckets). Every other
    # anonymous request is refused (403 AccessDenied), as all are while this is off (docs/compatibility.md).
    anonymous_reads: bool = False
    # Readiness (/_s3lanes/readyz) answers 503 until every backend has answered once since start, so that a
    # gateway in front of an unreachable store gets no traffic. Later outages do not affect readiness.
    ready_requires_backend: bool = True
    # Client key pairs also come from this file (one access_key:secret_key[:backend_access_key:
    # backend_secret_key] per line or comma-separated, # comments), re-read when it changes: a Kubernetes
    # Secret mounted as a volume rotates keys without a restart. None = [[credentials]] and the environment.
    credentials_file: Path | None = None
    # Worker processes serving the listeners (one event loop, so one core, each). 1 = one process, as
    # before; N > 1: a supervisor binds the listeners and runs N workers on them (docs/deploy.md). The
    # workers share the node's write budget and bandwidth; worker 0 owns the spool, the others forward to it.
    workers: int = 1


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """An existing S3-compatible store. ``endpoint=None`` means: start the embedded SeaweedFS."""

    endpoint: str | None = None
    region: str = "us-east-1"
    addressing: Addressing = "path"
    verify_tls: bool = True
    ca_file: Path | None = None
    pool_size: int = 256
    connect_timeout_s: float = 5.0
    # Longest silence tolerated between two reads of a backend response (headers or body).
    read_timeout_s: float = 60.0
    # What the store can deliver (bytes/s), shared by all lanes. None = estimate it online.
    bandwidth_bps: float | None = None
    # SO_RCVBUF of backend connections (the kernel doubles it). Reads are paced as the gateway consumes
    # them; a small receive buffer keeps the store from pushing megabytes ahead of that pace into kernel
    # buffers, so the lane shares hold on the wire, not only in the gateway's accounting. 0 = autotuning.
    recv_buffer_bytes: int = 128 * 1024
    # TCP_NOTSENT_LOWAT of a store connection while a spool drain's body goes out on it paced under a cap
    # for the reads' sake: how much of it the kernel may hold not yet sent. A connection back from idle
    # restarts in slow start, and what its congestion window does not let out piles up in the socket
    # (megabytes with the kernel's autotuned send buffer) and then leaves at once: a burst over the lane's
    # cap on the wire. Bounding the unsent part bounds the burst, not the bytes in flight. 0 = no bound.
    notsent_lowat_bytes: int = 128 * 1024
    # Network planes: the local address outgoing connections are bound to (None = the kernel's choice), and
    # per lane, e.g. {"checkpoint": "10.1.0.5"} to send checkpoint drains over the storage network.
    source_address: str | None = None
    lane_source_addresses: Mapping[str, str] = field(default_factory=dict)
    # This backend's own identity (named backends): requests are re-signed as this key pair whatever the
    # client's key. None = the client key's backend identity ([[credentials]]), as for the default backend.
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    # Where this backend's identity comes from when access_key/secret_key are not set: "clients" (the client
    # key's backend identity, [[credentials]]) or "aws" (the standard AWS credential chain: environment,
    # shared config and credentials files, web identity / IRSA, container and instance metadata; temporary
    # credentials are refreshed before they expire). Static keys, when given, win.
    credential_source: Literal["clients", "aws"] = "clients"
    # The shared-config profile the AWS chain reads (None = AWS_PROFILE or "default").
    aws_profile: str | None = None
    # Another backend's name ("default" for [backend]) whose bottleneck this one shares (e.g. one array
    # behind two endpoints): both are then scheduled together, as one capacity. None = its own scheduler.
    shares_bottleneck_with: str | None = None
    # GET and HEAD over plain HTTP through the lean client (s3lanes.runtime.rawclient) instead of the aiohttp
    # session: about a third less gateway CPU per small GET. False = every request through the session.
    raw_reads: bool = True

    @property
    def embedded(self) -> bool:
        return self.endpoint is None


DEFAULT_BACKEND = "default"


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """``[[routes]]``: every operation on client-visible ``bucket`` goes to ``backend`` (the name of a
    ``[backends.<name>]`` table, or ``"default"``), where the bucket is called ``backend_bucket``."""

    bucket: str
    backend: str
    backend_bucket: str


@dataclass(frozen=True, slots=True)
class Credential:
    """A gateway key pair and the backend identity its requests are re-signed as (same pair by default)."""

    access_key: str
    secret_key: str
    backend_access_key: str
    backend_secret_key: str

    def __repr__(self) -> str:  # never print secrets
        return f"Credential(access_key={self.access_key!r}, backend_access_key={self.backend_access_key!r})"


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    s3_port: int = 0
    startup_timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    write_cap_mode: Literal["strict", "work_conserving"] = "strict"
    # Extra p99 latency reads may see over the idle baseline before paced lanes are cut back.
    latency_target_s: float = 0.005
    # Each request is charged this many bytes on top of its body (metadata operations pay only this).
    request_cost_bytes: int = 64 * 1024
    # Bodies are paced in chunks of this size through their lane.
    chunk_bytes: int = 1024 * 1024
    burst_bytes: int = 4 * 1024 * 1024
    window_s: float = 0.1
    inflight_bytes_max: int | None = None
    inflight_requests_max: int | None = None
    # While reads are active, a paced lane serves one round of its queue (every stream's next piece) within
    # this long, however hard the latency guard cuts it (up to the lane's cap). 0 = off.
    progress_interval_s: float = 2.0
    # While reads are active, capped lanes (and a durability floor raised toward the cap) are paced at
    # cap x (1 - cap_headroom), so that the write share stays under the cap on the wire. 0 = at the cap.
    cap_headroom: float = DEFAULT_CAP_HEADROOM


# Commit markers: objects drained only after everything spooled before them under the same prefix is on the
# backend. PyTorch DCP `.metadata`, DeepSpeed `latest`, Megatron `latest_checkpointed_iteration.txt`,
# TensorFlow `checkpoint`, Hadoop/Spark `_SUCCESS`, and the COMMIT/COMMITTED convention.
DEFAULT_COMMIT_MARKERS: tuple[str, ...] = (
    ".metadata",
    "COMMIT",
    "COMMITTED",
    "_SUCCESS",
    "latest",
    "latest_checkpointed_iteration.txt",
    "checkpoint",
)


@dataclass(frozen=True, slots=True)
class SpoolConfig:
    """The local write spool (burst buffer) for checkpoint writes. See docs/spool.md."""

    enabled: bool = True
    # Where spooled data and the journal live (local NVMe). Default: <state_dir>/spool.
    dir: Path | None = None
    # Bytes the spool may hold. 0 = 80% of the free space of its filesystem at start.
    capacity_bytes: int = 0
    # Above high_water * capacity new checkpoint writes are not spooled until usage falls below low_water.
    high_water: float = 0.90
    low_water: float = 0.75
    # What a write gets while the spool is full: "write_through" (sent straight to the backend) or
    # "slowdown" (503 SlowDown with Retry-After, for clients that should back off instead).
    when_full: Literal["write_through", "slowdown"] = "write_through"
    retry_after_s: int = 5
    # The durability deadline: acknowledged data must be on the backend within this long. Unset: within the
    # interval between checkpoint bursts the gateway observes (at most 3600 s; 3600 s until it has seen two).
    # The checkpoint lane's floor rises toward its cap as the deadline nears; data older than this (unset:
    # 3600 s) is reported as overdue.
    max_age_s: float | None = None

    @property
    def overdue_after_s(self) -> float:
        """Acknowledged data older than this is reported overdue: ``max_age_s``, or 3600 s when unset."""
        return DEFAULT_MAX_AGE_S if self.max_age_s is None else self.max_age_s

    # Lanes whose writes are spooled.
    lanes: tuple[str, ...] = ("checkpoint",)
    # Objects uploaded to the backend at once by the drainer.
    drain_concurrency: int = 8
    # Backoff between failed drain attempts: base * 2^n with full jitter, capped.
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    # Globs on the last path component of a key (see DEFAULT_COMMIT_MARKERS).
    commit_markers: tuple[str, ...] = DEFAULT_COMMIT_MARKERS
    # A listing merged with spooled keys reads the backend's listing of the prefix whole; beyond this many
    # backend keys the listing is refused with 503 rather than answered wrong.
    list_merge_max_keys: int = 200_000
    # The journal is rewritten with only live records once it grows past this.
    journal_compact_bytes: int = 64 * 1024 * 1024
    # Multipart uploads that were created in the spool and never completed are aborted after this long.
    abandoned_upload_s: float = 7 * 24 * 3600.0
    # Write data files with O_DIRECT (no copy into the page cache, no writeback storm after a burst) where the
    # spool's filesystem accepts it; probed at start, page cache otherwise.
    direct_io: bool = True
    # How long the store is given to apply (or drop) a drain request that may still be on its way to it
    # (a crash or an unanswered request left it there) before the key is read back and, if an older state
    # shows, the newest one applied again. None = [backend] read_timeout_s. See docs/spool.md (fencing).
    fence_s: float | None = None
    # The Content-Type of a spooled object written without one, kept with it and sent by the drain, so that
    # it answers the same in the spool and on the store: "sniff" (what SeaweedFS and Go-based stores pick:
    # the body's sniffed type for a PutObject, application/octet-stream for a multipart upload,
    # binary/octet-stream for a copy that replaces the headers) or one fixed type for every write (AWS S3:
    # "binary/octet-stream"). See docs/spool.md.
    default_content_type: str = "sniff"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A cluster-wide budget for shared lanes, through a Redis all gateways reach (docs/cluster.md).

    ``redis_url=None``: the gateway runs alone (nothing of the cluster code runs)."""

    redis_url: str | None = None
    # Namespace of the cluster's keys (s3lanes:<name>:...): gateways with one name share their budgets.
    name: str = "default"
    # This gateway in the cluster; unique per gateway.
    node_id: str = field(default_factory=socket.gethostname)
    # Every interval each gateway publishes its report and recomputes its allowance.
    interval_s: float = 0.5
    # A report not refreshed for ttl_intervals intervals is dropped (its gateway is gone).
    ttl_intervals: int = 3
    # Socket timeout of every Redis operation (a dead Redis must not hold the loop).
    redis_timeout_s: float = 0.25
    # Lanes whose budget is cluster-wide.
    lanes: tuple[str, ...] = ("checkpoint",)

    @property
    def enabled(self) -> bool:
        return self.redis_url is not None

    @property
    def ttl_s(self) -> float:
        return self.interval_s * self.ttl_intervals

    def __repr__(self) -> str:  # never print a Redis password
        url = self.redis_url
        if url is not None and urlsplit(url).password:
            url = re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)
        return (
            f"ClusterConfig(redis_url={url!r}, name={self.name!r}, node_id={self.node_id!r}, "
            f"interval_s={self.interval_s}, ttl_intervals={self.ttl_intervals}, lanes={self.lanes!r})"
        )


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    credentials: tuple[Credential, ...] = ()
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Named backends besides [backend] ("default"), and the buckets routed to them (docs/pools.md).
    backends: Mapping[str, BackendConfig] = field(default_factory=dict)
    routes: tuple[RouteConfig, ...] = ()
    lanes: Mapping[str, LaneSpec] = field(default_factory=default_lanes)
    rules: tuple[Rule, ...] = ()
    # access key -> lanes it may ask for with the x-s3lanes-lane hint (absent: every lane)
    tenant_lanes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # access key -> what it may read, write and which lanes it may use (tenants with read/write grants)
    tenant_policies: Mapping[str, TenantPolicy] = field(default_factory=dict)
    # The access keys of ``credentials`` that came from [server] credentials_file (replaced when it changes).
    file_access_keys: frozenset[str] = frozenset()

    def with_credentials(self, creds: tuple[Credential, ...]) -> Config:
        return replace(self, credentials=creds)


# --- parsing -----------------------------------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")


def parse_listen(value: str) -> Listen:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback). Raises ValueError with a readable message."""
    value = value.strip()
    if value.startswith("["):
        host, sep, port_s = value[1:].partition("]:")
        if not sep:
            raise ValueError(f"expected [ipv6]:port, got {value!r}")
    else:
        host, sep, port_s = value.rpartition(":")
        if not sep:
            raise ValueError(f"expected host:port, got {value!r}")
        host = host or "127.0.0.1"
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"port must be a number, got {port_s!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return Listen(host, port)


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}


def parse_size(value: Any) -> float:
    """``1048576``, ``"64KiB"``, ``"1.5 GB"`` -> bytes. Decimal units are powers of 1000, binary of 1024."""
    if isinstance(value, bool):
        raise ValueError("expected a size")
    if isinstance(value, int | float):
        out = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(number) :]
        if unit not in _SIZE_UNITS or not _NUMBER.fullmatch(number):
            raise ValueError(f"expected a size such as 512MiB or 2GB, got {value!r}")
        out = float(number) * _SIZE_UNITS[unit]
    if out != out or out < 0:
        raise ValueError("a size must be a non-negative number")
    return out


def parse_rate(value: Any) -> float:
    """``"60MB/s"``, ``"10GiB/s"``, ``"800M"`` or a number of bytes per second -> bytes per second."""
    if isinstance(value, str):
        text = value.strip()
        for suffix in ("/s", "ps", "/sec"):
            if text.lower().endswith(suffix):
                text = text[: -len(suffix)]
                break
        return parse_size(text)
    return parse_size(value)


_BOOL_TRUE = {"1", "true", "yes", "on"}
_BOOL_FALSE = {"0", "false", "no", "off"}


_INVALID: Any = object()  # what _coerce returns for a value it could not use (the problem is recorded)
_WHOLE = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _coerce(kind: str, value: Any, where: str, problems: _Problems) -> Any:
    """Turn a TOML or environment value into the declared kind; record a problem (in the user's terms, with
    the value once) and return ``_INVALID`` if it can't."""
    try:
        return _coerce_value(kind, value)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        problems.add(where, text if "got " in text else f"{text}, got {value!r}")
        return _INVALID


def _coerce_value(kind: str, value: Any) -> Any:
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value
    if kind == "opt_str":
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value or None
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
            return int(value.strip())
        raise ValueError("expected a whole number")
    if kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            out = float(value)
        elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            out = float(value.strip())
        else:
            raise ValueError("expected a number")
        if out != out or out < 0 or out == float("inf"):
            raise ValueError("expected a non-negative number")
        return out
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_TRUE | _BOOL_FALSE:
            return value.lower() in _BOOL_TRUE
        raise ValueError("expected true or false")
    if kind == "listen":
        if value in ("", None, False):
            return None
        if not isinstance(value, str):
            raise ValueError('expected "host:port" as a string')
        return parse_listen(value)
    if kind == "path":
        if not isinstance(value, str):
            raise ValueError("expected a path as a string")
        return Path(os.path.expanduser(value)) if value else None
    if kind == "rate":
        if value in ("", None):
            return None
        return parse_rate(value)
    if kind == "size":
        if value in ("", None):
            return None
        return int(parse_size(value))
    if kind == "str_map":
        if isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return dict(value)
        if isinstance(value, str):  # environment: "lane=addr,lane=addr"
            pairs = [p.partition("=") for p in value.split(",") if p.strip()]
            if all(sep and k.strip() and v.strip() for k, sep, v in pairs):
                return {k.strip(): v.strip() for k, _, v in pairs}
        raise ValueError("expected a table of names to strings (or name=value,... in the environment)")
    if kind == "str_list":
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError("expected a list of strings")
    raise AssertionError(kind)


SettingKind = Literal[
    "str", "opt_str", "int", "float", "bool", "listen", "path", "rate", "size", "str_map", "str_list"
]


@dataclass(frozen=True, slots=True)
class Setting:
    """One scalar setting, declared once: ``[section] key`` in TOML, ``S3LANES_<SECTION>_<KEY>`` in the
    environment, ``{section: {key: value}}`` from the command line. ``kind`` says how a value is read
    (:func:`_coerce_value`); the default is the dataclass field's. The schema check, the environment
    names, the renames and the settings that may be set back to none are all derived from
    :data:`SETTINGS`."""

    section: str
    # The name users write (units in the name, as they think of them: window_ms, capacity, bandwidth).
    key: str
    kind: SettingKind
    # The dataclass field it sets, when its name differs from ``key``.
    attr: str = ""
    # The TOML value times this is the field's value (window_ms -> window_s: 0.001). None: taken as is.
    scale: float | None = None
    # An empty value (or an empty string from the environment) sets the field to None rather than being
    # ignored (the field's default stays).
    nullable: bool = False

    @property
    def field_name(self) -> str:
        return self.attr or self.key

    @property
    def env_name(self) -> str:
        return f"S3LANES_{self.section.upper()}_{self.key.upper()}"


def _settings(section: str, *items: tuple[str, SettingKind] | Setting) -> tuple[Setting, ...]:
    return tuple(
        replace(i, section=section) if isinstance(i, Setting) else Setting(section, *i) for i in items
    )


def _nullable(key: str, kind: SettingKind) -> Setting:
    return Setting("", key, kind, nullable=True)


# Every [section] key: in each section, in the order the environment is read.
SETTINGS: tuple[Setting, ...] = (
    *_settings(
        "server",
        _nullable("listen", "listen"),
        _nullable("https_listen", "listen"),
        _nullable("admin_listen", "listen"),
        _nullable("tls_cert", "path"),
        _nullable("tls_key", "path"),
        ("domains", "str_list"),
        ("max_skew_s", "float"),
        ("max_header_bytes", "int"),
        ("max_url_bytes", "int"),
        ("state_dir", "path"),
        ("log_level", "str"),
        ("shutdown_grace_s", "float"),
        ("admin_open", "bool"),
        _nullable("admin_token", "opt_str"),
        ("log_format", "str"),
        ("drain_on_shutdown_s", "float"),
        ("zero_copy_min_bytes", "size"),
        ("workers", "int"),
        ("anonymous_reads", "bool"),
        _nullable("credentials_file", "path"),
        ("ready_requires_backend", "bool"),
    ),
    *_settings(
        "backend",
        _nullable("endpoint", "opt_str"),
        ("region", "str"),
        ("addressing", "str"),
        ("verify_tls", "bool"),
        _nullable("ca_file", "path"),
        ("pool_size", "int"),
        ("connect_timeout_s", "float"),
        ("read_timeout_s", "float"),
        Setting("", "bandwidth", "rate", attr="bandwidth_bps", scale=1.0, nullable=True),
        ("recv_buffer_bytes", "size"),
        ("notsent_lowat_bytes", "size"),
        _nullable("source_address", "opt_str"),
        Setting("", "lane_source_address", "str_map", attr="lane_source_addresses"),
        _nullable("access_key", "opt_str"),
        _nullable("secret_key", "opt_str"),
        ("credential_source", "str"),
        _nullable("aws_profile", "opt_str"),
        _nullable("shares_bottleneck_with", "opt_str"),
        ("raw_reads", "bool"),
    ),
    *_settings(
        "scheduler",
        ("write_cap_mode", "str"),
        Setting("", "latency_target_ms", "float", attr="latency_target_s", scale=0.001),
        ("request_cost_bytes", "size"),
        ("chunk_bytes", "size"),
        ("burst_bytes", "size"),
        Setting("", "window_ms", "float", attr="window_s", scale=0.001),
        _nullable("inflight_bytes_max", "size"),
        ("inflight_requests_max", "int"),
        ("progress_interval_s", "float"),
        ("cap_headroom", "float"),
    ),
    *_settings("embedded", ("s3_port", "int"), ("startup_timeout_s", "float")),
    *_settings(
        "spool",
        ("enabled", "bool"),
        ("dir", "path"),
        Setting("", "capacity", "size", attr="capacity_bytes", scale=1),
        ("high_water", "float"),
        ("low_water", "float"),
        ("when_full", "str"),
        ("retry_after_s", "int"),
        ("max_age_s", "float"),
        ("lanes", "str_list"),
        ("drain_concurrency", "int"),
        ("retry_base_s", "float"),
        ("retry_max_s", "float"),
        ("commit_markers", "str_list"),
        ("list_merge_max_keys", "int"),
        ("journal_compact_bytes", "size"),
        ("abandoned_upload_s", "float"),
        ("direct_io", "bool"),
        ("fence_s", "float"),
        ("default_content_type", "str"),
    ),
    *_settings(
        "cluster",
        _nullable("redis_url", "opt_str"),
        ("name", "str"),
        ("node_id", "str"),
        ("interval_s", "float"),
        ("ttl_intervals", "int"),
        ("redis_timeout_s", "float"),
        ("lanes", "str_list"),
    ),
)

# The dataclass each section builds.
SECTION_CLASSES: dict[str, type[Any]] = {
    "server": ServerConfig,
    "backend": BackendConfig,
    "scheduler": SchedulerSettings,
    "embedded": EmbeddedConfig,
    "spool": SpoolConfig,
    "cluster": ClusterConfig,
}

# section -> TOML key -> its declaration (derived from SETTINGS, in its order).
_SCHEMA: dict[str, dict[str, Setting]] = {}
for _setting in SETTINGS:
    _SCHEMA.setdefault(_setting.section, {})[_setting.key] = _setting
del _setting


def _section_values(name: str, raw: Mapping[str, Any], source: str, problems: _Problems) -> dict[str, Any]:
    schema = _SCHEMA[name]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        setting = schema.get(key)
        if setting is None:
            known = ", ".join(sorted(schema))
            problems.add(f"{source} [{name}].{key}", f"unknown setting (known: {known})")
            continue
        coerced = _coerce(setting.kind, value, f"{source} [{name}].{key}", problems)
        if coerced is not _INVALID and (coerced is not None or setting.nullable):
            out[key] = coerced
    return out


def _parse_credential_table(raw: Any, source: str, problems: _Problems) -> list[Credential]:
    creds: list[Credential] = []
    if not isinstance(raw, list):
        problems.add(source, "[[credentials]] must be an array of tables")
        return creds
    for i, item in enumerate(raw):
        where = f"{source} credentials[{i}]"
        if not isinstance(item, dict):
            problems.add(where, "expected a table with access_key and secret_key")
            continue
        unknown = set(item) - {"access_key", "secret_key", "backend_access_key", "backend_secret_key"}
        if unknown:
            problems.add(where, f"unknown keys {sorted(unknown)}")
        ak, sk = item.get("access_key"), item.get("secret_key")
        if not isinstance(ak, str) or not ak or not isinstance(sk, str) or not sk:
            problems.add(where, "access_key and secret_key are required non-empty strings")
            continue
        bak = item.get("backend_access_key", ak)
        bsk = item.get("backend_secret_key", sk)
        if not isinstance(bak, str) or not isinstance(bsk, str):
            problems.add(where, "backend_access_key and backend_secret_key must be strings")
            continue
        creds.append(Credential(ak, sk, bak, bsk))
    return creds


def parse_credentials_env(
    value: str, problems: _Problems | None = None, *, source: str = "S3LANES_CREDENTIALS"
) -> list[Credential]:
    problems = problems or _Problems()
    creds = []
    for i, item in enumerate(v for v in value.split(",") if v.strip()):
        parts = item.strip().split(":")
        if len(parts) == 2 and all(parts):
            creds.append(Credential(parts[0], parts[1], parts[0], parts[1]))
        elif len(parts) == 4 and all(parts):
            creds.append(Credential(*parts))
        else:
            problems.add(
                f"{source} item {i}",
                "expected access_key:secret_key"
                " or access_key:secret_key:backend_access_key:backend_secret_key",
            )
    return creds


# S3LANES_* variables other s3lanes tools read, which may be in the gateway's environment too: the client
# library's (s3lanes_client/config.py), the container's health check (deploy/Dockerfile), the test suites'.
OTHER_TOOLS_ENV = frozenset({"S3LANES_ENDPOINT_URL", "S3LANES_LANE", "S3LANES_HEALTH_URL"})
OTHER_TOOLS_ENV_PREFIXES = ("S3LANES_CONFORMANCE", "S3LANES_FUZZ_")


def _check_env_names(env: Mapping[str, str], problems: _Problems) -> None:
    """An unknown ``S3LANES_*`` variable is refused as an unknown TOML key is: a typo would otherwise be
    silently ignored, and the setting it meant left at its default."""
    known = {setting.env_name for setting in SETTINGS}
    known.add("S3LANES_CREDENTIALS")
    by_key: dict[str, list[str]] = {}
    for name in known:
        for section in _SCHEMA:
            prefix = f"S3LANES_{section.upper()}_"
            if name.startswith(prefix):
                by_key.setdefault(name[len(prefix) :], []).append(name)
    for name in sorted(env):
        if not name.startswith("S3LANES_") or name in known or name in OTHER_TOOLS_ENV:
            continue
        if name.startswith(OTHER_TOOLS_ENV_PREFIXES):
            continue
        guesses = by_key.get(name[len("S3LANES_") :]) or difflib.get_close_matches(
            name, known, n=1, cutoff=0.85
        )
        hint = f" (did you mean {' or '.join(sorted(guesses))}?)" if guesses else ""
        problems.add(
            f"environment {name}",
            f"unknown setting{hint}; settings are S3LANES_<SECTION>_<KEY> as in docs/configuration.md",
        )


def read_credentials_file(path: Path) -> list[Credential]:
    """The key pairs of a credentials file: ``access_key:secret_key[:backend_access_key:backend_secret_key]``
    per line or comma-separated (as ``S3LANES_CREDENTIALS``), blank lines and ``#`` comments ignored.
    Raises ValueError with a readable message (OSError included)."""
    try:
        text = path.read_text()
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a file") from None
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    items = [line.partition("#")[0].strip() for line in text.splitlines()]
    problems = _Problems()
    creds = parse_credentials_env(",".join(i for i in items if i), problems, source=str(path))
    if problems.items:
        raise ValueError("; ".join(problems.items))
    if not creds:
        raise ValueError(f"{path} holds no key pair")
    return creds


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build and validate the configuration. ``overrides`` are CLI flags as {section: {key: value}}."""
    env = os.environ if env is None else env
    problems = _Problems()
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SCHEMA}
    creds: list[Credential] = []
    lanes_raw: Mapping[str, Any] | None = None
    rules_raw: Any = None
    tenants_raw: Any = None
    backends_raw: Any = None
    routes_raw: Any = None
    src = "config"

    if path is not None:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError([f"{path}: no such file"]) from None
        except IsADirectoryError:
            raise ConfigError([f"{path}: is a directory; --config takes a TOML file"]) from None
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
        except UnicodeDecodeError:
            raise ConfigError([f"{path}: not valid TOML: not UTF-8 text"]) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
        src = str(path)
        for key, value in doc.items():
            if key in _SCHEMA:
                if not isinstance(value, dict):
                    problems.add(src, f"[{key}] must be a table")
                    continue
                sections[key].update(_section_values(key, value, src, problems))
            elif key == "credentials":
                creds.extend(_parse_credential_table(value, src, problems))
            elif key == "lanes":
                if isinstance(value, dict):
                    lanes_raw = value
                else:
                    problems.add(src, "[lanes] must be a table of [lanes.<name>] tables")
            elif key == "backends":
                backends_raw = value
            elif key == "routes":
                routes_raw = value
            elif key == "rules":
                rules_raw = value
            elif key == "tenants":
                tenants_raw = value
            else:
                known = ", ".join(
                    [*_SCHEMA, "backends", "routes", "credentials", "lanes", "rules", "tenants"]
                )
                problems.add(src, f"unknown section [{key}] (known: {known})")

    for setting in SETTINGS:
        if setting.env_name in env:
            raw = {setting.key: env[setting.env_name]}
            sections[setting.section].update(_section_values(setting.section, raw, "environment", problems))
    if env.get("S3LANES_CREDENTIALS"):
        creds = parse_credentials_env(env["S3LANES_CREDENTIALS"], problems)
    _check_env_names(env, problems)

    for name, values in (overrides or {}).items():
        sections[name].update(_section_values(name, values, "command line", problems))

    file_keys: frozenset[str] = frozenset()
    creds_file = sections["server"].get("credentials_file")
    if creds_file is not None:
        try:
            from_file = read_credentials_file(creds_file)
        except ValueError as exc:
            problems.add("[server].credentials_file", str(exc))
        else:
            creds.extend(from_file)
            file_keys = frozenset(c.access_key for c in from_file)

    lane_problems: list[str] = []
    lanes = parse_lanes(lanes_raw, src, lane_problems)
    rules = parse_rules(rules_raw, lanes, src, lane_problems) if rules_raw is not None else ()
    tenants = parse_tenants(tenants_raw, lanes, src, lane_problems) if tenants_raw is not None else {}
    policies = parse_tenant_policies(tenants_raw, src, lane_problems)
    problems.items.extend(lane_problems)

    cfg = Config(
        backends=_parse_backends(backends_raw, src, problems),
        routes=_parse_routes(routes_raw, src, problems),
        lanes=lanes,
        rules=rules,
        tenant_lanes=tenants,
        tenant_policies=policies,
        server=_build("server", sections["server"], problems),
        backend=_build("backend", sections["backend"], problems),
        credentials=tuple(creds),
        file_access_keys=file_keys,
        embedded=_build("embedded", sections["embedded"], problems),
        scheduler=_build("scheduler", sections["scheduler"], problems),
        spool=_build("spool", sections["spool"], problems),
        cluster=_build("cluster", sections["cluster"], problems),
    )
    _validate(cfg, problems)
    if problems.items:
        raise ConfigError(problems.items)
    return cfg


def _parse_backends(raw: Any, src: str, problems: _Problems) -> dict[str, BackendConfig]:
    """``[backends.<name>]`` tables: the keys of ``[backend]``, for another store."""
    out: dict[str, BackendConfig] = {}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.add(src, "[backends] must be a table of [backends.<name>] tables")
        return out
    for name, table in raw.items():
        where = f"{src} [backends.{name}]"
        if not isinstance(table, dict):
            problems.add(where, "must be a table")
            continue
        if name == DEFAULT_BACKEND or not _NAME.fullmatch(name):
            problems.add(
                where, f"a backend name is letters, digits, '-' and '_', and not {DEFAULT_BACKEND!r}"
            )
            continue
        values = _section_values("backend", table, where, problems)
        out[name] = _build("backend", values, problems)
    return out


def _parse_routes(raw: Any, src: str, problems: _Problems) -> tuple[RouteConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.add(src, "[[routes]] must be an array of tables")
        return ()
    out: list[RouteConfig] = []
    for i, item in enumerate(raw):
        where = f"{src} routes[{i}]"
        if not isinstance(item, dict):
            problems.add(where, "expected a table with bucket and backend")
            continue
        unknown = set(item) - {"bucket", "backend", "backend_bucket"}
        if unknown:
            problems.add(where, f"unknown keys {sorted(unknown)} (known: backend, backend_bucket, bucket)")
        bucket, backend = item.get("bucket"), item.get("backend")
        backend_bucket = item.get("backend_bucket", bucket)
        if not (
            isinstance(bucket, str)
            and isinstance(backend, str)
            and isinstance(backend_bucket, str)
            and bucket
            and backend
            and backend_bucket
        ):
            problems.add(where, "bucket and backend (and backend_bucket, if given) must be non-empty strings")
            continue
        out.append(RouteConfig(bucket=bucket, backend=backend, backend_bucket=backend_bucket))
    return tuple(out)


def _build(name: str, values: dict[str, Any], problems: _Problems) -> Any:
    """The section's dataclass from its TOML-named values (renamed and scaled as declared)."""
    cls = SECTION_CLASSES[name]
    values = dict(values)
    for setting in _SCHEMA[name].values():
        if setting.key in values and (setting.attr or setting.scale is not None):
            raw = values.pop(setting.key)
            scale = setting.scale
            values[setting.field_name] = raw if scale is None or raw is None else raw * scale
    try:
        return cls(**values)
    except TypeError as exc:  # pragma: no cover - schema and dataclasses out of step is a bug
        problems.add(f"[{name}]", str(exc))
        return cls()


_TABLES = ("backends", "routes", "credentials", "lanes", "rules", "tenants")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# S3's rules for bucket names (the part that matters for routing: 3-63 of a-z 0-9 . -, no IP address).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _validate_backend(name: str, b: BackendConfig, cfg: Config, problems: _Problems) -> None:
    where = "[backend]" if name == DEFAULT_BACKEND else f"[backends.{name}]"
    if name != DEFAULT_BACKEND and b.endpoint is None:
        problems.add(
            f"{where}.endpoint", "a named backend needs an endpoint (only [backend] can be embedded)"
        )
    for addr in (b.source_address, *b.lane_source_addresses.values()):
        if addr is None:
            continue
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            problems.add(f"{where}", f"source address {addr!r} is not an IP address")
    for lane in b.lane_source_addresses:
        if lane not in cfg.lanes:
            problems.add(f"{where}.lane_source_address", f"unknown lane {lane!r}")
    if (b.access_key is None) != (b.secret_key is None):
        problems.add(where, "access_key and secret_key go together")
    if b.credential_source not in ("clients", "aws"):
        problems.add(
            f"{where}.credential_source", f"expected 'clients' or 'aws', got {b.credential_source!r}"
        )
    elif b.credential_source == "aws" and b.endpoint is None and name == DEFAULT_BACKEND:
        problems.add(
            f"{where}.credential_source",
            "'aws' needs an external endpoint (the embedded store knows only the [[credentials]] keys)",
        )
    if b.aws_profile is not None and b.credential_source != "aws":
        problems.add(f"{where}.aws_profile", "is read only with credential_source = 'aws'")
    other = b.shares_bottleneck_with
    if other is not None and (other == name or (other != DEFAULT_BACKEND and other not in cfg.backends)):
        problems.add(f"{where}.shares_bottleneck_with", f"no other backend named {other!r}")


def _validate_routes(cfg: Config, problems: _Problems) -> None:
    seen: set[str] = set()
    targets: set[tuple[str, str]] = set()
    for r in cfg.routes:
        where = f"[[routes]] bucket {r.bucket!r}"
        if r.bucket in seen:
            problems.add(where, "routed twice")
        seen.add(r.bucket)
        for label, name in (("bucket", r.bucket), ("backend_bucket", r.backend_bucket)):
            if not _BUCKET.fullmatch(name) or ".." in name:
                problems.add(where, f"{label} {name!r} is not a valid S3 bucket name")
        if r.backend != DEFAULT_BACKEND and r.backend not in cfg.backends:
            known = ", ".join([DEFAULT_BACKEND, *sorted(cfg.backends)])
            problems.add(where, f"unknown backend {r.backend!r} (known: {known})")
        if (r.backend, r.backend_bucket) in targets:
            problems.add(where, f"another route already maps to {r.backend}:{r.backend_bucket}")
        targets.add((r.backend, r.backend_bucket))
    # A chain of shares_bottleneck_with must end (no cycles).
    for name in cfg.backends:
        hops, cur = 0, name
        while cur != DEFAULT_BACKEND and cur in cfg.backends and hops <= len(cfg.backends):
            nxt = cfg.backends[cur].shares_bottleneck_with
            if nxt is None:
                break
            cur, hops = nxt, hops + 1
        if hops > len(cfg.backends):
            problems.add(f"[backends.{name}].shares_bottleneck_with", "forms a cycle")


def _validate(cfg: Config, problems: _Problems) -> None:
    s, b = cfg.server, cfg.backend
    if s.listen is None and s.https_listen is None:
        problems.add("[server]", "no listener: set listen and/or https_listen")
    if s.https_listen is not None and (s.tls_cert is None or s.tls_key is None):
        problems.add("[server]", "https_listen needs tls_cert and tls_key")
    if s.admin_listen is not None and s.admin_listen.port != 0:
        for other, name in ((s.listen, "listen"), (s.https_listen, "https_listen")):
            if other is not None and other.port == s.admin_listen.port:
                problems.add("[server].admin_listen", f"must use another port than {name} ({other})")
    for name in ("tls_cert", "tls_key"):
        p = getattr(s, name)
        if p is not None and not p.is_file():
            problems.add(f"[server].{name}", f"no such file: {p}")
    if s.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        problems.add("[server].log_level", f"expected DEBUG, INFO, WARNING or ERROR, got {s.log_level!r}")
    if s.max_skew_s <= 0:
        problems.add("[server].max_skew_s", "must be positive")
    if s.zero_copy_min_bytes < 0:
        problems.add("[server].zero_copy_min_bytes", "must be 0 (never) or a size")
    if not 1 <= s.workers <= MAX_WORKERS:
        problems.add("[server].workers", f"must be within [1, {MAX_WORKERS}], got {s.workers}")
    elif s.workers > 1 and s.admin_listen is not None:
        problems.add(
            "[server].workers",
            f"{s.workers} workers do not open a separate admin listener yet: unset [server] admin_listen"
            " (or workers = 1)",
        )
    if s.log_format not in ("text", "json"):
        problems.add("[server].log_format", f"expected 'text' or 'json', got {s.log_format!r}")
    if s.admin_token is not None and len(s.admin_token) < 16:
        problems.add("[server].admin_token", "must be at least 16 characters (or unset)")
    for d in s.domains:
        if not d or d.startswith(".") or "/" in d:
            problems.add("[server].domains", f"not a host name: {d!r}")
    if b.endpoint is not None:
        parts = urlsplit(b.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.add("[backend].endpoint", f"expected http(s)://host[:port], got {b.endpoint!r}")
        elif parts.path not in ("", "/") or parts.query:
            problems.add("[backend].endpoint", "must not carry a path or query")
        if not cfg.credentials:
            problems.add(
                "[credentials]",
                "an external backend needs at least one credential (or S3LANES_CREDENTIALS,"
                " or [server].credentials_file)",
            )
    for name, bc in ((DEFAULT_BACKEND, b), *cfg.backends.items()):
        where = "[backend]" if name == DEFAULT_BACKEND else f"[backends.{name}]"
        if name != DEFAULT_BACKEND and bc.endpoint is not None:
            parts = urlsplit(bc.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                problems.add(f"{where}.endpoint", f"expected http(s)://host[:port], got {bc.endpoint!r}")
        if bc.addressing not in ("path", "virtual"):
            problems.add(f"{where}.addressing", f"expected 'path' or 'virtual', got {bc.addressing!r}")
        if bc.pool_size < 1:
            problems.add(f"{where}.pool_size", "must be at least 1")
        if bc.connect_timeout_s <= 0 or bc.read_timeout_s <= 0:
            problems.add(where, "timeouts must be positive")
        if bc.ca_file is not None and not bc.ca_file.is_file():
            problems.add(f"{where}.ca_file", f"no such file: {bc.ca_file}")
        if bc.bandwidth_bps is not None and bc.bandwidth_bps <= 0:
            problems.add(f"{where}.bandwidth", "must be positive")
        _validate_backend(name, bc, cfg, problems)
    _validate_routes(cfg, problems)
    seen: set[str] = set()
    for c in cfg.credentials:
        if c.access_key in seen:
            problems.add("[credentials]", f"access key {c.access_key!r} appears twice")
        seen.add(c.access_key)
    sch = cfg.scheduler
    if sch.write_cap_mode not in ("strict", "work_conserving"):
        problems.add(
            "[scheduler].write_cap_mode",
            f"expected 'strict' or 'work_conserving', got {sch.write_cap_mode!r}",
        )
    if sch.latency_target_s <= 0 or sch.window_s <= 0:
        problems.add("[scheduler]", "latency_target_ms and window_ms must be positive")
    if not sch.progress_interval_s >= 0:
        problems.add("[scheduler].progress_interval_s", "must be >= 0 (0 turns the progress floor off)")
    if not 0.0 <= sch.cap_headroom < 1.0:
        problems.add("[scheduler].cap_headroom", "must be within [0, 1) (0 paces capped lanes at their cap)")
    if sch.chunk_bytes < 4096 or sch.request_cost_bytes < 0 or sch.burst_bytes < sch.chunk_bytes:
        problems.add(
            "[scheduler]", "need chunk_bytes >= 4 KiB, request_cost_bytes >= 0, burst_bytes >= chunk_bytes"
        )
    if b.bandwidth_bps is not None and b.bandwidth_bps <= 0:
        problems.add("[backend].bandwidth", "must be positive")
    sp = cfg.spool
    if not 0 < sp.low_water <= sp.high_water <= 1:
        problems.add("[spool]", "need 0 < low_water <= high_water <= 1")
    if sp.max_age_s is not None and not sp.max_age_s > 0:
        problems.add("[spool].max_age_s", "must be positive (it is the durability deadline)")
    if sp.when_full not in ("write_through", "slowdown"):
        problems.add("[spool].when_full", f"expected 'write_through' or 'slowdown', got {sp.when_full!r}")
    if sp.drain_concurrency < 1:
        problems.add("[spool].drain_concurrency", "must be at least 1")
    if sp.retry_after_s < 1:
        problems.add("[spool].retry_after_s", "must be at least 1")
    if sp.retry_base_s <= 0 or sp.retry_max_s < sp.retry_base_s:
        problems.add("[spool]", "need 0 < retry_base_s <= retry_max_s")
    if sp.capacity_bytes < 0:
        problems.add("[spool].capacity", "must not be negative")
    if sp.fence_s is not None and sp.fence_s < 0:
        problems.add("[spool].fence_s", "must not be negative")
    if not valid_default_content_type(sp.default_content_type):
        problems.add(
            "[spool].default_content_type",
            f"expected 'sniff' or a media type (binary/octet-stream), got {sp.default_content_type!r}",
        )
    for lane in sp.lanes:
        if lane not in cfg.lanes:
            problems.add("[spool].lanes", f"unknown lane {lane!r} (lanes: {', '.join(sorted(cfg.lanes))})")
    for glob in sp.commit_markers:
        if not glob or "/" in glob:
            problems.add("[spool].commit_markers", f"a marker is a file-name glob without '/': {glob!r}")
    if not 0 <= cfg.embedded.s3_port <= 65535:
        problems.add("[embedded].s3_port", "out of range")
    _validate_cluster(cfg, problems)


MAX_WORKERS = 1024

_CLUSTER_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def _validate_cluster(cfg: Config, problems: _Problems) -> None:
    cl = cfg.cluster
    if cl.redis_url is not None and urlsplit(cl.redis_url).scheme not in ("redis", "rediss", "unix"):
        problems.add(
            "[cluster].redis_url",
            "expected redis://host:port[/db], rediss://... or unix:///path, "
            f"got scheme {urlsplit(cl.redis_url).scheme!r}",
        )
    if not _CLUSTER_NAME_RE.fullmatch(cl.name):
        problems.add("[cluster].name", f"1-64 letters, digits, '_', '.' or '-', got {cl.name!r}")
    if not _NODE_ID_RE.fullmatch(cl.node_id):
        problems.add("[cluster].node_id", f"1-200 letters, digits, '_', '.', ':' or '-', got {cl.node_id!r}")
    if not 0.05 <= cl.interval_s <= 60:
        problems.add("[cluster].interval_s", f"must be within [0.05, 60] seconds, got {cl.interval_s}")
    if cl.ttl_intervals < 2:
        problems.add("[cluster].ttl_intervals", "must be at least 2 (a report must outlive one missed round)")
    if not 0 < cl.redis_timeout_s < cl.interval_s:
        problems.add("[cluster].redis_timeout_s", "must be positive and shorter than interval_s")
    if not cl.lanes:
        problems.add("[cluster].lanes", "name at least one lane whose budget is cluster-wide")
    if len(set(cl.lanes)) != len(cl.lanes):
        problems.add("[cluster].lanes", f"a lane is named twice: {list(cl.lanes)}")
    for lane in cl.lanes:
        params = cfg.lanes.get(lane)
        if params is None:
            problems.add("[cluster].lanes", f"unknown lane {lane!r} (lanes: {', '.join(sorted(cfg.lanes))})")
        elif params.read_protected:
            problems.add(
                "[cluster].lanes",
                f"{lane!r} is the read-protected lane: the cluster budget caps write lanes to protect it",
            )
