"""Locust users that speak S3, signed with SigV4: ``DatasetReader``, ``CheckpointWriter`` and ``Lister``.

Import the user classes into a locustfile (``loadtests/locustfile*.py`` do); the options they read are
registered on Locust's parser when this module is imported. Locust's ``--help`` does not list them (it is
printed before any locustfile is imported): docs/loadtests.md has the table. They show in the web UI.

Theory of operation
-------------------
*Signing.* Every request is signed by :class:`S3Signer` with the project's own
:func:`s3lanes.core.sigv4.sign_headers` (what the gateway itself uses towards its backend): the path and
query are percent-encoded once, the S3 way, and sent exactly as signed (geventhttpclient's re-quoting
leaves such a URI unchanged), with the ``Host`` header set explicitly. Object bodies travel as
``UNSIGNED-PAYLOAD`` (as the AWS SDKs do over TLS); small XML bodies are signed with their SHA-256. A wrong
secret therefore fails every request with 403, which is how a run proves it is signing at all.

*Users.* They are Locust ``FastHttpUser``\\s (geventhttpclient), so one load generator core drives many:

- ``DatasetReader``: ranged GETs of random ``--read-size`` pieces of the ``--dataset-objects`` objects that
  ``python -m loadtests.dataprep`` created, each user at ``--read-rate`` requests per second (Locust's
  ``constant_throughput``), in the stats as ``GET dataset range``.
- ``CheckpointWriter``: idle until the next burst, then its share (``--ckpt-size`` / ``--ckpt-writers``) as
  one multipart upload (``--ckpt-part-size`` parts, ``--ckpt-part-concurrency`` in flight), then idle again.
  Writers agree on bursts by wall clock alone (:class:`loadtests.locust_phases.BurstSchedule`: burst ``n``
  starts at ``n * --ckpt-period-s``), so K writers on any number of workers burst together. Each writer's
  share is also reported as a pseudo-request ``BURST checkpoint share`` whose response time is the save
  time the trainer would see, and its start and end feed the phase statistics.
- ``Lister``: metadata storms: every ``--lister-wait-s`` (+-50 %), ListObjectsV2 over the dataset prefix
  page by page, then ``--lister-heads`` HEADs of random keys it found.

*User counts.* ``--ckpt-writers`` and ``--lister-users`` set the classes' ``fixed_count`` (Locust spawns
fixed-count users first, then gives every remaining user to ``DatasetReader``); 0 removes the class.

*What this is not:* an S3 SDK. It knows the handful of operations above and treats any other answer as a
failure with the S3 error code in the message.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import random
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from urllib.parse import urlsplit

import gevent  # type: ignore[import-untyped]
import gevent.pool  # type: ignore[import-untyped]
from locust import FastHttpUser, events, task
from locust.argument_parser import LocustArgumentParser
from locust.contrib.fasthttp import ResponseContextManager
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from locust.user.wait_time import constant_throughput

from loadtests import locust_phases
from loadtests.dataprep import DEFAULT_OBJECT_SIZE, DEFAULT_OBJECTS, DEFAULT_PREFIX, dataset_key
from loadtests.locust_phases import BURST_REQUEST_TYPE, BurstSchedule, current_tracker, listener
from s3lanes.config import parse_size
from s3lanes.core.sigv4 import EMPTY_SHA256, UNSIGNED_PAYLOAD, sign_headers
from s3lanes.core.uri import s3_quote

log = logging.getLogger(__name__)

LANE_HEADER = "x-s3lanes-lane"
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# Bodies up to this size are signed with their SHA-256; larger ones (object data) are UNSIGNED-PAYLOAD.
SIGN_BODY_MAX_BYTES = 64 * 1024
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's minimum part size (all parts but the last)
MAX_LIST_PAGES = 1000  # bound on one storm's ListObjectsV2 pages


# --------------------------------------------------------------------------------------------------
# Options


def _size(text: str) -> int:
    return int(parse_size(text))


@listener(events.init_command_line_parser)
def _add_arguments(parser: LocustArgumentParser, **_kw: Any) -> None:
    # On the parser itself, not an argument group: only LocustArgumentParser knows is_secret.
    def arg(flag: str, **kw: Any) -> None:
        """An option read from the environment too: LOCUST_<FLAG> (``--read-rate``: LOCUST_READ_RATE), or
        ``env_var``."""
        kw.setdefault("env_var", "LOCUST_" + flag.removeprefix("--").upper().replace("-", "_"))
        parser.add_argument(flag, **kw)

    arg("--s3-access-key", default=None, env_var="AWS_ACCESS_KEY_ID", help="access key (AWS_ACCESS_KEY_ID)")
    arg(
        "--s3-secret-key",
        default=None,
        env_var="AWS_SECRET_ACCESS_KEY",
        is_secret=True,
        help="secret key (AWS_SECRET_ACCESS_KEY)",
    )
    arg("--s3-region", default="us-east-1", env_var="AWS_DEFAULT_REGION", help="SigV4 region")
    arg("--s3-bucket", default="locust", help="bucket of dataset and checkpoints")
    arg("--s3-timeout-s", type=float, default=60.0, help="connect/read timeout")
    arg(
        "--s3-lane-hints",
        action="store_true",
        default=False,
        help="send x-s3lanes-lane hints (dataset / checkpoint / metadata)",
    )
    arg("--dataset-prefix", default=DEFAULT_PREFIX)
    arg("--dataset-objects", type=int, default=DEFAULT_OBJECTS)
    arg("--dataset-object-size", default=DEFAULT_OBJECT_SIZE)
    arg("--read-size", default="256KiB", help="bytes per ranged GET")
    arg("--read-rate", type=float, default=10.0, help="GETs per second per DatasetReader (0: back to back)")
    arg("--ckpt-prefix", default="locust-ckpt/")
    arg("--ckpt-writers", type=int, default=2, help="CheckpointWriter users")
    arg("--ckpt-size", default="256MiB", help="bytes per burst, all writers")
    arg("--ckpt-period-s", type=float, default=60.0, help="seconds between bursts")
    arg("--ckpt-offset-s", type=float, default=0.0, help="burst phase offset")
    arg("--ckpt-warmup-s", type=float, default=10.0, help="no burst before")
    arg("--ckpt-part-size", default="8MiB")
    arg("--ckpt-part-concurrency", type=int, default=2)
    arg(
        "--ckpt-keep",
        type=int,
        default=2,
        help="checkpoint slots reused in rotation (0: a new key every burst)",
    )
    arg("--lister-users", type=int, default=1, help="Lister users")
    arg("--lister-wait-s", type=float, default=5.0, help="between storms")
    arg("--lister-page-size", type=int, default=1000)
    arg("--lister-heads", type=int, default=20, help="HEADs per storm")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadOptions:
    """The custom options, parsed and checked once per user start (the web UI may change them)."""

    access_key: str
    secret_key: str
    region: str
    bucket: str
    timeout_s: float
    lane_hints: bool
    dataset_prefix: str
    dataset_objects: int
    dataset_object_bytes: int
    read_bytes: int
    read_rate: float
    ckpt_prefix: str
    ckpt_writers: int
    ckpt_bytes: int
    ckpt_schedule: BurstSchedule
    ckpt_part_bytes: int
    ckpt_part_concurrency: int
    ckpt_keep: int
    lister_users: int
    lister_wait_s: float
    lister_page_size: int
    lister_heads: int

    @classmethod
    def from_parsed(cls, opts: Any, *, require_credentials: bool = True) -> LoadOptions:
        """``require_credentials=False`` checks the rest only (a master may leave them to its workers)."""

        def get(name: str) -> Any:
            return getattr(opts, name)

        # A worker gets the master's options, credentials included, and a master without any sends None:
        # then the worker's own environment counts.
        access_key = get("s3_access_key") or os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret_key = get("s3_secret_key") or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        if require_credentials and not (access_key and secret_key):
            raise ValueError(
                "no S3 credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --s3-access-key"
            )
        out = cls(
            access_key=str(access_key),
            secret_key=str(secret_key),
            region=str(get("s3_region")),
            bucket=str(get("s3_bucket")),
            timeout_s=float(get("s3_timeout_s")),
            lane_hints=bool(get("s3_lane_hints")),
            dataset_prefix=str(get("dataset_prefix")),
            dataset_objects=int(get("dataset_objects")),
            dataset_object_bytes=_size(get("dataset_object_size")),
            read_bytes=_size(get("read_size")),
            read_rate=float(get("read_rate")),
            ckpt_prefix=str(get("ckpt_prefix")),
            ckpt_writers=int(get("ckpt_writers")),
            ckpt_bytes=_size(get("ckpt_size")),
            ckpt_schedule=BurstSchedule(
                period_s=float(get("ckpt_period_s")),
                offset_s=float(get("ckpt_offset_s")),
                warmup_s=float(get("ckpt_warmup_s")),
            ),
            ckpt_part_bytes=_size(get("ckpt_part_size")),
            ckpt_part_concurrency=int(get("ckpt_part_concurrency")),
            ckpt_keep=int(get("ckpt_keep")),
            lister_users=int(get("lister_users")),
            lister_wait_s=float(get("lister_wait_s")),
            lister_page_size=int(get("lister_page_size")),
            lister_heads=int(get("lister_heads")),
        )
        problems = [
            msg
            for bad, msg in (
                (out.dataset_objects < 1, "--dataset-objects must be at least 1"),
                (out.read_bytes < 1, "--read-size must be at least 1 byte"),
                (out.read_rate < 0, "--read-rate cannot be negative"),
                (out.ckpt_writers < 0 or out.lister_users < 0, "user counts cannot be negative"),
                (out.ckpt_bytes < 1, "--ckpt-size must be at least 1 byte"),
                (
                    out.ckpt_part_bytes < MIN_PART_BYTES,
                    "--ckpt-part-size must be at least 5MiB (S3's minimum)",
                ),
                (out.ckpt_part_concurrency < 1, "--ckpt-part-concurrency must be at least 1"),
                (out.ckpt_keep < 0, "--ckpt-keep cannot be negative"),
                (out.lister_page_size < 1 or out.lister_page_size > 1000, "--lister-page-size is 1..1000"),
            )
            if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return out

    @property
    def share_bytes(self) -> int:
        """One writer's share of a burst."""
        return math.ceil(self.ckpt_bytes / max(1, self.ckpt_writers))


# --------------------------------------------------------------------------------------------------
# Signing


@dataclass(frozen=True, slots=True)
class SignedRequest:
    target: str  # path?query, as sent
    headers: dict[str, str]


class S3Signer:
    """Builds path-style S3 requests and signs them (SigV4, header auth) for one endpoint and key pair."""

    def __init__(self, endpoint_url: str, *, access_key: str, secret_key: str, region: str) -> None:
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--host must be an http(s) URL, got {endpoint_url!r}")
        self.host_header = parts.netloc.rpartition("@")[2]
        self.base_path = parts.path.rstrip("/")
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region

    def sign(
        self,
        method: str,
        bucket: str,
        key: str = "",
        *,
        query: Sequence[tuple[str, str]] = (),
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        now_wall: float | None = None,
    ) -> SignedRequest:
        path = f"{self.base_path}/{s3_quote(bucket)}" + (f"/{s3_quote(key, safe='/')}" if key else "")
        raw_query = "&".join(f"{s3_quote(k)}={s3_quote(v)}" for k, v in sorted(query))
        if body is None or not body:
            payload_hash = EMPTY_SHA256
        elif len(body) <= SIGN_BODY_MAX_BYTES:
            payload_hash = hashlib.sha256(body).hexdigest()
        else:
            payload_hash = UNSIGNED_PAYLOAD
        hdrs = {"host": self.host_header, **{k.lower(): v for k, v in (headers or {}).items()}}
        hdrs.update(
            sign_headers(
                method,
                path,
                raw_query,
                hdrs,
                access_key=self._access_key,
                secret_key=self._secret_key,
                region=self._region,
                payload_hash=payload_hash,
                now_wall=time.time() if now_wall is None else now_wall,
            )
        )
        # geventhttpclient adds a Host header unless one is given under exactly this spelling
        hdrs["Host"] = hdrs.pop("host")
        return SignedRequest(target=path + (f"?{raw_query}" if raw_query else ""), headers=hdrs)


# --------------------------------------------------------------------------------------------------
# Responses


@dataclass(frozen=True, slots=True)
class S3Reply:
    status: int
    headers: dict[str, str]
    content: bytes


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def xml_texts(content: bytes, tag: str) -> list[str]:
    """Texts of every element named ``tag`` (any namespace) in an S3 XML document."""
    root = ET.fromstring(content)
    return [el.text or "" for el in root.iter() if _local(el.tag) == tag]


def xml_check(*required: str) -> Callable[[S3Reply], str | None]:
    """A :meth:`S3User.s3` check: the body is an S3 XML document (not an <Error>) with these elements."""

    def check(reply: S3Reply) -> str | None:
        try:
            root = ET.fromstring(reply.content)
        except ET.ParseError:
            return f"not XML: {reply.content[:60]!r}"
        if _local(root.tag) == "Error":  # S3 may answer 200 with an <Error> document
            return f"error document: {s3_error_code(reply.content)}"
        present = {_local(el.tag) for el in root.iter()}
        missing = [tag for tag in required if tag not in present]
        return f"no <{missing[0]}> in the answer" if missing else None

    return check


def s3_error_code(content: bytes | None) -> str:
    if not content:
        return ""
    try:
        root = ET.fromstring(content)
    except ET.ParseError:
        return ""
    if _local(root.tag) != "Error":
        return ""
    return next((el.text or "" for el in root if _local(el.tag) == "Code"), "")


def _describe(resp: ResponseContextManager) -> str:
    if resp.status_code == 0:
        return f"no response: {getattr(resp, 'error', None)!r}"
    code = s3_error_code(resp.content if resp.status_code >= 300 else None)
    return f"HTTP {resp.status_code} {code}".rstrip()


# --------------------------------------------------------------------------------------------------
# Users


class S3User(FastHttpUser):
    """Base: options, a signer, and :meth:`s3` (one signed request, checked, recorded in Locust's stats)."""

    abstract = True
    lane: ClassVar[str] = ""  # the lane hint this class sends with --s3-lane-hints

    opts: LoadOptions
    signer: S3Signer

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.opts = LoadOptions.from_parsed(environment.parsed_options)
        self.signer = S3Signer(
            self.host or "",
            access_key=self.opts.access_key,
            secret_key=self.opts.secret_key,
            region=self.opts.region,
        )
        self.rng = random.Random()

    def s3(
        self,
        method: str,
        key: str = "",
        *,
        name: str,
        query: Sequence[tuple[str, str]] = (),
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        ok: Iterable[int] = (200,),
        check: Callable[[S3Reply], str | None] | None = None,
    ) -> S3Reply | None:
        """Send one signed request; None if it failed (and then it is a failure in the stats)."""
        hdrs = dict(headers or {})
        if self.opts.lane_hints and self.lane:
            hdrs[LANE_HEADER] = self.lane
        req = self.signer.sign(method, self.opts.bucket, key, query=query, headers=hdrs, body=body)
        with self.client.request(
            method, req.target, name=name, headers=req.headers, data=cast(Any, body), catch_response=True
        ) as resp:
            if resp.status_code not in tuple(ok):
                resp.failure(_describe(resp))
                return None
            reply = S3Reply(
                resp.status_code,
                {str(k).lower(): str(v) for k, v in (resp.headers or {}).items()},
                resp.content or b"",
            )
            problem = check(reply) if check is not None else None
            if problem:
                resp.failure(problem)
                return None
            resp.success()
            return reply


class DatasetReader(S3User):
    """Random ranged GETs over the dataset, ``--read-rate`` per second per user."""

    lane = "dataset"

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        rate = self.opts.read_rate
        self._pace: Callable[[Any], float] | None = constant_throughput(rate) if rate > 0 else None

    def wait_time(self) -> float:
        return self._pace(self) if self._pace is not None else 0.0

    @task
    def read_range(self) -> None:
        o = self.opts
        index = self.rng.randrange(o.dataset_objects)
        length = min(o.read_bytes, o.dataset_object_bytes)
        start = self.rng.randrange(0, o.dataset_object_bytes - length + 1)

        def check(reply: S3Reply) -> str | None:
            got = len(reply.content)
            return None if got == length else f"short read: {got} of {length} bytes"

        self.s3(
            "GET",
            dataset_key(o.dataset_prefix, index),
            name="GET dataset range",
            headers={"Range": f"bytes={start}-{start + length - 1}"},
            ok=(206, 200),
            check=check,
        )


class Lister(S3User):
    """Metadata storms: a full ListObjectsV2 of the dataset prefix, then HEADs of random keys."""

    lane = "metadata"

    def wait_time(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.opts.lister_wait_s

    @task
    def storm(self) -> None:
        o = self.opts
        keys: list[str] = []
        token = ""
        for _ in range(MAX_LIST_PAGES):
            query = [("list-type", "2"), ("prefix", o.dataset_prefix), ("max-keys", str(o.lister_page_size))]
            if token:
                query.append(("continuation-token", token))
            reply = self.s3("GET", name="LIST dataset page", query=query, check=xml_check("IsTruncated"))
            if reply is None:
                return
            keys += xml_texts(reply.content, "Key")
            truncated = xml_texts(reply.content, "IsTruncated") == ["true"]
            token = next(iter(xml_texts(reply.content, "NextContinuationToken")), "")
            if not truncated or not token:
                break
        for key in self.rng.sample(keys, min(o.lister_heads, len(keys))):
            self.s3("HEAD", key, name="HEAD dataset object")


_writer_ids = itertools.count()
_part_data: dict[int, bytes] = {}


def part_data(size_bytes: int) -> bytes:
    """Random (incompressible) bytes for a part of this size, made once per size per process."""
    data = _part_data.get(size_bytes)
    if data is None:
        data = _part_data[size_bytes] = os.urandom(size_bytes)
    return data


def part_sizes(total_bytes: int, part_bytes: int) -> list[int]:
    full, rest = divmod(total_bytes, part_bytes)
    return [part_bytes] * full + ([rest] if rest else [])


class CheckpointWriter(S3User):
    """Periodic bursts: its share of ``--ckpt-size`` as one multipart upload every ``--ckpt-period-s``."""

    lane = "checkpoint"

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        runner = environment.runner
        worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
        self.writer_id = f"w{worker:03d}-{next(_writer_ids):03d}"
        self.last_burst: int | None = None

    def wait_time(self) -> float:
        return 0.0  # the task itself sleeps until the next burst

    @task
    def checkpoint(self) -> None:
        now = time.time()
        test_start = current_tracker().started_at or now
        burst, start_at = self.opts.ckpt_schedule.next_burst(
            now, test_start=test_start, last_done=self.last_burst
        )
        if start_at > now:
            gevent.sleep(start_at - now)
        self.last_burst = burst
        self.run_burst(burst)

    def key_for(self, burst: int) -> str:
        o = self.opts
        step = burst % o.ckpt_keep if o.ckpt_keep else burst
        prefix = o.ckpt_prefix if not o.ckpt_prefix or o.ckpt_prefix.endswith("/") else o.ckpt_prefix + "/"
        return f"{prefix}step-{step:08d}/__{self.writer_id}_0.distcp"

    def run_burst(self, burst: int) -> bool:
        """Upload this writer's share of ``burst``; reported to the phase tracker and as a BURST request."""
        size_bytes = self.opts.share_bytes
        tracker = current_tracker()
        t0 = time.time()
        t0_perf = time.perf_counter()
        tracker.burst_started(burst, self.writer_id, t0)
        # A user stopped mid-burst (GreenletExit) leaves the burst open: it lasted until the test stopped,
        # and it is neither a failure nor a save time.
        ok = self.multipart_upload(self.key_for(burst), size_bytes)
        elapsed_ms = (time.perf_counter() - t0_perf) * 1000
        tracker.burst_ended(burst, self.writer_id, t0 + elapsed_ms / 1000, size_bytes=size_bytes, ok=ok)
        self.environment.events.request.fire(
            request_type=BURST_REQUEST_TYPE,
            name="checkpoint share (one writer)",
            response_time=elapsed_ms,
            response_length=size_bytes if ok else 0,
            exception=None if ok else RuntimeError(f"burst {burst}: upload failed"),
            context={},
            start_time=t0,
        )
        return ok

    def multipart_upload(self, key: str, size_bytes: int) -> bool:
        created = self.s3(
            "POST", key, name="POST create multipart", query=[("uploads", "")], check=xml_check("UploadId")
        )
        upload_id = next(iter(xml_texts(created.content, "UploadId")), "") if created else ""
        if not upload_id:
            return False
        sizes = part_sizes(size_bytes, self.opts.ckpt_part_bytes)

        def put(number: int) -> tuple[int, str | None]:
            reply = self.s3(
                "PUT",
                key,
                name="PUT part",
                query=[("partNumber", str(number)), ("uploadId", upload_id)],
                body=part_data(sizes[number - 1]),
                check=lambda r: None if r.headers.get("etag") else "no ETag in the answer",
            )
            etag = _header(reply, "etag") if reply else None
            return number, etag

        pool = gevent.pool.Pool(self.opts.ckpt_part_concurrency)
        etags = dict(pool.imap_unordered(put, range(1, len(sizes) + 1)))
        if any(etag is None for etag in etags.values()):
            self.s3(
                "DELETE", key, name="DELETE abort multipart", query=[("uploadId", upload_id)], ok=(204, 200)
            )
            return False
        doc = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etags[n]}</ETag></Part>" for n in sorted(etags)
        )
        body = f'<CompleteMultipartUpload xmlns="{S3_NS[1:-1]}">{doc}</CompleteMultipartUpload>'.encode()
        done = self.s3(
            "POST",
            key,
            name="POST complete multipart",
            query=[("uploadId", upload_id)],
            headers={"Content-Type": "application/xml"},
            body=body,
            check=xml_check(),
        )
        return done is not None


def _header(reply: S3Reply, name: str) -> str | None:
    return reply.headers.get(name)


# --------------------------------------------------------------------------------------------------
# Wiring


def apply_user_counts(environment: Environment) -> None:
    """``--ckpt-writers``/``--lister-users`` -> the classes' ``fixed_count`` (0: the class is not run)."""
    opts = environment.parsed_options
    if opts is None:
        return
    for cls, count in ((CheckpointWriter, int(opts.ckpt_writers)), (Lister, int(opts.lister_users))):
        cls.fixed_count = max(0, count)
        cls.weight = 1 if count > 0 else 0


def _apply_client_settings(environment: Environment) -> None:
    opts = environment.parsed_options
    if opts is None:
        return
    S3User.network_timeout = S3User.connection_timeout = float(opts.s3_timeout_s)
    # one connection per part in flight (FastHttpUser's default pool is 10)
    CheckpointWriter.concurrency = max(10, int(opts.ckpt_part_concurrency))


@listener(events.init)
def _on_init(environment: Environment, **_kw: Any) -> None:
    apply_user_counts(environment)
    _apply_client_settings(environment)
    opts = environment.parsed_options
    runner = environment.runner
    if opts is not None and opts.headless and not isinstance(runner, WorkerRunner):
        try:  # fail at start, not in every user (with the web UI the options may still be filled in)
            LoadOptions.from_parsed(opts, require_credentials=not isinstance(runner, MasterRunner))
        except ValueError as exc:
            log.error("%s", exc)
            raise SystemExit(2) from exc


@listener(events.test_start)
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    apply_user_counts(environment)  # the web UI may have changed the options


locust_phases.install(events)
