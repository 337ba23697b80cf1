"""The spool crash workload: S3 operations against a gateway that is SIGKILLed at random moments, a model of
what was acknowledged, and the check of the backend against that model.

Shared by the suite's crash test (``tests/e2e/test_spool_crash.py``, sized to about a minute) and the script
for longer runs (``python -m loadtests.spool_crash``).

Theory of operation
-------------------
*Workers* (threads) each own a disjoint set of keys and issue one operation at a time on them: PUTs of mixed
sizes, multipart uploads (completed, or aborted), DELETEs and DeleteObjects. A key is touched by one worker
only, one request at a time, so per key the operations are totally ordered and the model can say which
final states are acceptable (a state is an object's bytes, or "absent"):

* an acknowledged operation (a 2xx answer) sets the key's acceptable states to {its result};
* an operation whose outcome is unknown (the connection broke after the request may have reached the
  gateway: it was killed under it) adds its result: it may or may not have been applied;
* a connection refused at connect time reached no one: the operation is sent again once the gateway is back.

An unknown operation could still land *after* a later acknowledged one if the process that took it was still
alive (a timeout rather than a kill). Every request notes the gateway *generation* (incremented before each
spawn, after the previous process is reaped) when it starts and when it ends. An unknown operation whose end
generation is older than the start generation of a later ack was taken by a process that was dead before that
ack's process started; recovery replays its journal before the new process listens, so it cannot land after
the ack and is dropped from the acceptable states. Otherwise it stays acceptable. (This assumes the backend
finishes the requests a killed gateway had already sent it within the ~0.4 s a restart takes.)

The *killer* (the calling thread) SIGKILLs the gateway at random moments: 0-300 ms after a restart, while a
big upload is on the wire, during start-up (recovery), or after a longer while. The backend's bandwidth is
limited in the gateway's config, so drains are running at almost every kill. The gateway is restarted on the
same port and state directory each time.

*Stall mode* (``CrashConfig.stall``): every kill happens while the store is frozen (SIGSTOP by its pid,
for ``stall_min_s`` to ``stall_max_s``): the store is stalled, drains put requests on the wire into its
sockets, the gateway is SIGKILLed and restarted, and the store is resumed either after the restarted gateway
has had time to send the newer states of those keys (it is still stalled when the new process starts) or
before the restart. The old requests are then applied by the store after the gateway sent newer ones, which
the spool's fencing must undo before flush answers durable. In this mode an operation whose outcome the
client does not know may land at any later time (a request the killed gateway proxied sits in the stalled
store's socket too), so it stays acceptable whatever the generations say.

At the end every key is read through the gateway (the recovered view must be an acceptable state), the
bucket is flushed (``POST /_s3lanes/flush``), and the backend, read directly, must hold exactly that view and
nothing else, with no multipart upload left behind. Every gateway log must show its recovery line and no
traceback.

Requests are signed with botocore's SigV4 signer (independent of the gateway's) and sent with http.client on a
fresh connection each: no SDK retries, no pooled connection to a dead process, and a refused connect is told
apart from a failure after the request may have reached the gateway.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import hashlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from loadtests.harness.endpoint import Endpoint
from loadtests.harness.gateway import server_toml, stop_process

KiB = 1024
MiB = 1024 * 1024
REGION = "us-east-1"
PUT_SIZES: tuple[tuple[int, int], ...] = ((0, 10), (KiB, 25), (300 * KiB, 25), (2 * MiB, 20), (6 * MiB, 20))
MULTIPART_LAYOUTS: tuple[tuple[int, ...], ...] = (
    (5 * MiB, KiB),
    (5 * MiB, 300 * KiB),
    (5 * MiB, 2 * MiB),
    (5 * MiB, 5 * MiB, 300 * KiB),
)
BIG_BODY_BYTES = 2 * MiB  # a body at least this big counts as a "big upload" for the killer
SEND_CHUNK_BYTES = 256 * KiB
REQUEST_TIMEOUT_S = 30.0
GATEWAY_START_TIMEOUT_S = 30.0
UP_WAIT_TIMEOUT_S = 60.0
READY_POLL_S = 0.01
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
RECOVERY_RE = re.compile(
    r"spool recovery: (?P<records>\d+) journal records \((?P<journal_bytes>\d+) bytes\),"
    r" (?P<entries>\d+) objects \((?P<bytes>\d+) bytes\) to drain,"
    r" (?P<uploads>\d+) open multipart uploads, (?P<orphans>\d+) unacknowledged files removed"
    r"(?:, torn journal tail of (?P<torn>\d+) bytes truncated)?"
    r"(?:, (?P<lost>\d+) entries LOST)?"
)

IN_DOUBT_RE = re.compile(r"spool recovery: .*, (\d+) keys in doubt")

# --- values and the model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Value:
    """An object's content, as far as the check cares: its size and SHA-256."""

    size: int
    sha256: str

    @classmethod
    def of(cls, data: bytes) -> Value:
        return cls(len(data), hashlib.sha256(data).hexdigest())

    def __str__(self) -> str:
        return f"{self.size}B:{self.sha256[:10]}"


State = Value | None  # None: the key is absent


def show(state: State) -> str:
    return "absent" if state is None else str(state)


def payload(seed: str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def multipart_etag(part_md5s: Iterable[str]) -> str:
    md5s = list(part_md5s)
    return md5_hex(b"".join(bytes.fromhex(m) for m in md5s)) + f"-{len(md5s)}"


@dataclass(slots=True)
class KeyModel:
    states: set[State] = field(default_factory=lambda: {None})
    # unknown outcomes that might still land later: (generation when the request ended, its result)
    floating: list[tuple[int, State]] = field(default_factory=list)
    history: list[str] = field(default_factory=list)


@dataclass(slots=True)
class UploadModel:
    key: str
    status: str  # "open" (created, acknowledged), "maybe" (a Complete/Abort with unknown outcome), "closed"


class Model:
    """The acceptable final states of every key, and the multipart uploads that may still be open."""

    def __init__(self, keys: Iterable[str], *, unknown_may_land_late: bool = False) -> None:
        self._late = unknown_may_land_late
        self._lock = threading.Lock()
        self.keys: dict[str, KeyModel] = {k: KeyModel() for k in keys}
        self.uploads: dict[str, UploadModel] = {}
        self.unknown_creates: collections.Counter[str] = collections.Counter()

    def acked(self, key: str, state: State, gen_start: int, what: str) -> None:
        with self._lock:
            km = self.keys[key]
            km.floating = [(g, s) for g, s in km.floating if self._late or g >= gen_start]
            km.states = {state} | {s for _, s in km.floating}
            km.history.append(f"ack {what} -> {show(state)} (gen {gen_start})")

    def unknown(self, key: str, state: State, gen_end: int, what: str) -> None:
        with self._lock:
            km = self.keys[key]
            km.floating.append((gen_end, state))
            km.states.add(state)
            km.history.append(f"unknown {what} -> {show(state)} (gen <= {gen_end})")

    def upload(self, upload_id: str, key: str, status: str) -> None:
        with self._lock:
            self.uploads[upload_id] = UploadModel(key, status)

    def unknown_create(self, key: str) -> None:
        with self._lock:
            self.unknown_creates[key] += 1

    def upload_allowed(self, upload_id: str, key: str, unknown_seen: collections.Counter[str]) -> bool:
        """May this upload still be open? An upload id we never learnt counts against the key's unknown
        CreateMultipartUploads (``unknown_seen`` tallies those already matched)."""
        with self._lock:
            up = self.uploads.get(upload_id)
            if up is not None:
                return up.key == key and up.status != "closed"
            unknown_seen[key] += 1
            return unknown_seen[key] <= self.unknown_creates[key]


# --- the S3 client -----------------------------------------------------------------------------------------


class Refused(Exception):
    """The connection was refused (or not established): nothing was sent."""


class GatewayGone(Exception):
    """The gateway could not be started again: the workload stops."""


class GatewayStartFailed(RuntimeError):
    """``s3lanes serve`` exited (or did not become ready) during start-up; carries its log tail."""


class Unknown(Exception):
    """The request may have reached the gateway, but no complete answer came back."""

    def __init__(self, reason: str, *, timeout: bool) -> None:
        super().__init__(reason)
        self.timeout = timeout


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def error_code(self) -> str:
        match = re.search(rb"<Code>([^<]*)</Code>", self.body)
        return match.group(1).decode() if match else ""

    def describe(self) -> str:
        return f"{self.status} {self.error_code or self.body[:200]!r}"


class _LiteralS3Auth(botocore.auth.SigV4Auth):  # type: ignore[misc]
    """SigV4 as S3 computes it: no path normalisation; x-amz-content-sha256 signed as given."""

    def _normalize_url_path(self, path: str) -> str:
        return path


def key_path(bucket: str, key: str | None = None) -> str:
    path = "/" + urllib.parse.quote(bucket, safe="~")
    if key is not None:
        path += "/" + urllib.parse.quote(key, safe="/~")
    return path


class S3Client:
    """One signed request per fresh connection; no retries, no redirects, no added headers."""

    def __init__(
        self, endpoint_url: str, access_key: str, secret_key: str, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        assert endpoint_url.startswith("http://"), endpoint_url
        self.endpoint = Endpoint.from_url(endpoint_url)
        self._creds = Credentials(access_key, secret_key)
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        query: str = "",
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> Reply:
        target = path + ("?" + query if query else "")
        hdrs = {"Host": self.endpoint.netloc, **(headers or {})}
        if body or method in ("PUT", "POST"):
            hdrs["Content-Length"] = str(len(body))
        hdrs["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
        req = AWSRequest(method=method, url=f"http://{self.endpoint.netloc}{target}", headers=hdrs)
        _LiteralS3Auth(self._creds, "s3", REGION).add_auth(req)
        hdrs = dict(req.headers.items())
        conn = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=self.timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise Refused(repr(exc)) from exc
            try:
                conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in hdrs.items():
                    conn.putheader(name, value)
                conn.endheaders()
                view = memoryview(body)
                for start in range(0, len(view), SEND_CHUNK_BYTES):
                    conn.send(view[start : start + SEND_CHUNK_BYTES])
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise Unknown(repr(exc), timeout=isinstance(exc, TimeoutError)) from exc
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        finally:
            conn.close()


# --- the workload ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    size: int
    seed: str


@dataclass(frozen=True, slots=True)
class Multipart:
    key: str
    part_sizes: tuple[int, ...]
    seed: str
    abort: bool  # abort instead of completing


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class DeleteMany:
    keys: tuple[str, ...]


Op = Put | Multipart | Delete | DeleteMany


def worker_keys(worker: int, count: int) -> list[str]:
    """A worker's keys: plain files in one checkpoint directory and its commit marker (drained last)."""
    keys = [f"ckpt/w{worker}/shard-{i}.bin" for i in range(count - 1)]
    keys.append(f"ckpt/w{worker}/.metadata")
    return keys


def next_op(rng: random.Random, keys: list[str], seed: str) -> Op:
    key = rng.choice(keys)
    r = rng.random()
    if r < 0.55:
        sizes, weights = zip(*PUT_SIZES, strict=True)
        return Put(key, rng.choices(sizes, weights)[0], seed)
    if r < 0.70:
        return Multipart(key, rng.choice(MULTIPART_LAYOUTS), seed, abort=rng.random() < 0.25)
    if r < 0.88:
        return Delete(key)
    return DeleteMany(tuple(rng.sample(keys, rng.randint(2, min(4, len(keys))))))


@dataclass(slots=True)
class Stats:
    ops: int = 0
    acked: int = 0
    unknown: int = 0
    refused: int = 0  # refused connects, each followed by a resend
    kills: int = 0
    kills_by_mode: collections.Counter[str] = field(default_factory=collections.Counter)
    ops_by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    acked_bytes: int = 0
    checks: int = 0  # checks of the store between kills (check_each_kill)
    restart_s: list[float] = field(default_factory=list)


class Harness:
    """What the workers and the killer share: is the gateway up, its generation, big uploads on the wire."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.gen = 0
        self.stop = threading.Event()
        self.gone = threading.Event()  # the gateway will not come back
        self.stats = Stats()
        self.anomalies: list[str] = []
        self._lock = threading.Lock()
        self._big = 0
        self.gate = threading.Event()  # cleared: workers start no new operation (a check is running)
        self.gate.set()
        self._active = 0  # operations under way

    def note(self, text: str) -> None:
        with self._lock:
            self.anomalies.append(text)

    def count_op(self, kind: str) -> None:
        with self._lock:
            self.stats.ops += 1
            self.stats.ops_by_kind[kind] += 1

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    @contextlib.contextmanager
    def big_upload(self, nbytes: int) -> Iterator[None]:
        big = nbytes >= BIG_BODY_BYTES
        if big:
            with self._lock:
                self._big += 1
        try:
            yield
        finally:
            if big:
                with self._lock:
                    self._big -= 1

    @property
    def big_in_flight(self) -> bool:
        return self._big > 0

    def enter(self) -> bool:
        """A worker about to start an operation: waits while paused. False once the run stops."""
        while not self.stop.is_set():
            if self.gate.wait(0.1):
                with self._lock:
                    if self.gate.is_set():
                        self._active += 1
                        return True
        return False

    def leave(self) -> None:
        with self._lock:
            self._active -= 1

    def pause(self, timeout_s: float = REQUEST_TIMEOUT_S * 4) -> bool:
        """Stop the workers between operations; True once none is under way."""
        self.gate.clear()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._active == 0:
                    return True
            time.sleep(0.01)
        return False

    def resume(self) -> None:
        self.gate.set()


@dataclass(frozen=True, slots=True)
class Outcome:
    reply: Reply | None  # None: unknown
    gen_start: int
    gen_end: int
    reason: str = ""


class Worker(threading.Thread):
    def __init__(
        self,
        harness: Harness,
        model: Model,
        client: S3Client,
        bucket: str,
        keys: list[str],
        seed: int,
        index: int,
    ) -> None:
        super().__init__(name=f"crash-worker-{index}", daemon=True)
        self.h = harness
        self.model = model
        self.client = client
        self.bucket = bucket
        self.keys = keys
        self.rng = random.Random(f"{seed}-worker-{index}")
        self.index = index
        self.n = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.h.enter():
                try:
                    self.n += 1
                    op = next_op(self.rng, self.keys, f"{self.index}-{self.n}")
                    self.execute(op)
                    self.h.count_op(type(op).__name__)
                finally:
                    self.h.leave()
        except GatewayGone:
            pass
        except BaseException as exc:  # reported by the harness; a worker must not die silently
            self.error = exc

    # -- sending ---------------------------------------------------------------------------------------------

    def call(
        self, method: str, key: str | None, query: str = "", body: bytes = b"", **headers: str
    ) -> Outcome:
        """Send; while the connection is refused, wait for the gateway to come back and send again."""
        while True:
            if not self.h.up.wait(UP_WAIT_TIMEOUT_S):
                raise RuntimeError(f"the gateway was not back within {UP_WAIT_TIMEOUT_S} s")
            if self.h.gone.is_set():
                raise GatewayGone()
            gen_start = self.h.gen
            try:
                with self.h.big_upload(len(body)):
                    reply = self.client.request(method, key_path(self.bucket, key), query, body, headers)
            except Refused:
                self.h.count(refused=1)
                time.sleep(0.01)
                continue
            except Unknown as exc:
                if exc.timeout:
                    self.h.note(f"{method} {key} {query}: timed out after {self.client.timeout_s} s")
                return Outcome(None, gen_start, self.h.gen, str(exc))
            return Outcome(reply, gen_start, self.h.gen)

    def unexpected(self, what: str, reply: Reply) -> None:
        self.h.note(f"{what}: unexpected answer {reply.describe()}")

    # -- operations ------------------------------------------------------------------------------------------

    def execute(self, op: Op) -> None:
        if isinstance(op, Put):
            self.put(op)
        elif isinstance(op, Multipart):
            self.multipart(op)
        elif isinstance(op, Delete):
            self.delete(op)
        else:
            self.delete_many(op)

    def settle(self, key: str, state: State, out: Outcome, what: str, ok: bool) -> None:
        if ok:
            self.model.acked(key, state, out.gen_start, what)
            self.h.count(acked=1, acked_bytes=state.size if state is not None else 0)
        else:
            self.model.unknown(key, state, out.gen_end, what)
            self.h.count(unknown=1)

    def put(self, op: Put) -> None:
        body = payload(f"put-{op.seed}", op.size)
        value = Value.of(body)
        md5 = md5_hex(body)
        md5_b64 = base64.b64encode(bytes.fromhex(md5)).decode()
        what = f"PUT {op.key} {value}"
        headers = {"Content-MD5": md5_b64, "Content-Type": "application/x-ckpt"}
        out = self.call("PUT", op.key, "", body, **headers)
        reply = out.reply
        if reply is not None and reply.status == 200:
            if reply.headers.get("etag", "").strip('"') != md5:
                self.h.note(f"{what}: acknowledged with ETag {reply.headers.get('etag')}, not {md5}")
            self.settle(op.key, value, out, what, True)
            return
        if reply is not None:
            self.unexpected(what, reply)
        self.settle(op.key, value, out, what, False)

    def multipart(self, op: Multipart) -> None:
        key = op.key
        out = self.call("POST", key, "uploads=", b"", **{"Content-Type": "application/x-ckpt"})
        reply = out.reply
        match = re.search(rb"<UploadId>([^<]+)</UploadId>", reply.body) if reply is not None else None
        if reply is None or reply.status != 200 or match is None:
            if reply is not None:
                self.unexpected(f"CreateMultipartUpload {key}", reply)
            self.model.unknown_create(key)  # it may exist, under an id we never learnt
            self.h.count(unknown=1)
            return
        upload_id = match.group(1).decode()
        self.model.upload(upload_id, key, "open")
        qid = urllib.parse.quote(upload_id, safe="")
        parts = [payload(f"mpu-{op.seed}-{n}", size) for n, size in enumerate(op.part_sizes, start=1)]
        md5s = [md5_hex(p) for p in parts]
        for number, (body, md5) in enumerate(zip(parts, md5s, strict=True), start=1):
            out = self.call("PUT", key, f"partNumber={number}&uploadId={qid}", body)
            reply = out.reply
            if reply is not None and reply.status == 200:
                if reply.headers.get("etag", "").strip('"') != md5:
                    self.h.note(f"UploadPart {key} #{number}: ETag {reply.headers.get('etag')}, not {md5}")
                continue
            if reply is not None:
                self.unexpected(f"UploadPart {key} #{number} ({upload_id})", reply)
            self.abort(key, upload_id)  # a client that lost a part gives the upload up
            self.h.count(unknown=1)
            return
        if op.abort:
            if self.abort(key, upload_id):
                self.h.count(acked=1)
            else:
                self.h.count(unknown=1)
            return
        xml = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{m}&quot;</ETag></Part>"
            for n, m in enumerate(md5s, start=1)
        )
        body = f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode()
        value = Value.of(b"".join(parts))
        what = f"CompleteMultipartUpload {key} {value} ({len(parts)} parts)"
        out = self.call("POST", key, f"uploadId={qid}", body, **{"Content-Type": "application/xml"})
        reply = out.reply
        if reply is not None and reply.status == 200 and b"<Error>" not in reply.body:
            etag = re.search(rb"<ETag>([^<]+)</ETag>", reply.body)
            want = multipart_etag(md5s)
            got = etag.group(1).decode().replace("&quot;", "").strip('"') if etag else ""
            if got != want:
                self.h.note(f"{what}: acknowledged with ETag {got!r}, not {want!r}")
            self.model.upload(upload_id, key, "closed")
            self.settle(key, value, out, what, True)
            return
        if reply is not None:
            self.unexpected(what, reply)
        self.model.upload(upload_id, key, "maybe")
        self.settle(key, value, out, what, False)

    def abort(self, key: str, upload_id: str) -> bool:
        """AbortMultipartUpload; True if acknowledged."""
        qid = urllib.parse.quote(upload_id, safe="")
        out = self.call("DELETE", key, f"uploadId={qid}")
        reply = out.reply
        if reply is not None and reply.status in (200, 204):
            self.model.upload(upload_id, key, "closed")
            return True
        if reply is not None:
            self.unexpected(f"AbortMultipartUpload {key} ({upload_id})", reply)
        self.model.upload(upload_id, key, "maybe")
        return False

    def delete(self, op: Delete) -> None:
        what = f"DELETE {op.key}"
        out = self.call("DELETE", op.key)
        reply = out.reply
        ok = reply is not None and reply.status in (200, 204)
        if reply is not None and not ok:
            self.unexpected(what, reply)
        self.settle(op.key, None, out, what, ok)

    def delete_many(self, op: DeleteMany) -> None:
        objects = "".join(f"<Object><Key>{escape(k)}</Key></Object>" for k in op.keys)
        body = f"<Delete><Quiet>false</Quiet>{objects}</Delete>".encode()
        md5_b64 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        what = f"DeleteObjects {list(op.keys)}"
        out = self.call(
            "POST", None, "delete=", body, **{"Content-MD5": md5_b64, "Content-Type": "application/xml"}
        )
        reply = out.reply
        deleted: set[str] = set()
        if reply is not None and reply.status == 200:
            try:
                root = ET.fromstring(reply.body)
            except ET.ParseError:
                root = None
                self.unexpected(what, reply)
            for el in root if root is not None else ():
                tag = el.tag.removeprefix(S3_NS)
                k = el.findtext(f"{S3_NS}Key") or el.findtext("Key") or ""
                if tag == "Deleted":
                    deleted.add(k)
                elif tag == "Error":
                    self.h.note(f"{what}: {k}: {ET.tostring(el)[:300]!r}")
        elif reply is not None:
            self.unexpected(what, reply)
        for k in op.keys:
            if reply is not None and reply.status == 200 and k not in deleted:
                self.h.note(f"{what}: the answer does not list {k} as deleted")
            self.settle(k, None, out, f"{what}[{k}]", k in deleted)


# --- the gateway process -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def crash_gateway_toml(
    *,
    port: int,
    state_dir: Path,
    backend_endpoint: str,
    access_key: str,
    secret_key: str,
    bandwidth: str = "20MB/s",
    journal_compact: str = "32KiB",
    fence_s: float | None = None,
    workers: int = 1,
) -> str:
    """A gateway on a fixed port whose spool drains slowly (bandwidth) and compacts its journal often;
    ``workers`` > 1: a supervisor and that many worker processes, worker 0 owning the spool."""
    return f"""
{server_toml(state_dir, log_level="INFO", listen=f"127.0.0.1:{port}")}workers = {workers}

[backend]
endpoint = "{backend_endpoint}"
region = "{REGION}"
bandwidth = "{bandwidth}"
connect_timeout_s = 2
read_timeout_s = 30

[spool]
retry_base_s = 0.2
retry_max_s = 2
journal_compact_bytes = "{journal_compact}"
{"" if fence_s is None else f"fence_s = {fence_s}"}

[[credentials]]
access_key = "{access_key}"
secret_key = "{secret_key}"
"""


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux: /proc/<pid>/task/*/children; elsewhere none)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                found.extend(int(x) for x in fh.read().split())
    return found


class GatewayProcess:
    """``s3lanes serve`` as a subprocess, started again and again on the same config (each run gets its own
    directory for the ready file and the log, so no log is overwritten)."""

    def __init__(self, work_dir: Path, config_toml: str, *, cwd: Path | None = None) -> None:
        self.work_dir = work_dir
        self.config_path = work_dir / "s3lanes.toml"
        work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config_toml)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self._ready: Path | None = None
        self.endpoint_url = ""

    def spawn(self) -> None:
        run_dir = self.work_dir / f"run-{len(self.logs):04d}"
        run_dir.mkdir()
        self._ready = run_dir / "ready.json"
        log_path = run_dir / "gateway.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as log_fh:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "s3lanes",
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--ready-file",
                    str(self._ready),
                ],
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches the driver only; it stops the gateway itself
                cwd=self.cwd,
            )

    def wait_ready(self, timeout_s: float = GATEWAY_START_TIMEOUT_S) -> None:
        assert self.proc is not None and self._ready is not None
        deadline = time.monotonic() + timeout_s
        while not self._ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                text = self.logs[-1].read_text(errors="replace")
                errors = re.findall(r"^\w*(?:Error|Exception|Corrupt)\b.*$", text, re.MULTILINE)
                first = errors[-1] if errors else "no exception in the log"
                raise GatewayStartFailed(
                    f"{first} (exit code {self.proc.returncode}; {self.logs[-1]}):\n{text[-2000:]}"
                )
            time.sleep(READY_POLL_S)
        doc = json.loads(self._ready.read_text())
        self.endpoint_url = next(u for u in doc["endpoints"] if u.startswith("http://"))

    @property
    def ready(self) -> bool:
        return self._ready is not None and self._ready.exists()

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def kill(self) -> None:
        """SIGKILL (by pid) and reap. With several workers, the supervisor and the workers (the pids the
        kernel lists as its children) all die at once, rather than the workers being asked to stop when
        their supervisor goes."""
        if self.proc is not None and self.proc.poll() is None:
            # Stopped first, all of them (the supervisor first, so it restarts nobody): no worker answers
            # anything once another one is gone, as in a power cut; then killed.
            self.proc.send_signal(signal.SIGSTOP)
            children = _children(self.proc.pid)
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, SIGKILL after ``timeout_s``; the exit code (None if never started)."""
        return None if self.proc is None else stop_process(self.proc, timeout_s)


# --- the run -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CrashConfig:
    ops: int = 200  # at least this many operations
    kills: int = 30  # at least this many SIGKILLs
    workers: int = 3
    keys_per_worker: int = 7
    seed: int = 1
    max_kill_phase_s: float = 150.0  # the workload stops here even if the counts were not reached
    flush_timeout_s: float = 120.0
    stall: bool = False  # every kill while the store is frozen (run_crash's stall_store does it)
    stall_min_s: float = 2.0
    stall_max_s: float = 6.0
    # The gateway's [spool] fence_s (None: its default, [backend] read_timeout_s = 30 s here). A loopback
    # SeaweedFS applies what it received within milliseconds once it runs; 30 s fences, chained through
    # commit markers, would only stretch the final flush of a run that kills every second.
    fence_s: float | None = 5.0
    check_each_kill: bool = False  # after every kill: pause, flush, compare the store with the model
    gateway_workers: int = 1  # [server] workers of the gateway (every kill takes all of them down)


@dataclass(slots=True)
class RecoveryStats:
    incarnations: int = 0
    recovery_lines: int = 0
    with_pending: int = 0  # recoveries that found acknowledged data still to drain
    max_entries: int = 0
    max_uploads: int = 0
    torn_tails: int = 0
    torn_bytes: int = 0
    orphans_removed: int = 0
    lost: int = 0
    compactions: int = 0
    drain_failures: int = 0
    in_doubt_keys: int = 0  # keys found in doubt by recoveries, summed
    fence_reapplies: int = 0  # newest states applied again after a fence found an older one


@dataclass(slots=True)
class CrashReport:
    stats: Stats
    recovery: RecoveryStats
    problems: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    kill_phase_s: float = 0.0
    flush_s: float = 0.0
    total_s: float = 0.0
    keys_present: int = 0
    keys_ambiguous: int = 0  # keys whose model allowed more than one final state

    @property
    def ok(self) -> bool:
        return not self.problems and not self.anomalies

    def summary(self) -> str:
        s, r = self.stats, self.recovery
        restart = sorted(s.restart_s)
        median = restart[len(restart) // 2] if restart else 0.0
        lines = [
            f"operations: {s.ops} ({', '.join(f'{k} {v}' for k, v in sorted(s.ops_by_kind.items()))})",
            f"  per key: acknowledged {s.acked} ({s.acked_bytes / MiB:.0f} MiB of object data), outcome"
            f" unknown {s.unknown}; refused connects resent {s.refused}",
            f"kills: {s.kills} ({', '.join(f'{k} {v}' for k, v in sorted(s.kills_by_mode.items())) or '-'}),"
            f" restart to ready median {median:.2f} s"
            + (f"; store checked after {s.checks} of them (flush, then every key)" if s.checks else ""),
            f"recovery: {r.recovery_lines} recovery lines in {r.incarnations} gateway logs;"
            f" {r.with_pending} found data to drain (max {r.max_entries} objects,"
            f" {r.max_uploads} open uploads)",
            f"  torn journal tails {r.torn_tails} ({r.torn_bytes} bytes); unacknowledged files removed"
            f" {r.orphans_removed}; entries lost {r.lost}; journal compactions {r.compactions};"
            f" failed drain attempts logged {r.drain_failures}",
            f"  keys in doubt at recovery {r.in_doubt_keys}; fence re-applies {r.fence_reapplies}",
            f"final: {self.keys_present} keys present on the backend; {self.keys_ambiguous} keys had more"
            " than one acceptable state",
            f"time: kill phase {self.kill_phase_s:.1f} s, final flush {self.flush_s:.1f} s, total"
            f" {self.total_s:.1f} s",
        ]
        for title, items in (("PROBLEMS", self.problems), ("ANOMALIES (unexpected answers)", self.anomalies)):
            if items:
                lines.append(f"{title}: {len(items)}")
                lines.extend(f"  - {p}" for p in items[:50])
        lines.append("verdict: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


def read_recovery(logs: list[Path]) -> tuple[RecoveryStats, list[str]]:
    """Recovery statistics from the gateway logs, and what is wrong in them."""
    stats = RecoveryStats(incarnations=len(logs))
    problems: list[str] = []
    for n, path in enumerate(logs):
        text = path.read_text(errors="replace") if path.exists() else ""
        if "Traceback" in text:
            start = text.index("Traceback")
            excerpt = text[max(0, start - 500) : start + 3000]
            problems.append(f"gateway log {path} has a traceback:\n{excerpt}")
        for line in text.splitlines():
            if " CRITICAL " in line or " ERROR " in line:
                problems.append(f"gateway log {path.parent.name}: {line}")
        stats.compactions += text.count("journal compacted")
        stats.drain_failures += len(re.findall(r"drain of .* failed", text))
        stats.in_doubt_keys += sum(int(n) for n in IN_DOUBT_RE.findall(text))
        stats.fence_reapplies += text.count("applying the newest state again")
        matches = list(RECOVERY_RE.finditer(text))
        stats.recovery_lines += len(matches)
        ready = "serving S3 on" in text
        if ready and not matches:
            problems.append(f"gateway log {path.parent.name} (run {n}) served without a recovery line")
        for m in matches:
            entries = int(m["entries"])
            stats.with_pending += entries > 0 or int(m["uploads"]) > 0
            stats.max_entries = max(stats.max_entries, entries)
            stats.max_uploads = max(stats.max_uploads, int(m["uploads"]))
            if m["torn"]:
                stats.torn_tails += 1
                stats.torn_bytes += int(m["torn"])
            stats.orphans_removed += int(m["orphans"])
            stats.lost += int(m["lost"] or 0)
    return stats, problems


KILL_MODES: tuple[tuple[str, int], ...] = (("soon", 40), ("big-upload", 30), ("later", 30))
RECOVERY_KILL_P = 0.15  # after a restart, the chance of killing the new process again during its start-up


STALL_RESUME_BEFORE_P = 0.5  # stall mode: the share of kills after which the store resumes before the restart


def _stall_kill(
    gw: GatewayProcess,
    h: Harness,
    cfg: CrashConfig,
    rng: random.Random,
    stall_store: Callable[[bool], None],
) -> str:
    """Freeze the store, let drains put requests on the wire into it, SIGKILL and restart the gateway,
    resume the store before or after the restart (the restarted gateway then sends newer states into the
    still frozen store). The store is resumed whatever happens. The kill mode, for the statistics."""
    stall_s = rng.uniform(cfg.stall_min_s, cfg.stall_max_s)
    before = rng.random() < STALL_RESUME_BEFORE_P
    stall_store(True)
    frozen_at = time.monotonic()
    try:
        time.sleep(rng.uniform(0.2, min(1.5, stall_s / 2)))
        h.up.clear()
        killed_at = time.monotonic()
        gw.kill()
        h.gen += 1
        if before:
            time.sleep(rng.uniform(0.0, 0.2))
            stall_store(False)
        gw.spawn()
        gw.wait_ready()
        h.stats.restart_s.append(time.monotonic() - killed_at)
        h.up.set()
        if not before:
            time.sleep(max(0.0, stall_s - (time.monotonic() - frozen_at)))
    finally:
        stall_store(False)
    return "stall-resume-before-restart" if before else "stall-resume-after-restart"


def _kill_loop(
    gw: GatewayProcess,
    h: Harness,
    workers: list[Worker],
    cfg: CrashConfig,
    rng: random.Random,
    say: Callable[[str], None],
    stall_store: Callable[[bool], None] | None = None,
    check: Callable[[], None] | None = None,
) -> None:
    """SIGKILL and restart the gateway until both counts are reached (or the time is up)."""
    deadline = time.monotonic() + cfg.max_kill_phase_s
    modes, weights = zip(*KILL_MODES, strict=True)
    while (h.stats.kills < cfg.kills or h.stats.ops < cfg.ops) and time.monotonic() < deadline:
        if not all(w.is_alive() for w in workers):
            return
        if h.stats.kills >= cfg.kills:  # enough kills: let the workload reach its count undisturbed
            time.sleep(0.1)
            continue
        if cfg.stall and stall_store is not None:
            mode = _stall_kill(gw, h, cfg, rng, stall_store)
            h.stats.kills += 1
            h.stats.kills_by_mode[mode] += 1
            if check is not None:
                check()
            if h.stats.kills % 10 == 0:
                elapsed = cfg.max_kill_phase_s - (deadline - time.monotonic())
                say(f"  {h.stats.kills} kills, {h.stats.ops} operations, {elapsed:.0f} s")
            time.sleep(rng.uniform(0.0, 0.5))  # the store works for a while: drains catch up
            continue
        mode = rng.choices(modes, weights)[0]
        if mode == "soon":  # 0-300 ms after the restart: first requests, resumed drains
            time.sleep(rng.uniform(0.0, 0.3))
        elif mode == "big-upload":  # while a body of 2 MiB or more is on the wire (or within 1.5 s)
            until = time.monotonic() + 1.5
            while not h.big_in_flight and time.monotonic() < until:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.05))
        else:  # later: a backlog has built up, drains are running
            time.sleep(rng.uniform(0.3, 1.5))
        h.up.clear()
        gw.kill()
        h.stats.kills += 1
        h.stats.kills_by_mode[mode] += 1
        started = time.monotonic()
        h.gen += 1
        gw.spawn()
        if rng.random() < RECOVERY_KILL_P:
            # Again, at a random point of its start-up (imports, recovery, compaction), before it listens.
            time.sleep(rng.uniform(0.05, 0.8))
            if not gw.ready:
                gw.kill()
                h.stats.kills += 1
                h.stats.kills_by_mode["during-start-up"] += 1
                h.gen += 1
                gw.spawn()
        gw.wait_ready()
        h.stats.restart_s.append(time.monotonic() - started)
        h.up.set()
        if h.stats.kills % 10 == 0:
            elapsed = cfg.max_kill_phase_s - (deadline - time.monotonic())
            say(f"  {h.stats.kills} kills, {h.stats.ops} operations, {elapsed:.0f} s")


def run_crash(
    cfg: CrashConfig,
    *,
    work_dir: Path,
    backend_endpoint: str,
    access_key: str,
    secret_key: str,
    bucket: str,
    backend: Any,
    gateway_cwd: Path | None = None,
    say: Callable[[str], None] = lambda text: None,
    stall_store: Callable[[bool], None] | None = None,
) -> CrashReport:
    """The whole crash run against ``bucket`` (which must exist and be empty). ``backend`` is a boto3 client
    straight to the store, the ground truth. Stops its gateway in every case. ``stall_store(True)`` freezes
    the store, ``stall_store(False)`` resumes it (needed by ``cfg.stall``)."""
    if cfg.stall and stall_store is None:
        raise ValueError("a stall run needs stall_store")
    began = time.monotonic()
    port = free_port()
    toml = crash_gateway_toml(
        port=port,
        state_dir=work_dir / "state",
        backend_endpoint=backend_endpoint,
        access_key=access_key,
        secret_key=secret_key,
        fence_s=cfg.fence_s,
        workers=cfg.gateway_workers,
    )
    gw = GatewayProcess(work_dir / "gateway", toml, cwd=gateway_cwd)
    h = Harness()
    keys_by_worker = [worker_keys(w, cfg.keys_per_worker) for w in range(cfg.workers)]
    model = Model((k for keys in keys_by_worker for k in keys), unknown_may_land_late=cfg.stall)
    report = CrashReport(stats=h.stats, recovery=RecoveryStats())
    store_check = StoreCheck(report, model, bucket, backend, port, cfg.flush_timeout_s, say)
    rng = random.Random(f"{cfg.seed}-killer")
    try:
        gw.start()
        h.up.set()
        url = f"http://127.0.0.1:{port}"
        client = S3Client(url, access_key, secret_key)
        workers = [
            Worker(h, model, client, bucket, keys, cfg.seed, i) for i, keys in enumerate(keys_by_worker)
        ]
        for w in workers:
            w.start()
        say(f"gateway on {url}; {cfg.workers} workers on {len(model.keys)} keys; killing")
        try:
            check = functools.partial(_check_now, store_check, h) if cfg.check_each_kill else None
            _kill_loop(gw, h, workers, cfg, rng, say, stall_store, check)
        except GatewayStartFailed as exc:
            report.problems.append(f"after kill {h.stats.kills} the gateway did not start again: {exc}")
            h.gone.set()
            h.up.set()  # release the workers waiting for it
        report.kill_phase_s = time.monotonic() - began
        h.stop.set()
        for w in workers:
            w.join(REQUEST_TIMEOUT_S * 4)
            if w.is_alive():
                report.problems.append(f"{w.name} did not finish its last operation")
            elif w.error is not None:
                report.problems.append(f"{w.name} died: {w.error!r}")
        if h.stats.kills < cfg.kills or h.stats.ops < cfg.ops:
            report.problems.append(
                f"the run stopped after {report.kill_phase_s:.0f} s with {h.stats.kills} kills and"
                f" {h.stats.ops} operations (wanted {cfg.kills} and {cfg.ops})"
            )
        if not h.gone.is_set():
            say(f"workload done: {h.stats.ops} operations, {h.stats.kills} kills; verifying")
            _verify(store_check, client)
    finally:
        h.stop.set()
        code = gw.stop()
        if code not in (0, None) and not h.gone.is_set():
            report.problems.append(f"the gateway exited with {code} on SIGTERM")
        recovery, log_problems = read_recovery(gw.logs)
        report.recovery = recovery
        report.problems.extend(log_problems)
        if recovery.lost:
            report.problems.append(f"recovery reported {recovery.lost} acknowledged entries LOST")
        report.anomalies = list(h.anomalies)
        report.total_s = time.monotonic() - began
    return report


CHECK_AGAIN_AFTER_S = 1.0
SLOW_CHECK_S = 20.0  # a state put back late shows only once the store applied the old request


@dataclass(frozen=True, slots=True)
class StoreCheck:
    """What comparing the store with the model takes, between kills (:func:`_check_now`) and at the end
    (:func:`_verify`): the report the problems go to, the gateway's port to flush, the store's client."""

    report: CrashReport
    model: Model
    bucket: str
    backend: Any
    port: int
    flush_timeout_s: float
    say: Callable[[str], None]


def _check_now(c: StoreCheck, h: Harness) -> None:
    """Between kills: pause the workers, flush, and check that the store holds an acceptable state of every
    key (twice, the second time a moment later) and no drain upload, then let the workers go on."""
    report, model, bucket, backend, say = c.report, c.model, c.bucket, c.backend, c.say
    began = time.monotonic()
    if not h.pause():
        report.problems.append(f"after kill {h.stats.kills}: the workers did not pause")
        h.resume()
        return
    paused_s = time.monotonic() - began
    try:
        flushed = flush(c.port, bucket, c.flush_timeout_s)
        flush_s = time.monotonic() - began - paused_s
        if paused_s + flush_s > SLOW_CHECK_S:
            say(f"  after kill {h.stats.kills}: workers paused after {paused_s:.1f} s, flush {flush_s:.1f} s")
        if not flushed.get("durable"):
            report.problems.append(f"after kill {h.stats.kills}: flush did not answer durable: {flushed}")
            return
        h.stats.checks += 1
        for look in range(2):
            if look:
                time.sleep(CHECK_AGAIN_AFTER_S)
            for key, km in model.keys.items():
                state = _backend_state(backend, bucket, key)
                if state not in km.states:
                    acceptable = ", ".join(sorted(show(s) for s in km.states))
                    report.problems.append(
                        f"after kill {h.stats.kills} (flush durable, look {look + 1}): {key}: the store holds"
                        f" {show(state)}; acceptable {{{acceptable}}}; " + " | ".join(km.history[-6:])
                    )
            uploads = [
                u
                for u in backend.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
                if not any(u["UploadId"] in p for p in report.problems)  # each one reported once
            ]
            if uploads:
                report.problems.append(
                    f"after kill {h.stats.kills} (flush durable, look {look + 1}): {len(uploads)} multipart"
                    f" uploads on the store: " + "; ".join(f"{u['Key']} {u['UploadId']}" for u in uploads[:5])
                )
        if report.problems:
            say(f"  after kill {h.stats.kills}: {len(report.problems)} problems so far")
    finally:
        h.resume()


def _gateway_view(client: S3Client, bucket: str, key: str) -> State | str:
    """A key's state as the gateway serves it, or why it could not be read."""
    try:
        reply = client.request("GET", key_path(bucket, key))
    except (Refused, Unknown) as exc:
        return f"GET {key} through the gateway failed: {exc}"
    if reply.status == 200:
        return Value.of(reply.body)
    if reply.status == 404 and reply.error_code == "NoSuchKey":
        return None
    return f"GET {key} through the gateway: {reply.describe()}"


def _backend_state(backend: Any, bucket: str, key: str) -> State:
    from botocore.exceptions import ClientError

    try:
        obj = backend.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    return Value.of(obj["Body"].read())


def _verify(c: StoreCheck, client: S3Client) -> None:
    report, model, bucket, backend, say = c.report, c.model, c.bucket, c.backend, c.say
    problems = report.problems

    def explain(key: str) -> str:
        km = model.keys[key]
        acceptable = ", ".join(sorted(show(s) for s in km.states))
        return f"acceptable: {{{acceptable}}}; history: " + " | ".join(km.history[-8:])

    # 1. What the recovered gateway serves (from its spool, or the backend for drained keys).
    view: dict[str, State] = {}
    for key, km in model.keys.items():
        got = _gateway_view(client, bucket, key)
        if isinstance(got, str):
            problems.append(got)
            continue
        view[key] = got
        if got not in km.states:
            problems.append(f"{key}: the gateway serves {show(got)}; {explain(key)}")
        report.keys_ambiguous += len(km.states) > 1

    # 2. Flush, then the backend must hold exactly the view.
    started = time.monotonic()
    flushed = flush(c.port, bucket, c.flush_timeout_s)
    report.flush_s = time.monotonic() - started
    say(f"flush: {flushed} after {report.flush_s:.1f} s")
    if not flushed.get("durable"):
        problems.append(f"flush did not report the bucket durable: {flushed}")
    on_backend: set[str] = set()
    for page in backend.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        on_backend.update(o["Key"] for o in page.get("Contents", []))
    for extra in sorted(on_backend - set(model.keys)):
        problems.append(f"the backend holds a key nobody wrote: {extra}")
    for key, km in model.keys.items():
        state = _backend_state(backend, bucket, key)
        report.keys_present += state is not None
        if state not in km.states:
            problems.append(f"{key}: the backend holds {show(state)}; {explain(key)}")
        elif key in view and state != view[key]:
            problems.append(
                f"{key}: the backend holds {show(state)} but the gateway served {show(view[key])} before the"
                f" flush; {explain(key)}"
            )
    # 3. No multipart upload is left behind. The client's uploads were all spooled, so whatever the backend
    # lists now (the drainer is idle for the bucket after the flush) was left there by the drainer. What the
    # gateway lists beyond that is its spool's open uploads: each must be one the client may not have closed.
    leftovers: dict[str, str] = {}
    for page in backend.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for up in page.get("Uploads", []):
            leftovers[up["UploadId"]] = f"{up['Key']} (initiated {up.get('Initiated')})"
    # A kill between a drain's CreateMultipartUpload and the journal record of its id leaves an open intent
    # in the journal, from which the next start finds and aborts that upload (docs/spool.md): none may be
    # left once the flush has answered.
    described = "; ".join(f"{where} {uid}" for uid, where in list(leftovers.items())[:8])
    if leftovers:
        problems.append(f"{len(leftovers)} multipart uploads left behind on the backend: {described}")
    try:
        reply = client.request("GET", key_path(bucket), "uploads=")
        listed = _uploads_in(reply.body) if reply.status == 200 else []
        if reply.status != 200:
            problems.append(f"ListMultipartUploads through the gateway: {reply.describe()}")
    except (Refused, Unknown) as exc:
        problems.append(f"ListMultipartUploads through the gateway failed: {exc}")
        listed = []
    seen: collections.Counter[str] = collections.Counter()
    for key, upload_id in listed:
        if upload_id in leftovers:
            continue
        if not model.upload_allowed(upload_id, key, seen):
            problems.append(f"the gateway holds an upload that was completed or aborted: {key} {upload_id}")
        with contextlib.suppress(Refused, Unknown):  # clean up (the spool would keep it for days)
            qid = urllib.parse.quote(upload_id, safe="")
            client.request("DELETE", key_path(bucket, key), "uploadId=" + qid)


def _uploads_in(body: bytes) -> list[tuple[str, str]]:
    root = ET.fromstring(body)
    out = []
    for up in root.iter(f"{S3_NS}Upload"):
        out.append((up.findtext(f"{S3_NS}Key") or "", up.findtext(f"{S3_NS}UploadId") or ""))
    for up in root.iter("Upload"):  # an answer without the namespace
        out.append((up.findtext("Key") or "", up.findtext("UploadId") or ""))
    return out


def flush(port: int, bucket: str, timeout_s: float, prefix: str = "") -> dict[str, Any]:
    """``POST /_s3lanes/flush`` (unsigned: a loopback peer); the JSON answer plus its HTTP ``status``."""
    query = urllib.parse.urlencode({"bucket": bucket, "prefix": prefix, "timeout": str(timeout_s)})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s + 30)
    try:
        conn.request("POST", f"/_s3lanes/flush?{query}", headers={"Content-Length": "0"})
        resp = conn.getresponse()
        doc: dict[str, Any] = json.loads(resp.read())
        doc["status"] = resp.status
        return doc
    finally:
        conn.close()
