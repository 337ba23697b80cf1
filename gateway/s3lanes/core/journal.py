"""The write spool's crash-recovery journal codec: records to frames, and a journal's bytes back to records.

Pure: no file I/O, no asyncio, no clock. The shell (``s3lanes.runtime``) appends the bytes this module
produces with ``os.write`` + ``fsync`` in batches (group commit), and on start-up reads the whole file, calls
:func:`replay`, truncates the file to :attr:`Replay.valid_bytes` and re-applies :attr:`Replay.records`.

Theory of operation
-------------------
A journal file is a 5-byte header followed by frames, one per record::

    file   := header frame*
    header := "S3LJ" version                      5 bytes; version is one byte, currently 0x01

    frame (all integers big-endian):

    offset 0        2                  6                  10                     10 + length
           +--------+------------------+------------------+----------------------+
           | A5 5A  | length (u32)     | crc32c (u32)     | payload              |
           +--------+------------------+------------------+----------------------+
           | magic  |<------------------ CRC32C covers ------------------------->|
                    |  (the 4 length bytes, then the payload; not magic, not the crc itself)

    payload := msgpack.packb(record, use_bin_type=True), a map with str keys, at most MAX_RECORD_BYTES

The CRC covers the length field, so a damaged length is caught like a damaged payload (once the frame it
describes fits in the file). The magic is not needed to walk a clean file; it is what lets :func:`replay` look
for frames at arbitrary offsets after a damaged one.

Torn tail versus corruption. A crash can only tear the *end* of the file: the last batch may have landed in
part, and the filesystem may already have extended the file with zeros (or left junk) where data had not yet
landed. Records in a torn batch were never acknowledged (the shell acknowledges only after fsync), so dropping
them is correct. Damage in the *middle* of the file is different: the frames after it were fsynced and
acknowledged, and dropping them would silently lose writes clients were told are durable. So at the first bad
frame, at offset X, :func:`replay` asks one question: does any valid frame start anywhere after X?

* no  -> torn tail: keep the records before X, report ``valid_bytes = X`` so the shell truncates there;
* yes -> mid-file corruption: raise :class:`JournalCorrupt` and let the gateway refuse to start, loudly.

The same rule applies to the header: an empty file, a prefix of the magic, or a header that is (a prefix of
the magic followed by) zeros is a file whose header never fully landed, i.e. torn at offset 0. A full-length
header that is not ours, or names a version we do not know, is never torn: :class:`JournalCorrupt` at 0.

What this is not: it is not a guarantee against every false alarm. A record whose payload itself contains a
complete, valid frame (for instance a bytes value holding another journal's frames), cut by a crash before its
own end, will be reported as corruption because the embedded frame is found by the scan. That errs on the
loud side, which is the side we want; records in this gateway are metadata and never embed frames. The same
holds if a crash persists the pages of one unsynced batch out of order (a hole, then a later frame of that
batch): replay cannot tell that from damage to acknowledged data, so it reports corruption.

Cost: replay is one pass over the frames (one CRC32C and one ``msgpack.unpackb`` per frame). The scan after a
bad frame uses ``bytes.find`` for the magic and then tests candidates cheapest-first (length sane, fits, the
payload starts with a msgpack map marker, CRC, decode), so a torn tail, which is at most one batch long, costs
next to nothing. Measured (CPython 3.11, one core): 64 MiB of 1 KiB frames with a torn tail, 0.15-0.18 s;
64 MiB of 154-byte frames (436k records), about 0.8 s, of which unpackb is ~0.5 us and the CRC ~0.3 us per
frame; 64 MiB of zeros or random junk after a bad frame, ~0.1 s of scanning. A tail hand-crafted to be full
of plausible frame headers (1M of them: ~1.2 s) is the slow case; such a file is corrupt anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack
from awscrt import checksums

from s3lanes.errors import GatewayError

__all__ = [
    "FILE_MAGIC",
    "FRAME_HEADER_BYTES",
    "FRAME_MAGIC",
    "HEADER_BYTES",
    "JOURNAL_VERSION",
    "MAX_RECORD_BYTES",
    "JournalCorrupt",
    "Replay",
    "encode_batch",
    "encode_record",
    "file_header",
    "replay",
]

JOURNAL_VERSION: Final = 1
_FILE_MAGIC_PREFIX: Final = b"S3LJ"
FILE_MAGIC: Final = _FILE_MAGIC_PREFIX + bytes([JOURNAL_VERSION])
HEADER_BYTES: Final = len(FILE_MAGIC)

FRAME_MAGIC: Final = b"\xa5\x5a"
MAX_RECORD_BYTES: Final = 16 * 1024 * 1024
# Records may carry the number of the append batch they were written in (the shell sets it); replay uses
# it to tell a torn last batch with a hole from damage (see _hole_in_last_batch).
BATCH_KEY: Final = "_b"

# magic (2s), payload length (u32), CRC32C of length bytes + payload (u32).
_FRAME_HEAD: Final = struct.Struct(">2sII")
FRAME_HEADER_BYTES: Final = _FRAME_HEAD.size
_LENGTH: Final = struct.Struct(">I")
_LENGTH_START: Final = len(FRAME_MAGIC)
_CRC_START: Final = _LENGTH_START + _LENGTH.size

# First byte of a msgpack map: fixmap (0x80-0x8f), map16 (0xde), map32 (0xdf). Only a scan pre-filter.
_MAP_MARKERS: Final = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])

# Everything msgpack.unpackb is known to raise on garbage: FormatError, StackError, ExtraData and
# UnpackValueError are ValueErrors; OutOfData and BufferFull are only UnpackExceptions; TypeError and
# OverflowError are caught defensively (unhashable or out-of-range values from odd encodings).
_DECODE_ERRORS: Final = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


class JournalCorrupt(GatewayError):
    """The journal is damaged somewhere other than its tail, or is not an s3lanes journal at all.

    Not a torn tail: those are repaired silently by :func:`replay`. This one means acknowledged writes may be
    lost, so recovery must stop and a human must look. ``offset`` is where the first bad byte range starts;
    ``next_valid_offset`` is where the scan found a valid frame after it (None for header errors).
    """

    def __init__(self, offset: int, reason: str, next_valid_offset: int | None = None) -> None:
        self.offset = offset
        self.reason = reason
        self.next_valid_offset = next_valid_offset
        super().__init__(f"journal corrupt at offset {offset}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.offset, self.reason, self.next_valid_offset))


@dataclass(frozen=True, slots=True)
class Replay:
    """What :func:`replay` found: the good records and where the good prefix of the file ends."""

    records: list[dict[str, Any]]
    # Header + whole good frames. The shell truncates the file to this length before appending again;
    # 0 means the header itself is missing or torn and must be (re)written.
    valid_bytes: int
    # Bytes after valid_bytes that were discarded as a torn tail; 0 for a clean file.
    torn_bytes: int

    @property
    def torn(self) -> bool:
        return self.torn_bytes > 0


def file_header() -> bytes:
    """The bytes a new journal file starts with."""
    return FILE_MAGIC


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One frame holding ``record``.

    Every frame this returns is one :func:`replay` accepts: a record that would not decode back (a non-str
    top-level key, a nested map key msgpack refuses to decode strictly) is refused here, at append time,
    rather than discovered at recovery time as "corruption" that stops the gateway. Raises TypeError for
    non-str top-level keys or values msgpack cannot pack, OverflowError for ints outside msgpack's range
    (-2**63 .. 2**64-1), ValueError for a payload over MAX_RECORD_BYTES or one that does not decode back.
    """
    for key in record:
        if type(key) is not str:
            raise TypeError(f"journal record keys must be str, got {type(key).__name__}: {key!r}")
    payload: bytes = msgpack.packb(dict(record), use_bin_type=True)
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"journal record is {len(payload)} bytes packed; the limit is {MAX_RECORD_BYTES}")
    # Checking decodability costs one decode per append; records are small metadata and appends are
    # fsync-bound, while an undecodable frame would halt the next start-up.
    problem = _decode_payload(payload)
    if isinstance(problem, str):
        raise ValueError(f"journal record does not decode back: {problem}")
    length = _LENGTH.pack(len(payload))
    crc = checksums.crc32c(payload, checksums.crc32c(length))
    return b"".join((FRAME_MAGIC, length, _LENGTH.pack(crc), payload))


def encode_batch(records: Iterable[Mapping[str, Any]]) -> bytes:
    """The frames for ``records``, concatenated: one ``os.write`` for a group commit."""
    return b"".join([encode_record(record) for record in records])


def replay(data: bytes | memoryview) -> Replay:
    """Decode a whole journal file. Returns the good records; raises :class:`JournalCorrupt` (only) otherwise.

    Never raises for a torn tail, however it is torn (cut mid-frame, padded with zeros, followed by junk).
    """
    with memoryview(data) as view:
        # Sub-views made below die with _replay's frame, so the release here always succeeds and a caller's
        # mmap can be closed even while a JournalCorrupt (and its traceback) is still alive.
        outcome = _replay(view.cast("B") if view.format != "B" or view.ndim != 1 else view)
    if isinstance(outcome, JournalCorrupt):
        raise outcome
    return outcome


# --------------------------------------------------------------------------------------------------
# Internals


def _replay(view: memoryview) -> Replay | JournalCorrupt:
    size = len(view)
    if size == 0:
        return Replay([], 0, 0)
    head = bytes(view[:HEADER_BYTES])
    if head != FILE_MAGIC:
        if not _is_torn_header(head):
            reason = "not an s3lanes journal"
            if len(head) == HEADER_BYTES and head.startswith(_FILE_MAGIC_PREFIX):
                reason = f"unsupported journal version {head[-1]}"
            return JournalCorrupt(0, reason)
        return _torn_or_corrupt(view, [], 0, "journal header is torn")

    records: list[dict[str, Any]] = []
    pos = HEADER_BYTES
    while pos < size:
        frame = _read_frame(view, pos)
        if isinstance(frame, str):
            return _torn_or_corrupt(view, records, pos, frame)
        record, pos = frame
        records.append(record)
    return Replay(records, size, 0)


def _is_torn_header(head: bytes) -> bool:
    """A header that never fully landed: a prefix of FILE_MAGIC, then nothing or zeros."""
    landed = 0
    while landed < len(head) and head[landed] == FILE_MAGIC[landed]:
        landed += 1
    return head[landed:].count(0) == len(head) - landed


def _torn_or_corrupt(
    view: memoryview, records: list[dict[str, Any]], bad_offset: int, reason: str
) -> Replay | JournalCorrupt:
    next_valid = _find_valid_frame(view, bad_offset + 1)
    if next_valid is None:
        return Replay(records, bad_offset, len(view) - bad_offset)
    if _hole_in_last_batch(view, records, next_valid):
        return Replay(records, bad_offset, len(view) - bad_offset)
    return JournalCorrupt(
        bad_offset,
        f"{reason}, yet a valid frame follows at offset {next_valid}: the journal is damaged, not torn",
        next_valid,
    )


def _hole_in_last_batch(view: memoryview, records: list[dict[str, Any]], first_valid: int) -> bool:
    """True if every valid frame after a damaged spot belongs to the newest batch (``BATCH_KEY``).

    The shell appends one batch with one write and fdatasyncs it before it acknowledges anything in it, and
    writes the next batch only after that. A crash during a batch's write-back may persist its pages in any
    order: a hole, then a later frame of the same batch. Earlier batches were synced, so they cannot have
    holes. Such a tail is torn (nothing in it was acknowledged), not damaged.
    """
    batches = {r.get(BATCH_KEY) for r in records}
    newest_before = max((b for b in batches if isinstance(b, int)), default=-1)
    pos: int | None = first_valid
    after: set[Any] = set()
    while pos is not None and pos < len(view):
        frame = _read_frame(view, pos)
        if isinstance(frame, str):
            pos = _find_valid_frame(view, pos + 1)
            continue
        record, pos = frame
        after.add(record.get(BATCH_KEY))
    if len(after) != 1:
        return False
    (batch,) = after
    return isinstance(batch, int) and batch >= newest_before


def _read_frame(view: memoryview, pos: int) -> tuple[dict[str, Any], int] | str:
    """The record in the frame at ``pos`` and the offset just past the frame, or why it is not a frame."""
    size = len(view)
    if size - pos < FRAME_HEADER_BYTES:
        return f"frame header cut short ({size - pos} of {FRAME_HEADER_BYTES} bytes)"
    magic, length, crc = _FRAME_HEAD.unpack_from(view, pos)
    if magic != FRAME_MAGIC:
        return f"bad frame magic {magic.hex()}"
    if length > MAX_RECORD_BYTES:
        return f"frame length {length} exceeds the {MAX_RECORD_BYTES}-byte limit"
    end = pos + FRAME_HEADER_BYTES + length
    if end > size:
        return f"frame of {length} payload bytes runs {end - size} bytes past the end of the data"
    payload = view[pos + FRAME_HEADER_BYTES : end]
    if checksums.crc32c(payload, checksums.crc32c(view[pos + _LENGTH_START : pos + _CRC_START])) != crc:
        return "frame CRC32C mismatch"
    record = _decode_payload(payload)
    if isinstance(record, str):
        return record
    return record, end


def _decode_payload(payload: bytes | memoryview) -> dict[str, Any] | str:
    """The record a payload holds, or why it holds none.

    Bounded in memory: unpackb caps every declared str/bin/array/map length at len(payload).
    """
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except _DECODE_ERRORS as exc:
        return f"payload is not valid msgpack ({type(exc).__name__}: {exc})"
    if not isinstance(value, dict):
        return f"payload is a msgpack {type(value).__name__}, not a map"
    for key in value:
        if type(key) is not str:
            return f"payload map has a {type(key).__name__} key"
    return value


def _find_valid_frame(view: memoryview, start: int) -> int | None:
    """The offset of the first valid frame starting at or after ``start``, or None."""
    size = len(view)
    if size - start < FRAME_HEADER_BYTES + 1:  # the smallest valid payload, an empty map, is 1 byte
        return None
    haystack = bytes(view[start:])  # a torn tail is at most one batch; a copy lets us use bytes.find
    hit = haystack.find(FRAME_MAGIC)
    while hit != -1:
        pos = start + hit
        if size - pos < FRAME_HEADER_BYTES + 1:
            return None
        # Cheapest tests first: most magic-looking byte pairs in junk fail on length or the map marker,
        # without paying for a CRC over up to MAX_RECORD_BYTES.
        _, length, _ = _FRAME_HEAD.unpack_from(view, pos)
        if (
            0 < length <= MAX_RECORD_BYTES
            and pos + FRAME_HEADER_BYTES + length <= size
            and view[pos + FRAME_HEADER_BYTES] in _MAP_MARKERS
            and not isinstance(_read_frame(view, pos), str)
        ):
            return pos
        hit = haystack.find(FRAME_MAGIC, hit + 1)
    return None
