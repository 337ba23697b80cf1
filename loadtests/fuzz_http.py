"""Hostile input against a real gateway: malformed and hostile HTTP requests over raw sockets.

Run it as ``python -m loadtests.fuzz_http --cases 10000 --seed N`` (``--quick`` is the 600-case CI subset;
``--help`` lists the knobs). Results and what they mean live in ``docs/reliability.md`` ("Hostile input").

Theory of operation
-------------------
The script starts its own SeaweedFS (or uses one given with ``--backend-endpoint``), creates a bucket on it
directly, and starts a real ``s3lanes serve`` subprocess in front of it with the write spool on (spool and
state directories under one temporary directory, the process's working directory and ``TMPDIR`` there too)
and real credentials. Then it runs ``--cases`` cases, ``--concurrency`` at a time. A case is a short
sequence of exchanges on one keep-alive connection (a new one when the server closed it), written byte for
byte with asyncio streams, never through an HTTP library, because broken framing needs raw bytes. Each case
kind (:data:`KINDS`) mixes hostile requests with valid SigV4-signed ones (signed with
``gateway.core.sigv4.sign_headers``): broken, missing and duplicated Authorization, bad and skewed dates,
wrong payload hashes and digests, truncated, oversized and mis-framed bodies, bad aws-chunked framing and
trailers, invalid ranges and part numbers, odd keys (``..``, ``.``, ``//``, ``%00``, ``%2F``, raw non-UTF-8
bytes, 1 KiB of unicode, control characters, keys over 1024 bytes), bad XML for CompleteMultipartUpload and
DeleteObjects, unknown query parameters, odd methods, HTTP/1.0, pipelining and garbage that is not HTTP.

A case's randomness comes from ``random.Random(f"{seed}-{index}")`` and every key a case touches lies under
``<marker>/c<index>/`` (the marker is derived from the seed), so cases are independent and
``--seed N --only-case I`` replays case I alone, printing every request and answer: that is the reproducer.

Every answer is classified: its status; for an error (>= 400, not HEAD) whether the body is S3 error XML
with a ``<Code>``; whether it came from the S3 handler (it carries ``x-amz-request-id``) or from the HTTP
parser below it; and whether status and code are among those the case expects (S3's answer for that input).
After the hostile part of a case, a valid request checks that nothing was lost: the object a hostile write
tried to replace still reads back byte for byte, and a valid request on the same connection still gets its
own answer (no request desynchronisation).

Ground truth is kept in a ledger: every object a *valid* request completely wrote (its MD5 and ETag), every
key deleted, every multipart upload a case left open on purpose, and the keys whose last write has no
certain outcome (no answer came, or S3 leaves the meaning open): those may hold either version. At the end
the script flushes the spool (``POST /_s3lanes/flush``; it stops waiting once the pending count stops
falling: an acknowledged write that can never drain is a missing object), lists the bucket and its
multipart uploads straight on SeaweedFS with boto3, and compares. SeaweedFS's own handling of keys ending
in ``/`` (``PUT a/b/`` with data is kept as ``a/b/b``, or with a few bytes as an empty ``a/b/``; direct
requests to it do the same) is reported apart, not as partial objects. It snapshots the file system before
and after (the temporary directory outside the spool and state directories, the gateway's working directory
and ``TMPDIR``, the top level of ``/tmp`` and of the current directory; keys aim path traversals at
``/tmp/<marker>...``, so anything named after the marker counts wherever it appears), and scans the
gateway's logs for tracebacks. A gateway that dies is a crash: recorded with the cases in flight, then
restarted on the same state directory (its recovery replays the journal) so that the run goes on.

The figures that must be 0 (the exit status is 1 otherwise): crashes (the gateway process died, or did not
exit 0 on SIGTERM), 500 answers, files created outside the spool and state directories, partial or
unexpected objects on the backend, acknowledged objects missing from it, multipart uploads left open on the
backend that no case left open, read-backs that differ from what valid writes left, wrong answers (bytes
that are not the slice a 200/206 names, injected headers, a 200 whose XML does not parse), desynchronised
connections, tracebacks in the gateway's logs and errors of this harness itself. Reported beside them: 503
answers (acceptable only if justified), other 5xx, answers outside the expected set (and of those, the ones
the store gave and the gateway relayed), error answers without S3 XML, answers of the HTTP parser below the
S3 handler, timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote
from xml.etree import ElementTree

import gateway
from gateway.core.chunked import encode_aws_chunked
from gateway.core.sigv4 import (
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    ChunkSigner,
    canonical_query,
    canonical_uri,
    sign_headers,
    signing_key,
)
from gateway.seaweed.options import SeaweedIdentity, SeaweedOptions
from gateway.seaweed.process import SeaweedProcess

QUICK_CASES = 600
FULL_CASES = 10_000
REGION = "us-east-1"
ACCESS_KEY = "FUZZHTTPACCESSKEY001"
UNKNOWN_ACCESS_KEY = "FUZZHTTPUNKNOWNKEY01"
GATEWAY_SOURCE = Path(gateway.__file__).resolve().parent.parent
GATEWAY_START_TIMEOUT_S = 30.0
GATEWAY_STOP_TIMEOUT_S = 30.0
# One answer. Hostile input is answered in milliseconds, but a write to a key whose spooled data is still
# draining may wait up to 30 s (gateway.http.spool_front.KEY_CLEAR_TIMEOUT_S) before its answer.
READ_TIMEOUT_S = 45.0
CONNECT_TIMEOUT_S = 5.0
FLUSH_TIMEOUT_S = 300.0
FLUSH_WINDOW_S = 4.0  # one flush call; the drain retries a failed upload within 2 s (retry_max_s below)
FLUSH_STALL_WINDOWS = 3  # pending count not falling for this many windows: the drain is stuck
MAX_ANSWER_HEAD_BYTES = 256 * 1024
MAX_ANSWER_BODY_BYTES = 64 * 1024 * 1024
SMALL_BODY_BYTES = 256 * 1024  # the proxy verifies bodies up to this size whole (gateway.http.proxy)
MIN_PART_BYTES = 5 * 1024 * 1024
MAX_EXAMPLES_PER_FINDING = 3
MAX_RESTARTS = 25
EXCERPT_BYTES = 1500
WRITE_THROUGH = ("x-s3lanes-write-through", "true")
# weed makes one unix socket per gRPC server in /tmp with no flag to move it (gateway.seaweed).
_WEED_SOCKET_RE = re.compile(r"^seaweedfs-\w+-grpc-\d+\.sock$")
_SPOOL_LAYOUT_RE = re.compile(r"^(journal|journal\.tmp|data|data/[0-9a-f]{32})$")
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


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.fuzz_http",
        description="s3lanes under hostile HTTP input: malformed requests against a real gateway with the "
        "write spool on, mixed with valid signed ones; checks crashes, 500s, files outside the spool, "
        "partial objects on the backend and lost writes.",
    )
    p.add_argument("--cases", type=int, help=f"cases to run ({FULL_CASES}; --quick {QUICK_CASES})")
    p.add_argument("--seed", type=int, help="random seed (default: a fresh one, printed)")
    p.add_argument("--quick", action="store_true", help=f"the CI subset: {QUICK_CASES} cases")
    p.add_argument("--out", type=Path, help="JSON results (default results/fuzz-http-<timestamp>.json)")
    p.add_argument("--no-out", action="store_true", help="write no JSON")
    p.add_argument("--concurrency", type=int, default=4, help="cases in flight at once (4)")
    p.add_argument("--tmp-dir", type=Path, help="parent of the temporary directory (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, spool)")
    p.add_argument("--backend-endpoint", help="use this running S3 store instead of starting SeaweedFS")
    p.add_argument("--backend-access-key", help="its access key (with --backend-endpoint)")
    p.add_argument(
        "--backend-secret-key",
        default=os.environ.get("FUZZ_HTTP_BACKEND_SECRET_KEY"),
        help="its secret key (with --backend-endpoint; default: $FUZZ_HTTP_BACKEND_SECRET_KEY)",
    )
    p.add_argument(
        "--only-case",
        action="append",
        type=int,
        default=[],
        help="run only this case index (repeatable; with the run's --seed this replays it) and print "
        "every exchange",
    )
    p.add_argument("--verbose", action="store_true", help="print every exchange")
    p.add_argument("--kinds", help="only these case kinds, comma-separated (see KINDS; default: all)")
    p.add_argument(
        "--gateway-source",
        type=Path,
        default=GATEWAY_SOURCE,
        help="run the gateway from this source tree (e.g. a `git archive` of one commit, so that edits to "
        "the working tree during the run cannot reach the gateway's restarts); default: this checkout",
    )
    a = p.parse_args(argv)
    cases = a.cases if a.cases is not None else (QUICK_CASES if a.quick else FULL_CASES)
    if cases <= 0 or a.concurrency <= 0:
        p.error("--cases and --concurrency must be positive")
    backend = None
    if a.backend_endpoint:
        if not a.backend_access_key or not a.backend_secret_key:
            p.error("--backend-endpoint needs --backend-access-key and --backend-secret-key")
        backend = BackendSpec(a.backend_endpoint, a.backend_access_key, a.backend_secret_key)
    seed = a.seed if a.seed is not None else secrets.randbelow(2**31)
    out = None
    if not a.no_out:
        out = a.out or Path("results") / f"fuzz-http-{time.strftime('%Y%m%d-%H%M%S')}.json"
    words = ["python -m loadtests.fuzz_http", *(["--quick"] if a.quick else [])]
    words += ["--cases", str(cases), "--seed", str(seed), "--concurrency", str(a.concurrency)]
    if a.kinds:
        unknown = {k.strip() for k in a.kinds.split(",") if k.strip()} - {name for name, _, _ in KINDS}
        if unknown:
            p.error(f"unknown case kinds: {sorted(unknown)}")
        words += ["--kinds", a.kinds]
    if a.gateway_source != GATEWAY_SOURCE:
        words += ["--gateway-source", str(a.gateway_source)]
    return Options(
        cases=cases,
        seed=seed,
        quick=a.quick,
        out=out,
        concurrency=a.concurrency,
        tmp_dir=a.tmp_dir,
        keep=a.keep,
        backend=backend,
        only_cases=tuple(a.only_case),
        verbose=a.verbose or bool(a.only_case),
        command=" ".join(words),
        gateway_source=a.gateway_source.resolve(),
        kinds=tuple(k.strip() for k in (a.kinds or "").split(",") if k.strip()),
    )


# --------------------------------------------------------------------------------------------------------
# Raw HTTP


@dataclass(slots=True)
class Answer:
    """One HTTP answer as read off the wire, or why there was none (``status is None``)."""

    status: int | None
    reason: str = ""
    version: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    interim: list[int] = field(default_factory=list)
    error: str = ""  # "timeout", "closed" (EOF or reset before a whole answer), "bad-answer: ..."
    closes: bool = False  # the server will close the connection after this answer

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def from_handler(self) -> bool:
        """Answered by the gateway's S3 handler (it stamps every answer with a request id)."""
        return self.header("x-amz-request-id") is not None

    def error_code(self) -> str | None:
        return xml_error_code(self.body)

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        code = self.error_code() if self.status >= 400 else None
        text = f"{self.status} {self.reason}".strip()
        return f"{text} [{code}]" if code else text


def answer_source(ans: Answer) -> str:
    """Who produced an answer: the HTTP parser below the S3 handler, the handler itself, the spool, or the
    backend (relayed: the gateway echoes the store's request id in x-s3lanes-backend-request-id)."""
    if ans.status is None:
        return "none"
    if not ans.from_handler:
        return "parser"
    if ans.header("x-s3lanes-source") == "spool":
        return "spool"
    if ans.header("x-s3lanes-backend-request-id") is not None:
        return "backend"
    return "gateway"


def xml_error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document, None if ``body`` is not one."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    if root.tag.rpartition("}")[2] != "Error":
        return None
    for child in root:
        if child.tag.rpartition("}")[2] == "Code" and child.text and child.text.strip():
            return child.text.strip()
    return None


class Conn:
    """One client connection: write bytes as they are, read answers as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.usable = True

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_ANSWER_HEAD_BYTES)
        return cls(reader, writer)

    async def send(self, data: bytes, *, half_close: bool = False) -> str:
        """Write ``data``; ``half_close`` then shuts our side (the server sees EOF). '' or why it failed."""
        try:
            self.writer.write(data)
            async with asyncio.timeout(READ_TIMEOUT_S):
                await self.writer.drain()
            if half_close and self.writer.can_write_eof():
                self.writer.write_eof()
        except TimeoutError:
            self.usable = False
            return "send timeout"
        except (ConnectionError, OSError) as exc:
            self.usable = False
            return f"send failed: {type(exc).__name__}"
        return ""

    async def answer(self, method: str, *, stop_at_interim: bool = False) -> Answer:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                ans = await self._answer(method, stop_at_interim)
        except TimeoutError:
            self.usable = False
            return Answer(None, error="timeout")
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.usable = False
            return Answer(None, error="closed")
        except (asyncio.LimitOverrunError, ValueError) as exc:
            self.usable = False
            return Answer(None, error=f"bad-answer: {exc}")
        if ans.closes:
            self.usable = False
        return ans

    async def _answer(self, method: str, stop_at_interim: bool) -> Answer:
        interim: list[int] = []
        while True:
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head[:-4].decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            status_text, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or not status_text.isdigit():
                raise ValueError(f"status line {lines[0][:80]!r}")
            status = int(status_text)
            headers = []
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise ValueError(f"header line {line[:80]!r}")
                headers.append((name.strip(), value.strip()))
            if 100 <= status < 200 and status != 101:
                interim.append(status)
                if stop_at_interim:
                    return Answer(status, reason, version, headers, interim=interim)
                continue
            break
        ans = Answer(status, reason, version, headers, interim=interim)
        connection = (ans.header("connection") or "").lower()
        ans.closes = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if method == "HEAD" or status in (204, 304):
            return ans
        if "chunked" in (ans.header("transfer-encoding") or "").lower():
            ans.body = await self._chunked_body()
        elif (length := ans.header("content-length")) is not None:
            if not length.isdigit() or int(length) > MAX_ANSWER_BODY_BYTES:
                raise ValueError(f"content-length {length!r}")
            ans.body = await self.reader.readexactly(int(length))
        else:
            ans.body = await self.reader.read(MAX_ANSWER_BODY_BYTES)
            ans.closes = True
        return ans

    async def _chunked_body(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = await self.reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            if await self.reader.readexactly(2) != b"\r\n":
                raise ValueError("chunk not followed by CRLF")

    async def close(self) -> None:
        self.usable = False
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def _wire(text: str) -> bytes:
    """UTF-8, with lone surrogates standing for the raw bytes they came from (surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


@dataclass(slots=True)
class Req:
    """A request before it is put on the wire; cases edit it (drop, duplicate, corrupt parts) first."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    version: str = "HTTP/1.1"
    # Body bytes actually sent; None: all of ``body`` (a truncated upload sends fewer than promised).
    sent_body: bytes | None = None

    def set(self, name: str, value: str) -> Req:
        self.drop(name)
        self.headers.append((name, value))
        return self

    def drop(self, name: str) -> Req:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()]
        return self

    def get(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def head_bytes(self) -> bytes:
        lines = [_wire(f"{self.method} {self.target} {self.version}")]
        lines += [_wire(f"{k}: {v}") for k, v in self.headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def wire(self) -> bytes:
        return self.head_bytes() + (self.body if self.sent_body is None else self.sent_body)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def multipart_etag(part_md5s: Sequence[str]) -> str:
    joined = b"".join(bytes.fromhex(m) for m in part_md5s)
    return f"{hashlib.md5(joined).hexdigest()}-{len(part_md5s)}"


def excerpt(data: bytes, limit: int = EXCERPT_BYTES) -> str:
    """Request bytes for a report: printable ASCII kept, everything else escaped (a bytes literal body)."""
    cut = data[:limit]
    text = repr(cut)[2:-1]
    return text + (f"... ({len(data)} bytes in all)" if len(data) > limit else "")


# --------------------------------------------------------------------------------------------------------
# Expectations, findings and figures


@dataclass(frozen=True, slots=True)
class Expect:
    """The answers S3 would give (or that are acceptable) for one request.

    ``codes`` None: any code (or none) is fine. ``no_answer``: the server may close without answering
    (a body cut short, garbage that is not HTTP).
    """

    statuses: frozenset[int]
    codes: frozenset[str] | None = None
    no_answer: bool = False

    def matches(self, status: int, code: str | None, method: str = "GET") -> bool:
        if status not in self.statuses:
            return False
        # A HEAD answer has no body, so no code to compare.
        return self.codes is None or status < 300 or method == "HEAD" or code in self.codes


def expect(*statuses: int, codes: Sequence[str] | None = None, no_answer: bool = False) -> Expect:
    return Expect(frozenset(statuses), frozenset(codes) if codes is not None else None, no_answer)


OK = expect(200)
ANY = Expect(frozenset(range(100, 600)))
AUTH_ERRORS = (
    "AccessDenied",
    "AuthorizationHeaderMalformed",
    "AuthorizationQueryParametersError",
    "InvalidArgument",
    "InvalidRequest",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "RequestTimeTooSkewed",
)
AUTH_FAIL = expect(400, 403, codes=AUTH_ERRORS)
BODY_ERRORS = (
    "IncompleteBody",
    "InvalidChunkSizeError",
    "MalformedTrailerError",
    "SignatureDoesNotMatch",
    "XAmzContentSHA256Mismatch",
    "BadDigest",
    "InvalidDigest",
    "InvalidRequest",
    "InvalidArgument",
    "MissingContentLength",
)


@dataclass(slots=True)
class Finding:
    """Answers of one kind of problem (same case kind, step, category, status and code), with examples."""

    category: str
    kind: str
    step: str
    status: int | None
    code: str | None
    source: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Figures:
    cases_run: int = 0
    requests: int = 0
    crashes: int = 0
    answers_500: int = 0
    answers_503: int = 0
    answers_other_5xx: int = 0
    files_outside_spool: int = 0
    partial_objects: int = 0
    backend_mangled_keys: int = 0  # SeaweedFS's own handling of keys ending in "/" (not counted as partial)
    missing_objects: int = 0
    open_uploads_unexpected: int = 0
    read_back_mismatch: int = 0
    wrong_answers: int = 0
    desynced: int = 0
    tracebacks: int = 0
    tracebacks_from_parser: int = 0  # of those: aiohttp logging bytes its HTTP parser refused
    harness_errors: int = 0
    unexpected_answers: int = 0
    unexpected_from_backend: int = 0  # of those: the store's own answer, relayed
    errors_without_xml: int = 0  # from the S3 handler
    parser_answers: int = 0  # answered below the S3 handler (aiohttp's HTTP parser), no S3 XML
    timeouts: int = 0
    cases_interrupted: int = 0  # cut short by a crash
    no_answer_gateway_down: int = 0  # requests that met a dead gateway (counted under crashes)
    pipelines_refused_whole: int = 0  # see case_pipeline
    no_answer: int = 0

    MUST_BE_ZERO = (
        "crashes",
        "answers_500",
        "files_outside_spool",
        "partial_objects",
        "missing_objects",
        "open_uploads_unexpected",
        "read_back_mismatch",
        "wrong_answers",
        "desynced",
        "tracebacks",
        "harness_errors",
    )

    def failed(self) -> list[str]:
        return [name for name in self.MUST_BE_ZERO if getattr(self, name)]


# --------------------------------------------------------------------------------------------------------
# The ledger: what valid requests completely wrote


@dataclass(frozen=True, slots=True)
class Stored:
    md5: str
    etag: str  # without quotes
    size: int
    case: int


@dataclass(slots=True)
class Ledger:
    objects: dict[str, Stored] = field(default_factory=dict)
    # Keys whose last write has no certain outcome (no answer): any of these MD5s, or None for absent.
    uncertain: dict[str, set[str | None]] = field(default_factory=dict)
    # Backend multipart uploads a case left open on purpose: (key, upload id).
    open_uploads: set[tuple[str, str]] = field(default_factory=set)
    # Objects acknowledged under keys a store may normalise (dot segments, empty segments): by MD5.
    odd_by_md5: dict[str, str] = field(default_factory=dict)
    # Every key ever written that ends in "/": SeaweedFS stores PUT "a/b/" with data as "a/b/b" (or, for a
    # few bytes, as an empty directory marker "a/b/"), whatever the gateway does (see check_backend).
    trailing_slash: set[str] = field(default_factory=set)
    # Key prefixes of cases a crash cut short: an upload they created may never have reached them.
    crash_cut_prefixes: set[str] = field(default_factory=set)

    def put(self, key: str, body_md5: str, etag: str, size: int, case: int) -> None:
        self.objects[key] = Stored(body_md5, etag, size, case)
        if key.endswith("/"):
            self.trailing_slash.add(key)
        self.uncertain.pop(key, None)
        if odd_key(key):
            self.odd_by_md5[body_md5] = key

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)
        self.uncertain.pop(key, None)

    def maybe(self, key: str, body_md5: str | None) -> None:
        """A write whose outcome is unknown: the key may hold the old object or the new one."""
        options = self.uncertain.setdefault(key, set())
        old = self.objects.get(key)
        options.add(old.md5 if old is not None else None)
        options.add(body_md5)


def odd_key(key: str) -> bool:
    segments = key.replace("\\", "/").split("/")
    return key.startswith("/") or any(seg in ("", ".", "..") for seg in segments)


# --------------------------------------------------------------------------------------------------------
# A case: its randomness, its keys, its connection, and the exchanges it makes


class Case:
    """One case: a few exchanges on one connection, all on keys under ``<marker>/c<index>/``."""

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.index = index
        self.rng = random.Random(f"{run.opts.seed}-{index}")
        self.prefix = f"{run.marker}/c{index:05d}/"
        self.kind = ""
        self._conn: Conn | None = None
        self.uploads: list[tuple[str, str]] = []  # (key, upload id) of every upload this case created
        self.generation = run.generation  # gateway restarts before this case began
        self.saw_no_answer = False

    # -- names and bodies ------------------------------------------------------------------------------------

    def key(self, name: str = "obj") -> str:
        return self.prefix + name

    def size(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.75:
            return self.rng.randint(1, 4096)
        if r < 0.92:
            return self.rng.randint(4097, 64 * 1024)
        if r < 0.985:
            return self.rng.randint(SMALL_BODY_BYTES + 1, 600 * 1024)  # the streaming (held-back) path
        return self.rng.randint(1024 * 1024, 2 * 1024 * 1024)

    def body(self, size: int | None = None) -> bytes:
        n = self.size() if size is None else size
        return self.rng.randbytes(n)

    def path(self, key: str | None, bucket: str | None = None) -> str:
        out = "/" + (bucket or self.run.bucket)
        if key is not None:
            out += "/" + quote(key, safe="/~", errors="surrogateescape")
        return out

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    # -- building requests -----------------------------------------------------------------------------------

    def signed(
        self,
        method: str,
        key: str | None = None,
        *,
        query: str = "",
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        payload: str | None = None,
        raw_path: str | None = None,
        host: str | None = None,
        when: float | None = None,
        access_key: str = ACCESS_KEY,
        secret: str | None = None,
        bucket: str | None = None,
        content_length: bool | None = None,
    ) -> Req:
        """A SigV4-signed request (header auth) as a well-behaved client sends it."""
        raw_path = raw_path if raw_path is not None else self.path(key, bucket)
        host = host if host is not None else self.run.host_header
        lowered = {"host": host}
        for name, value in headers:
            lowered[name.lower()] = value
        payload_hash = payload if payload is not None else sha256_hex(body)
        auth = sign_headers(
            method,
            raw_path,
            query,
            lowered,
            access_key=access_key,
            secret_key=secret if secret is not None else self.run.secret_key,
            region=REGION,
            payload_hash=payload_hash,
            now_wall=when if when is not None else time.time(),
        )
        out = [("Host", host), *headers]
        out += [
            ("x-amz-date", auth["x-amz-date"]),
            ("x-amz-content-sha256", auth["x-amz-content-sha256"]),
            ("Authorization", auth["authorization"]),
        ]
        if content_length or (content_length is None and (body or method in ("PUT", "POST"))):
            out.append(("Content-Length", str(len(body))))
        target = raw_path + (f"?{query}" if query else "")
        return Req(method, target, out, body)

    def presigned(
        self,
        method: str,
        key: str,
        *,
        expires_s: int = 300,
        when: float | None = None,
        extra_query: str = "",
        secret: str | None = None,
    ) -> Req:
        """A presigned-URL request (query auth, ``UNSIGNED-PAYLOAD``), as botocore's presigned URLs are."""
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when if when is not None else time.time()))
        scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
        params = [
            ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            ("X-Amz-Credential", f"{ACCESS_KEY}/{scope}"),
            ("X-Amz-Date", amz_date),
            ("X-Amz-Expires", str(expires_s)),
            ("X-Amz-SignedHeaders", "host"),
        ]
        query = "&".join(f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in params)
        if extra_query:
            query += "&" + extra_query
        raw_path = self.path(key)
        host = self.run.host_header
        creq = "\n".join(
            [
                method,
                canonical_uri(raw_path),
                canonical_query(query),
                f"host:{host}\n",
                "host",
                UNSIGNED_PAYLOAD,
            ]
        )
        sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{sha256_hex(creq.encode())}"
        skey = signing_key(secret if secret is not None else self.run.secret_key, amz_date[:8], REGION, "s3")
        signature = hmac.new(skey, sts.encode(), hashlib.sha256).hexdigest()
        query += f"&X-Amz-Signature={signature}"
        return Req(method, f"{raw_path}?{query}", [("Host", host)])

    # -- exchanges -------------------------------------------------------------------------------------------

    async def connection(self, fresh: bool = False) -> Conn:
        if self._conn is not None and (fresh or not self._conn.usable):
            await self._conn.close()
            self._conn = None
        if self._conn is None:
            self._conn = await Conn.open(self.run.host, self.run.port)
        return self._conn

    @property
    def conn_usable(self) -> bool:
        return self._conn is not None and self._conn.usable

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def x(
        self,
        step: str,
        req: Req | bytes,
        exp: Expect,
        *,
        method: str | None = None,
        half_close: bool = False,
        fresh: bool = False,
    ) -> Answer:
        """Send one request (as it is) and read its answer; classify the answer."""
        data = req.wire() if isinstance(req, Req) else req
        verb = method or (req.method if isinstance(req, Req) else "GET")
        conn = await self.connection(fresh)
        await conn.send(data, half_close=half_close)
        ans = await conn.answer(verb)
        if half_close:
            conn.usable = False
        self.run.classify(self, step, verb, data, ans, exp)
        return ans

    async def pipeline(self, step: str, reqs: Sequence[Req], exps: Sequence[Expect]) -> list[Answer]:
        """Send several requests in one write, then read their answers in order."""
        conn = await self.connection(fresh=True)
        data = b"".join(r.wire() for r in reqs)
        await conn.send(data)
        answers = []
        for i, (r, exp) in enumerate(zip(reqs, exps, strict=True)):
            ans = await conn.answer(r.method) if conn.usable else Answer(None, error="closed")
            self.run.classify(self, f"{step}[{i}]", r.method, r.wire(), ans, exp)
            answers.append(ans)
        return answers

    # -- valid operations and the checks that nothing was lost ----------------------------------------------

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        write_through: bool = False,
        step: str = "put",
        headers: Sequence[tuple[str, str]] = (),
        payload: str | None = None,
    ) -> bool:
        """A valid PUT; recorded in the ledger once acknowledged."""
        hdrs = [*headers, *([WRITE_THROUGH] if write_through else [])]
        ans = await self.x(step, self.signed("PUT", key, headers=hdrs, body=body, payload=payload), OK)
        return self.after_write(key, body, ans)

    def after_write(self, key: str, body: bytes, ans: Answer, *, etag: str | None = None) -> bool:
        if ans.status is not None and 200 <= ans.status < 300:
            self.run.ledger.put(key, md5_hex(body), etag or md5_hex(body), len(body), self.index)
            return True
        if ans.status is None:
            self.run.ledger.maybe(key, md5_hex(body))
        return False

    async def check(self, key: str, step: str = "read-back", *, same_conn: bool = True) -> None:
        """GET ``key`` and compare with the ledger: the object a valid write left, or 404.

        On a connection a hostile request used before, this is also the desynchronisation probe: a wrong
        answer there that a fresh connection does not repeat means the hostile request's bytes were taken
        for (part of) this one.
        """
        ledger = self.run.ledger
        if key in ledger.uncertain:
            return
        stored = ledger.objects.get(key)
        exp = OK if stored is not None else expect(404, codes=["NoSuchKey"])
        reused = same_conn and self.conn_usable
        req = self.signed("GET", key)
        ans = await self.x(step, req, exp, fresh=not reused)
        if ans.status is None or self._read_back_ok(ans, stored):
            return  # no answer is no verdict (and is counted as such)
        if reused:
            again = await self.x(step + " (fresh connection)", self.signed("GET", key), exp, fresh=True)
            if again.status is None:
                return
            if self._read_back_ok(again, stored):
                if ans.from_handler and ans.status in (200, 404):
                    # The handler answered this very GET, only with what the key held a moment earlier.
                    note = "stale read: the same GET a moment later, on a fresh connection, reads it right"
                    self.run.problem("read_back_mismatch", self, step, req.wire(), ans, note)
                else:
                    note = "a fresh connection reads it right"
                    self.run.problem("desynced", self, step, req.wire(), ans, note)
                return
            ans = again
        note = f"expected {'MD5 ' + stored.md5 if stored else '404'}"
        if ans.status == 200:
            note += f", got MD5 {md5_hex(ans.body)} ({len(ans.body)} bytes)"
        self.run.problem("read_back_mismatch", self, step, req.wire(), ans, note)

    @staticmethod
    def _read_back_ok(ans: Answer, stored: Stored | None) -> bool:
        if stored is None:
            return ans.status == 404
        return ans.status == 200 and md5_hex(ans.body) == stored.md5


# --------------------------------------------------------------------------------------------------------
# The run: figures, findings, the ledger


class Run:
    def __init__(
        self, opts: Options, host: str, port: int, bucket: str, marker: str, secret_key: str
    ) -> None:
        self.opts = opts
        self.host = host
        self.port = port
        self.host_header = f"{host}:{port}"
        self.bucket = bucket
        self.marker = marker
        self.secret_key = secret_key
        self.figures = Figures()
        self.ledger = Ledger()
        self.findings: dict[tuple[str, str, str, int | None, str | None, str], Finding] = {}
        self.kinds: Counter[str] = Counter()
        self.answers: dict[str, Counter[str]] = {}
        self.gateway_alive: Callable[[], bool] = lambda: True
        self.crashes: list[dict[str, Any]] = []
        self.in_flight: set[int] = set()
        self.generation = 0  # gateway restarts so far
        self.stopped = ""  # why the run stopped early, if it did

    def classify(self, case: Case, step: str, method: str, data: bytes, ans: Answer, exp: Expect) -> None:
        f = self.figures
        f.requests += 1
        label = str(ans.status) if ans.status is not None else ans.error.split(":")[0]
        self.answers.setdefault(case.kind, Counter())[label] += 1
        if self.opts.verbose:
            print(f"--- case {case.index} {case.kind} / {step}\n>>> {excerpt(data, 4000)}")
            print(f"<<< {ans.describe()} {excerpt(ans.body, 600)}")
        if ans.status is None and (case.generation != self.generation or not self.gateway_alive()):
            f.no_answer_gateway_down += 1
            return
        if ans.status is None:
            if ans.error == "timeout":
                f.timeouts += 1
                self._finding("timeout", case, step, data, ans)
            elif not exp.no_answer:
                case.saw_no_answer = True  # perhaps a gateway dying: see run_cases
                f.no_answer += 1
                self._finding("no answer", case, step, data, ans)
            return
        code = ans.error_code() if ans.status >= 400 else None
        if ans.status == 500:
            f.answers_500 += 1
            self._finding("500 answer", case, step, data, ans)
        elif ans.status == 503:
            f.answers_503 += 1
            self._finding("503 answer", case, step, data, ans)
        elif ans.status > 500:
            f.answers_other_5xx += 1
        if ans.status >= 400 and method != "HEAD" and code is None:
            if ans.from_handler:
                f.errors_without_xml += 1
                self._finding("error without S3 XML", case, step, data, ans)
            else:
                f.parser_answers += 1
                self._finding("HTTP parser answer", case, step, data, ans)
        if not exp.matches(ans.status, code, method):
            f.unexpected_answers += 1
            if answer_source(ans) == "backend":
                f.unexpected_from_backend += 1
            want = sorted(exp.statuses) if len(exp.statuses) < 10 else "any"
            codes = sorted(exp.codes) if exp.codes is not None else "any"
            self._finding("unexpected answer", case, step, data, ans, f"expected {want} {codes}")

    def problem(self, figure: str, case: Case, step: str, data: bytes, ans: Answer, note: str = "") -> None:
        """Count a must-be-0 problem found by a case's own checks (lost write, desync, wrong answer)."""
        setattr(self.figures, figure, getattr(self.figures, figure) + 1)
        self._finding(figure.replace("_", " "), case, step, data, ans, note)

    def _finding(
        self, category: str, case: Case, step: str, data: bytes, ans: Answer, note: str = ""
    ) -> None:
        code = ans.error_code() if ans.status is not None and ans.status >= 400 else None
        source = answer_source(ans)
        ident = (category, case.kind, step, ans.status, code, source)
        finding = self.findings.get(ident)
        if finding is None:
            finding = self.findings[ident] = Finding(category, case.kind, step, ans.status, code, source)
        finding.count += 1
        if len(finding.examples) < MAX_EXAMPLES_PER_FINDING:
            finding.examples.append(
                {
                    "case": case.index,
                    "request": excerpt(data),
                    "answer": ans.describe(),
                    "answer_body": excerpt(ans.body, 400),
                    "note": note,
                }
            )

    def harness_error(self, case: Case, exc: BaseException) -> None:
        self.figures.harness_errors += 1
        self._finding("harness error", case, type(exc).__name__, b"", Answer(None, error=repr(exc)[:300]))


# --------------------------------------------------------------------------------------------------------
# Case kinds. Each sends hostile requests mixed with valid ones and checks that nothing was lost.

CaseFn = Callable[[Case], Awaitable[None]]


async def seed_object(c: Case, key: str | None = None) -> tuple[str, bytes]:
    """A valid object for a case to attack (spooled, or written through to the backend)."""
    key = key or c.key()
    body = c.body(c.rng.randint(1, 3000) if c.rng.random() < 0.8 else None)
    await c.put(key, body, write_through=c.rng.random() < 0.3, step="seed")
    return key, body


async def case_valid(c: Case) -> None:
    """Controls: valid PUT, GET, HEAD, overwrite and DELETE, spooled and written through."""
    key = c.key("v")
    body = c.body()
    await c.put(key, body, write_through=c.rng.random() < 0.3)
    await c.check(key)
    r = c.rng.random()
    if r < 0.3:
        ans = await c.x("head", c.signed("HEAD", key), OK)
        if ans.status == 200 and ans.header("content-length") != str(len(body)):
            c.run.problem("wrong_answers", c, "head", b"", ans, f"Content-Length for {len(body)} bytes")
    elif r < 0.55:
        ans = await c.x("delete", c.signed("DELETE", key), expect(204))
        if ans.status == 204:
            c.run.ledger.delete(key)
        await c.check(key, "read-back after delete")
    elif r < 0.75:
        await c.put(key, c.body(), write_through=c.rng.random() < 0.3, step="overwrite")
        await c.check(key, "read-back after overwrite")


def _garbage_authorization(c: Case, good: str) -> str:
    cred = good.split("Credential=", 1)[1].split(",", 1)[0]
    sig = good.rsplit("Signature=", 1)[1]
    options = [
        "",
        " ",
        "AWS4-HMAC-SHA256",
        "AWS4-HMAC-SHA256 ",
        "Bearer abc",
        "Basic dXNlcjpwYXNz",
        f"AWS {ACCESS_KEY}:c2lnbmF0dXJl",  # SigV2
        f"AWS4-ECDSA-P256-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}, Extra=1",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=HOST;X-Amz-Date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=x-amz-date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={sig[:-1]}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={sig}0",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={'g' * 64}",
        f"AWS4-HMAC-SHA256 Credential=/{cred}, SignedHeaders=host;x-amz-date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred.replace('aws4_request', 'aws5_request')}, SignedHeaders=host, "
        f"Signature={sig}",
        "AWS4-HMAC-SHA256 Credential="
        + cred.replace("/s3/", "/s3\x00/")
        + f", SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/2024013/{REGION}/s3/aws4_request, SignedHeaders=host, "
        f"Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20241332/{REGION}/s3/aws4_request, SignedHeaders=host, "
        f"Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}//s3/aws4_request, SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential=ü/{cred}, SignedHeaders=host, Signature={sig}",
        "AWS4-HMAC-SHA256 Credential=\udcff\udcfe, SignedHeaders=host, Signature=" + sig,
        "AWS4-HMAC-SHA256 " + ",".join(["Credential=x"] * 200),
        "".join(chr(c.rng.randint(0x21, 0x7E)) for _ in range(c.rng.randint(1, 300))),
        "".join(chr(c.rng.randint(0xA0, 0x2FFF)) for _ in range(c.rng.randint(1, 100))),
        "AWS4-HMAC-SHA256 Credential=" + "A" * 7000 + f"/{cred.split('/', 1)[1]}, SignedHeaders=host, "
        f"Signature={sig}",
    ]
    return str(c.choice(options))


def _mutate_alnum(c: Case, text: str, *, start: int = 0) -> str:
    """``text`` with one alphanumeric character (at or after ``start``, outside %XX escapes) replaced by a
    different one that no canonicalisation can map back to it (so the result is never equivalent)."""
    positions = []
    i = start
    while i < len(text):
        if text[i] == "%":
            i += 3
            continue
        if text[i].isascii() and text[i].isalnum():
            positions.append(i)
        i += 1
    if not positions:
        return text + "0"
    pos = c.choice(positions)
    old = text[pos]
    if old.isdigit():
        new = str((int(old) + c.rng.randint(1, 9)) % 10)
    elif old in "abcdef":  # hex digits of a signature: stay lower-case hex, differ in value
        new = c.choice([h for h in "0123456789abcdef" if h != old])
    else:
        new = c.choice([ch for ch in "ghijkmnpqrstuvwxyzGHJKMNPQRSTUVWXYZ" if ch.lower() != old.lower()])
    return text[:pos] + new + text[pos + 1 :]


async def case_auth(c: Case) -> None:
    """Broken, missing, duplicated, mutated and mixed authentication; the object under attack survives."""
    key, _ = await seed_object(c)
    method = c.choice(["GET", "PUT", "HEAD", "DELETE"])
    body = c.body(c.rng.randint(0, 2000)) if method == "PUT" else b""
    req = c.signed(method, key, body=body, headers=[("x-amz-meta-fz", "v1")] if method == "PUT" else [])
    good = req.get("Authorization") or ""
    variant = c.choice(
        [
            "missing",
            "garbage",
            "duplicated",
            "wrong-secret",
            "unknown-key",
            "mutated",
            "mutated",
            "both-mechanisms",
            "presigned",
            "presigned",
            "unsigned-x-amz-header",
        ]
    )
    exp = AUTH_FAIL
    if variant == "missing":
        req.drop("Authorization")
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "garbage":
        req.set("Authorization", _garbage_authorization(c, good))
        exp = Expect(AUTH_FAIL.statuses, AUTH_FAIL.codes, no_answer=False)
    elif variant == "duplicated":
        other = c.choice(
            [good, _garbage_authorization(c, good), c.signed(method, key, body=body).get("Authorization")]
        )
        req.headers.append(("Authorization", str(other)))
    elif variant == "wrong-secret":
        req = c.signed(method, key, body=body, secret=c.run.secret_key + "x")
        exp = expect(403, codes=["SignatureDoesNotMatch"])
    elif variant == "unknown-key":
        req = c.signed(method, key, body=body, access_key=UNKNOWN_ACCESS_KEY)
        exp = expect(403, codes=["InvalidAccessKeyId"])
    elif variant == "mutated":
        where = c.choice(["path", "signature", "meta", "date", "region", "signed-headers"])
        if where == "path":
            head, _, rest = req.target.partition(c.prefix)
            req.target = head + c.prefix + _mutate_alnum(c, rest)
        elif where == "signature":
            req.set(
                "Authorization", good[: good.rindex("=") + 1] + _mutate_alnum(c, good[good.rindex("=") + 1 :])
            )
        elif where == "meta" and method == "PUT":
            req.set("x-amz-meta-fz", "v2")
        elif where == "date":
            req.set("x-amz-date", _mutate_alnum(c, req.get("x-amz-date") or ""))
            exp = expect(400, 403, codes=AUTH_ERRORS)
        elif where == "region":
            req.set("Authorization", good.replace(f"/{REGION}/", "/eu-west-1/"))
        else:
            req.set("Authorization", good.replace("SignedHeaders=", "SignedHeaders=content-length;"))
        exp = expect(400, 403, codes=AUTH_ERRORS)
    elif variant == "both-mechanisms":
        req.target += ("&" if "?" in req.target else "?") + "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        exp = expect(400, 403, codes=["InvalidArgument", "SignatureDoesNotMatch"])
    elif variant == "unsigned-x-amz-header":
        req.headers.append(("x-amz-meta-unsigned", "sneaked"))
        exp = expect(403, codes=["AccessDenied"])
    else:  # presigned
        await case_presigned_variant(c, key)
        await c.check(key)
        return
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "PUT" and ans.status == 200:
        c.after_write(key, body, ans)
    elif method == "DELETE" and ans.status == 204:
        c.run.ledger.delete(key)
    await c.check(key)


async def case_presigned_variant(c: Case, key: str) -> None:
    variant = c.choice(
        [
            "valid",
            "expired",
            "too-long",
            "bad-expires",
            "missing-param",
            "duplicated-param",
            "bad-signature",
            "bad-algorithm",
            "bad-credential",
            "bad-date",
            "sigv2",
            "future",
            "valid-put",
        ]
    )
    exp = expect(
        400,
        403,
        codes=[
            "AuthorizationQueryParametersError",
            "AccessDenied",
            "InvalidRequest",
            "SignatureDoesNotMatch",
        ],
    )
    if variant == "valid":
        req, exp = c.presigned("GET", key), OK if key in c.run.ledger.objects else expect(404)
    elif variant == "valid-put":
        body = c.body(c.rng.randint(0, 5000))
        req = c.presigned("PUT", key)
        req.headers.append(("Content-Length", str(len(body))))
        req.body = body
        ans = await c.x("presigned valid PUT", req, OK)
        c.after_write(key, body, ans)
        return
    elif variant == "expired":
        req = c.presigned("GET", key, expires_s=c.rng.randint(0, 600), when=time.time() - 3600)
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "future":
        req = c.presigned("GET", key, when=time.time() + c.rng.randint(3600, 10**8))
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "too-long":
        req = c.presigned("GET", key, expires_s=c.choice([604801, 10**9, 2**63]))
        exp = expect(400, codes=["AuthorizationQueryParametersError"])
    else:
        req = c.presigned("GET", key)
        target = req.target
        if variant == "bad-expires":
            value = c.choice(["abc", "-1", "", "1e3", "0x10", "%2B5", "99999999999999999999", "%00"])
            target = re.sub(r"X-Amz-Expires=[^&]*", f"X-Amz-Expires={value}", target)
        elif variant == "missing-param":
            name = c.choice(
                [
                    "X-Amz-Algorithm",
                    "X-Amz-Credential",
                    "X-Amz-Date",
                    "X-Amz-Expires",
                    "X-Amz-SignedHeaders",
                    "X-Amz-Signature",
                ]
            )
            target = re.sub(rf"[?&]{name}=[^&]*", "", target)
            if "?" not in target and "&" in target:
                target = target.replace("&", "?", 1)
        elif variant == "duplicated-param":
            name = c.choice(["X-Amz-Algorithm", "X-Amz-Date", "X-Amz-Expires", "X-Amz-Signature"])
            found = re.search(rf"{name}=([^&]*)", target)
            target += f"&{name}={found.group(1) if found else ''}"
        elif variant == "bad-signature":
            head, _, sig = target.rpartition("X-Amz-Signature=")
            target = head + "X-Amz-Signature=" + _mutate_alnum(c, sig)
        elif variant == "bad-algorithm":
            target = target.replace("AWS4-HMAC-SHA256", c.choice(["AWS4-HMAC-SHA1", "", "aws4-hmac-sha256"]))
        elif variant == "bad-credential":
            target = re.sub(
                r"X-Amz-Credential=[^&]*",
                "X-Amz-Credential="
                + c.choice(
                    ["", "x", "%2F%2F%2F%2F", ACCESS_KEY + "%2F2024%2Fr%2Fs3%2Faws4_request", "%FF%FE"]
                ),
                target,
            )
        elif variant == "bad-date":
            target = re.sub(
                r"X-Amz-Date=[^&]*",
                "X-Amz-Date=" + c.choice(["", "2024", "20240101T000000", "99999999T999999Z", "%00"]),
                target,
            )
        elif variant == "sigv2":
            target = c.path(key) + f"?AWSAccessKeyId={ACCESS_KEY}&Expires=9999999999&Signature=abc%3D"
        req.target = target
    await c.x(f"presigned {variant}", req, exp)


async def case_date(c: Case) -> None:
    """Bad, missing and skewed request dates; a credential date that disagrees with x-amz-date."""
    key, _ = await seed_object(c)
    method = c.choice(["GET", "PUT", "HEAD"])
    body = c.body(c.rng.randint(0, 2000)) if method == "PUT" else b""
    variant = c.choice(["garbage", "no-date", "date-header", "skewed", "within-skew", "extreme", "scope"])
    exp = expect(400, 403, codes=AUTH_ERRORS)
    if variant == "skewed":
        skew = c.rng.choice([-1, 1]) * c.rng.randint(16 * 60, 10 * 365 * 86400)
        req = c.signed(method, key, body=body, when=time.time() + skew)
        exp = expect(403, codes=["RequestTimeTooSkewed"])
    elif variant == "within-skew":
        req = c.signed(method, key, body=body, when=time.time() + c.rng.randint(-600, 600))
        exp = OK if method != "HEAD" or key in c.run.ledger.objects else expect(200, 404)
        if key not in c.run.ledger.objects and method == "GET":
            exp = expect(404)
    else:
        req = c.signed(method, key, body=body)
        amz = req.get("x-amz-date") or ""
        if variant == "garbage":
            req.set(
                "x-amz-date",
                c.choice(
                    [
                        "",
                        "now",
                        "2024-01-01T00:00:00Z",
                        amz[:-1],
                        amz + "Z",
                        amz.lower(),
                        "\uff12\uff10\uff12\uff14\uff10\uff11\uff10\uff11T000000Z",
                        amz.replace("T", " "),
                        "\udcff" * 16,
                    ]
                ),
            )
        elif variant == "no-date":
            req.drop("x-amz-date")
        elif variant == "date-header":
            req.drop("x-amz-date")
            req.set(
                "Date",
                c.choice(
                    [
                        "Mon, 32 Jan 2024 00:00:00 GMT",
                        "yesterday",
                        "",
                        "Mon, 01 Jan 2024",
                        "Mon, 01 Jan 99999 00:00:00 GMT",
                        "Mon, 01 Jan 2024 25:61:61 GMT",
                        time.strftime("%a, %d %b %Y %H:%M:%S", time.gmtime()),
                    ]
                ),
            )
        elif variant == "extreme":
            date = c.choice(
                [
                    "99991231T235959Z",
                    "00010101T000000Z",
                    "19700101T000000Z",
                    "20240230T000000Z",
                    "20241301T000000Z",
                    "20240101T246060Z",
                    "20161231T235960Z",
                ]
            )
            req.set("x-amz-date", date)
            auth = req.get("Authorization") or ""
            req.set("Authorization", re.sub(r"/\d{8}/", f"/{date[:8]}/", auth, count=1))
        else:  # scope: the credential's date is not the request's
            auth = req.get("Authorization") or ""
            req.set("Authorization", re.sub(r"/\d{8}/", "/20200101/", auth, count=1))
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "PUT":
        c.after_write(key, body, ans)
    await c.check(key)


async def case_payload(c: Case) -> None:
    """Wrong or malformed x-amz-content-sha256, Content-MD5 and x-amz-checksum-*; the old object survives."""
    key, _ = await seed_object(c)
    body = c.body() if c.rng.random() < 0.85 else b""  # an empty body makes no digest true but its own
    other = body + b"!" if c.rng.random() < 0.5 or not body else c.body(len(body))  # never equal to body
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    variant = c.choice(
        [
            "sha256-wrong",
            "sha256-malformed",
            "md5-wrong",
            "md5-malformed",
            "checksum-wrong",
            "checksum-malformed",
            "checksum-two",
            "checksum-unknown",
            "sdk-algorithm",
            "control",
        ]
    )
    unsigned = c.rng.random() < 0.5
    payload = UNSIGNED_PAYLOAD if unsigned else None
    headers: list[tuple[str, str]] = list(wt)
    exp = expect(400, codes=BODY_ERRORS)
    if variant == "sha256-wrong":
        payload = sha256_hex(other)
        exp = expect(400, codes=["XAmzContentSHA256Mismatch"])
    elif variant == "sha256-malformed":
        payload = c.choice(
            [
                "abc",
                sha256_hex(body)[:63],
                sha256_hex(body) + "0",
                "STREAMING-FOO",
                "unsigned-payload",
                "z" * 64,
                "UNSIGNED-PAYLOAD\udcff",
            ]
        )
        exp = expect(400, codes=["InvalidArgument"])
    elif variant == "md5-wrong":
        headers.append(("Content-MD5", md5_b64(other)))
        exp = expect(400, codes=["BadDigest"])
    elif variant == "md5-malformed":
        headers.append(("Content-MD5", c.choice(["abc", "", "====", md5_b64(body)[:-2], md5_hex(body), "ü"])))
        exp = expect(400, codes=["InvalidDigest"])
    elif variant == "checksum-wrong":
        headers.append(("x-amz-checksum-crc32", crc32_b64(other)))
        exp = expect(400, codes=["BadDigest"])
    elif variant == "checksum-malformed":
        headers.append(("x-amz-checksum-crc32", c.choice(["", "abc", "AAAAAAAA", "!!!!", "AAAA===="])))
        exp = expect(400, codes=["InvalidRequest", "InvalidArgument"])
    elif variant == "checksum-two":
        headers += [
            ("x-amz-checksum-crc32", crc32_b64(body)),
            ("x-amz-checksum-sha256", base64.b64encode(hashlib.sha256(body).digest()).decode()),
        ]
        exp = expect(400, codes=["InvalidRequest"])
    elif variant == "checksum-unknown":
        headers.append(("x-amz-checksum-md7", "AAAA"))
        exp = expect(200, 400, codes=["InvalidRequest", "InvalidArgument"])
    elif variant == "sdk-algorithm":
        headers += [
            ("x-amz-sdk-checksum-algorithm", c.choice(["SHA1", "FOO", ""])),
            ("x-amz-checksum-crc32", crc32_b64(body)),
        ]
        exp = expect(400, codes=["InvalidRequest"])
    else:
        exp = OK
    req = c.signed("PUT", key, headers=headers, body=body, payload=payload)
    ans = await c.x(variant, req, exp)
    c.after_write(key, body, ans)
    await c.check(key)


async def case_truncated(c: Case) -> None:
    """A body shorter than its Content-Length (the client goes away); nothing of it may be stored."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 4000) if c.rng.random() < 0.6 else None) or b"x"
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    payload = UNSIGNED_PAYLOAD if c.rng.random() < 0.5 else None
    req = c.signed("PUT", key, headers=wt, body=body, payload=payload)
    req.sent_body = body[: c.rng.randrange(len(body))]
    exp = expect(400, codes=["IncompleteBody"], no_answer=True)
    ans = await c.x("truncated then EOF", req, exp, half_close=True)
    if ans.status == 200:
        c.run.problem(
            "read_back_mismatch", c, "truncated then EOF", req.wire(), ans, "a cut body was acknowledged"
        )
    await c.check(key, same_conn=False)


async def case_length(c: Case) -> None:
    """Odd Content-Length and Transfer-Encoding: huge, negative, garbage, duplicated, both, extra bytes."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 3000))
    variant = c.choice(
        [
            "huge",
            "garbage",
            "duplicate",
            "cl-and-te",
            "te-chunked",
            "te-bad",
            "te-odd",
            "extra-bytes",
            "get-with-body",
            "missing",
        ]
    )
    req = c.signed("PUT", key, body=body, payload=UNSIGNED_PAYLOAD if c.rng.random() < 0.5 else None)
    parser_or_s3 = Expect(frozenset({400, 411, 413, 501}), None, no_answer=True)
    if variant == "huge":
        req.set("Content-Length", str(c.choice([5 * 1024**3 + 1, 10**13, 2**63 - 1, 2**64, 10**30])))
        ans = await c.x(
            "huge Content-Length then EOF", req, expect(400, 413, no_answer=True), half_close=True
        )
    elif variant == "garbage":
        req.set(
            "Content-Length",
            c.choice(["-1", "abc", "1 2", "0x10", "+5", "5,5", "", "1e3", "\u0663", "\udcff"]),
        )
        ans = await c.x("garbage Content-Length", req, parser_or_s3, half_close=True)
    elif variant == "duplicate":
        req.headers.append(("Content-Length", c.choice([str(len(body)), str(len(body) + 1), "0"])))
        ans = await c.x("two Content-Length", req, Expect(frozenset({200, 400}), None, True), half_close=True)
    elif variant == "cl-and-te":
        req.set("Transfer-Encoding", "chunked")
        req.body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        ans = await c.x("Content-Length and chunked", req, Expect(frozenset({200, 400, 411}), None, True))
    elif variant in ("te-chunked", "te-bad"):
        req.drop("Content-Length").set("Transfer-Encoding", "chunked")
        pieces = [body[i : i + 700] for i in range(0, len(body), 700)]
        coded = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
        if variant == "te-bad":
            coded = c.choice(
                [
                    b"zz\r\n" + coded,
                    coded[:-2],
                    coded.replace(b"\r\n", b"\n", 1),
                    b"fffffffffffffffffff\r\n" + coded,
                    coded[: len(coded) // 2],
                ]
            )
        req.body = coded
        exp = Expect(frozenset({200, 400, 411}), None, no_answer=True)
        ans = await c.x(f"{variant}", req, exp, half_close=variant == "te-bad")
        if variant == "te-bad" and ans.status == 200:
            c.run.problem(
                "read_back_mismatch", c, variant, req.wire(), ans, "a broken chunked body was acknowledged"
            )
            ans = Answer(400)
    elif variant == "te-odd":
        req.drop("Content-Length").set(
            "Transfer-Encoding",
            c.choice(["gzip, chunked", "chunked, gzip", "identity", "xchunked", "chunked\x0b", " chunked"]),
        )
        ans = await c.x(
            "odd Transfer-Encoding", req, Expect(frozenset({200, 400, 411, 501}), None, True), half_close=True
        )
    elif variant == "extra-bytes":
        extra = c.choice([b"garbage", b"\r\n\r\n", b"GET / HTTP/1.1\r\n", c.rng.randbytes(50)])
        req.sent_body = body + extra
        # aiohttp parses what arrived in one read as a whole: junk right behind a request may get the
        # request itself refused (400, not executed), which is fine; executing part of it is not.
        exp = Expect(frozenset({200, 400}), None, no_answer=True)
        ans = await c.x("body longer than Content-Length", req, exp, half_close=True)
        c.after_write(key, body, ans)
        conn = await c.connection()
        if ans.status == 200 and not ans.closes:
            junk = await conn.answer("GET")
            c.run.classify(
                c, "the extra bytes", "GET", extra, junk, Expect(frozenset({400}), None, no_answer=True)
            )
        await c.check(key, same_conn=False)
        return
    elif variant == "get-with-body":
        req = c.signed("GET", key, body=body, content_length=True)
        ans = await c.x("GET with a body", req, expect(200, 400))
        await c.check(key)
        return
    else:  # no Content-Length, no Transfer-Encoding: an empty body for HTTP/1.1
        req.drop("Content-Length")
        req.sent_body = b""
        req = c.signed("PUT", key, body=b"", content_length=False)
        ans = await c.x("PUT without Content-Length", req, expect(200, 411, codes=["MissingContentLength"]))
        c.after_write(key, b"", ans)
        await c.check(key)
        return
    c.after_write(key, body, ans)  # no answer (a half-close): either outcome, the check is skipped
    await c.check(key, same_conn=False)


def _streaming_put(
    c: Case,
    key: str,
    payload_bytes: bytes,
    mode: str,
    *,
    trailer: bool,
    headers: Sequence[tuple[str, str]] = (),
) -> tuple[Req, bytes]:
    """A valid aws-chunked PUT in ``mode`` (STREAMING-*), with a CRC32 trailer if ``trailer``."""
    trailer_headers = [("x-amz-trailer", "x-amz-checksum-crc32")] if trailer else []
    hdrs = [
        ("Content-Encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", str(len(payload_bytes))),
        *trailer_headers,
        *headers,
    ]
    req = c.signed("PUT", key, headers=hdrs, payload=mode, content_length=False)
    cuts = sorted(
        c.rng.sample(range(1, len(payload_bytes)), min(c.rng.randint(0, 4), max(len(payload_bytes) - 1, 0)))
    )
    chunks = [payload_bytes[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload_bytes)], strict=True)]
    trailers = {"x-amz-checksum-crc32": crc32_b64(payload_bytes)} if trailer else None
    signer = None
    if mode in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER):
        seed = (req.get("Authorization") or "").rsplit("Signature=", 1)[1]
        signer = ChunkSigner.for_request(
            secret_key=c.run.secret_key,
            amz_date=req.get("x-amz-date") or "",
            region=REGION,
            seed_signature=seed,
        )
    encoded = encode_aws_chunked(chunks, signer=signer, trailers=trailers)
    req.body = encoded
    req.set("Content-Length", str(len(encoded)))
    return req, encoded


def _break_framing(c: Case, encoded: bytes, signed: bool) -> tuple[str, bytes]:
    first_line_end = encoded.index(b"\r\n")
    size_text = encoded[:first_line_end].split(b";")[0]
    variants: list[tuple[str, bytes]] = [
        (
            "bad hex size",
            c.choice([b"zz", b"-1", b"", b" 10", b"0x10", b"1" * 20, b"ffffffffffff"])
            + encoded[len(size_text) :],
        ),
        ("missing CRLF after the size", encoded[:first_line_end] + encoded[first_line_end + 2 :]),
        ("bare LF after the size", encoded[:first_line_end] + b"\n" + encoded[first_line_end + 2 :]),
        ("bytes after the end", encoded + c.choice([b"0\r\n\r\n", b"x", b"\r\n"])),
        ("no final chunk", encoded[: _final_chunk_at(encoded)]),
        ("random byte flipped", _flip(c, encoded)),
        ("random bytes inserted", _insert(c, encoded)),
        ("random cut", encoded[: c.rng.randrange(len(encoded))]),
        ("chunk header too long", encoded[:first_line_end] + b";" + b"x" * 2000 + encoded[first_line_end:]),
    ]
    if b"\r\n\r\n" in encoded[first_line_end:]:
        data_end = encoded.index(b"\r\n", first_line_end + 2 + int(size_text, 16))
        variants.append(("missing CRLF after data", encoded[:data_end] + encoded[data_end + 2 :]))
    if signed:
        sig_at = encoded.find(b"chunk-signature=")
        if sig_at >= 0:
            variants += [
                (
                    "chunk signature changed",
                    encoded[: sig_at + 16]
                    + bytes(reversed(encoded[sig_at + 16 : sig_at + 80]))
                    + encoded[sig_at + 80 :],
                ),
                ("chunk signature missing", encoded[: sig_at - 1] + encoded[sig_at + 80 :]),
                ("chunk signature short", encoded[: sig_at + 79] + encoded[sig_at + 80 :]),
            ]
    if b"x-amz-checksum-crc32:" in encoded:
        at = encoded.index(b"x-amz-checksum-crc32:")
        line_end = encoded.index(b"\r\n", at)
        variants += [
            ("trailer wrong checksum", encoded[: at + 21] + b"AAAAAA==" + encoded[line_end:]),
            ("trailer not announced", encoded[:at] + b"x-amz-checksum-sha1" + encoded[at + 20 :]),
            ("trailer repeated", encoded[:at] + encoded[at : line_end + 2] + encoded[at:]),
            ("trailer missing", encoded[:at] + encoded[line_end + 2 :]),
            ("trailer without colon", encoded[: at + 20] + encoded[at + 21 :]),
            ("trailer too big", encoded[:at] + b"x-amz-meta-pad:" + b"p" * 20000 + b"\r\n" + encoded[at:]),
            ("final empty line missing", encoded[:-2]),
        ]
        if b"x-amz-trailer-signature:" in encoded:
            sat = encoded.index(b"x-amz-trailer-signature:") + 24
            variants.append(("trailer signature changed", encoded[:sat] + b"0" * 64 + encoded[sat + 64 :]))
    name, body = c.choice(variants)
    return str(name), bytes(body)


def _final_chunk_at(encoded: bytes) -> int:
    """Where the zero-size chunk's header starts (the body is chunks, then that header, then trailers)."""
    at = max(encoded.rfind(b"\r\n0;"), encoded.rfind(b"\r\n0\r\n"))
    return at + 2 if at >= 0 else 0


def _flip(c: Case, data: bytes) -> bytes:
    if not data:
        return b"\x00"
    pos = c.rng.randrange(len(data))
    return data[:pos] + bytes([data[pos] ^ c.rng.randint(1, 255)]) + data[pos + 1 :]


def _insert(c: Case, data: bytes) -> bytes:
    pos = c.rng.randrange(len(data) + 1)
    return data[:pos] + c.rng.randbytes(c.rng.randint(1, 8)) + data[pos:]


async def case_aws_chunked(c: Case) -> None:
    """aws-chunked bodies: valid (signed, signed with trailer, unsigned with trailer) and broken framing."""
    key, _ = await seed_object(c)
    payload_bytes = c.body(c.rng.randint(0, 5000) if c.rng.random() < 0.8 else None)
    mode = c.choice([STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER])
    trailer = mode != STREAMING_SIGNED
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    req, encoded = _streaming_put(c, key, payload_bytes, mode, trailer=trailer, headers=wt)
    signed = mode != STREAMING_UNSIGNED_TRAILER
    variant = c.choice(["valid", "framing", "framing", "framing", "decoded-length", "headers"])
    step = variant
    exp: Expect = OK
    half_close = False
    if variant == "framing":
        step, body = _break_framing(c, encoded, signed)
        req.body = body
        req.set("Content-Length", str(len(body)))
        # Content-Length matches what is sent: the server reads it all and must answer (a half-close here
        # would make aiohttp drop the connection before the answer, whatever the outcome).
        exp = Expect(frozenset({200, 400, 403}), frozenset(BODY_ERRORS))
    elif variant == "decoded-length":
        value = c.choice(
            [
                str(len(payload_bytes) + 1),
                str(max(len(payload_bytes) - 1, 0) if payload_bytes else 1),
                "abc",
                "-1",
                "",
                "1e3",
                str(2**64),
                "\u0663",
                None,
            ]
        )
        step = f"x-amz-decoded-content-length {value!r}"
        if value is None:
            req.drop("x-amz-decoded-content-length")
        else:
            req.set("x-amz-decoded-content-length", value)
        exp = expect(400, 403, 411, codes=[*BODY_ERRORS, "AccessDenied"])
    elif variant == "headers":
        what = c.choice(
            ["no content-encoding", "odd content-encoding", "trailer header garbage", "no trailer header"]
        )
        step = what
        if what == "no content-encoding":
            req.drop("Content-Encoding")
        elif what == "odd content-encoding":
            req.set(
                "Content-Encoding", c.choice(["aws-chunked, gzip", "gzip,aws-chunked", "AWS-CHUNKED", ","])
            )
        elif what == "trailer header garbage":
            req.set(
                "x-amz-trailer",
                c.choice(["x-amz-checksum-foo", "", ",,,", "x-amz-checksum-crc32,x-amz-checksum-crc32"]),
            )
        else:
            req.drop("x-amz-trailer")
        exp = Expect(frozenset({200, 400, 403}), frozenset([*BODY_ERRORS, "AccessDenied"]))
    ans = await c.x(step, req, exp, half_close=half_close)
    c.after_write(key, payload_bytes, ans)  # a 200 must have stored exactly the payload: check() reads it
    await c.check(key, same_conn=not half_close)


def s3_range(header: str, size: int) -> tuple[int, int] | str:
    """S3's answer to ``Range: header`` on a ``size``-byte object: (first, last), "200" or "416"."""
    unit, sep, spec = header.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return "200"
    m = re.fullmatch(r"([0-9]*)-([0-9]*)", spec.strip(), re.ASCII)
    if m is None or (not m.group(1) and not m.group(2)):
        return "200"
    first_raw, last_raw = m.groups()
    if first_raw and last_raw and int(last_raw) < int(first_raw):
        return "200"
    if first_raw:
        first = int(first_raw)
        if first >= size:
            return "416"
        return first, min(int(last_raw), size - 1) if last_raw else size - 1
    suffix = int(last_raw)
    if suffix == 0 or size == 0:
        return "416"
    return max(size - suffix, 0), size - 1


def _range_header(c: Case, size: int) -> str:
    n = max(size, 1)
    a, b = sorted((c.rng.randrange(n + 3), c.rng.randrange(n + 3)))
    return str(
        c.choice(
            [
                f"bytes={a}-{b}",
                f"bytes={a}-",
                f"bytes=-{c.rng.randrange(n + 3)}",
                f"bytes={b}-{a}",
                f"bytes={size}-",
                "bytes=-0",
                "bytes=",
                "bytes=-",
                f"bytes={a}-{b},{b}-",
                "items=0-1",
                "bytes=abc",
                "bytes=1-2-3",
                f"bytes= {a}-{b}",
                f"BYTES={a}-{b}",
                "bytes=0-99999999999999999999999",
                "bytes=99999999999999999999-",
                "bytes=\u0661-\u0662",
                "bytes=0x10-",
                "bytes=-1-2",
                f"bytes=\t{a}-{b}",
                "",
                "bytes",
                "=0-1",
                "bytes==0-1",
                f"bytes={a}-{b}\udcff",
                "bytes=0-0",
                f"bytes=-{size}",
            ]
        )
    )


async def case_range(c: Case) -> None:
    """Ranges, partNumber and conditional headers on a spooled or backend object; bodies must be right."""
    key, body = await seed_object(c)
    stored = c.run.ledger.objects.get(key)
    if stored is None:
        return
    method = "GET" if c.rng.random() < 0.8 else "HEAD"
    variant = c.choice(["range", "range", "range", "part-number", "conditional", "range-and-part"])
    headers: list[tuple[str, str]] = []
    query = ""
    exp = Expect(frozenset({200, 206, 304, 400, 412, 416}), None)
    if variant in ("range", "range-and-part"):
        header = _range_header(c, len(body))
        headers.append(("Range", header))
    if variant in ("part-number", "range-and-part"):
        value = c.choice(
            [
                "0",
                "-1",
                "1",
                "2",
                "10001",
                "abc",
                "",
                "%C2%B2",
                "%EF%BC%91",
                "1.0",
                "%201",
                "01",
                "99999999999999999999",
            ]
        )
        query = f"partNumber={value}"
    if variant == "conditional":
        name = c.choice(["If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"])
        value = c.choice(
            [
                "*",
                '"abc"',
                f'"{stored.etag}"',
                stored.etag,
                "W/" + f'"{stored.etag}"',
                "garbage",
                "",
                "Mon, 01 Jan 2024 00:00:00 GMT",
                "Mon, 01 Jan 2999 00:00:00 GMT",
                "\udcff",
            ]
        )
        headers.append((name, value))
    req = c.signed(method, key, headers=headers, query=query)
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "GET" and ans.status in (200, 206):
        _check_read(c, req, ans, body)
    await c.check(key)


def _check_read(c: Case, req: Req, ans: Answer, body: bytes) -> None:
    """A 200 must carry the whole object, a 206 exactly the slice its Content-Range names."""
    if ans.status == 200:
        if ans.body != body:
            c.run.problem(
                "wrong_answers", c, "read", req.wire(), ans, f"200 with {len(ans.body)} of {len(body)} bytes"
            )
        return
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", ans.header("content-range") or "")
    if m is None or int(m.group(3)) != len(body) or ans.body != body[int(m.group(1)) : int(m.group(2)) + 1]:
        got = f"Content-Range {ans.header('content-range')!r}, {len(ans.body)} bytes"
        note = f"{got} of a {len(body)}-byte object"
        c.run.problem("wrong_answers", c, "ranged read", req.wire(), ans, note)
        return
    rng = req.get("Range")
    if rng is not None and "partNumber" not in req.target:
        want = s3_range(rng, len(body))
        if want != (int(m.group(1)), int(m.group(2))):
            # The bytes match what the answer says; only the choice differs from S3's.
            exp = Expect(frozenset({200 if want == "200" else 206}), None)
            c.run.classify(c, f"ranged read (S3 answers {want})", "GET", req.wire(), ans, exp)


def _upload_id(ans: Answer) -> str | None:
    try:
        root = ElementTree.fromstring(ans.body)
    except ElementTree.ParseError:
        return None
    for el in root.iter():
        if el.tag.rpartition("}")[2] == "UploadId" and el.text:
            return el.text
    return None


def _etag_of(ans: Answer) -> str:
    return (ans.header("etag") or "").strip('"')


async def _create_upload(c: Case, key: str, wt: bool) -> str | None:
    req = c.signed("POST", key, query="uploads", headers=[WRITE_THROUGH] if wt else [])
    ans = await c.x("create multipart upload", req, OK)
    upload_id = _upload_id(ans) if ans.status == 200 else None
    if upload_id is not None:
        c.uploads.append((key, upload_id))
    return upload_id


async def _upload_part(c: Case, key: str, upload_id: str, number: str, body: bytes) -> Answer:
    query = f"partNumber={number}&uploadId={quote(upload_id, safe='~')}"
    return await c.x(f"upload part {number}", c.signed("PUT", key, query=query, body=body), OK)


def _complete_xml(parts: Sequence[tuple[int | str, str]]) -> bytes:
    inner = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{e}&quot;</ETag></Part>" for n, e in parts
    )
    return f'<CompleteMultipartUpload xmlns="{S3_NS}">{inner}</CompleteMultipartUpload>'.encode()


async def _finish_upload(
    c: Case, key: str, upload_id: str, parts: list[tuple[int, str, bytes]], wt: bool
) -> None:
    """End a case's upload: complete it validly, abort it, or (written through, sometimes) leave it open."""
    r = c.rng.random()
    q = f"uploadId={quote(upload_id, safe='~')}"
    if parts and r < 0.45 and all(len(b) >= MIN_PART_BYTES for _, _, b in parts[:-1]):
        xml = _complete_xml([(n, e) for n, e, _ in parts])
        ans = await c.x("complete (valid)", c.signed("POST", key, query=q, body=xml), OK)
        if ans.status == 200:
            whole = b"".join(b for _, _, b in parts)
            c.after_write(key, whole, ans, etag=multipart_etag([e for _, e, _ in parts]))
        elif ans.status is None:
            c.run.ledger.maybe(key, md5_hex(b"".join(b for _, _, b in parts)))
    elif wt and r > 0.93:
        c.run.ledger.open_uploads.add((key, upload_id))
    else:
        await c.x("abort", c.signed("DELETE", key, query=q), expect(204))
        if c.rng.random() < 0.3:
            await c.x(
                "abort again", c.signed("DELETE", key, query=q), expect(204, 404, codes=["NoSuchUpload"])
            )


async def case_part_numbers(c: Case) -> None:
    """UploadPart, ListParts and uploads with odd part numbers, odd upload ids and odd paging parameters."""
    key = c.key("mp")
    wt = c.rng.random() < 0.4
    upload_id = await _create_upload(c, key, wt)
    if upload_id is None:
        return
    parts: list[tuple[int, str, bytes]] = []
    part = c.body(c.rng.randint(1, 3000))
    ans = await _upload_part(c, key, upload_id, "1", part)
    if ans.status == 200:
        parts.append((1, _etag_of(ans), part))
    for _ in range(c.rng.randint(1, 3)):
        variant = c.choice(["part number", "part number", "upload id", "list parts"])
        if variant == "part number":
            number = c.choice(
                [
                    "0",
                    "-1",
                    "10001",
                    "2147483648",
                    "18446744073709551617",
                    "abc",
                    "",
                    "1e3",
                    "%C2%B2",
                    "%D9%A3",
                    "%2B1",
                    "%201",
                    "01",
                    "1.5",
                    "%00",
                    "10000",
                ]
            )
            query = f"partNumber={number}&uploadId={quote(upload_id, safe='~')}"
            body = c.body(c.rng.randint(0, 500))
            ok = number in ("10000", "01")
            exp = (
                expect(200, 400, codes=["InvalidArgument"]) if ok else expect(400, codes=["InvalidArgument"])
            )
            ans = await c.x(f"upload part {number!r}", c.signed("PUT", key, query=query, body=body), exp)
            if ans.status == 200 and number == "01":
                parts = [p for p in parts if p[0] != 1] + [(1, _etag_of(ans), body)]
        elif variant == "upload id":
            bad = c.choice(
                [
                    upload_id + "x",
                    "s3lanes-" + "0" * 32,
                    "s3lanes-",
                    "",
                    "../x",
                    "%00",
                    "s3lanes-%FF",
                    "x" * 2000,
                    upload_id.upper(),
                    "s3lanes-\udcff",
                ]
            )
            op = c.choice(["PUT", "GET", "DELETE", "POST"])
            query = f"uploadId={bad}" + ("&partNumber=1" if op == "PUT" else "")
            body = _complete_xml([(1, parts[0][1])]) if op == "POST" and parts else b""
            exp = Expect(
                frozenset({400, 404}),
                frozenset(["NoSuchUpload", "InvalidArgument", "InvalidRequest"])
                if "\udcff" not in bad
                else None,
            )
            ans = await c.x(
                f"{op} with upload id {bad[:20]!r}", c.signed(op, key, query=query, body=body), exp
            )
            if ans.status == 200 and op == "POST":
                c.run.problem("wrong_answers", c, "complete with a bad upload id", b"", ans)
        else:
            params = c.choice(
                [
                    "max-parts=-1",
                    "max-parts=abc",
                    "max-parts=99999999999999999999",
                    "max-parts=0",
                    "part-number-marker=-5",
                    "part-number-marker=abc",
                    "max-parts=%C2%B2",
                    "part-number-marker=99999999999999999999",
                    "max-parts=1&part-number-marker=1",
                ]
            )
            query = f"uploadId={quote(upload_id, safe='~')}&{params}"
            ans = await c.x(f"list parts {params}", c.signed("GET", key, query=query), expect(200, 400))
            if ans.status == 200:
                _require_xml(c, "list parts", ans)
    await _finish_upload(c, key, upload_id, parts, wt)
    await c.check(key)


def _require_xml(c: Case, step: str, ans: Answer) -> None:
    try:
        ElementTree.fromstring(ans.body)
    except ElementTree.ParseError as exc:
        c.run.problem("wrong_answers", c, step, b"", ans, f"a 200 whose XML does not parse: {exc}")


_BILLION_LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8))
    + b"]>"
)
_XXE = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'


def _bad_xml(c: Case, root: str, good: bytes, inner_good: str) -> tuple[str, bytes]:
    options: list[tuple[str, bytes]] = [
        ("empty", b""),
        ("not xml", b"not xml at all"),
        ("truncated", good[: c.rng.randrange(max(len(good), 1))]),
        ("wrong root", good.replace(root.encode(), b"Foo")),
        ("unclosed", f"<{root}>".encode() + inner_good.encode()),
        ("billion laughs", _BILLION_LAUGHS + f"<{root}>&i;</{root}>".encode()),
        ("external entity", _XXE + f"<{root}>&e;</{root}>".encode()),
        ("deep nesting", f"<{root}>".encode() + b"<a>" * 50000 + b"</a>" * 50000 + f"</{root}>".encode()),
        ("not utf-8", good.replace(b"<", b"\xff<", 1)),
        ("utf-16", good.decode().encode("utf-16")),
        ("nul byte", good.replace(b">", b">\x00", 1)),
        ("random bytes", c.rng.randbytes(c.rng.randint(1, 200))),
        (
            "huge",
            f"<{root}>".encode() + b"<!-- " + b"x" * (5 * 1024 * 1024) + b" -->" + f"</{root}>".encode(),
        ),
        ("comment and pi", b"<?pi x?><!-- c -->" + good),
        ("cdata", good.replace(b"<ETag>", b"<ETag><![CDATA[", 1).replace(b"</ETag>", b"]]></ETag>", 1)),
    ]
    name, body = c.choice(options)
    return str(name), bytes(body)


async def case_xml_complete(c: Case) -> None:
    """CompleteMultipartUpload with malformed, hostile and invalid part lists; the upload survives them."""
    key = c.key("mpx")
    wt = c.rng.random() < 0.35
    upload_id = await _create_upload(c, key, wt)
    if upload_id is None:
        return
    parts: list[tuple[int, str, bytes]] = []
    for n in range(1, c.rng.choice([1, 1, 2, 3]) + 1):
        body = c.body(c.rng.randint(1, 2000))
        ans = await _upload_part(c, key, upload_id, str(n), body)
        if ans.status == 200:
            parts.append((n, _etag_of(ans), body))
    good = _complete_xml([(n, e) for n, e, _ in parts])
    inner = good.decode().split(">", 1)[1].rsplit("<", 1)[0]
    variant = c.choice(["xml", "xml", "part list"])
    benign = False
    if variant == "xml":
        step, body = _bad_xml(c, "CompleteMultipartUpload", good, inner)
        benign = step in ("comment and pi", "cdata")
    else:
        first = parts[0][1] if parts else "0" * 32
        lists: list[tuple[str, list[tuple[int | str, str]]]] = [
            ("no parts", []),
            ("part number not a number", [("abc", first)]),
            ("part number superscript", [("²", first)]),
            ("part number arabic-indic", [("\u0661", first)]),
            ("part number fullwidth", [("\uff11", first)]),
            ("part number negative", [("-1", first)]),
            ("part number zero", [(0, first)]),
            ("part number huge", [("99999999999999999999999", first)]),
            ("part number 10001", [(10001, first)]),
            ("wrong etag", [(1, "0" * 32)]),
            ("unknown part", [(7, first)]),
            ("descending", [(2, first), (1, first)]),
            ("repeated", [(1, first), (1, first)]),
            ("empty etag", [(1, "")]),
            ("etag unquoted", [(1, first)]),
        ]
        step, plist = c.choice(lists)
        body = _complete_xml(plist)
        if step == "etag unquoted":
            body = body.replace(b"&quot;", b"")
            benign = True
        if step == "part number fullwidth" or step == "part number arabic-indic":
            benign = True  # S3 refuses them; a lenient store reading them as 1 is no loss
    q = f"uploadId={quote(upload_id, safe='~')}"
    codes = [
        "MalformedXML",
        "InvalidPart",
        "InvalidPartOrder",
        "EntityTooSmall",
        "InvalidArgument",
        "InvalidRequest",
    ]
    exp = expect(200, 400, codes=codes) if benign else expect(400, codes=codes)
    ans = await c.x(f"complete: {step}", c.signed("POST", key, query=q, body=body), exp)
    if ans.status == 200:
        # Completed: with parts 1..n as listed, or (lenient parse) with whatever the store took.
        whole = b"".join(b for _, _, b in parts)
        c.run.ledger.maybe(key, md5_hex(whole))
        c.run.ledger.maybe(key, md5_hex(parts[0][2]) if parts else None)
        return
    await _finish_upload(c, key, upload_id, parts, wt)
    await c.check(key)


def _delete_xml(keys: Sequence[str], quiet: bool) -> bytes:
    def esc(k: str) -> str:
        return k.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    inner = "".join(f"<Object><Key>{esc(k)}</Key></Object>" for k in keys)
    q = "<Quiet>true</Quiet>" if quiet else ""
    return f'<Delete xmlns="{S3_NS}">{q}{inner}</Delete>'.encode()


async def case_xml_delete(c: Case) -> None:
    """DeleteObjects with malformed XML, bad digests and odd structure: a refused request deletes nothing."""
    keys = [c.key(f"d{i}") for i in range(c.rng.randint(1, 3))]
    for k in keys:
        await c.put(k, c.body(c.rng.randint(1, 2000)), write_through=c.rng.random() < 0.3, step="seed")
    good = _delete_xml(keys, c.rng.random() < 0.5)
    inner = good.decode().split(">", 1)[1].rsplit("<", 1)[0]
    variant = c.choice(["xml", "xml", "digest", "structure", "valid"])
    headers: list[tuple[str, str]] = []
    deletes_ok = False
    exp: Expect
    if variant == "xml":
        step, body = _bad_xml(c, "Delete", good, inner)
        headers.append(("Content-MD5", md5_b64(body)))
        exp = expect(400, codes=["MalformedXML", "InvalidRequest"])
        deletes_ok = step in ("comment and pi", "cdata")
        if deletes_ok:
            exp = expect(200, 400, codes=["MalformedXML", "InvalidRequest"])
    elif variant == "digest":
        body = good
        step = c.choice(["no Content-MD5", "wrong Content-MD5", "malformed Content-MD5"])
        if step == "wrong Content-MD5":
            headers.append(("Content-MD5", md5_b64(good + b" ")))
            exp = expect(400, codes=["BadDigest"])
        elif step == "malformed Content-MD5":
            headers.append(("Content-MD5", "abc"))
            exp = expect(400, codes=["InvalidDigest"])
        else:
            exp = expect(200, 400, codes=["InvalidRequest", "MissingContentMD5"])
            deletes_ok = True
    elif variant == "structure":
        other = c.key("keep")
        await c.put(other, c.body(c.rng.randint(1, 500)), step="seed")
        step, text = c.choice(
            [
                (
                    "key outside object",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key></Object>'
                    f"<Key>{other}</Key></Delete>",
                ),
                (
                    "object without key",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key></Object>'
                    f"<Object><VersionId>x</VersionId></Object><Extra><Key>{other}</Key></Extra>"
                    "</Delete>",
                ),
                (
                    "nested object",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key><Object><Key>{other}</Key>'
                    "</Object></Object></Delete>",
                ),
                (
                    "too many keys",
                    f'<Delete xmlns="{S3_NS}">' + f"<Object><Key>{other}</Key></Object>" * 1001 + "</Delete>",
                ),
                ("no objects", f'<Delete xmlns="{S3_NS}"></Delete>'),
                (
                    "quiet garbage",
                    f'<Delete xmlns="{S3_NS}"><Quiet>maybe</Quiet><Object><Key>{other}</Key></Object>'
                    "</Delete>",
                ),
            ]
        )
        body = text.encode()
        headers.append(("Content-MD5", md5_b64(body)))
        exp = expect(200, 400, codes=["MalformedXML", "InvalidRequest", "InvalidArgument"])
        keys = [*keys, other]
    else:
        step, body = "valid", good
        headers.append(("Content-MD5", md5_b64(body)))
        exp = OK
        deletes_ok = True
    ans = await c.x(
        f"delete objects: {step}", c.signed("POST", None, query="delete", headers=headers, body=body), exp
    )
    if ans.status == 200:
        deleted = _deleted_keys(ans.body)
        if deleted is None:
            c.run.problem("wrong_answers", c, step, body, ans, "DeleteObjects result does not parse")
            for k in keys:
                c.run.ledger.uncertain[k] = {None, *(s.md5 for s in [c.run.ledger.objects.get(k)] if s)}
        else:
            for k in deleted:
                c.run.ledger.delete(k)
            if "<Quiet>true</Quiet>" in body.decode(errors="replace") and deletes_ok:
                for k in keys:  # quiet mode lists only errors
                    if k.encode() in body:
                        c.run.ledger.delete(k)
    elif ans.status is None:
        for k in keys:
            c.run.ledger.uncertain[k] = {None, *(s.md5 for s in [c.run.ledger.objects.get(k)] if s)}
    for k in keys:
        await c.check(k)


def _deleted_keys(body: bytes) -> set[str] | None:
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    out = set()
    for el in root:
        if el.tag.rpartition("}")[2] == "Deleted":
            for child in el:
                if child.tag.rpartition("}")[2] == "Key":
                    out.add(child.text or "")
    return out


def _odd_key(c: Case) -> tuple[str, str | None]:
    """(key name, raw path override or None): hostile keys and their relatives."""
    marker_name = f"{c.run.marker}-c{c.index:05d}"
    unicode_kib = "".join(
        chr(
            c.rng.choice(
                [c.rng.randint(0xA0, 0xD7FF), c.rng.randint(0xE000, 0xFFFD), c.rng.randint(0x10000, 0x10FFFF)]
            )
        )
        for _ in range(300)
    )
    unicode_kib = unicode_kib.encode("utf-8")[:1024].decode("utf-8", "ignore")
    controls = "".join(chr(c.rng.choice([*range(1, 32), 0x7F])) for _ in range(c.rng.randint(1, 8)))
    p = c.prefix
    options: list[tuple[str, str | None]] = [
        (p + "..", None),
        (p + ".", None),
        (p + "sub/../up", None),
        (p + "sub/./here", None),
        (p + "a//b", None),
        (p + "trailing/", None),
        (p + "..\\..\\win", None),
        (p + "nul\x00byte", None),
        (p + "slash%2Fin-name", None),
        (p + "a/b", c.path(p) + "a%2Fb"),  # an encoded slash is a slash in the key
        (p + "..", c.path(p) + "%2E%2E"),
        (
            p + "invalid-utf8",
            c.path(p) + c.choice(["%FF%FE", "a%C3%28", "%ED%A0%80", "%C0%AF", "%F8%88%80%80%80"]),
        ),
        (p + "uni-" + unicode_kib, None),
        (p + "ctl-" + controls, None),
        (p + "long-" + "k" * c.rng.randint(1025 - len(p), 1400), None),
        (p + "exact-" + "k" * (1024 - len(p) - 6), None),
        (p + "q?#&=+ %", None),
        (p + "emoji-\U0001f600\u202e\u200b", None),
        (p + "nonchar-\ufffe\uffff", None),
        (p + "../../../../../../../../tmp/" + marker_name, None),
        (p + "..%2f..%2f..%2f..%2ftmp%2f" + marker_name, None),
        ("/tmp/" + marker_name, None),
        ("../" + marker_name, None),
        ("./" + marker_name, None),
    ]
    return c.choice(options)


async def case_odd_keys(c: Case) -> None:
    """PUT, GET, HEAD, LIST and DELETE of hostile keys: stored and read back exactly, or refused."""
    key, raw_path = _odd_key(c)
    body = c.body(c.rng.randint(0, 3000))
    wt = c.rng.random() < 0.3
    headers = [WRITE_THROUGH] if wt else []
    req = c.signed("PUT", key, headers=headers, body=body, raw_path=raw_path)
    exp = Expect(frozenset({200, 400}), None)
    if len(key.encode()) > 1024:
        exp = expect(400, codes=["KeyTooLongError"])
    if key.endswith("invalid-utf8"):
        exp = expect(400, codes=["InvalidURI", "InvalidArgument", "InvalidRequest"])  # S3: InvalidURI
    ans = await c.x("odd key PUT", req, exp)
    stored = c.after_write(key, body, ans)
    if stored:
        c.run.ledger.odd_by_md5[md5_hex(body)] = key
    get = c.signed("GET", key, raw_path=raw_path)
    gans = await c.x("odd key GET", get, OK if stored else expect(400, 404))
    if stored and gans.status == 200 and gans.body != body:
        if key.endswith("/") and answer_source(gans) == "backend":
            c.run.figures.backend_mangled_keys += 1  # the store's own doing (see Ledger.trailing_slash)
            c.run.ledger.maybe(key, None)
        else:
            c.run.problem("read_back_mismatch", c, "odd key GET", get.wire(), gans, "read back differs")
    if c.rng.random() < 0.3:
        await c.x(
            "odd key HEAD", c.signed("HEAD", key, raw_path=raw_path), OK if stored else expect(400, 404)
        )
    if c.rng.random() < 0.4:
        enc = c.choice(["&encoding-type=url", ""])
        query = f"list-type=2&prefix={quote(c.prefix, safe='~')}{enc}"
        lans = await c.x("list the case prefix", c.signed("GET", None, query=query), expect(200, 400))
        if lans.status == 200:
            _require_xml(c, "list the case prefix", lans)
    if stored and c.rng.random() < 0.5:
        dans = await c.x("odd key DELETE", c.signed("DELETE", key, raw_path=raw_path), expect(204))
        if dans.status == 204:
            c.run.ledger.delete(key)
            c.run.ledger.odd_by_md5.pop(md5_hex(body), None)


async def case_raw_path(c: Case) -> None:
    """Keys sent as raw bytes in the request line (unencoded UTF-8, invalid UTF-8), validly signed."""
    raw = c.choice(
        [
            "raw-ü€\U0001f600",
            "raw-\udcff\udcfe",  # bytes FF FE
            "raw-\udcc3(",  # C3 28: invalid UTF-8
            "raw-\udced\udca0\udc80",  # an encoded surrogate
            "raw-\udcc0\udcaf",  # an overlong "/"
            "raw-\t-tab",
            "raw-sp ace",
        ]
    )
    key = c.prefix + raw
    raw_path = "/" + c.run.bucket + "/" + c.prefix + raw
    body = c.body(c.rng.randint(0, 2000))
    wt = c.rng.random() < 0.3
    req = c.signed("PUT", key, headers=[WRITE_THROUGH] if wt else [], body=body, raw_path=raw_path)
    ans = await c.x("raw-byte key PUT", req, Expect(frozenset({200, 400}), None))
    if ans.status == 200:
        # The key the store keeps for raw bytes is its business: match it by content at the end.
        c.run.ledger.put(key, md5_hex(body), md5_hex(body), len(body), c.index)
        c.run.ledger.odd_by_md5[md5_hex(body)] = key
        gans = await c.x("raw-byte key GET", c.signed("GET", key, raw_path=raw_path), OK)
        if gans.status == 200 and gans.body != body:
            c.run.problem("read_back_mismatch", c, "raw-byte key GET", b"", gans, "read back differs")
    elif ans.status is None:
        c.run.ledger.maybe(key, md5_hex(body))


_SUBRESOURCES = frozenset(
    {
        "acl",
        "tagging",
        "uploads",
        "uploadId",
        "partNumber",
        "versionId",
        "torrent",
        "restore",
        "select",
        "delete",
        "cors",
        "policy",
        "website",
        "attributes",
        "list-type",
    }
)


async def case_query(c: Case) -> None:
    """Unknown, repeated, empty and odd query parameters on valid requests."""
    key, _ = await seed_object(c)
    params = c.choice(
        [
            "foo=bar",
            "x-id=GetObject",
            "%00=%00",
            "=",
            "&&&",
            "a=1&a=2",
            "versionId=garbage",
            "versionId=",
            "list-type=3",
            "uploads",
            "acl&tagging",
            "tagging=%FF",
            "%FF%FE=1",
            "a+b=c+d",
            "a%2Bb=%2B",
            "ü=€",
            "x=" + "v" * 6000,
            "response-content-type=text%2Fplain",
            "attributes",
            "torrent",
            "restore",
            "select&select-type=2",
            "uploadId",
            "partNumber=1",
            "delete",
            "cors",
            "policy",
            "website",
            "encoding-type=%00",
            "max-keys=" + "9" * 100,
            "continuation-token=%FF",
            "prefix=%C0%AF",
            "x-amz-date=20240101T000000Z",
            "X-Amz-Signature=" + "0" * 64,
            "AWSAccessKeyId=x",
        ]
    )
    method = c.choice(["GET", "GET", "HEAD", "PUT", "DELETE"])
    target_key: str | None = key if c.rng.random() < 0.7 else None
    body = c.body(c.rng.randint(0, 500)) if method == "PUT" and target_key else b""
    if method == "DELETE" and target_key is None:
        method = "GET"
    if method in ("PUT", "DELETE") and params in (
        "acl&tagging",
        "tagging=%FF",
        "uploads",
        "delete",
        "restore",
    ):
        method = "GET"
    req = c.signed(method, target_key, query=params, body=body)
    ans = await c.x(f"{method} ?{params[:40]}", req, ANY)
    names = {part.partition("=")[0] for part in params.split("&")}
    # What a 2xx means for the object: written (no sub-resource, or a version id, which names no other
    # object here), untouched (acl, tagging, a part of an upload), or either (the rest).
    writes = not names & _SUBRESOURCES or names & _SUBRESOURCES == {"versionId"}
    keeps = bool(names & {"acl", "tagging"})
    if target_key is not None and ans.status is not None and 200 <= ans.status < 300:
        if method == "PUT" and writes:
            c.after_write(target_key, body, ans)
        elif method == "DELETE" and writes and "versionId" not in names:
            c.run.ledger.delete(target_key)
        elif not keeps:
            c.run.ledger.maybe(target_key, md5_hex(body) if method == "PUT" else None)
    elif ans.status is None and method in ("PUT", "DELETE") and target_key is not None:
        c.run.ledger.maybe(target_key, md5_hex(body) if method == "PUT" else None)
    await c.check(key)


async def case_methods(c: Case) -> None:
    """HEAD, OPTIONS and methods S3 does not know, signed and not, on the bucket and on keys."""
    key, _ = await seed_object(c)
    method = c.choice(
        [
            "OPTIONS",
            "PATCH",
            "TRACE",
            "PROPFIND",
            "FOO",
            "get",
            "CONNECT",
            "M" * 100,
            "HEAD",
            "MKCOL",
            "LOCK",
            "SEARCH",
        ]
    )
    on_key = c.rng.random() < 0.6
    signed = c.rng.random() < 0.7
    if signed:
        req = c.signed(method, key if on_key else None)
    else:
        req = Req(method, c.path(key if on_key else None), [("Host", c.run.host_header)])
        if c.rng.random() < 0.5:
            req.headers += [("Origin", "http://example.com"), ("Access-Control-Request-Method", "GET")]
    ans = await c.x(
        f"{method[:12]} {'signed' if signed else 'unsigned'}", req, Expect(ANY.statuses, None, True)
    )
    if method == "HEAD" and ans.body:
        c.run.problem("wrong_answers", c, "HEAD", req.wire(), ans, "a HEAD answer with a body")
    await c.check(key)


async def case_http10(c: Case) -> None:
    """HTTP/1.0 (with and without Host), HTTP/0.9-style and unknown versions."""
    key, body = await seed_object(c)
    variant = c.choice(
        ["1.0 GET", "1.0 GET no host", "1.0 PUT", "1.0 keep-alive", "0.9", "2.0", "1.2", "9.9"]
    )
    if variant == "0.9":
        data = f"GET {c.path(key)}\r\n\r\n".encode()
        await c.x(variant, data, Expect(frozenset(range(400, 600)), None, True), half_close=True)
    elif variant in ("2.0", "1.2", "9.9"):
        req = c.signed("GET", key)
        req.version = f"HTTP/{variant}"
        await c.x(f"HTTP/{variant}", req, Expect(frozenset({200, 400, 404, 505}), None, True))
    else:
        method = "PUT" if variant == "1.0 PUT" else "GET"
        new = c.body(c.rng.randint(0, 3000)) if method == "PUT" else b""
        req = c.signed(method, key, body=new)
        req.version = "HTTP/1.0"
        exp = OK
        if variant == "1.0 GET no host":
            req.drop("Host")
            exp = expect(400, 403, codes=AUTH_ERRORS)
        if variant == "1.0 keep-alive":
            req.headers.append(("Connection", "keep-alive"))
        ans = await c.x(variant, req, exp)
        if method == "PUT":
            c.after_write(key, new, ans)
        elif ans.status == 200 and ans.body != body and key in c.run.ledger.objects:
            c.run.problem("wrong_answers", c, variant, req.wire(), ans, "HTTP/1.0 GET body differs")
    await c.check(key, same_conn=False)


async def case_pipeline(c: Case) -> None:
    """Several requests in one write; every answer must belong to its own request, in order."""
    key, body = await seed_object(c)
    reqs: list[Req] = []
    exps: list[Expect] = []
    checks: list[tuple[int, bytes | None]] = []  # (index, expected GET body or None for 404)
    current: bytes | None = body if key in c.run.ledger.objects else None
    uncertain = key in c.run.ledger.uncertain
    for i in range(c.rng.randint(2, 6)):
        what = c.choice(["get", "get", "put", "head", "bad-auth", "missing", "bad-range", "list"])
        if what == "get":
            reqs.append(c.signed("GET", key))
            exps.append(OK if current is not None else expect(404))
            checks.append((i, current))
        elif what == "put":
            current = c.body(c.rng.randint(0, 2000))
            reqs.append(c.signed("PUT", key, body=current))
            exps.append(OK)
        elif what == "head":
            reqs.append(c.signed("HEAD", key))
            exps.append(OK if current is not None else expect(404))
        elif what == "bad-auth":
            r = c.signed("GET", key)
            reqs.append(r.set("Authorization", _garbage_authorization(c, r.get("Authorization") or "")))
            exps.append(AUTH_FAIL)
        elif what == "missing":
            reqs.append(c.signed("GET", c.key("missing")))
            exps.append(expect(404, codes=["NoSuchKey"]))
        elif what == "bad-range":
            reqs.append(c.signed("GET", key, headers=[("Range", f"bytes={10**9}-")]))
            exps.append(expect(416, 200, 404, codes=["InvalidRange", "NoSuchKey"]))
        else:
            reqs.append(c.signed("GET", None, query=f"list-type=2&prefix={quote(c.prefix, safe='~')}"))
            exps.append(OK)
    answers = await c.pipeline("pipelined", reqs, exps)
    for r, ans in zip(reqs, answers, strict=True):
        if r.method == "PUT":
            c.after_write(key, r.body, ans)
    if not uncertain:
        for i, want in checks:
            ans = answers[i]
            if ans.status is None:
                continue
            if (want is None and ans.status != 404) or (
                want is not None and (ans.status != 200 or ans.body != want)
            ):
                if not ans.from_handler and ans.closes:
                    # aiohttp parses what one read brought as a whole: an unparsable request in it gets the
                    # whole batch one 400 and the connection closed. Nothing ran; not a desync.
                    c.run.figures.pipelines_refused_whole += 1
                    break
                c.run.problem(
                    "desynced", c, f"pipelined[{i}]", reqs[i].wire(), ans, "answer of another request"
                )
    await c.check(key, same_conn=False)


async def case_big_head(c: Case) -> None:
    """Oversized header sections, header values, request lines and URLs."""
    key, _ = await seed_object(c)
    variant = c.choice(
        [
            "many headers",
            "one huge value",
            "huge signed meta",
            "long url",
            "huge request line",
            "many small signed",
        ]
    )
    exp = Expect(frozenset({400, 413, 414, 431}), None, no_answer=True)
    if variant == "many headers":
        req = c.signed("GET", key)
        req.headers += [(f"X-Pad-{i}", "v" * 50) for i in range(c.rng.randint(100, 3000))]
    elif variant == "one huge value":
        req = c.signed("GET", key)
        req.headers.append(("X-Pad", "v" * c.rng.choice([8200, 16 * 1024, 64 * 1024, 1024 * 1024])))
    elif variant == "huge signed meta":
        req = c.signed("PUT", key, headers=[("x-amz-meta-pad", "m" * c.rng.randint(7000, 9000))], body=b"x")
        exp = Expect(frozenset({200, 400, 413, 431}), None, no_answer=True)
    elif variant == "many small signed":
        hdrs = [(f"x-amz-meta-k{i}", "v" * 20) for i in range(c.rng.randint(200, 400))]
        req = c.signed("PUT", key, headers=hdrs, body=b"x")
    elif variant == "long url":
        long_key = c.prefix + "u" * c.rng.randint(8 * 1024, 20 * 1024)
        req = c.signed("GET", long_key)
    else:
        req = c.signed("GET", key, query="x=" + "q" * c.rng.randint(9000, 70000))
    ans = await c.x(variant, req, exp)
    if ans.status == 200 and req.method == "PUT":
        c.after_write(key, req.body, ans)
    await c.check(key, same_conn=False)


async def case_garbage(c: Case) -> None:
    """Bytes that are not (valid) HTTP."""
    key, _ = await seed_object(c)
    get = c.signed("GET", key)
    head = get.head_bytes()
    options: list[tuple[str, bytes]] = [
        ("random bytes", c.rng.randbytes(c.rng.randint(1, 2000))),
        ("random text", bytes(c.rng.randint(0x20, 0x7E) for _ in range(c.rng.randint(1, 500)))),
        ("method only", b"GET\r\n\r\n"),
        ("no version", f"GET {c.path(key)}\r\nHost: x\r\n\r\n".encode()),
        ("no final CRLF", head[:-2]),
        ("header without colon", head.replace(b"\r\n\r\n", b"\r\nNoColonHere\r\n\r\n")),
        ("space in header name", head.replace(b"\r\n\r\n", b"\r\nBad Name: x\r\n\r\n")),
        ("space before colon", head.replace(b"Host:", b"Host :")),
        ("obs-fold", head.replace(b"\r\n\r\n", b"\r\nX-Fold: a\r\n b\r\n\r\n")),
        ("bare LF", head.replace(b"\r\n", b"\n")),
        ("bare CR", head.replace(b"\r\n", b"\r")),
        ("NUL in header value", head.replace(b"\r\n\r\n", b"\r\nX-Nul: a\x00b\r\n\r\n")),
        ("NUL in target", head.replace(b" HTTP/1.1", b"\x00 HTTP/1.1", 1)),
        ("control char in target", head.replace(b" HTTP/1.1", b"\x01\x7f HTTP/1.1", 1)),
        ("space in target", head.replace(b" HTTP/1.1", b" x HTTP/1.1", 1)),
        ("latin-1 header value", head.replace(b"\r\n\r\n", b"\r\nx-amz-meta-l: \xe9\xff\r\n\r\n")),
        ("invalid header name bytes", head.replace(b"\r\n\r\n", b"\r\n\xc3\xa9: x\r\n\r\n")),
        (
            "absolute-form target",
            head.replace(c.path(key).encode(), f"http://{c.run.host_header}{c.path(key)}".encode(), 1),
        ),
        ("asterisk target", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("authority target", f"CONNECT {c.run.host_header} HTTP/1.1\r\nHost: x\r\n\r\n".encode()),
        ("tls client hello", bytes.fromhex("16030100a5010000a10303") + c.rng.randbytes(160)),
        ("http2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        (
            "upgrade h2c",
            head.replace(
                b"\r\n\r\n",
                b"\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
            ),
        ),
        (
            "websocket upgrade",
            head.replace(
                b"\r\n\r\n",
                b"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n",
            ),
        ),
        ("empty lines first", b"\r\n\r\n\r\n" + head),
        ("lowercase version", head.replace(b"HTTP/1.1", b"http/1.1", 1)),
    ]
    step, data = c.choice(options)
    await c.x(step, data, Expect(frozenset(range(100, 600)), None, no_answer=True), half_close=True)
    await c.check(key, same_conn=False)


async def case_expect(c: Case) -> None:
    """Expect: 100-continue with good and bad signatures, and Expect values nobody knows."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 4000))
    variant = c.choice(["good", "bad signature", "odd expect", "body without waiting"])
    if variant == "bad signature":
        req = c.signed(
            "PUT", key, body=body, secret=c.run.secret_key + "x", headers=[("Expect", "100-continue")]
        )
    else:
        expect_value = (
            c.choice(["200-ok", "100-continue, foo", "", "100-CONTINUE"])
            if variant == "odd expect"
            else "100-continue"
        )
        req = c.signed("PUT", key, body=body, headers=[("Expect", expect_value)])
    conn = await c.connection(fresh=True)
    if variant in ("body without waiting", "odd expect"):
        exp = OK if variant != "odd expect" else Expect(frozenset({200, 417}), None)
        ans = await c.x(variant, req, exp)
        c.after_write(key, body, ans)
        await c.check(key)
        return
    await conn.send(req.head_bytes())
    first = await conn.answer("PUT", stop_at_interim=True)
    if first.status == 100:
        await conn.send(body)
        ans = await conn.answer("PUT")
        c.run.classify(c, f"{variant}: after 100", "PUT", req.wire(), ans, OK)
        c.after_write(key, body, ans)
    else:
        exp = OK if variant == "good" else expect(403, codes=["SignatureDoesNotMatch"])
        c.run.classify(c, f"{variant}: first answer", "PUT", req.head_bytes(), first, exp)
        if first.status == 200:
            c.run.problem(
                "read_back_mismatch", c, variant, req.head_bytes(), first, "200 before the body was sent"
            )
    await c.check(key, same_conn=False)


async def case_list(c: Case) -> None:
    """ListObjects V1/V2 with odd prefixes, delimiters, max-keys, markers and tokens."""
    for i in range(c.rng.randint(0, 3)):
        await c.put(
            c.key(f"l{i}/x"), c.body(c.rng.randint(0, 300)), write_through=c.rng.random() < 0.3, step="seed"
        )
    v2 = c.rng.random() < 0.7
    prefix = c.prefix + c.choice(["", "l", "l0/", "\x01", "\x00", "ü", "%", "+", " ", "\ufffe", "\udcff"])
    params = [("list-type", "2")] if v2 else []
    params.append(("prefix", prefix))
    for name, values in [
        ("delimiter", ["/", "l", "\x00", "//", "ü", "", "x" * 300]),
        ("max-keys", ["-1", "abc", "1001", "99999999999", "0", "1", "2147483648", "%C2%B2"]),
        ("encoding-type", ["url", "URL", "foo", ""]),
        ("start-after" if v2 else "marker", [c.prefix, "\x01", "zzz", "", "\udcff"]),
        ("continuation-token", ["", "x", "czNsYW5lczE6", "czNsYW5lczE6_w", "A" * 5000, "%FF"]),
        ("fetch-owner", ["true", "maybe"]),
    ]:
        if c.rng.random() < 0.4:
            params.append((name, str(c.choice(values))))
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='', errors='surrogateescape')}" for k, v in params)
    ans = await c.x("list", c.signed("GET", None, query=query), expect(200, 400, codes=["InvalidArgument"]))
    if ans.status == 200:
        _require_xml(c, "list", ans)


async def case_copy(c: Case) -> None:
    """CopyObject with odd copy sources and conditions."""
    src, body = await seed_object(c)
    dst = c.key("copy")
    source = c.choice(
        [
            f"/{c.run.bucket}/{quote(src)}",
            f"{c.run.bucket}/{quote(src)}",
            "",
            "/",
            c.run.bucket,
            f"/{c.run.bucket}/",
            "%ZZ",
            f"/{c.run.bucket}/{quote(c.key('missing'))}",
            "/../../etc/passwd",
            f"/{c.run.bucket}/..",
            f"/{c.run.marker}-nobucket/{quote(src)}",
            f"/{c.run.bucket}/{quote(src)}?versionId=garbage",
            f"/{c.run.bucket}/%00",
            "x" * 3000,
            f"/{c.run.bucket}/{quote(src)}%FF",
            "\udcff",
        ]
    )
    headers = [("x-amz-copy-source", source)]
    if c.rng.random() < 0.3:
        headers.append(
            (
                c.choice(
                    [
                        "x-amz-copy-source-if-match",
                        "x-amz-copy-source-if-none-match",
                        "x-amz-copy-source-if-modified-since",
                    ]
                ),
                c.choice(["*", "garbage", '""']),
            )
        )
    if c.rng.random() < 0.2:
        headers.append(("x-amz-metadata-directive", c.choice(["REPLACE", "COPY", "garbage", ""])))
    if c.rng.random() < 0.3:
        headers.append(WRITE_THROUGH)
    req = c.signed("PUT", dst, headers=headers)
    ans = await c.x(f"copy from {source[:40]!r}", req, expect(200, 400, 403, 404, 412))
    if ans.status == 200:
        valid = source in (f"/{c.run.bucket}/{quote(src)}", f"{c.run.bucket}/{quote(src)}")
        if valid and src in c.run.ledger.objects:
            c.after_write(dst, body, ans)
        else:
            c.run.ledger.uncertain[dst] = {None, md5_hex(body)}
            # A version id the store does not check (S3: 400/404) still names the source object.
            if not valid and "versionId=" not in source:
                c.run.problem(
                    "wrong_answers", c, "copy", req.wire(), ans, "copy from an odd source answered 200"
                )
    await c.check(dst, same_conn=False)
    await c.check(src)


async def case_meta(c: Case) -> None:
    """Metadata and stored headers with odd values, served back from the spool or the backend."""
    key = c.key("meta")
    body = c.body(c.rng.randint(0, 3000))
    name, value = c.choice(
        [
            ("x-amz-meta-u", "ünïcödé €"),
            ("x-amz-meta-l", "\udce9\udcff"),
            ("x-amz-meta-long", "v" * 2100),
            ("x-amz-meta-empty", ""),
            ("x-amz-meta-ctl", "a\x01b\x7f"),
            ("Content-Type", "text/plain; charset=ü"),
            ("Content-Type", "\udcff/\udcfe"),
            ("Content-Disposition", 'attachment; filename="a\\"b.txt"'),
            ("Cache-Control", "no-cache, \x01"),
            ("Expires", "not a date"),
            ("x-amz-tagging", "a=b&c"),
            ("x-amz-tagging", "%ZZ=%ZZ"),
            ("x-amz-tagging", "k=" + "v" * 300),
            ("x-amz-storage-class", "FOO"),
            ("x-amz-acl", "garbage"),
            ("x-amz-website-redirect-location", "javascript:alert(1)"),
            ("Content-Encoding", "gzip, br, ü"),
            ("Content-Language", "\udcc3("),
            ("x-amz-server-side-encryption", "ROT13"),
            ("x-amz-meta-" + "n" * 200, "v"),
        ]
    )
    headers = [(name, value)]
    if c.rng.random() < 0.4:
        headers += [(f"x-amz-meta-m{i}", "x" * 40) for i in range(60)]
    wt = c.rng.random() < 0.3
    req = c.signed("PUT", key, headers=headers + ([WRITE_THROUGH] if wt else []), body=body)
    ans = await c.x(f"PUT with {name}", req, Expect(frozenset({200, 400}), None))
    c.after_write(key, body, ans)
    if ans.status == 200:
        await c.x(f"HEAD with {name}", c.signed("HEAD", key), OK)
    await c.check(key)


async def case_overrides(c: Case) -> None:
    """response-* overrides carrying CR, LF, NUL and unicode: no header injection, no 500."""
    key, body = await seed_object(c)
    name = c.choice(
        [
            "response-content-type",
            "response-content-disposition",
            "response-cache-control",
            "response-expires",
            "response-content-language",
            "response-content-encoding",
        ]
    )
    value = c.choice(
        [
            "%0D%0AX-Injected:%201",
            "%0AX-Injected:%201",
            "a%00b",
            "%C3%BC",
            "x" * 8000,
            "%FF",
            "%E2%80%A8X-Injected:%201",
            "%C2%85X-Injected:%201",
            "text%2Fplain",
        ]
    )
    req = c.signed("GET", key, query=f"{name}={value}")
    ans = await c.x(f"{name}={value[:20]}", req, expect(200, 400))
    if ans.header("x-injected") is not None:
        c.run.problem("wrong_answers", c, "override", req.wire(), ans, "header injected")
    if ans.status == 200 and ans.body != body and key in c.run.ledger.objects:
        c.run.problem("wrong_answers", c, "override", req.wire(), ans, "body differs")
    await c.check(key)


async def case_vhost(c: Case) -> None:
    """Virtual-hosted-style requests and odd Host headers."""
    key, body = await seed_object(c)
    port = c.run.port
    variant = c.choice(
        [
            "virtual",
            "virtual upper",
            "virtual trailing dot",
            "empty host",
            "bare domain",
            "unicode",
            "long",
            "two hosts",
            "bad port",
            "ipv6",
            "bucket dots",
        ]
    )
    path = "/" + quote(key, safe="/~")
    host = {
        "virtual": f"{c.run.bucket}.localhost:{port}",
        "virtual upper": f"{c.run.bucket.upper()}.LOCALHOST:{port}",
        "virtual trailing dot": f"{c.run.bucket}.localhost.:{port}",
        "empty host": "",
        "bare domain": f"localhost:{port}",
        "unicode": f"bücket.localhost:{port}",
        "long": "h" * 300 + f".localhost:{port}",
        "two hosts": f"{c.run.bucket}.localhost:{port}",
        "bad port": f"{c.run.bucket}.localhost:abc",
        "ipv6": f"[::1]:{port}",
        "bucket dots": f"..{c.run.bucket}.localhost:{port}",
    }[variant]
    virtual = variant.startswith("virtual") or variant in ("two hosts", "bad port")
    req = c.signed("GET", key, raw_path=path if virtual or "localhost" in host else None, host=host)
    if variant == "two hosts":
        req.headers.insert(1, ("Host", c.run.host_header))
    exp = (
        OK
        if variant in ("virtual", "virtual upper", "virtual trailing dot", "bad port")
        else Expect(ANY.statuses, None)
    )
    if key not in c.run.ledger.objects:
        exp = Expect(ANY.statuses, None)
    ans = await c.x(variant, req, exp)
    if ans.status == 200 and variant.startswith("virtual") and ans.body != body:
        c.run.problem("wrong_answers", c, variant, req.wire(), ans, "virtual-hosted GET body differs")
    await c.check(key)


async def case_admin(c: Case) -> None:
    """The admin endpoints with odd methods and parameters (unsigned, from loopback)."""
    path = c.choice(
        [
            "/_s3lanes/status",
            "/_s3lanes/metrics",
            "/metrics",
            "/_s3lanes/flush",
            "/_s3lanes/",
            "/_s3lanes/status/x",
            "/healthz",
            "/readyz",
            "/_s3lanes/ui",
            "/_s3lanes/flush%00",
        ]
    )
    method = c.choice(["GET", "POST", "PUT", "DELETE", "HEAD"])
    query = c.choice(
        [
            "",
            f"bucket={c.run.marker}-nobucket&timeout=" + c.choice(["-1", "abc", "nan", "inf", "1e309", "0"]),
            f"bucket={c.run.bucket}&prefix={quote(c.prefix)}&timeout=5",
            "bucket=..&prefix=%00&timeout=1",
            "bucket=&timeout=1",
            "timeout=1",
            f"bucket={c.run.bucket}&prefix=%FF&timeout=1",
        ]
    )
    target = path + (f"?{query}" if query else "")
    req = Req(method, target, [("Host", c.run.host_header), ("Content-Length", "0")])
    await c.x(f"{method} {path}", req, Expect(ANY.statuses, None))


KINDS: tuple[tuple[str, int, CaseFn], ...] = (
    ("valid", 8, case_valid),
    ("auth", 12, case_auth),
    ("date", 6, case_date),
    ("payload-hash", 8, case_payload),
    ("truncated-body", 6, case_truncated),
    ("content-length", 6, case_length),
    ("aws-chunked", 10, case_aws_chunked),
    ("range", 6, case_range),
    ("part-numbers", 4, case_part_numbers),
    ("odd-keys", 10, case_odd_keys),
    ("raw-path-bytes", 3, case_raw_path),
    ("xml-complete", 4, case_xml_complete),
    ("xml-delete", 3, case_xml_delete),
    ("query", 4, case_query),
    ("methods", 3, case_methods),
    ("http-versions", 2, case_http10),
    ("pipelining", 3, case_pipeline),
    ("big-headers", 2, case_big_head),
    ("garbage", 4, case_garbage),
    ("expect-100", 2, case_expect),
    ("list", 3, case_list),
    ("copy", 2, case_copy),
    ("metadata", 3, case_meta),
    ("response-overrides", 2, case_overrides),
    ("virtual-host", 2, case_vhost),
    ("admin", 1, case_admin),
)


def pick_kind(seed: int, index: int, only: tuple[str, ...] = ()) -> tuple[str, CaseFn]:
    kinds = [k for k in KINDS if not only or k[0] in only]
    rng = random.Random(f"{seed}-{index}-kind")
    name, _, fn = rng.choices(kinds, weights=[w for _, w, _ in kinds])[0]
    return name, fn


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
[server]
listen = "127.0.0.1:0"
state_dir = "{stack.state_dir}"
domains = ["localhost"]
log_level = "INFO"
shutdown_grace_s = 5
drain_on_shutdown_s = 0

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
    with open(stack.log_path, "wb") as log_fh:
        stack.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--ready-file", str(ready)],
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches this script only; it stops the gateway itself
            cwd=stack.gateway_cwd,
            env=env,
        )
    deadline = time.monotonic() + GATEWAY_START_TIMEOUT_S
    while not ready.exists():
        if stack.proc.poll() is not None or time.monotonic() > deadline:
            raise FuzzError(
                "the gateway did not start:\n" + stack.log_path.read_text(errors="replace")[-3000:]
            )
        time.sleep(0.05)
    doc = json.loads(ready.read_text())
    url = next(u for u in doc["endpoints"] if u.startswith("http://"))
    stack.port = int(url.rsplit(":", 1)[1].rstrip("/"))


def stop_gateway(stack: Stack) -> None:
    proc = stack.proc
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(GATEWAY_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stack.exit_code = proc.returncode


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


# --------------------------------------------------------------------------------------------------------
# End checks: the backend against the ledger, uploads left open, files, the log


@dataclass(slots=True)
class EndReport:
    flush: dict[str, Any] = field(default_factory=dict)
    backend_objects: int = 0
    ledger_objects: int = 0
    normalised: list[dict[str, str]] = field(default_factory=list)
    mangled: list[dict[str, str]] = field(default_factory=list)  # the store's own key mangling (see Ledger)
    partial: list[dict[str, str]] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    open_uploads: list[dict[str, str]] = field(default_factory=list)
    deliberate_uploads: int = 0
    new_files: list[str] = field(default_factory=list)
    unattributed_new_entries: list[str] = field(default_factory=list)
    tracebacks: list[dict[str, str]] = field(default_factory=list)
    gateway_exit_code: int | None = None
    crashes: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: str = ""
    gateway_logs: list[str] = field(default_factory=list)
    cleanup_error: str = ""
    spool_status: dict[str, Any] = field(default_factory=dict)  # when the flush did not end durable


async def spool_status(run: Run) -> dict[str, Any]:
    """The gateway's own view of what is still pending (``GET /_s3lanes/status``, its spool section)."""
    conn = await Conn.open(run.host, run.port)
    try:
        await conn.send(Req("GET", "/_s3lanes/status", [("Host", run.host_header)]).wire())
        ans = await conn.answer("GET")
    finally:
        await conn.close()
    try:
        doc = json.loads(ans.body)
    except ValueError:
        return {"http_status": ans.status, "body": excerpt(ans.body, 500)}
    return dict(doc.get("spool") or doc) if isinstance(doc, dict) else {"body": doc}


async def flush(run: Run) -> dict[str, Any]:
    """Wait until the spool has drained the run's bucket: ``POST /_s3lanes/flush`` in short windows, until
    it reports durable, or the pending count stops falling (an entry the drain can never upload: counted
    as missing by the backend check), or ``FLUSH_TIMEOUT_S`` is up."""
    began = time.monotonic()
    best: int | None = None
    stalled = 0
    doc: dict[str, Any] = {}
    while time.monotonic() - began < FLUSH_TIMEOUT_S:
        conn = await Conn.open(run.host, run.port)
        try:
            target = f"/_s3lanes/flush?bucket={run.bucket}&timeout={FLUSH_WINDOW_S:.0f}"
            await conn.send(Req("POST", target, [("Host", run.host_header), ("Content-Length", "0")]).wire())
            ans = await conn.answer("POST")
        finally:
            await conn.close()
        try:
            doc = json.loads(ans.body)
        except ValueError:
            doc = {"body": excerpt(ans.body, 500)}
        doc["http_status"] = ans.status
        if doc.get("durable"):
            break
        pending = doc.get("pending_objects")
        if not isinstance(pending, int):
            break
        if best is None or pending < best:
            best, stalled = pending, 0
        else:
            stalled += 1
            if stalled >= FLUSH_STALL_WINDOWS:
                doc["stalled"] = True
                break
    doc["waited_s"] = round(time.monotonic() - began, 1)
    return doc


def check_backend(run: Run, backend: BackendSpec, report: EndReport) -> None:
    """Every object on the backend must be one a valid request completely wrote; nothing acknowledged
    may be missing; no multipart upload may be open that no case left open on purpose."""
    s3 = s3_client(backend)
    ledger = run.ledger
    seen: set[str] = set()
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=run.bucket):
            for obj in page.get("Contents", []):
                key, etag = obj["Key"], obj["ETag"].strip('"')
                report.backend_objects += 1
                stored = ledger.objects.get(key) if key not in ledger.uncertain else None
                if _mangled_by_store(ledger, key, obj["Size"], stored):
                    report.mangled.append({"key": key, "etag": etag, "size": str(obj["Size"])})
                    seen.add(key)
                    seen.update(
                        k for k in ledger.trailing_slash if key in (k, k + k.rstrip("/").rsplit("/", 1)[-1])
                    )
                    continue
                if stored is not None:
                    seen.add(key)
                    if etag == stored.etag:
                        continue
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                    if md5 == stored.md5:
                        continue
                    report.partial.append(
                        {"key": key, "etag": etag, "expected": stored.etag, "case": str(stored.case)}
                    )
                    continue
                if key in ledger.uncertain:
                    allowed = ledger.uncertain[key]
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                    if md5 in allowed:
                        seen.add(key)
                        continue
                    report.partial.append(
                        {"key": key, "etag": etag, "expected": f"one of {sorted(map(str, allowed))}"}
                    )
                    continue
                # Not in the ledger under this name: a store may keep odd keys under a normalised name.
                md5 = etag if re.fullmatch(r"[0-9a-f]{32}", etag) else ""
                if not md5:
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                original = ledger.odd_by_md5.get(md5)
                if original is not None and original in ledger.objects:
                    seen.add(original)
                    report.normalised.append({"sent": original, "stored": key})
                    continue
                report.partial.append(
                    {"key": key, "etag": etag, "expected": "no object (no valid write made it)"}
                )
        for key, stored in ledger.objects.items():
            if key not in seen and key not in ledger.trailing_slash and key not in ledger.uncertain:
                report.missing.append({"key": key, "md5": stored.md5, "case": str(stored.case)})
        for key, allowed in ledger.uncertain.items():
            if key not in seen and None not in allowed and key not in ledger.objects:
                report.missing.append({"key": key, "md5": f"one of {sorted(map(str, allowed))}", "case": "?"})
        open_ok = {upload_id for _, upload_id in ledger.open_uploads}
        report.deliberate_uploads = len(open_ok)
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=run.bucket):
            for up in page.get("Uploads", []):
                if up["UploadId"] not in open_ok and not up["Key"].startswith(
                    tuple(ledger.crash_cut_prefixes)
                ):
                    report.open_uploads.append({"key": up["Key"], "upload_id": up["UploadId"]})
    finally:
        s3.close()
    report.ledger_objects = len(ledger.objects)


def _mangled_by_store(ledger: Ledger, key: str, size: int, stored: Stored | None) -> bool:
    """SeaweedFS (4.x) keeps PUT "a/b/" with data as "a/b/b", and with a few bytes as an empty "a/b/"."""
    if key.endswith("/"):
        return key in ledger.trailing_slash and size == 0 and (stored is None or stored.size > 0)
    parent, _, name = key.rpartition("/")
    return bool(name) and parent.rpartition("/")[2] == name and parent + "/" in ledger.trailing_slash


def cleanup_bucket(backend: BackendSpec, bucket: str) -> str:
    """Empty and delete the run's bucket (when the store outlives the run). Best effort: '' or what failed.

    Keys go one by one (in the URL): a DeleteObjects document cannot carry keys with control characters.
    """
    s3 = s3_client(backend)
    try:
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for up in page.get("Uploads", []):
                s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    except Exception as exc:  # leftovers in a test store must not hide the run's figures
        return f"{type(exc).__name__}: {exc}"
    finally:
        s3.close()
    return ""


_LOG_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# A traceback of aiohttp's HTTP parser refusing bytes that are not HTTP: logged by aiohttp itself.
_PARSER_TRACEBACK = re.compile(
    r"_parser\.feed_data|http_exceptions\.(BadHttpMessage|BadStatusLine|LineTooLong|"
    r"InvalidHeader|BadHttpMethod|TransferEncodingError|ContentLengthError)"
)


_EXCEPTION_LINE = re.compile(r"^((?:[a-z_]\w*\.)*[A-Z]\w*)(?::\s*(.*))?$")


def traceback_kind(excerpt_text: str) -> str:
    """The last exception of a traceback and the start of its message (request ids and offsets dropped)."""
    lines = excerpt_text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _EXCEPTION_LINE.match(lines[i])
        if m:
            message = m.group(2) or ""
            if message.endswith("message:") and i + 1 < len(lines):  # aiohttp's: the reason is below
                message = lines[i + 1].strip()
            message = re.sub(r"\[rid=\w+\]|position \d+(-\d+)?|'\\udc[0-9a-f]{2}'", "", message)
            return f"{m.group(1)}: {message[:70]}".rstrip(": ")
    return lines[-1][:80] if lines else "?"


def scan_log(path: Path) -> list[dict[str, str]]:
    """Every log record of the gateway that carries a traceback: where it comes from, and an excerpt."""
    if not path.exists():
        return []
    records: list[list[str]] = []
    for line in path.read_text(errors="replace").splitlines():
        if _LOG_RECORD_START.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    out = []
    for rec in records:
        text = "\n".join(rec)
        if _TRACEBACK not in text:
            continue
        # aiohttp's server refusing bytes before any handler ran: logged from data_received.
        parser = "in data_received" in text and _PARSER_TRACEBACK.search(text) is not None
        origin = "aiohttp HTTP parser" if parser else "gateway"
        lines = rec if len(rec) <= 14 else [*rec[:3], "    ...", *rec[-10:]]
        out.append({"origin": origin, "excerpt": "\n".join(lines)[:3000]})
    return out


# --------------------------------------------------------------------------------------------------------
# The run


@dataclass(slots=True)
class Result:
    opts: Options
    figures: Figures
    report: EndReport
    run: Run
    seconds: float
    started_utc: str

    @property
    def ok(self) -> bool:
        return not self.figures.failed()

    def as_json(self) -> dict[str, Any]:
        f = self.figures
        findings = sorted(self.run.findings.values(), key=lambda x: (-_severity(x.category), -x.count))
        return {
            "command": self.opts.command,
            "started_utc": self.started_utc,
            "commit": git_commit(),
            "gateway_source": str(self.opts.gateway_source),
            "seconds": round(self.seconds, 1),
            "seed": self.opts.seed,
            "python": sys.version.split()[0],
            "figures": dataclasses.asdict(f),
            "must_be_zero": {name: getattr(f, name) for name in f.MUST_BE_ZERO},
            "failed": f.failed(),
            "cases_per_kind": dict(sorted(self.run.kinds.items())),
            "answers_per_kind": {k: dict(sorted(v.items())) for k, v in sorted(self.run.answers.items())},
            "end": dataclasses.asdict(self.report),
            "findings": [dataclasses.asdict(x) for x in findings],
        }


_SEVERITY = {
    "500 answer": 9,
    "read back mismatch": 9,
    "desynced": 9,
    "wrong answers": 8,
    "harness error": 8,
    "timeout": 7,
    "no answer": 6,
    "error without S3 XML": 5,
    "503 answer": 5,
    "unexpected answer": 3,
    "HTTP parser answer": 1,
}


def _severity(category: str) -> int:
    return _SEVERITY.get(category, 4)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=GATEWAY_SOURCE,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=GATEWAY_SOURCE,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip() or "unknown"
    return commit + ("+dirty" if dirty.stdout.strip() else "")


async def run_cases(
    run: Run, stack: Stack, indices: Sequence[int], concurrency: int, say: Callable[[str], None]
) -> None:
    """Run the cases, ``concurrency`` at a time. A dead gateway is a crash: recorded (with the cases that
    were in flight, the suspects), then restarted on the same state directory so the run goes on (its
    recovery replays the journal; the backend check at the end covers what the crash may have lost)."""
    queue = list(reversed(indices))
    started = time.monotonic()
    last_report = started
    restart_lock = asyncio.Lock()
    gateway_up = asyncio.Event()  # cleared while a dead gateway is being restarted: no new case starts then
    gateway_up.set()

    async def after_death(index: int, kind: str) -> None:
        async with restart_lock:
            if stack.alive():
                return  # another worker restarted it already
            gateway_up.clear()
            try:
                await restart(index, kind)
            finally:
                gateway_up.set()

    async def restart(index: int, kind: str) -> None:
        stop_gateway(stack)
        tail = stack.log_path.read_text(errors="replace").splitlines()[-6:]
        in_flight = sorted(run.in_flight | {index})
        run.crashes.append(
            {
                "detected_after_case": index,
                "kind": kind,
                "in_flight": in_flight,
                "exit_code": stack.exit_code,
                "log_tail": tail,
            }
        )
        run.figures.crashes += 1
        run.generation += 1  # from now on, cases still in flight count as interrupted
        say(f"the gateway died (exit code {stack.exit_code}) with cases {in_flight} in flight")
        if len(run.crashes) > MAX_RESTARTS:
            run.stopped = f"more than {MAX_RESTARTS} crashes"
            return
        try:
            await asyncio.to_thread(start_gateway, stack)
        except FuzzError as exc:
            run.stopped = f"the gateway did not restart: {exc}"
            return
        run.port = stack.port
        run.host_header = f"{run.host}:{run.port}"

    async def worker() -> None:
        nonlocal last_report
        while queue and not run.stopped:
            await gateway_up.wait()
            if not queue or run.stopped:
                break
            index = queue.pop()
            kind, fn = pick_kind(run.opts.seed, index, run.opts.kinds)
            case = Case(run, index)
            case.kind = kind
            run.kinds[kind] += 1
            generation = run.generation
            run.in_flight.add(index)
            try:
                await fn(case)
            except Exception as exc:
                if isinstance(exc, OSError) and stack.alive():
                    await asyncio.sleep(1.0)  # a dying gateway closes its listener before it exits
                if generation != run.generation or not stack.alive():
                    run.figures.cases_interrupted += 1  # by a crash: not the harness's fault
                    run.ledger.open_uploads.update(case.uploads)  # it may not have ended them
                else:  # a bug of this harness: counted, never hidden
                    run.harness_error(case, exc)
                    if run.opts.verbose:
                        import traceback

                        traceback.print_exc()
            finally:
                await case.close()
                if case.saw_no_answer and stack.alive():
                    await asyncio.sleep(1.0)  # a connection cut by a dying gateway: let it finish dying
                run.in_flight.discard(index)
                if generation != run.generation or not stack.alive():
                    run.ledger.open_uploads.update(case.uploads)  # a crash may have kept it from ending them
                    run.ledger.crash_cut_prefixes.add(case.prefix)  # or from learning an upload's id
            run.figures.cases_run += 1
            if not stack.alive():
                await after_death(index, kind)
            now = time.monotonic()
            if now - last_report > 15:
                last_report = now
                f = run.figures
                say(
                    f"  {f.cases_run}/{len(indices)} cases, {f.requests} requests, {now - started:.0f} s; "
                    f"crashes {f.crashes}, 500s {f.answers_500}, "
                    f"read-back mismatches {f.read_back_mismatch}, "
                    f"harness errors {f.harness_errors}"
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def fuzz(opts: Options, *, work_dir: Path | None = None, say: Callable[[str], None] = print) -> Result:
    """The whole run. Starts (and always stops) the gateway, and SeaweedFS unless ``opts.backend`` is one."""
    began = time.monotonic()
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    marker = "fzq" + hashlib.sha256(f"fuzz-http-{opts.seed}".encode()).hexdigest()[:8]
    own_tmp = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="s3lanes-fuzz-", dir=opts.tmp_dir)) if work_dir is None else work_dir
    root.mkdir(parents=True, exist_ok=True)
    bucket = f"fuzz-{marker}"
    weed: SeaweedProcess | None = None
    backend = opts.backend
    stack: Stack | None = None
    try:
        if backend is None:
            secret = secrets.token_urlsafe(30)
            weed = SeaweedProcess(
                SeaweedOptions(
                    state_dir=root / "seaweedfs",
                    identities=(SeaweedIdentity("fuzz", ACCESS_KEY, secret),),
                    buckets=(bucket,),
                )
            )
            say("starting SeaweedFS ...")
            weed.start()
            backend = BackendSpec(weed.endpoint_url, ACCESS_KEY, secret)
        else:
            s3 = s3_client(backend)
            try:
                s3.create_bucket(Bucket=bucket)
            finally:
                s3.close()
        stack = Stack(
            root=root,
            backend=backend,
            weed=weed,
            state_dir=root / "state",
            spool_dir=root / "state" / "spool",
            run_dir=root / "harness",
            gateway_cwd=root / "gateway-cwd",
            gateway_tmp=root / "gateway-tmp",
            gateway_source=opts.gateway_source,
        )
        for d in (stack.run_dir, stack.gateway_cwd, stack.gateway_tmp):
            d.mkdir(parents=True, exist_ok=True)
        before = snapshot(stack, marker)
        start_gateway(stack)
        say(
            f"gateway pid {stack.proc.pid if stack.proc else '?'} on {stack.host}:{stack.port}, "
            f"spool {stack.spool_dir}"
        )
        run = Run(opts, stack.host, stack.port, bucket, marker, backend.secret_key)
        run.gateway_alive = stack.alive
        indices = list(opts.only_cases) if opts.only_cases else list(range(opts.cases))
        say(f"running {len(indices)} cases (seed {opts.seed}, concurrency {opts.concurrency}) ...")
        asyncio.run(run_cases(run, stack, indices, opts.concurrency, say))
        report = EndReport()
        if stack.alive():
            say("flushing the spool ...")
            report.flush = asyncio.run(flush(run))
            if not report.flush.get("durable"):
                report.spool_status = asyncio.run(spool_status(run))
            check_backend(run, backend, report)
        stop_gateway(stack)
        report.gateway_exit_code = stack.exit_code
        if stack.exit_code not in (0, None):
            run.figures.crashes += 1
            run.crashes.append(
                {"detected_after_case": None, "kind": "shutdown", "exit_code": stack.exit_code}
            )
        after = snapshot(stack, marker)
        report.new_files = sorted(
            (after.run_tree - before.run_tree)
            | (after.marked - before.marked)
            | set(spool_layout_violations(stack))
        )
        report.unattributed_new_entries = sorted(
            n
            for n in (after.tmp_top - before.tmp_top) | (after.cwd_top - before.cwd_top)
            if not _WEED_SOCKET_RE.match(n)
        )
        report.tracebacks = [tb for log in stack.logs for tb in scan_log(log)]
        if opts.out is not None and not opts.only_cases:
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            for i, log in enumerate(stack.logs, start=1):
                copy = opts.out.with_name(f"{opts.out.stem}.gateway-{i}.log")
                copy.write_bytes(log.read_bytes())
                report.gateway_logs.append(str(copy))
        report.crashes = run.crashes
        report.stopped_early = run.stopped
        f = run.figures
        f.files_outside_spool = len(report.new_files)
        f.partial_objects = len(report.partial)
        f.backend_mangled_keys += len(report.mangled)
        f.missing_objects = len(report.missing)
        f.open_uploads_unexpected = len(report.open_uploads)
        f.tracebacks = len(report.tracebacks)
        f.tracebacks_from_parser = sum(1 for t in report.tracebacks if t["origin"] != "gateway")
        if opts.backend is not None:
            report.cleanup_error = cleanup_bucket(backend, bucket)
        return Result(opts, f, report, run, time.monotonic() - began, started_utc)
    finally:
        if stack is not None:
            stop_gateway(stack)
        if weed is not None:
            weed.stop()
        if own_tmp and not opts.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        elif own_tmp:
            say(f"kept {root}")


# --------------------------------------------------------------------------------------------------------
# Report


def summary(result: Result) -> str:
    f = result.figures
    lines = [
        f"s3lanes hostile-input fuzz: {result.opts.command}",
        f"commit {git_commit()}, started {result.started_utc}, {result.seconds:.0f} s",
        "",
        "| figure | value | must be 0 |",
        "|---|---:|:---:|",
    ]
    for fld in dataclasses.fields(f):
        name = fld.name
        mark = "yes" if name in f.MUST_BE_ZERO else ""
        flag = " **FAIL**" if name in f.MUST_BE_ZERO and getattr(f, name) else ""
        lines.append(f"| {name} | {getattr(f, name)}{flag} | {mark} |")
    lines += ["", "| case kind | cases | answers |", "|---|---:|---|"]
    for kind, n in sorted(result.run.kinds.items()):
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(result.run.answers.get(kind, Counter()).items()))
        lines.append(f"| {kind} | {n} | {answers} |")
    r = result.report
    lines += [
        "",
        f"backend: {r.backend_objects} objects, ledger {r.ledger_objects}, "
        f"normalised keys {len(r.normalised)}, "
        f"deliberately open uploads {r.deliberate_uploads}; flush {r.flush.get('http_status')} "
        f"durable={r.flush.get('durable')}; gateway exit code {r.gateway_exit_code}",
    ]
    if r.unattributed_new_entries:
        lines.append(
            "new entries in /tmp or the cwd not named after the run (not counted): "
            f"{r.unattributed_new_entries[:10]}"
        )
    findings = sorted(result.run.findings.values(), key=lambda x: (-_severity(x.category), -x.count))
    if findings:
        lines += ["", "findings (worst first):"]
        for x in findings[:40]:
            lines.append(
                f"  [{x.category}] {x.kind} / {x.step}: {x.status} {x.code or ''} x{x.count}"
                f" (e.g. case {x.examples[0]['case'] if x.examples else '?'})"
            )
    for name, items in (("partial", r.partial), ("missing", r.missing), ("open uploads", r.open_uploads)):
        if items:
            shown_items = [{k: _short(v) for k, v in item.items()} for item in items[:5]]
            lines.append(f"{name} ({len(items)}): {shown_items}")
    if r.new_files:
        lines.append(f"files outside the spool ({len(r.new_files)}): {r.new_files[:10]}")
    for crash in r.crashes[:5]:
        last = (crash.get("log_tail") or ["?"])[-1]
        lines.append(
            f"crash (exit code {crash['exit_code']}, cases in flight {crash.get('in_flight')}): {last}"
        )
    groups: Counter[tuple[str, str]] = Counter()
    first: dict[tuple[str, str], str] = {}
    for tb in r.tracebacks:
        ident = (tb["origin"], traceback_kind(tb["excerpt"]))
        groups[ident] += 1
        first.setdefault(ident, tb["excerpt"])
    if groups:
        lines += ["", "tracebacks in the gateway log, by exception:"]
        lines += [f"  {n:5d}  [{origin}] {kind}" for (origin, kind), n in groups.most_common(20)]
    for (origin, _), excerpt_text in list(first.items())[:8]:
        if origin == "gateway":
            lines += ["", excerpt_text]
    lines += ["", "RESULT: " + ("ok" if result.ok else "FAILED: " + ", ".join(f.failed()))]
    return "\n".join(lines)


def _short(value: str, limit: int = 100) -> str:
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} chars)"


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        result = fuzz(opts)
    except FuzzError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(result))
    if opts.out is not None and not opts.only_cases:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(result.as_json(), indent=1, ensure_ascii=False, default=str) + "\n")
        print(f"wrote {opts.out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
