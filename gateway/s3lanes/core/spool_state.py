"""The write spool's bookkeeping: what is acknowledged, in which order it must reach the backend. Pure.

Theory of operation. Every change to the spool is a *record*: one of the frozen classes of
:mod:`s3lanes.core.journal_records`, which lists every kind and its encoding in one place (the shell journals
their maps). A record is applied here only once the journal holds it durably, in journal order, both live
and on replay, so the state after a crash is exactly the state that was acknowledged. The builders below
(``put_record`` ...) make the records; :meth:`SpoolState.apply` takes a record or a journal map.

Fencing. A request that completes an object may be applied by the store long after it was sent (the
store stalled with it in a socket buffer), after a newer state of the key that a restarted gateway (or a
drainer that gave up waiting for an answer) sent later. Such a key is *in doubt*: after replay, every key
with a ``wire`` not settled by a later ``done``; while running, a key whose completing request went
unanswered (the shell marks it). The newest entry of a key in doubt is not done once the store answered
its upload: the shell waits a fence interval, reads the key back and re-applies the newest state until the
store shows it, and only then clears the doubt and journals ``done``. ``done`` settles only wires of seqs
up to its own: a newer entry's wire, journaled while the ``done`` was still on its way, stays open.

Ordering rules (what the backend ends up with equals the order of acknowledgements):

* Per key, only the latest entry is live. A newer put/del *supersedes* older ones: their data is dropped
  without being uploaded; an upload of an older version already in flight is cut short if the store
  cannot complete it yet (the shell decides; a request that completes the object is let finish, since
  the store could still apply it after anything sent later). A newer entry of a key is not drained while
  an older one of the same key is still being uploaded.
* Commit markers (``.metadata``, ``COMMIT``... by file-name glob) are drained only when no entry acknowledged
  before them under the same directory prefix is still pending, so a manifest never reaches the backend
  before its shards.
* Otherwise entries drain oldest first.

Lifecycle of an entry (one transition table, illegal moves raise)::

    PENDING --start_upload--> UPLOADING --upload_failed--> PENDING (retry after backoff)
                                        --upload_succeeded--> UPLOADED --(done record applied)--> gone
    any state --superseded by a newer record of the key--> gone (an UPLOADING one once its upload ends)

Space: :class:`SpoolSpace` counts bytes on disk and bytes reserved by writes in progress, with high/low
water hysteresis.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from s3lanes.core.checksums import (
    ALGORITHMS,
    CHECKSUM_HEADER_PREFIX,
    header_for,
    multipart_checksum,
    upload_checksum,
)
from s3lanes.core.journal_records import (
    Abort,
    BackendIntent,
    BackendIntentEnd,
    BackendUpload,
    BackendUploadEnd,
    Complete,
    CreateUpload,
    Delete,
    Done,
    Part,
    Put,
    Record,
    SeqMark,
    Unwire,
    Wire,
    decode,
)
from s3lanes.core.transitions import Transitions
from s3lanes.errors import (
    BadDigest,
    EntityTooSmall,
    InvalidPart,
    InvalidPartOrder,
    InvalidRequest,
    MalformedXML,
)

MIN_PART_BYTES = 5 * 1024 * 1024
_RECORD_TYPES = (
    Put,
    Complete,
    Delete,
    CreateUpload,
    Part,
    Abort,
    Done,
    Wire,
    Unwire,
    BackendUpload,
    BackendUploadEnd,
    BackendIntent,
    BackendIntentEnd,
    SeqMark,
)
MAX_PARTS = 10_000


class EntryState(enum.Enum):
    PENDING = "pending"
    UPLOADING = "uploading"
    UPLOADED = "uploaded"


_MOVES = Transitions(
    {
        EntryState.PENDING: {EntryState.UPLOADING},
        EntryState.UPLOADING: {EntryState.PENDING, EntryState.UPLOADED},
        EntryState.UPLOADED: (),
    }
)


# What a record of an acknowledged request opens with, and so do the entry or upload it makes (and compaction
# makes it again from): seq, bucket, key, access key, lane, acknowledged at (wall clock).
_Head = tuple[int, str, str, str, str, float]


@dataclass(slots=True)
class Entry:
    """One acknowledged operation waiting for the backend. Its first fields are its record's head
    (:func:`_head`)."""

    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    acked_at: float  # wall clock
    kind: str  # "put" or "del"
    size: int = 0
    etag: str = ""  # quoted
    files: tuple[str, ...] = ()  # spool file ids, one per part
    part_sizes: tuple[int, ...] = ()  # multipart layout of the client (empty: a single PUT)
    part_md5s: tuple[str, ...] = ()  # hex MD5 per part (multipart only)
    meta: tuple[tuple[str, str], ...] = ()  # headers to send with the upload (lower-case names)
    # Multipart with a checksum algorithm: each part's checksum (base64), sent with the part by the drain.
    part_checksums: tuple[str, ...] = ()
    # The object's x-amz-checksum-* headers as GET/HEAD show them with x-amz-checksum-mode: ENABLED.
    checksum: tuple[tuple[str, str], ...] = ()
    marker: bool = False
    state: EntryState = EntryState.PENDING
    attempts: int = 0
    not_before: float = 0.0  # monotonic time before which a failed upload is not retried
    superseded: bool = False
    last_error: str = ""

    @property
    def head(self) -> _Head:
        return (self.seq, self.bucket, self.key, self.access_key, self.lane, self.acked_at)

    def move(self, to: EntryState) -> None:
        _MOVES.check(self.state, to, "entry", self.seq)
        self.state = to

    @property
    def multipart(self) -> bool:
        return bool(self.part_sizes)

    @property
    def dir_prefix(self) -> str:
        return self.key.rpartition("/")[0] + "/" if "/" in self.key else ""


@dataclass(frozen=True, slots=True)
class Origin:
    """Who made an acknowledged request, through which lane, and when (wall clock): what its record carries
    after the key (:class:`Put`, :class:`Delete`, :class:`CreateUpload`)."""

    access_key: str
    lane: str
    at: float


@dataclass(frozen=True, slots=True)
class PartFile:
    number: int
    file: str
    size: int
    md5: str  # hex
    checksum: str = ""  # base64, in the upload's checksum algorithm (empty: the upload has none)

    @property
    def etag(self) -> str:
        return f'"{self.md5}"'


@dataclass(slots=True)
class Upload:
    """A multipart upload created in the spool and not yet completed or aborted. Its first fields are its
    record's head (:func:`_head`)."""

    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    created_at: float
    upload_id: str
    meta: tuple[tuple[str, str], ...]
    parts: dict[int, PartFile] = field(default_factory=dict)
    # The part each number held before its latest upload, kept until the completion: two uploads of one
    # part can run at once, and the store completes with the ETag of either (not only of the last written).
    replaced: dict[int, PartFile] = field(default_factory=dict)

    @property
    def head(self) -> _Head:
        return (self.seq, self.bucket, self.key, self.access_key, self.lane, self.created_at)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts.values()) + sum(p.size for p in self.replaced.values())

    def all_parts(self) -> list[PartFile]:
        return [*self.replaced.values(), *self.parts.values()]

    @property
    def checksum_algorithm(self) -> tuple[str, str] | None:
        """``(algorithm, type)`` the upload was created with (x-amz-checksum-algorithm/-type), or None."""
        return checksum_of_meta(self.meta)


@dataclass(frozen=True, slots=True)
class Applied:
    """What the shell must do after a record was applied."""

    garbage: tuple[str, ...] = ()  # spool files no record refers to any more: unlink them
    cancel: tuple[int, ...] = ()  # seqs of superseded uploads in flight: cancel them
    removed: tuple[Entry, ...] = ()  # entries that left the spool (done or superseded): wake flush waiters


def _head(rec: Put | Complete | Delete | CreateUpload) -> _Head:
    return (rec.seq, rec.bucket, rec.key, rec.access_key, rec.lane, rec.at)


def _intent_seq(token: str) -> int:
    """The entry an intent belongs to (tokens are ``s<seq>``); -1 if it names none."""
    return int(token[1:]) if token[:1] == "s" and token[1:].isdigit() else -1


def multipart_etag(part_md5s: Sequence[str]) -> str:
    digest = hashlib.md5(b"".join(bytes.fromhex(m) for m in part_md5s), usedforsecurity=False).hexdigest()
    return f'"{digest}-{len(part_md5s)}"'


def _glob_regex(globs: Sequence[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


_UPLOAD_CHECKSUM_HEADERS = frozenset({"x-amz-checksum-algorithm", "x-amz-checksum-type"})


def _pairs(meta: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in meta)


def checksum_of_meta(meta: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """``(algorithm, type)`` kept with a multipart upload's headers, or None."""
    found = dict(meta)
    try:
        return upload_checksum(found.get("x-amz-checksum-algorithm"), found.get("x-amz-checksum-type"))
    except InvalidRequest:  # validated when the upload was created; a journal of another version: none
        return None


def object_checksum(
    meta: Sequence[tuple[str, str]], part_sizes: Sequence[int], part_checksums: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    """The x-amz-checksum-* headers GET/HEAD show for an object: a single PUT's verified checksum (kept
    among its headers), or a multipart object's composite or full-object checksum with its type."""
    if not part_sizes:
        return tuple(
            (k, v)
            for k, v in meta
            if k.startswith(CHECKSUM_HEADER_PREFIX) and k[len(CHECKSUM_HEADER_PREFIX) :].upper() in ALGORITHMS
        )
    algo = checksum_of_meta(meta)
    if algo is None or len(part_checksums) != len(part_sizes) or not all(part_checksums):
        return ()
    algorithm, kind = algo
    value = multipart_checksum(algorithm, kind, part_checksums, part_sizes)
    return ((header_for(algorithm), value), ("x-amz-checksum-type", kind))


class SpoolState:
    """Entries, uploads and their order. Owned by the spool shell; not thread-safe."""

    def __init__(self, commit_markers: Sequence[str] = ()) -> None:
        self._markers = _glob_regex(commit_markers)
        self.entries: dict[int, Entry] = {}  # seq -> entry, in seq order
        self._latest: dict[tuple[str, str], Entry] = {}  # (bucket, key) -> live entry
        self._uploading_keys: dict[tuple[str, str], int] = {}  # key -> seq being uploaded
        self.uploads: dict[str, Upload] = {}
        # Multipart uploads the drainer opened on the backend and has not completed or aborted yet:
        # backend upload id -> (bucket, key, access key, lane). After a crash they are aborted.
        self.backend_uploads: dict[str, tuple[str, str, str, str]] = {}
        # Drain multipart uploads about to be created (token -> bucket, key, access key, lane, not before):
        # journaled before the CreateMultipartUpload, ended once its upload id is journaled. One left open
        # after a crash means the store may hold an upload whose id the journal never got; the janitor
        # finds it by listing the key's uploads initiated since ``not before``.
        self.backend_intents: dict[str, tuple[str, str, str, str, float]] = {}
        # Completing drain requests that may be on the wire, per key: the seqs of ``wire`` records not
        # settled by a ``done`` of that seq or a newer one of the key.
        self.wires: dict[tuple[str, str], set[int]] = {}
        # Keys whose state on the store is in doubt (see the module doc). Not journaled: derived from the
        # wires at recovery (:meth:`recovered`), added to by the shell, cleared once the fence confirmed.
        self.in_doubt: set[tuple[str, str]] = set()
        self._next_seq = 1
        self.bytes_on_disk = 0

    # -- records ---------------------------------------------------------------------------------------------

    def next_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def is_marker(self, key: str) -> bool:
        return self._markers is not None and self._markers.fullmatch(key.rpartition("/")[2]) is not None

    def apply(self, record: Record | Mapping[str, Any]) -> Applied:
        """Apply one journaled record (a journal map is decoded first: :func:`.journal_records.decode`)."""
        rec = record if isinstance(record, _RECORD_TYPES) else decode(record)
        seq = rec.seq if isinstance(rec, (Put, Complete, Delete, CreateUpload, SeqMark)) else 0
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        match rec:
            case Put() | Complete():
                return self._apply_put(rec)
            case Delete():
                return self._add(Entry(*_head(rec), kind="del"))
            case CreateUpload():
                self.uploads[rec.upload_id] = Upload(*_head(rec), upload_id=rec.upload_id, meta=rec.meta)
                return Applied()
            case Part():
                upload = self.uploads.get(rec.upload_id)
                part = PartFile(rec.number, rec.file, rec.size, rec.md5, rec.checksum)
                if upload is None:  # aborted while the part was being written
                    return Applied(garbage=(part.file,))
                old = upload.parts.get(part.number)
                upload.parts[part.number] = part
                self.bytes_on_disk += part.size
                if old is not None:
                    older = upload.replaced.get(part.number)
                    upload.replaced[part.number] = old
                    if older is not None:
                        self.bytes_on_disk -= older.size
                        return Applied(garbage=(older.file,))
                return Applied()
            case Abort():
                gone = self.uploads.pop(rec.upload_id, None)
                if gone is None:
                    return Applied()
                self.bytes_on_disk -= gone.size
                return Applied(garbage=tuple(p.file for p in gone.all_parts()))
            case SeqMark():  # written by compaction: keeps seqs growing across rewrites
                return Applied()
            case BackendUpload():
                self.backend_uploads[rec.upload_id] = (rec.bucket, rec.key, rec.access_key, rec.lane)
                return Applied()
            case BackendUploadEnd():
                self.backend_uploads.pop(rec.upload_id, None)
                return Applied()
            case BackendIntent():
                self.backend_intents[rec.token] = (
                    rec.bucket,
                    rec.key,
                    rec.access_key,
                    rec.lane,
                    rec.not_before,
                )
                return Applied()
            case BackendIntentEnd():
                self.backend_intents.pop(rec.token, None)
                return Applied()
            case Wire():
                self.wires.setdefault((rec.bucket, rec.key), set()).add(rec.seq)
                return Applied()
            case Unwire():
                ident = (rec.bucket, rec.key)
                wires = self.wires.get(ident, set())
                wires.discard(rec.seq)
                if not wires:
                    self.wires.pop(ident, None)
                return Applied()
            case Done():
                done = self.entries.get(rec.seq)
                if rec.bucket is not None and rec.key is not None:
                    self._settle_wires(rec.bucket, rec.key, rec.seq)
                elif done is not None:  # older journals' done records name no key: the entry's
                    self._settle_wires(done.bucket, done.key, done.seq)
                if done is None:
                    return Applied()
                self._remove(done)
                return Applied(garbage=done.files, removed=(done,))
        # Every record type is matched above, and decode() refuses anything else.
        raise ValueError(f"not a journal record: {rec!r}")  # pragma: no cover

    def _apply_put(self, rec: Put | Complete) -> Applied:
        garbage: list[str] = []
        if isinstance(rec, Complete):
            upload = self.uploads.pop(rec.upload_id, None)
            if upload is None:
                raise ValueError(f"journal: completion of unknown upload {rec.upload_id}")
            older = set(rec.older)  # numbers completed with their replaced part
            parts = [upload.replaced[n] if n in older else upload.parts[n] for n in rec.part_numbers]
            used = {p.file for p in parts}
            for part in upload.all_parts():
                if part.file not in used:
                    garbage.append(part.file)
                    self.bytes_on_disk -= part.size
            files = tuple(p.file for p in parts)
            part_sizes = tuple(p.size for p in parts)
            part_md5s = tuple(p.md5 for p in parts)
            size = sum(part_sizes)
            meta = upload.meta
            part_checksums = tuple(p.checksum for p in parts)
            if upload.checksum_algorithm is None or not all(part_checksums):
                # Without every part's checksum the object has none, and the drain must not create its
                # upload with an algorithm whose completion would need them.
                part_checksums = ()
                meta = tuple(kv for kv in meta if kv[0] not in _UPLOAD_CHECKSUM_HEADERS)
            self.bytes_on_disk -= size  # counted again below, as the entry's
        else:
            files = rec.files
            part_sizes = rec.part_sizes
            part_md5s = rec.part_md5s
            part_checksums = rec.part_checksums
            size = rec.size
            meta = rec.meta
        self.bytes_on_disk += size
        entry = Entry(
            *_head(rec),
            kind="put",
            size=size,
            etag=rec.etag,
            files=files,
            part_sizes=part_sizes,
            part_md5s=part_md5s,
            meta=meta,
            part_checksums=part_checksums,
            checksum=object_checksum(meta, part_sizes, part_checksums),
            marker=self.is_marker(rec.key),
        )
        applied = self._add(entry)
        return Applied(
            garbage=tuple(garbage) + applied.garbage, cancel=applied.cancel, removed=applied.removed
        )

    def _add(self, entry: Entry) -> Applied:
        ident = (entry.bucket, entry.key)
        old = self._latest.get(ident)
        garbage: tuple[str, ...] = ()
        cancel: tuple[int, ...] = ()
        removed: tuple[Entry, ...] = ()
        if old is not None:
            removed = (old,)
            if old.state is EntryState.UPLOADING:
                # Still on the wire: it stays in `entries` (its files stay) until the upload returns.
                old.superseded = True
                del self._latest[ident]
                cancel = (old.seq,)
            else:
                self._remove(old)
                garbage = old.files
        self.entries[entry.seq] = entry
        self._latest[ident] = entry
        return Applied(garbage=garbage, cancel=cancel, removed=removed)

    def _settle_wires(self, bucket: str, key: str, seq: int) -> None:
        ident = (bucket, key)
        wires = self.wires.get(ident)
        if wires is None:
            return
        wires.difference_update([s for s in wires if s <= seq])
        if not wires:
            del self.wires[ident]

    def recovered(self) -> int:
        """Called once the journal is replayed: every key with a completing request that may still be on
        the wire is in doubt. The number of such keys."""
        self.in_doubt.update(self.wires)
        return len(self.wires)

    def wire_needed(self, entry: Entry) -> bool:
        """Whether a ``wire`` record must be journaled before a completing request of ``entry`` is sent
        (none is while one of this entry is still open, e.g. on a retry)."""
        return entry.seq not in self.wires.get((entry.bucket, entry.key), ())

    @staticmethod
    def wire_record(entry: Entry) -> Wire:
        return Wire(entry.bucket, entry.key, entry.seq)

    def unwire_needed(self, entry: Entry) -> bool:
        """Whether ``entry`` has an open wire that an ``unwire`` may settle: not while its key is in doubt
        (an earlier request of the same entry may be the one still on its way)."""
        ident = (entry.bucket, entry.key)
        return ident not in self.in_doubt and entry.seq in self.wires.get(ident, ())

    @staticmethod
    def unwire_record(entry: Entry) -> Unwire:
        return Unwire(entry.bucket, entry.key, entry.seq)

    def is_in_doubt(self, entry: Entry) -> bool:
        return (entry.bucket, entry.key) in self.in_doubt

    def _remove(self, entry: Entry) -> None:
        self.entries.pop(entry.seq, None)
        ident = (entry.bucket, entry.key)
        if self._latest.get(ident) is entry:
            del self._latest[ident]
        if self._uploading_keys.get(ident) == entry.seq:
            del self._uploading_keys[ident]
        self.bytes_on_disk -= entry.size

    # -- record builders (seq assigned in journal order) -----------------------------------------------------

    def put_record(
        self,
        *,
        bucket: str,
        key: str,
        origin: Origin,
        file: str,
        size: int,
        md5: str,
        meta: Sequence[tuple[str, str]],
    ) -> Put:
        head = self._head(bucket, key, origin)
        return Put(*head, files=(file,), size=size, etag=f'"{md5}"', meta=_pairs(meta))

    def delete_record(self, *, bucket: str, key: str, origin: Origin) -> Delete:
        return Delete(*self._head(bucket, key, origin))

    def create_upload_record(
        self, *, bucket: str, key: str, origin: Origin, upload_id: str, meta: Sequence[tuple[str, str]]
    ) -> CreateUpload:
        return CreateUpload(*self._head(bucket, key, origin), upload_id, _pairs(meta))

    def _head(self, bucket: str, key: str, origin: Origin) -> _Head:
        """What every acknowledged record starts with: the next seq, the key, and its :class:`Origin`."""
        return (self.next_seq(), bucket, key, origin.access_key, origin.lane, origin.at)

    @staticmethod
    def part_record(
        *, upload_id: str, number: int, file: str, size: int, md5: str, checksum: str = ""
    ) -> Part:
        return Part(upload_id, number, file, size, md5, checksum)

    @staticmethod
    def abort_record(upload_id: str) -> Abort:
        return Abort(upload_id)

    @staticmethod
    def done_record(seq: int, entry: Entry | None = None) -> Done:
        """``entry`` given: the record names its key, and settles the key's wires up to ``seq`` even if
        replay no longer holds the entry (superseded before it drained)."""
        if entry is None:
            return Done(seq)
        return Done(seq, entry.bucket, entry.key)

    @staticmethod
    def backend_upload_record(upload_id: str, entry: Entry) -> BackendUpload:
        return BackendUpload(entry.bucket, entry.key, entry.access_key, entry.lane, upload_id=upload_id)

    @staticmethod
    def backend_upload_end_record(upload_id: str) -> BackendUploadEnd:
        return BackendUploadEnd(upload_id)

    @staticmethod
    def backend_intent_record(token: str, entry: Entry, not_before: float) -> BackendIntent:
        return BackendIntent(
            entry.bucket, entry.key, entry.access_key, entry.lane, token=token, not_before=not_before
        )

    @staticmethod
    def backend_intent_end_record(token: str) -> BackendIntentEnd:
        return BackendIntentEnd(token)

    def open_backend_work(self, bucket: str | None = None, prefix: str = "") -> int:
        """Drain multipart uploads the store may hold that are neither completed nor aborted yet (recorded
        ids, and open intents of entries no longer pending: a pending entry is counted as itself), under
        bucket/prefix (every bucket if None)."""
        places = [(v[0], v[1]) for v in self.backend_uploads.values()]
        places += [
            (v[0], v[1]) for t, v in self.backend_intents.items() if _intent_seq(t) not in self.entries
        ]
        return sum(1 for b, k in places if (bucket is None or b == bucket) and k.startswith(prefix))

    def complete_record(
        self,
        upload: Upload,
        requested: Sequence[tuple[int, str]],
        now_wall: float,
        *,
        part_checksums: Sequence[Mapping[str, str]] = (),
        object_checksum: tuple[str, str] | None = None,
    ) -> Complete:
        """Validate a CompleteMultipartUpload part list the way S3 does; the put record that completes it.

        ``part_checksums``: per requested part, the ``Checksum<ALGORITHM>`` fields of its ``Part`` element
        (algorithm -> base64). ``object_checksum``: the request's own ``x-amz-checksum-<algorithm>`` header
        (algorithm, value), the checksum the client expects the *object* to have. For an upload created with
        a checksum algorithm, every part must name its checksum in that algorithm (else InvalidRequest) and it
        must be the one the part was stored with, as the object's must be the one computed (else BadDigest,
        as the store answers)."""
        if not requested:
            raise MalformedXML("The multipart upload must name at least one part.")
        last = 0
        parts: list[PartFile] = []
        older: list[int] = []
        for number, etag in requested:
            if number <= last:
                raise InvalidPartOrder()
            last = number
            md5 = etag.strip().strip('"')
            part = upload.parts.get(number)
            if part is None or md5 != part.md5:
                part = upload.replaced.get(number)
                if part is None or md5 != part.md5:
                    raise InvalidPart(PartNumber=str(number))
                older.append(number)
            parts.append(part)
        for part in parts[:-1]:
            if part.size < MIN_PART_BYTES:
                raise EntityTooSmall(
                    ProposedSize=str(part.size),
                    MinSizeAllowed=str(MIN_PART_BYTES),
                    PartNumber=str(part.number),
                )
        algo = upload.checksum_algorithm
        if algo is not None:
            algorithm = algo[0]
            for i, part in enumerate(parts):
                named = part_checksums[i] if i < len(part_checksums) else {}
                if set(named) - {algorithm} or algorithm not in named:
                    raise InvalidRequest(
                        f"The upload was created using a {algorithm.lower()} checksum. The complete request"
                        f" must include the checksum for each part. It was missing for part {part.number}"
                        " in the request."
                    )
                if named[algorithm].strip() != part.checksum:
                    raise BadDigest(f"The {algorithm} you specified for part {part.number} did not match.")
            if object_checksum is not None:
                computed = multipart_checksum(
                    algorithm, algo[1], [p.checksum for p in parts], [p.size for p in parts]
                )
                if object_checksum[0].upper() != algorithm or object_checksum[1].strip() != computed:
                    named_algorithm = object_checksum[0].upper()
                    raise BadDigest(
                        f"The {named_algorithm} you specified did not match the calculated checksum."
                    )
        return Complete(
            seq=self.next_seq(),
            upload_id=upload.upload_id,
            part_numbers=tuple(p.number for p in parts),
            bucket=upload.bucket,
            key=upload.key,
            etag=multipart_etag([p.md5 for p in parts]),
            access_key=upload.access_key,
            lane=upload.lane,
            at=now_wall,
            older=tuple(older),
        )

    # -- queries ---------------------------------------------------------------------------------------------

    def lookup(self, bucket: str, key: str) -> Entry | None:
        """The live entry of a key (a put to serve, or a tombstone), if the spool has one."""
        return self._latest.get((bucket, key))

    def has_key(self, bucket: str, key: str) -> bool:
        """True while any entry of the key (live, or superseded but still uploading) is in the spool."""
        ident = (bucket, key)
        return ident in self._latest or ident in self._uploading_keys

    def has_bucket_prefix(self, bucket: str, prefix: str) -> bool:
        return any(e.bucket == bucket and e.key.startswith(prefix) for e in self._latest.values())

    def live_under(self, bucket: str, prefix: str) -> Iterator[Entry]:
        for entry in self._latest.values():
            if entry.bucket == bucket and entry.key.startswith(prefix):
                yield entry

    def pending_under(
        self, bucket: str, prefix: str, max_seq: int | None = None
    ) -> tuple[int, int, float | None]:
        """(objects, bytes, oldest acked_at) of entries not yet on the backend under bucket/prefix."""
        count = 0
        nbytes = 0
        oldest: float | None = None
        for entry in self.entries.values():
            if max_seq is not None and entry.seq > max_seq:
                break
            if entry.bucket == bucket and entry.key.startswith(prefix):
                count += 1
                nbytes += entry.size
                oldest = entry.acked_at if oldest is None else min(oldest, entry.acked_at)
        return count, nbytes, oldest

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def oldest_acked_at(self) -> float | None:
        for entry in self.entries.values():
            return entry.acked_at
        return None

    def pending_by_prefix(self, depth: int = 1) -> dict[tuple[str, str], int]:
        """Pending bytes per (bucket, first `depth` path components of the key)."""
        out: dict[tuple[str, str], int] = {}
        for entry in self.entries.values():
            parts = entry.key.split("/")
            prefix = "/".join(parts[:depth]) + "/" if len(parts) > depth else ""
            ident = (entry.bucket, prefix)
            out[ident] = out.get(ident, 0) + entry.size
        return out

    # -- drain -----------------------------------------------------------------------------------------------

    def drainable(self, now: float, limit: int) -> list[Entry]:
        """Up to ``limit`` entries that may start uploading now, oldest first, keeping every ordering rule."""
        out: list[Entry] = []
        if limit <= 0:
            return out
        # dir prefix -> seq of the oldest entry under it still pending or in flight, per bucket
        earlier: list[Entry] = []
        # A key K and a key under K/ are a file and a directory of one name on a store that keeps a tree
        # (SeaweedFS): written at once, one of them can be lost (a client writing them in turn loses
        # neither). So an entry waits while an earlier one is its file-or-directory namesake.
        earlier_files: set[tuple[str, str]] = set()  # (bucket, key) of earlier entries
        earlier_dirs: set[tuple[str, str]] = set()  # (bucket, "a/b") for every directory of an earlier key
        for entry in self.entries.values():
            ancestors = _ancestor_dirs(entry.key)
            if entry.state is EntryState.PENDING and not entry.superseded and entry.not_before <= now:
                ident = (entry.bucket, entry.key)
                blocked = ident in self._uploading_keys
                if not blocked and entry.marker:
                    prefix = entry.dir_prefix
                    blocked = any(e.bucket == entry.bucket and e.key.startswith(prefix) for e in earlier)
                if not blocked:
                    blocked = (not entry.key.endswith("/") and ident in earlier_dirs) or any(
                        (entry.bucket, d) in earlier_files for d in ancestors
                    )
                if not blocked:
                    out.append(entry)
                    if len(out) >= limit:
                        break
            earlier.append(entry)
            if not entry.key.endswith("/"):
                earlier_files.add((entry.bucket, entry.key))
            earlier_dirs.update((entry.bucket, d) for d in ancestors)
        return out

    def next_retry_at(self, now: float) -> float | None:
        """Earliest time a pending entry leaves its backoff (entries already past it are not timed waits)."""
        times = [
            e.not_before
            for e in self.entries.values()
            if e.state is EntryState.PENDING and not e.superseded and e.not_before > now
        ]
        return min(times) if times else None

    def start_upload(self, entry: Entry) -> None:
        entry.move(EntryState.UPLOADING)
        self._uploading_keys[(entry.bucket, entry.key)] = entry.seq
        entry.attempts += 1

    def upload_failed(self, entry: Entry, retry_at: float, error: str) -> Applied:
        """The attempt failed (or was cancelled). A superseded entry leaves the spool now."""
        entry.move(EntryState.PENDING)
        entry.last_error = error
        ident = (entry.bucket, entry.key)
        if self._uploading_keys.get(ident) == entry.seq:
            del self._uploading_keys[ident]
        if entry.superseded:
            self._remove(entry)
            return Applied(garbage=entry.files, removed=(entry,))
        entry.not_before = retry_at
        return Applied()

    def upload_succeeded(self, entry: Entry) -> None:
        """On the backend; the shell journals a done record (whose apply removes the entry)."""
        entry.move(EntryState.UPLOADED)
        ident = (entry.bucket, entry.key)
        if self._uploading_keys.get(ident) == entry.seq:
            del self._uploading_keys[ident]

    def expired_uploads(self, now_wall: float, max_age_s: float) -> list[Upload]:
        return [u for u in self.uploads.values() if now_wall - u.created_at > max_age_s]

    # -- compaction ------------------------------------------------------------------------------------------

    def snapshot_records(self) -> list[Record]:
        """Records that rebuild the live state on their own (the journal is rewritten with these)."""
        items: list[tuple[int, Put | Delete | CreateUpload]] = []
        for entry in self.entries.values():
            if entry.superseded:
                continue
            if entry.kind == "put":
                items.append(
                    (
                        entry.seq,
                        Put(
                            *entry.head,
                            files=entry.files,
                            size=entry.size,
                            etag=entry.etag,
                            meta=entry.meta,
                            part_sizes=entry.part_sizes if entry.multipart else (),
                            part_md5s=entry.part_md5s if entry.multipart else (),
                            part_checksums=entry.part_checksums if entry.multipart else (),
                        ),
                    )
                )
            else:
                items.append(
                    (
                        entry.seq,
                        Delete(*entry.head),
                    )
                )
        for upload in self.uploads.values():
            items.append(
                (
                    upload.seq,
                    CreateUpload(*upload.head, upload_id=upload.upload_id, meta=upload.meta),
                )
            )
        items.sort(key=lambda item: item[0])
        out: list[Record] = []
        for _, rec in items:
            out.append(rec)
            if isinstance(rec, CreateUpload):
                # Replaced parts first: replayed, each is then replaced again by the part after it.
                for part in self.uploads[rec.upload_id].all_parts():
                    out.append(
                        Part(rec.upload_id, part.number, part.file, part.size, part.md5, part.checksum)
                    )
        for upload_id, (bucket, key, access_key, lane) in self.backend_uploads.items():
            out.append(BackendUpload(bucket, key, access_key, lane, upload_id=upload_id))
        for token, (bucket, key, access_key, lane, not_before) in self.backend_intents.items():
            out.append(BackendIntent(bucket, key, access_key, lane, token=token, not_before=not_before))
        for (bucket, key), wire_seqs in self.wires.items():
            out.extend(Wire(bucket, key, s) for s in sorted(wire_seqs))
        out.append(SeqMark(self.last_seq))
        return out

    def referenced_files(self) -> set[str]:
        files: set[str] = set()
        for entry in self.entries.values():
            files.update(entry.files)
        for upload in self.uploads.values():
            files.update(p.file for p in upload.all_parts())
        return files


class Admission(enum.Enum):
    SPOOL = "spool"
    FULL = "full"  # above high water: write-through or SlowDown, as configured
    TOO_BIG = "too_big"  # cannot fit at all: write-through


@dataclass(slots=True)
class SpoolSpace:
    """Bytes used and reserved against the spool's capacity, with high/low water hysteresis."""

    capacity_bytes: int
    high_water: float
    low_water: float
    used_bytes: int = 0
    reserved_bytes: int = 0
    full: bool = False

    def _update(self, *, may_fill: bool = True) -> None:
        level = self.used_bytes + self.reserved_bytes
        if self.full and level < self.low_water * self.capacity_bytes:
            self.full = False
        elif may_fill and not self.full and level > self.high_water * self.capacity_bytes:
            self.full = True

    def admit(self, nbytes: int, *, must: bool = False) -> Admission:
        """Reserve room for a write of ``nbytes``. ``must``: parts of a spooled upload ignore high water."""
        self._update()
        if self.used_bytes + self.reserved_bytes + nbytes > self.capacity_bytes:
            return Admission.TOO_BIG
        if self.full and not must:
            return Admission.FULL
        self.reserved_bytes += nbytes
        self._update()
        return Admission.SPOOL

    def release(self, reserved: int) -> None:
        """A write finished (its bytes are now counted in ``used``) or failed: drop its reservation."""
        self.reserved_bytes -= reserved
        self._update()

    def set_used(self, nbytes: int) -> None:
        """Bytes on disk changed. May clear ``full``, never set it: a write's bytes land in ``used`` while its
        reservation is still held (counted twice for an instant); high water is judged when writes are
        admitted and released."""
        self.used_bytes = nbytes
        self._update(may_fill=False)

    @property
    def level(self) -> float:
        return (self.used_bytes + self.reserved_bytes) / self.capacity_bytes if self.capacity_bytes else 1.0


def _ancestor_dirs(key: str) -> list[str]:
    """The directories a store that keeps a tree makes for ``key``: ``a`` and ``a/b`` for ``a/b/c``."""
    parts = key.split("/")[:-1]
    return ["/".join(parts[: n + 1]) for n in range(len(parts))]
