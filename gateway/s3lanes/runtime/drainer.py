"""The drainer: uploads spooled entries to the backend through their lane, in the order the spool allows.

A single loop asks :meth:`SpoolState.drainable` for work whenever something changes (an ack, a finished
upload, a retry time reached) and runs up to ``drain_concurrency`` uploads at once. Each upload pays its
lane like any client request (request cost, then body bytes chunk by chunk through a
:class:`~s3lanes.runtime.dispatcher.StreamBudget`), so the scheduler's read share and write cap apply to
drains exactly as to write-through traffic.

An object the client wrote in one PUT is uploaded in one PUT with Content-MD5; one the client wrote as a
multipart upload is uploaded as a multipart upload with the client's own part boundaries, so the backend
computes the same ETag the gateway acknowledged. The backend's ETag is checked; only after it matches is the
entry marked done in the journal, and only then are its files freed. Failures retry with capped exponential
backoff and jitter, forever: acknowledged data is never given up. An upload whose entry is superseded while
in flight (overwrite or DELETE acknowledged meanwhile) is cancelled; a multipart one is aborted.

Fencing: before a request that completes an object goes out, the journal records that the key may have a
request on the wire. A key whose such request may still be applied by the store (after a crash, or when
no answer came) is *in doubt*: once the newest state of it is applied, the drainer waits ``fence_s``, reads
the key back (HEAD) and applies the newest state again until the store shows it; only then is it done.

A file body goes to a plain-TCP store with ``sendfile(2)``, each granted piece straight from the spool file
into the connection's socket (:class:`SpoolFileBody`); over TLS, or with ``[server] zero_copy_min_bytes =
0``, it is read and written through the connection as usual. Either way the same pieces are granted first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import functools
import html
import logging
import os
import random
import re
import socket
import types
import xml.etree.ElementTree as ET
from collections.abc import AsyncGenerator, Iterator, Mapping
from xml.sax.saxutils import escape

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from s3lanes.clock import Clock
from s3lanes.config import Credential, SpoolConfig
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD
from s3lanes.core.spool_state import Entry, EntryState
from s3lanes.core.uri import s3_quote
from s3lanes.errors import S3Error
from s3lanes.metrics import Metrics
from s3lanes.runtime.backend import UnsentBound
from s3lanes.runtime.dispatcher import StreamBudget
from s3lanes.runtime.pools import Pools, StoreCall
from s3lanes.runtime.splice import SourceEnded, plain_socket, run_settled, send_file
from s3lanes.runtime.spool import Spool, SpoolWriteFailed

log = logging.getLogger("s3lanes.drain")

# A spool file is read (and handed to the socket) at most this much at a time, and never more than one
# scheduler chunk: a paced lane's burst at the backend's bottleneck is what one read hands the kernel, so
# reading more than a grant at once would undo a small ``[scheduler] chunk_bytes``.
READ_CHUNK_BYTES = 1024 * 1024
_UPLOAD_ID = re.compile(rb"<UploadId>([^<]+)</UploadId>")
_ETAG = re.compile(rb"<ETag>([^<]+)</ETag>")
# The warning that acknowledged data is older than [spool] max_age_s is logged at most this often.
_AGE_WARNING_INTERVAL_S = 60.0
JANITOR_INTERVAL_S = 5.0


class DrainError(Exception):
    pass


class Superseded(Exception):
    """A newer write of the key was acknowledged while this upload could still be cut short."""


# Uploads a stale intent may have created are those the store says were initiated since the intent's entry
# was acknowledged; this much slack covers the store's clock (Initiated) against ours (acked_at).
_CLOCK_SLACK_S = 120.0
# A fence whose read-back was slow (the store stalled again) waits another interval, at most this many times
# in a row: a store that is merely slow to answer a HEAD must not keep a key pending for ever.
_FENCE_SLOW_LOOKS = 3


def _listed_uploads(data: bytes) -> list[tuple[str, str, float]]:
    """(upload id, key, initiated as a Unix time) of a ListMultipartUploads answer."""
    out: list[tuple[str, str, float]] = []
    root = ET.fromstring(data)
    for up in root.iter():
        if not up.tag.endswith("Upload") or up.tag.endswith("Uploads"):
            continue
        fields = {child.tag.rsplit("}", 1)[-1]: child.text or "" for child in up}
        try:
            when = datetime.datetime.fromisoformat(
                fields.get("Initiated", "").replace("Z", "+00:00")
            ).timestamp()
        except ValueError:
            when = float("inf")  # unknown: treated as recent
        out.append((fields.get("UploadId", ""), fields.get("Key", ""), when))
    return out


async def close_body(body: object) -> None:
    """A file body cut short (error, cancellation) closes its file now, not when it is collected.

    Only a body that is not running: while aiohttp's writer task is inside the generator (awaiting the next
    grant, or closing the file after the last chunk), ``aclose()`` raises RuntimeError; that task finishes
    or is cancelled with the request, and the generator's ``finally`` closes the file then."""
    if isinstance(body, types.AsyncGeneratorType) and not body.ag_running:
        await body.aclose()


class SpoolFileBody(Payload):
    """A spool file as the body of a drain request: opened only when aiohttp writes the body, paced through
    the lane piece by piece, sent with ``sendfile(2)`` when the drainer may and the connection is plain TCP
    whose transport has nothing buffered once the request headers are out, else copied."""

    _size: int  # Payload's, known here: the file's length

    def __init__(self, drainer: Drainer, entry: Entry, file_id: str, size: int, *, commits: bool) -> None:
        super().__init__(None)
        self._size = size
        self._drainer = drainer
        self._entry = entry
        self._file_id = file_id
        self._commits = commits

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a spool file body is not text")

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        drainer = self._drainer
        size = self._size if content_length is None else min(content_length, self._size)
        sock = None
        if drainer.zero_copy and size:
            send_headers = getattr(writer, "send_headers", None)
            if send_headers is not None:
                send_headers()
                transport = writer.transport
                if transport is not None and transport.get_write_buffer_size() == 0:
                    sock = plain_socket(transport)
        if sock is not None:
            await drainer._send_file_body(
                sock.fileno(), self._entry, self._file_id, size, self._commits, sock=sock
            )
            return
        transport = writer.transport
        conn = None if transport is None else transport.get_extra_info("socket")
        body = drainer._file_body(
            self._entry,
            self._file_id,
            size,
            commits=self._commits,
            sock=conn if isinstance(conn, socket.socket) else None,
        )
        async with contextlib.aclosing(body):
            async for chunk in body:
                await writer.write(chunk)


def _norm_etag(etag: str) -> str:
    return html.unescape(etag).strip().strip('"').lower()


class Drainer:
    def __init__(
        self,
        spool: Spool,
        pools: Pools,
        credentials: Mapping[str, Credential],
        cfg: SpoolConfig,
        clock: Clock,
        metrics: Metrics,
        *,
        chunk_bytes: int,
        request_cost_bytes: int,
        lane_names: frozenset[str],
        default_lane: str = "checkpoint",
        zero_copy: bool = False,
        in_doubt_hold_s: float = 60.0,
        fence_s: float = 60.0,
    ) -> None:
        self.zero_copy = zero_copy
        self._in_doubt_hold_s = in_doubt_hold_s
        self._fence_s = fence_s
        self._lane_names = lane_names
        self._spool = spool
        self._pools = pools
        self._creds = credentials
        self._cfg = cfg
        self._clock = clock
        self._metrics = metrics
        self._chunk = chunk_bytes
        self._read_bytes = max(1, min(READ_CHUNK_BYTES, chunk_bytes))
        self._request_cost = request_cost_bytes
        self._default_lane = default_lane
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._janitor: asyncio.Task[None] | None = None
        self._janitor_at = -JANITOR_INTERVAL_S
        self._owned_uploads: set[str] = set()  # backend upload ids of multipart drains in progress
        # (bucket, key) -> CreateMultipartUploads of the drain sent and not yet answered with an id
        self._creating: dict[tuple[str, str], int] = {}
        self._intent_locks: dict[
            str, asyncio.Lock
        ] = {}  # one per drain upload intent (see _upload_multipart)
        self._abortable: set[int] = set()  # seqs whose upload may still be cut (see _cancel)
        self._in_doubt: set[int] = set()  # seqs with a completing request out and no answer yet (_drain)
        self._fencing: set[int] = set()  # seqs waiting out a fence (see _fence): they hold no drain slot
        # Stale drain uploads and intents (by upload id or intent token) -> when the store first answered
        # about them here: they are closed only once a look a fence interval later finds nothing either,
        # since an older request (a CreateMultipartUpload, a part) may still be applied (_settled).
        self._first_answer: dict[str, float] = {}
        self._closing = False
        self._last_age_warning = 0.0
        self._rng = random.Random()
        spool.on_cancel = self._cancel
        self.uploads_ok = 0
        self.uploads_failed = 0
        self.paused = False  # POST /_s3lanes/drain?pause=1 (hold): no new upload starts until resumed

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def status(self) -> dict[str, object]:
        errors = [
            {"bucket": e.bucket, "key": e.key, "attempts": e.attempts, "error": e.last_error}
            for e in self._spool.entries()
            if e.last_error
        ][:20]
        return {
            "in_flight": len(self._tasks),
            "uploads_ok": self.uploads_ok,
            "uploads_failed": self.uploads_failed,
            "failing": errors,
        }

    async def run(self) -> None:
        wakeup = self._spool.drain_wakeup
        while True:
            with contextlib.suppress(TimeoutError):
                await self._clock.wait_for(wakeup.wait(), self._next_timeout())
            wakeup.clear()
            if self._closing:
                return
            if self.paused:
                continue
            self._check_age()
            self._start_janitor()
            free = self._cfg.drain_concurrency - len(self._tasks) + len(self._fencing)
            for entry in self._spool.drainable(self._clock.monotonic(), free):
                self._spool.drain_started(entry)
                task = asyncio.create_task(self._drain(entry), name=f"drain-{entry.seq}")
                self._tasks[entry.seq] = task
                task.add_done_callback(functools.partial(self._task_done, entry=entry))

    def hold(self, paused: bool | None) -> bool:
        """Pause (True) or resume (False) draining, an operator and test switch; uploads in flight finish
        either way. Returns whether it is paused now (None: only that)."""
        if paused is not None:
            self.paused = paused
            self._spool.drain_wakeup.set()
        return self.paused

    def _task_done(self, task: asyncio.Task[None], *, entry: Entry) -> None:
        """Whatever happened to the task (even a cancel before it ran), its key is not left blocked."""
        self._tasks.pop(entry.seq, None)
        self._abortable.discard(entry.seq)
        if not self._closing:
            self._in_doubt.discard(entry.seq)
        self._fencing.discard(entry.seq)
        if entry.state is EntryState.UPLOADING:
            self._spool.drain_failed(entry, self._clock.monotonic(), "cancelled")
        self._spool.drain_wakeup.set()

    def open_upload_ids(self) -> frozenset[str]:
        """Backend multipart upload ids the drain has open (journaled, or in progress): not the clients'
        uploads, so a client's ListMultipartUploads through the gateway does not show them."""
        return frozenset(self._spool.backend_uploads()) | self._owned_uploads

    def creating_upload_keys(self, bucket: str) -> frozenset[str]:
        """Keys of ``bucket`` whose drain CreateMultipartUpload is on its way: the store may list the upload
        before its id is known here, so a client's ListMultipartUploads hides that key's uploads meanwhile."""
        return frozenset(k for (b, k) in self._creating if b == bucket)

    def _start_janitor(self) -> None:
        """Backend multipart uploads recorded in the journal that no drain owns (left by a crash, or an abort
        that failed) are aborted in the background, at most every JANITOR_INTERVAL_S."""
        if self._janitor is not None and not self._janitor.done():
            return
        now = self._clock.monotonic()
        if now - self._janitor_at < JANITOR_INTERVAL_S:
            return
        if any(u not in self._owned_uploads for u in self._spool.backend_uploads()) or any(
            t not in self._intent_locks or not self._intent_locks[t].locked()
            for t in self._spool.backend_intents()
        ):
            self._janitor_at = now
            self._janitor = asyncio.create_task(self._abort_stale_backend_uploads(), name="drain-janitor")

    async def _abort_stale_backend_uploads(self) -> None:
        await self._resolve_stale_intents()
        stale = [(u, v) for u, v in self._spool.backend_uploads().items() if u not in self._owned_uploads]
        for upload_id, (bucket, key, access_key, lane) in stale:
            probe = Entry(
                seq=0, kind="put", bucket=bucket, key=key, access_key=access_key, lane=lane, acked_at=0
            )
            try:
                status, data, _ = await self._request(
                    probe, "DELETE", f"uploadId={s3_quote(upload_id, safe='')}", {}
                )
            except Exception as exc:
                log.warning(
                    "could not abort stale backend upload %s of %s/%s: %s", upload_id, bucket, key, exc
                )
                continue
            if status in (200, 204, 404):
                if not self._settled(upload_id):
                    continue  # aborted; aborted again after the fence interval, in case it came back
                with contextlib.suppress(SpoolWriteFailed):
                    await self._spool.journal_backend_upload_end(upload_id)
            else:
                log.warning("abort of stale backend upload %s answered %d: %r", upload_id, status, data[:200])

    def _settled(self, name: str) -> bool:
        """Whether a stale upload or intent the store has just answered about may be closed: only a fence
        interval after its first answer here (a request the store still holds from a killed process, or one
        that went unanswered, could create or recreate the upload until then)."""
        now = self._clock.monotonic()
        first = self._first_answer.setdefault(name, now)
        if now - first < self._fence_s:
            return False
        del self._first_answer[name]
        return True

    def _fence_left(self, name: str) -> float:
        first = self._first_answer.get(name)
        return 0.0 if first is None else max(0.0, first + self._fence_s - self._clock.monotonic())

    def _intent_lock(self, token: str) -> asyncio.Lock:
        lock = self._intent_locks.get(token)
        if lock is None:
            lock = self._intent_locks[token] = asyncio.Lock()
        return lock

    async def _resolve_stale_intents(self) -> None:
        """Open intents no attempt is working on: the process that journaled one died, or its attempt failed,
        between the intent and the upload id. Each is resolved (see :meth:`_resolve_intent`), or left for
        the next round while the store is unavailable."""
        for token in list(self._spool.backend_intents()):
            lock = self._intent_lock(token)
            if lock.locked():
                continue
            async with lock:
                try:
                    await self._resolve_intent(token)
                except Exception as exc:  # the store is unavailable: the drain's own errors say so
                    log.debug("could not resolve drain upload intent %s: %s", token, exc)
            if token not in self._spool.backend_intents():
                self._intent_locks.pop(token, None)

    async def _resolve_intent(self, token: str) -> None:
        """List the key's multipart uploads on the store and abort those initiated since the intent's entry
        was acknowledged that the journal does not know (while a key has spooled data, writes of it through
        the gateway are spooled, so such an upload is a drain's); then end the intent, once a listing a
        fence interval after the first one was made (the CreateMultipartUpload may still be in the store)."""
        found = self._spool.backend_intents().get(token)
        if found is None:
            return
        bucket, key, access_key, lane, not_before = found
        probe = Entry(seq=0, kind="put", bucket=bucket, key=key, access_key=access_key, lane=lane, acked_at=0)
        status, data, _ = await self._request(
            probe, "GET", f"uploads=&prefix={s3_quote(key, safe='')}", {}, bucket_level=True
        )
        if status != 200:
            raise DrainError(f"ListMultipartUploads answered {status}: {data[:200]!r}")
        known = set(self._spool.backend_uploads()) | self._owned_uploads
        for upload_id, up_key, initiated in _listed_uploads(data):
            if up_key != key or upload_id in known or initiated < not_before - _CLOCK_SLACK_S:
                continue
            qid = s3_quote(upload_id, safe="")
            st, body, _ = await self._request(probe, "DELETE", f"uploadId={qid}", {})
            if st not in (200, 204, 404):
                raise DrainError(f"AbortMultipartUpload answered {st}: {body[:200]!r}")
            log.info(
                "aborted drain upload %s of %s/%s left by a crash or a failed attempt", upload_id, bucket, key
            )
        if not self._settled(token):
            return
        with contextlib.suppress(SpoolWriteFailed):
            await self._spool.journal_backend_intent_end(token)

    def _next_timeout(self) -> float:
        now = self._clock.monotonic()
        retry_at = self._spool.next_retry_at(now)
        timeout = 5.0
        if retry_at is not None and retry_at > now:
            timeout = min(timeout, retry_at - now + 0.001)
        return max(timeout, 0.001)

    def _check_age(self) -> None:
        oldest = self._spool.oldest_acked_at()
        if oldest is None:
            return
        age = self._clock.wall() - oldest
        now = self._clock.monotonic()
        if age > self._cfg.overdue_after_s and now - self._last_age_warning > _AGE_WARNING_INTERVAL_S:
            self._last_age_warning = now
            log.warning(
                "spool: data acknowledged %.0f s ago is still not on the backend (overdue after %.0f s,"
                " [spool].max_age_s); %d objects pending",
                age,
                self._cfg.overdue_after_s,
                self._spool.pending_objects(),
            )

    async def close(self) -> None:
        self._closing = True
        self._spool.drain_wakeup.set()
        seqs = list(self._tasks)
        tasks = list(self._tasks.values())
        if self._janitor is not None:
            tasks.append(self._janitor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Drains cut here whose completing request never went out whole, or was answered, leave nothing on
        # the wire (_task_done keeps _in_doubt while closing, so this is known only now).
        await self._unwire(
            [e for s in seqs if s not in self._in_doubt and (e := self._spool.entry(s)) is not None]
        )

    def _cancel(self, seq: int) -> None:
        """A newer write superseded an entry being uploaded: stop the upload if that is still safe.

        Safe while the store cannot complete the object: a single PUT whose last byte has not been handed
        to the connection (cutting it leaves a short body, which the store discards), a multipart upload
        before its completion request (it is aborted). Once a request that completes the object is on the
        wire, the store may still apply it after anything sent later, so it is let finish; the key stays
        blocked until the store has answered, and the newer entry goes after it. The body checks the same
        condition itself before each piece (:meth:`_stop_if_cut`), since it runs in the HTTP client's task.
        """
        task = self._tasks.get(seq)
        if task is not None and seq in self._abortable:
            task.cancel()

    def _stop_if_cut(self, entry: Entry) -> None:
        """Called by a drain body right before it hands a piece to the connection, in the same event-loop
        step: a superseded entry whose upload may still be cut goes no further.

        Cancelling the drain task alone is not enough. aiohttp writes the body from a task of its own, which
        it cancels only when the cancelled request unwinds; if that writer is already runnable (its grant or
        its read just came in) it runs first and hands over the last piece, the store applies the PUT, and
        the newer DELETE or overwrite, sent as soon as the drain task is gone, can reach the store before
        it. The fuzzer saw exactly that: a DeleteObjects acknowledged, the key back on the store."""
        if entry.superseded and entry.seq in self._abortable:
            raise Superseded()

    # -- one entry -------------------------------------------------------------------------------------------

    async def _drain(self, entry: Entry) -> None:
        try:
            await self._upload(entry)
            if self._spool.is_in_doubt(entry):
                await self._fence(entry)
        except Exception as exc:
            if entry.seq in self._in_doubt:
                await self._hold_in_doubt(entry, exc)
            else:  # answered, or cut before it could complete the object: nothing of it is on the wire
                await self._unwire([entry])
            if isinstance(exc, Superseded) or entry.superseded:
                # Cut on purpose (the body stopped itself, which the HTTP client reports as a connection
                # error), or failed after a newer write won: either way nothing to retry and no failure.
                self._spool.drain_failed(entry, self._clock.monotonic(), "superseded")
                return
            self.uploads_failed += 1
            delay = self._backoff(entry.attempts)
            level = logging.WARNING if entry.attempts in (1, 5) or entry.attempts % 20 == 0 else logging.DEBUG
            log.log(
                level,
                "drain of %s/%s (entry %d, attempt %d) failed: %s; retrying in %.1f s",
                entry.bucket,
                entry.key,
                entry.seq,
                entry.attempts,
                exc,
                delay,
            )
            self._metrics.backend_errors.labels(entry.lane, "drain").inc()
            self._spool.drain_failed(entry, self._clock.monotonic() + delay, str(exc))
        else:
            self.uploads_ok += 1
            self._spool.drain_succeeded(entry)
            self._metrics.spool_durable_latency.observe(max(0.0, self._clock.wall() - entry.acked_at))
            # With the journal out of service the entry is forgotten in memory but its files are kept, so
            # a restart (which replays the old journal) finds the data and at worst uploads it again.
            await self._spool.drain_done(entry)

    async def _hold_in_doubt(self, entry: Entry, exc: Exception) -> None:
        """A request that completes the object (the PUT's last byte, the multipart completion, the
        tombstone's DELETE) went out and no answer came: the store may still apply it. The key stays
        blocked (the entry is still uploading) for as long as an answer would have been waited for, so a
        newer write of the key is not sent right behind a request that may yet land after it."""
        self._in_doubt.discard(entry.seq)
        self._spool.mark_in_doubt(entry)  # its newest state is fenced (_fence)
        log.warning(
            "drain of %s/%s (entry %d): a request that completes the object went unanswered (%s); the key"
            " stays blocked for %.0f s in case the store still applies it, and its newest state is read back"
            " after it drains",
            entry.bucket,
            entry.key,
            entry.seq,
            exc,
            self._in_doubt_hold_s,
        )
        await self._clock.sleep(self._in_doubt_hold_s)

    async def _wire(self, entry: Entry) -> None:
        """Journal that a request completing ``entry`` may be on its way to the store, before it is sent:
        after a crash the key is then in doubt (see :meth:`_fence`). With the journal out of service the
        request goes out unrecorded (a crash then leaves the key unfenced: drains are not held up)."""
        await self._spool.journal_wire(entry)

    async def _unwire(self, entries: list[Entry]) -> None:
        """Settle the wires of entries none of whose requests can still be applied (so that a restart does
        not fence their keys for nothing); best effort."""
        await self._spool.journal_unwire(entries)

    async def _fence(self, entry: Entry) -> None:
        """The newest state of a key in doubt was applied and answered: an older request of the key may
        still be applied after it. Wait ``fence_s`` (the store has just answered, so the interval is one
        of a working store; a HEAD that is slow again says it stalled, and the wait starts over), read the
        key back, and apply the newest state again until the store shows it. Until then the entry stays
        uploading: served from the spool, pending in flush and status. It holds no drain slot meanwhile."""
        self._fencing.add(entry.seq)
        self._spool.drain_wakeup.set()
        slow_looks = 0
        try:
            while True:
                await self._clock.sleep(self._fence_s)
                if entry.superseded:
                    raise Superseded()  # the newer entry of the key is fenced in its turn
                started = self._clock.monotonic()
                shows = await self._store_shows(entry)
                slow = self._clock.monotonic() - started > max(1.0, self._fence_s / 2)
                if shows and (not slow or slow_looks >= _FENCE_SLOW_LOOKS):
                    break
                if shows:
                    slow_looks += 1  # the store stalled again: give an older request another interval
                    continue
                self._spool.note_fence_reapply()
                log.warning(
                    "drain of %s/%s (entry %d): after the fence the store holds an older state (a request"
                    " left on the wire was applied late); applying the newest state again",
                    entry.bucket,
                    entry.key,
                    entry.seq,
                )
                self._fencing.discard(entry.seq)
                await self._upload(entry)
                self._fencing.add(entry.seq)
        finally:
            self._fencing.discard(entry.seq)
        self._spool.clear_in_doubt(entry)

    async def _store_shows(self, entry: Entry) -> bool:
        """Whether the store holds what ``entry`` applied: absence for a tombstone, else its ETag and size."""
        status, data, head = await self._request(entry, "HEAD", "", {})
        if status == 404:
            return entry.kind == "del"
        if status != 200:
            raise DrainError(f"HEAD after the fence answered {status}: {data[:200]!r}")
        if entry.kind == "del":
            return False
        if int(head.get("Content-Length", "-1")) != entry.size:
            return False
        got = _norm_etag(head.get("ETag", ""))
        # No ETag at all (SeaweedFS, empty objects): the size matches, and all empty objects are alike.
        return not got or got == _norm_etag(entry.etag)

    def _backoff(self, attempts: int) -> float:
        cap = min(self._cfg.retry_max_s, self._cfg.retry_base_s * (2 ** max(0, attempts - 1)))
        return float(cap / 2 + self._rng.uniform(0, cap / 2))

    def _credential(self, entry: Entry) -> Credential:
        cred = self._creds.get(entry.access_key)
        if cred is None:
            raise DrainError(
                f"access key {entry.access_key!r} that acknowledged this write is no longer configured"
            )
        return cred

    def _lane(self, entry: Entry) -> str:
        return entry.lane if entry.lane in self._lane_names else self._default_lane

    async def _request(
        self,
        entry: Entry,
        method: str,
        raw_query: str,
        headers: dict[str, str],
        body: bytes | SpoolFileBody | None = None,
        *,
        bucket_level: bool = False,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        lane = self._lane(entry)
        key = None if bucket_level else entry.key
        try:
            try:
                resp = await self._pools.request(
                    StoreCall(lane, entry.bucket, key, method, headers, self._credential(entry), raw_query),
                    body,
                    cost=self._request_cost,
                    observe_errors=True,
                    payload_hash=UNSIGNED_PAYLOAD,
                )
            except S3Error as exc:
                raw_path = self._pools.target(entry.bucket, key, raw_query)[1].raw_path
                raise DrainError(f"{method} {raw_path}: {exc.code}: {exc.message}") from exc
            self._in_doubt.discard(entry.seq)  # the store answered: whatever it did, it has done
            try:
                data = await resp.read()
                return resp.status, data, resp.headers.copy()  # case-insensitive (Go sends Etag)
            finally:
                resp.release()
        finally:
            await close_body(body)

    async def _file_body(
        self,
        entry: Entry,
        file_id: str,
        size: int,
        *,
        commits: bool = False,
        sock: socket.socket | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The file's bytes, paced through the lane. ``commits``: this body's last byte makes the request
        complete (a single PUT): from then on the upload may no longer be cancelled. ``sock``: the store
        connection they go out on (its unsent bytes are bounded while the lane is capped for reads)."""
        lane, budget, fd = await self._open_body(entry, file_id, size)
        bound = self._unsent_bound(entry, sock)
        scheduler = self._pools.dispatcher_for(entry.bucket).scheduler
        sent = 0
        up = self._metrics.bytes.labels(lane, "up")
        try:
            for offset, n in self._pieces(size, budget):
                await budget.take(n)
                bound.set(scheduler.capped_for_reads(lane))
                chunk = await run_settled(self._spool.run_read_io(os.pread, fd, n, offset))
                if len(chunk) != n:
                    raise DrainError(f"spool file {file_id} ended before {offset + n} of {size} bytes")
                if commits and offset + n >= size:
                    await self._wire(entry)  # the last piece completes the object: journaled first
                self._stop_if_cut(entry)
                sent += n
                up.inc(n)
                if commits and sent >= size:
                    self._abortable.discard(entry.seq)
                    self._in_doubt.add(entry.seq)
                yield chunk
        finally:
            bound.close()
            budget.close()
            await self._close_file(fd, whole=sent >= size)

    def _pieces(self, size: int, budget: StreamBudget) -> Iterator[tuple[int, int]]:
        """(offset, length) of the pieces a body of ``size`` bytes is granted and sent in: no larger than
        the budget's tickets, so that no piece goes out as one burst bigger than its lane allows."""
        step = min(self._read_bytes, budget.piece_bytes)
        for offset in range(0, size, step):
            yield offset, min(step, size - offset)

    def _unsent_bound(self, entry: Entry, sock: socket.socket | None) -> UnsentBound:
        """The bound on a drain body's unsent bytes on its store connection (``[backend]
        notsent_lowat_bytes`` of the store the entry drains to), set piece by piece while its lane is
        capped for the reads' sake."""
        return UnsentBound(sock, self._pools.backend_for(entry.bucket).cfg.notsent_lowat_bytes)

    async def _open_body(self, entry: Entry, file_id: str, size: int) -> tuple[str, StreamBudget, int]:
        """The lane, its budget for ``size`` bytes and the open file of a body about to be sent."""
        lane = self._lane(entry)
        budget = StreamBudget(self._pools.dispatcher_for(entry.bucket), lane, self._chunk, size)
        path = self._spool.file_path(file_id)
        try:
            fd = await self._spool.run_read_io_owned(os.open, path, os.O_RDONLY, release=os.close)
        except BaseException:
            budget.close()
            raise
        return lane, budget, fd

    async def _close_file(self, fd: int, *, whole: bool) -> None:
        """A drained file's descriptor. After the whole body went out it is closed right here: the store's
        answer may arrive at any moment, and aiohttp cancels a request's body writer that is still running
        then (closing the connection instead of reusing it). Cut short, it is closed on a read thread."""
        if whole:
            os.close(fd)
        else:
            await run_settled(self._spool.run_read_io(os.close, fd))

    async def _send_file_body(
        self,
        sock_fd: int,
        entry: Entry,
        file_id: str,
        size: int,
        commits: bool,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        """The file's bytes into the connection's socket with ``sendfile(2)``, in the pieces
        :meth:`_file_body` reads, each granted before it is sent (``sock``: that socket, whose unsent
        bytes are bounded while the lane is capped for reads)."""
        lane, budget, fd = await self._open_body(entry, file_id, size)
        bound = self._unsent_bound(entry, sock)
        scheduler = self._pools.dispatcher_for(entry.bucket).scheduler
        sent = 0
        up, zero_copy = self._metrics.bytes.labels(lane, "up"), self._metrics.zero_copy_bytes.labels(lane)

        def count(n: int) -> None:  # per sendfile call: the last one may be cut by the store's answer
            nonlocal sent
            sent += n
            up.inc(n)
            zero_copy.inc(n)

        try:
            for offset, n in self._pieces(size, budget):
                await budget.take(n)
                bound.set(scheduler.capped_for_reads(lane))
                if commits and offset + n >= size:
                    await self._wire(entry)  # the last piece completes the object: journaled first
                self._stop_if_cut(entry)
                if commits and offset + n >= size:
                    self._abortable.discard(entry.seq)
                    self._in_doubt.add(entry.seq)
                try:
                    await send_file(sock_fd, fd, offset, n, self._spool.run_read_io, on_sent=count)
                except SourceEnded:
                    raise DrainError(
                        f"spool file {file_id} ended before {offset + n} of {size} bytes"
                    ) from None
        finally:
            bound.close()
            budget.close()
            await self._close_file(fd, whole=sent >= size)

    async def _upload(self, entry: Entry) -> None:
        if entry.kind == "del":
            await self._wire(entry)
            self._in_doubt.add(entry.seq)
            status, data, _ = await self._request(entry, "DELETE", "", {})
            if status not in (200, 204, 404):
                raise DrainError(f"DELETE answered {status}: {data[:300]!r}")
            return
        if entry.multipart:
            await self._upload_multipart(entry)
        else:
            await self._upload_single(entry)

    async def _upload_single(self, entry: Entry) -> None:
        headers = dict(entry.meta)
        md5_hex = _norm_etag(entry.etag)
        headers["content-md5"] = base64.b64encode(bytes.fromhex(md5_hex)).decode()
        headers["content-length"] = str(entry.size)
        if entry.size:
            self._abortable.add(entry.seq)  # until the last byte is handed to the connection
            body: bytes | SpoolFileBody = SpoolFileBody(self, entry, entry.files[0], entry.size, commits=True)
        else:
            await self._wire(entry)
            body = b""
            self._in_doubt.add(entry.seq)
        status, data, resp_headers = await self._request(entry, "PUT", "", headers, body)
        if status != 200:
            raise DrainError(f"PUT answered {status}: {data[:300]!r}")
        got = _norm_etag(resp_headers.get("ETag", ""))
        if not got:
            # Some stores (SeaweedFS for empty bodies) answer a PUT without an ETag: ask for it.
            status, _, head = await self._request(entry, "HEAD", "", {})
            got = _norm_etag(head.get("ETag", "")) if status == 200 else ""
            if status != 200 or int(head.get("Content-Length", "-1")) != entry.size:
                raise DrainError(f"backend holds {head.get('Content-Length')} bytes, not {entry.size}")
            if not got:
                # No ETag at all (SeaweedFS, empty objects): the size matches and the PUT carried
                # Content-MD5, which the store checked.
                return
        if got != md5_hex:
            raise DrainError(f"backend ETag {got!r} differs from the acknowledged {md5_hex!r}")

    async def _upload_multipart(self, entry: Entry) -> None:
        headers = {k: v for k, v in entry.meta if k != "content-md5"}
        # The intent is journaled before the store creates the upload, its id right after: a crash in
        # between leaves an open intent, from which the janitor finds and aborts the upload. With the
        # journal out of service the drain goes on unrecorded (a crash then leaves an upload that only the
        # store's lifecycle rules remove: better than holding acknowledged data forever).
        token = f"s{entry.seq}"  # one per entry: failed attempts do not pile up
        # Held from the intent until the upload id is journaled, so the janitor never resolves an intent
        # whose upload is being created (it would miss it, or abort a live one).
        async with self._intent_lock(token):
            while token in self._spool.backend_intents():
                # A previous attempt (or process) may have left an upload behind: clean it up first, and
                # look again a fence interval later (its CreateMultipartUpload may still be in the store).
                # With the journal out of service the intent cannot end: one look, as for other drains.
                await self._resolve_intent(token)
                if token not in self._spool.backend_intents() or self._spool.degraded is not None:
                    break
                await self._clock.sleep(max(0.05, self._fence_left(token)))
            journaled = True
            if token not in self._spool.backend_intents():
                try:
                    await self._spool.journal_backend_intent(token, entry, entry.acked_at)
                except SpoolWriteFailed:
                    if self._spool.degraded is None:
                        raise
                    journaled = False
            ident = (entry.bucket, entry.key)
            self._creating[ident] = self._creating.get(ident, 0) + 1
            try:
                status, data, _ = await self._request(entry, "POST", "uploads", headers)
                match = _UPLOAD_ID.search(data)
                if status != 200 or match is None:
                    raise DrainError(f"CreateMultipartUpload answered {status}: {data[:300]!r}")
                upload_id = html.unescape(match.group(1).decode())
                self._owned_uploads.add(upload_id)
            finally:
                left = self._creating.pop(ident) - 1
                if left:
                    self._creating[ident] = left
            try:
                await self._spool.journal_backend_upload(
                    upload_id, entry, ends_intent=token if journaled else None
                )
            except SpoolWriteFailed:  # (out of service, they are kept in memory and this does not raise)
                self._owned_uploads.discard(upload_id)  # the open intent covers it
                raise
            if self._spool.degraded is not None:
                log.warning(
                    "drain of %s/%s: journal out of service, upload %s recorded in memory only",
                    entry.bucket,
                    entry.key,
                    upload_id,
                )
        qid = s3_quote(upload_id, safe="")
        # An upload created with a checksum algorithm (kept among its headers): each part carries its own,
        # and the completion names them, so the store keeps the object's checksum as acknowledged.
        algorithm = dict(entry.meta).get("x-amz-checksum-algorithm", "") if entry.part_checksums else ""
        finished = False
        try:
            self._abortable.add(entry.seq)  # parts may be cut short; the completion may not
            for number, (file_id, size, md5_hex) in enumerate(
                zip(entry.files, entry.part_sizes, entry.part_md5s, strict=True), start=1
            ):
                if entry.superseded:
                    raise Superseded()
                part_headers = {
                    "content-length": str(size),
                    "content-md5": base64.b64encode(bytes.fromhex(md5_hex)).decode(),
                }
                if algorithm:
                    part_headers[f"x-amz-checksum-{algorithm.lower()}"] = entry.part_checksums[number - 1]
                body = SpoolFileBody(self, entry, file_id, size, commits=False) if size else b""
                status, data, resp_headers = await self._request(
                    entry, "PUT", f"partNumber={number}&uploadId={qid}", part_headers, body
                )
                if status != 200:
                    raise DrainError(f"UploadPart {number} answered {status}: {data[:300]!r}")
                got = _norm_etag(resp_headers.get("ETag", ""))
                if got != md5_hex:
                    raise DrainError(f"UploadPart {number}: backend ETag {got!r} differs from {md5_hex!r}")
            await self._wire(entry)
            self._abortable.discard(entry.seq)
            if entry.superseded:
                raise Superseded()
            xml = "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{escape(m)}&quot;</ETag>"
                + (
                    f"<Checksum{algorithm}>{escape(entry.part_checksums[n - 1])}</Checksum{algorithm}>"
                    if algorithm
                    else ""
                )
                + "</Part>"
                for n, m in enumerate(entry.part_md5s, start=1)
            )
            body_xml = f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode()
            self._in_doubt.add(entry.seq)
            status, data, _ = await self._request(
                entry, "POST", f"uploadId={qid}", {"content-type": "application/xml"}, body_xml
            )
            etag = _ETAG.search(data)
            if status != 200 or b"<Error>" in data or etag is None:
                raise DrainError(f"CompleteMultipartUpload answered {status}: {data[:300]!r}")
            finished = True
            if _norm_etag(etag.group(1).decode()) != _norm_etag(entry.etag):
                raise DrainError(
                    f"backend multipart ETag {etag.group(1).decode()!r} differs from the acknowledged"
                    f" {entry.etag!r}"
                )
        except BaseException:
            if not finished:
                try:
                    await asyncio.shield(self._abort(entry, qid))
                    finished = True
                except Exception as exc:
                    log.debug("abort of backend upload %s failed: %s", upload_id, exc)
            raise
        finally:
            self._owned_uploads.discard(upload_id)
            if finished:
                with contextlib.suppress(SpoolWriteFailed):
                    await asyncio.shield(self._spool.journal_backend_upload_end(upload_id))

    async def _abort(self, entry: Entry, qid: str) -> None:
        status, data, _ = await self._request(entry, "DELETE", f"uploadId={qid}", {})
        if status not in (200, 204, 404):
            raise DrainError(f"AbortMultipartUpload answered {status}: {data[:200]!r}")
