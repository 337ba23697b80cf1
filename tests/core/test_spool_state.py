"""The spool's pure bookkeeping: records applied in journal order, supersession, commit markers, multipart,
retries, replay/compaction equivalence, the drain order the backend sees, and the space hysteresis.

No I/O and no clock: every time is an explicit ``now`` (monotonic) or ``now_wall`` (journaled) argument.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from s3lanes.core.journal_records import Done, Record, Unwire, Wire
from s3lanes.core.spool_state import (
    MIN_PART_BYTES,
    Admission,
    Applied,
    Entry,
    EntryState,
    Origin,
    PartFile,
    SpoolSpace,
    SpoolState,
    Upload,
    multipart_etag,
)
from s3lanes.core.transitions import IllegalTransition
from s3lanes.errors import EntityTooSmall, InvalidPart, InvalidPartOrder, MalformedXML, S3Error
from tests.budget import examples

MARKERS = (".metadata", "COMMIT")
B = "bkt"
T0 = 1_000.0  # monotonic "now" of the drain side
WALL0 = 1_700_000_000.0  # wall clock written into records
FAR = 1e12  # a "now" after every backoff

Ident = tuple[str, str]


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def part_data(number: int) -> bytes:
    return f"part-{number}".encode()


def part_etag(number: int) -> str:
    return f'"{md5_hex(part_data(number))}"'


class Spool:
    """A SpoolState plus what its shell keeps: the journal (every applied record, in order), the files it
    wrote (id -> size) and how often each was reported as garbage."""

    def __init__(self, markers: Sequence[str] = MARKERS) -> None:
        self.state = SpoolState(markers)
        self.records: list[Record] = []
        self.written: dict[str, int] = {}
        self.garbage: Counter[str] = Counter()
        self.last = Applied()
        self._ids = itertools.count(1)
        self._wall = WALL0

    def wall(self) -> float:
        self._wall += 1.0
        return self._wall

    def new_file(self, size: int) -> str:
        file = f"f{next(self._ids)}"
        self.written[file] = size
        return file

    def apply(self, rec: Record) -> Applied:
        applied = self.state.apply(rec)
        self.records.append(rec)
        self.garbage.update(applied.garbage)
        self.last = applied
        return applied

    def track(self, applied: Applied) -> Applied:
        """Count the garbage of an Applied that did not come from a record (upload_failed)."""
        self.garbage.update(applied.garbage)
        self.last = applied
        return applied

    def put(self, key: str, *, bucket: str = B, size: int = 100, data: bytes | None = None) -> Entry:
        file = self.new_file(size)
        body = data if data is not None else f"{bucket}/{key}/{file}".encode()
        rec = self.state.put_record(
            bucket=bucket,
            key=key,
            file=file,
            size=size,
            md5=md5_hex(body),
            meta=(("content-type", "application/octet-stream"),),
            origin=Origin("AK", "checkpoint", self.wall()),
        )
        self.apply(rec)
        return self.state.entries[rec.seq]

    def delete(self, key: str, *, bucket: str = B) -> Entry:
        rec = self.state.delete_record(bucket=bucket, key=key, origin=Origin("AK", "checkpoint", self.wall()))
        self.apply(rec)
        return self.state.entries[rec.seq]

    def create(self, key: str, upload_id: str, *, bucket: str = B) -> Upload:
        rec = self.state.create_upload_record(
            upload_id=upload_id,
            bucket=bucket,
            key=key,
            meta=(("x-amz-meta-step", "10"),),
            origin=Origin("AK", "checkpoint", self.wall()),
        )
        self.apply(rec)
        return self.state.uploads[upload_id]

    def part(self, upload_id: str, number: int, size: int, data: bytes | None = None) -> PartFile:
        file = self.new_file(size)
        md5 = md5_hex(data if data is not None else part_data(number))
        self.apply(SpoolState.part_record(upload_id=upload_id, number=number, file=file, size=size, md5=md5))
        return PartFile(number, file, size, md5)

    def complete(self, upload_id: str, numbers: Sequence[int]) -> Entry:
        upload = self.state.uploads[upload_id]
        requested = [(n, upload.parts[n].etag) for n in numbers]
        rec = self.state.complete_record(upload, requested, self.wall())
        self.apply(rec)
        return self.state.entries[rec.seq]

    def done(self, entry: Entry) -> Applied:
        return self.apply(SpoolState.done_record(entry.seq, entry))

    def ship(self, entry: Entry) -> Applied:
        """Upload ``entry`` successfully and journal its done record."""
        self.state.start_upload(entry)
        self.state.upload_succeeded(entry)
        return self.done(entry)

    def assert_files_accounted(self) -> None:
        """Every file written is either still referenced or was reported garbage, exactly once; the bytes
        on disk are the sizes of the referenced files."""
        assert max(self.garbage.values(), default=1) == 1, self.garbage.most_common(3)
        assert set(self.garbage) <= set(self.written)
        outstanding = set(self.written) - set(self.garbage)
        assert self.state.referenced_files() == outstanding
        assert self.state.bytes_on_disk == sum(self.written[f] for f in outstanding)


def seqs(entries: Sequence[Entry]) -> list[int]:
    return [e.seq for e in entries]


# -- basics ------------------------------------------------------------------------------------------------


def test_put_is_served_by_lookup_until_its_done_record_then_its_files_and_bytes_are_released() -> None:
    s = Spool()
    a = s.put("x/a", size=100)
    b = s.put("x/b", size=50)
    assert s.state.lookup(B, "x/a") is a and s.state.has_key(B, "x/a")
    assert s.state.lookup("other", "x/a") is None and not s.state.has_key("other", "x/a")
    assert a.kind == "put" and a.files == ("f1",) and a.etag == f'"{md5_hex(b"bkt/x/a/f1")}"'
    assert not a.marker and not a.multipart
    assert s.state.bytes_on_disk == 150
    assert s.state.last_seq == b.seq == a.seq + 1

    drained = s.state.drainable(T0, 10)
    assert seqs(drained) == [a.seq, b.seq]
    for entry in drained:
        s.state.start_upload(entry)
        s.state.upload_succeeded(entry)
    # Uploaded but not yet journaled as done: still served from the spool, no longer drainable.
    assert s.state.lookup(B, "x/a") is a and a.state is EntryState.UPLOADED
    assert s.state.drainable(T0, 10) == []

    applied = s.done(a)
    assert applied == Applied(garbage=a.files, removed=(a,))
    assert s.state.lookup(B, "x/a") is None and not s.state.has_key(B, "x/a")
    assert s.state.bytes_on_disk == 50
    s.done(b)
    assert s.done(a) == Applied()  # a repeated (or stale) done record is a no-op
    assert s.state.entries == {} and s.state.bytes_on_disk == 0
    assert set(s.garbage) == set(s.written)
    s.assert_files_accounted()


def test_every_file_is_garbage_exactly_once_over_a_mixed_life() -> None:
    s = Spool()
    first = s.put("k/a", size=10)
    s.put("k/a", size=11)  # supersedes a pending entry
    uploading = s.put("k/b", size=12)
    s.state.start_upload(uploading)
    s.put("k/b", size=13)  # supersedes an entry in flight: its files stay until the upload ends
    s.delete("k/a")
    s.track(s.state.upload_failed(uploading, T0, "cancelled"))
    s.create("k/big", "u1")
    s.part("u1", 1, MIN_PART_BYTES)
    s.part("u1", 1, MIN_PART_BYTES)  # re-upload of part 1
    s.part("u1", 2, 5)
    s.part("u1", 3, 6)
    s.complete("u1", [1, 2])  # part 3 unused
    s.create("k/gone", "u2")
    s.part("u2", 1, 7)
    s.apply(SpoolState.abort_record("u2"))
    s.part("u2", 2, 8)  # written while the abort was journaled
    s.assert_files_accounted()
    assert s.garbage[first.files[0]] == 1

    for _ in range(10):
        drained = s.state.drainable(FAR, 100)
        if not drained:
            break
        for entry in drained:
            s.ship(entry)
    assert s.state.entries == {} and s.state.uploads == {}
    assert set(s.garbage) == set(s.written)
    s.assert_files_accounted()
    assert s.state.bytes_on_disk == 0


# -- supersession ------------------------------------------------------------------------------------------


def test_newer_put_supersedes_a_pending_entry_whose_files_become_garbage_and_which_never_drains() -> None:
    s = Spool()
    a = s.put("k", size=100)
    b = s.put("k", size=30)
    assert s.last == Applied(garbage=a.files, removed=(a,))
    assert s.state.lookup(B, "k") is b
    assert a.seq not in s.state.entries
    assert seqs(s.state.drainable(T0, 10)) == [b.seq]
    assert s.state.bytes_on_disk == 30
    s.assert_files_accounted()


def test_newer_put_supersedes_an_uploaded_entry_awaiting_its_done_record_at_once() -> None:
    s = Spool()
    a = s.put("k")
    s.state.start_upload(a)
    s.state.upload_succeeded(a)
    b = s.put("k")
    assert s.last == Applied(garbage=a.files, removed=(a,))  # already on the backend: nothing to cancel
    assert seqs(s.state.drainable(T0, 10)) == [b.seq]
    assert s.done(a) == Applied()
    assert s.state.lookup(B, "k") is b
    s.assert_files_accounted()


@pytest.mark.parametrize("newer_kind", ["put", "del"])
@pytest.mark.parametrize("outcome", ["failed", "succeeded"])
def test_superseding_an_uploading_entry_cancels_it_and_blocks_the_newer_one_until_the_upload_ends(
    newer_kind: str, outcome: str
) -> None:
    s = Spool()
    a = s.put("k", size=100)
    s.state.start_upload(a)
    newer = s.put("k", size=40) if newer_kind == "put" else s.delete("k")
    assert s.last == Applied(cancel=(a.seq,), removed=(a,))
    assert a.superseded
    assert s.state.lookup(B, "k") is newer and newer.kind == newer_kind
    assert s.state.has_key(B, "k")
    # The cancelled upload still reads its files: they are neither garbage nor freed yet.
    assert a.seq in s.state.entries and set(a.files) <= s.state.referenced_files()
    assert s.state.bytes_on_disk == 100 + newer.size
    assert s.state.drainable(T0, 10) == []
    assert s.state.drainable(FAR, 10) == []
    s.assert_files_accounted()

    if outcome == "failed":
        applied = s.track(s.state.upload_failed(a, T0 + 100.0, "cancelled"))
        assert applied == Applied(garbage=a.files, removed=(a,))
        assert a.seq not in s.state.entries
    else:
        s.state.upload_succeeded(a)  # the cancel lost the race: a is on the backend
        assert seqs(s.state.drainable(T0, 10)) == [newer.seq]  # before a's done record, already
        assert s.done(a) == Applied(garbage=a.files, removed=(a,))
    assert s.state.lookup(B, "k") is newer
    assert seqs(s.state.drainable(T0, 10)) == [newer.seq]  # a's backoff is not inherited
    assert s.state.bytes_on_disk == newer.size
    s.assert_files_accounted()
    s.ship(newer)
    assert not s.state.has_key(B, "k") and s.state.bytes_on_disk == 0


def test_a_third_version_does_not_cancel_twice_and_waits_for_the_first_upload() -> None:
    s = Spool()
    a = s.put("k")
    s.state.start_upload(a)
    b = s.put("k")
    c = s.put("k")
    assert s.last == Applied(garbage=b.files, removed=(b,))  # b was pending: dropped, nothing to cancel
    assert s.state.drainable(T0, 10) == []
    s.track(s.state.upload_failed(a, T0, "cancelled"))
    assert seqs(s.state.drainable(T0, 10)) == [c.seq]
    s.assert_files_accounted()


# -- commit markers ----------------------------------------------------------------------------------------


def test_marker_waits_for_pending_shards_of_its_directory() -> None:
    s = Spool()
    shard1 = s.put("ckpt/step10/shard1")
    shard2 = s.put("ckpt/step10/shard2")
    meta = s.put("ckpt/step10/.metadata")
    assert meta.marker and not shard1.marker
    assert seqs(s.state.drainable(T0, 10)) == [shard1.seq, shard2.seq]
    s.ship(shard1)
    assert seqs(s.state.drainable(T0, 10)) == [shard2.seq]
    s.ship(shard2)
    assert seqs(s.state.drainable(T0, 10)) == [meta.seq]


def test_marker_waits_until_uploading_shards_are_done_not_merely_uploaded() -> None:
    s = Spool()
    shard1 = s.put("ckpt/step10/shard1")
    shard2 = s.put("ckpt/step10/shard2")
    meta = s.put("ckpt/step10/.metadata")
    s.state.start_upload(shard1)
    s.state.start_upload(shard2)
    assert s.state.drainable(T0, 10) == []
    s.state.upload_succeeded(shard1)
    s.done(shard1)
    assert s.state.drainable(T0, 10) == []  # shard2 still in flight
    s.track(s.state.upload_failed(shard2, T0 + 5.0, "503"))
    assert s.state.drainable(T0, 10) == []  # shard2 backing off still blocks the marker
    assert seqs(s.state.drainable(T0 + 5.0, 10)) == [shard2.seq]
    s.state.start_upload(shard2)
    s.state.upload_succeeded(shard2)
    assert s.state.drainable(T0 + 5.0, 10) == []  # on the backend, but its done record is not applied
    s.done(shard2)
    assert seqs(s.state.drainable(T0 + 5.0, 10)) == [meta.seq]


def test_marker_is_blocked_by_older_tombstones_and_subdirectories_under_its_prefix() -> None:
    s = Spool()
    s.put("ckpt/step10/old")
    gone = s.delete("ckpt/step10/old")
    sub = s.put("ckpt/step10/sub/shard")
    commit = s.put("ckpt/step10/COMMIT")
    assert seqs(s.state.drainable(T0, 10)) == [gone.seq, sub.seq]
    s.ship(gone)
    assert seqs(s.state.drainable(T0, 10)) == [sub.seq]
    s.ship(sub)
    assert seqs(s.state.drainable(T0, 10)) == [commit.seq]


def test_marker_in_another_directory_or_bucket_is_not_blocked() -> None:
    s = Spool()
    shard = s.put("ckpt/step10/shard1")
    other_dir = s.put("ckpt/step1/.metadata")  # "ckpt/step1/" is not a prefix of "ckpt/step10/..."
    sibling = s.put("ckpt/step11/COMMIT")
    other_bucket = s.put("ckpt/step10/.metadata", bucket="other")
    assert seqs(s.state.drainable(T0, 10)) == [shard.seq, other_dir.seq, sibling.seq, other_bucket.seq]


def test_shard_acknowledged_after_the_marker_does_not_block_it() -> None:
    s = Spool()
    meta = s.put("ckpt/step10/.metadata")
    late = s.put("ckpt/step10/shard9")
    assert seqs(s.state.drainable(T0, 10)) == [meta.seq, late.seq]


def test_shard_rewritten_after_the_marker_unblocks_the_marker() -> None:
    s = Spool()
    s.put("ckpt/step10/shard1")
    meta = s.put("ckpt/step10/.metadata")
    rewrite = s.put("ckpt/step10/shard1")  # supersedes the pending shard acknowledged before the marker
    assert seqs(s.state.drainable(T0, 10)) == [meta.seq, rewrite.seq]


def test_a_key_and_a_key_under_it_drain_one_after_the_other_in_acknowledgement_order() -> None:
    # On a store that keeps a tree, a/b is a file and a/b/c needs a directory a/b: written at once, one of
    # them can be lost. Each waits for an earlier namesake, either way round; others are not held up.
    s = Spool()
    file_ = s.put("a/b")
    under = s.put("a/b/c")
    other = s.put("a/c")
    deeper_first = s.put("x/y/z")
    file_after = s.put("x/y")
    elsewhere = s.put("a/b/c", bucket="other")
    assert seqs(s.state.drainable(T0, 10)) == [file_.seq, other.seq, deeper_first.seq, elsewhere.seq]
    s.state.start_upload(file_)
    assert seqs(s.state.drainable(T0, 10)) == [other.seq, deeper_first.seq, elsewhere.seq]  # in flight
    s.state.upload_succeeded(file_)
    s.done(file_)
    s.ship(deeper_first)
    assert seqs(s.state.drainable(T0, 10)) == [under.seq, other.seq, file_after.seq, elsewhere.seq]


def test_drainable_is_oldest_first_and_honours_the_limit() -> None:
    s = Spool()
    entries = [s.put(f"k{i}") for i in range(5)]
    assert seqs(s.state.drainable(T0, 2)) == seqs(entries[:2])
    assert s.state.drainable(T0, 0) == []
    s.state.start_upload(entries[0])
    assert seqs(s.state.drainable(T0, 2)) == seqs(entries[1:3])


# -- multipart ---------------------------------------------------------------------------------------------


def test_multipart_complete_keeps_the_chosen_parts_and_computes_the_s3_etag() -> None:
    s = Spool()
    upload = s.create("big/obj", "u1")
    p1 = s.part("u1", 1, MIN_PART_BYTES)
    p2_old = s.part("u1", 2, MIN_PART_BYTES, b"first try")
    p2 = s.part("u1", 2, MIN_PART_BYTES + 7)
    assert s.last == Applied()  # the replaced part is kept until the completion
    p3 = s.part("u1", 3, 10)
    p4 = s.part("u1", 4, 20)
    assert s.state.bytes_on_disk == 3 * MIN_PART_BYTES + 7 + 30
    assert s.state.lookup(B, "big/obj") is None  # nothing acknowledged until the completion
    assert upload.size == s.state.bytes_on_disk

    entry = s.complete("u1", [1, 2, 4])
    assert sorted(s.last.garbage) == sorted((p2_old.file, p3.file))
    digests = b"".join(hashlib.md5(part_data(n), usedforsecurity=False).digest() for n in (1, 2, 4))
    by_hand = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-3"'
    assert entry.etag == by_hand == multipart_etag([p1.md5, p2.md5, p4.md5])
    assert entry.files == (p1.file, p2.file, p4.file)
    assert entry.part_sizes == (MIN_PART_BYTES, MIN_PART_BYTES + 7, 20)
    assert entry.part_md5s == (p1.md5, p2.md5, p4.md5)
    assert entry.size == sum(entry.part_sizes) and entry.multipart
    assert entry.meta == (("x-amz-meta-step", "10"),)
    assert s.state.lookup(B, "big/obj") is entry
    assert "u1" not in s.state.uploads
    assert s.state.bytes_on_disk == entry.size
    s.assert_files_accounted()


def test_a_part_uploaded_twice_completes_with_either_etag_and_only_one_older_version_is_kept() -> None:
    """Two uploads of one part can run at once; the store completes with the ETag of either."""
    s = Spool()
    upload = s.create("obj", "u1")
    first = s.part("u1", 1, 10, b"first")
    second = s.part("u1", 1, 11, b"second")
    assert s.last == Applied()
    third = s.part("u1", 1, 12, b"third")
    assert s.last == Applied(garbage=(first.file,))  # one replaced version per part number
    assert s.state.bytes_on_disk == 23 == upload.size
    with pytest.raises(InvalidPart):
        s.state.complete_record(upload, [(1, first.etag)], WALL0)
    rec = s.state.complete_record(upload, [(1, second.etag)], WALL0)
    assert rec.older == (1,)
    s.apply(rec)
    entry = s.state.entries[rec.seq]
    assert entry.files == (second.file,) and entry.etag == multipart_etag([second.md5])
    assert s.last.garbage == (third.file,)
    assert s.state.bytes_on_disk == 11
    s.assert_files_accounted()


def test_replaced_parts_survive_compaction_and_replay() -> None:
    s = Spool()
    s.create("obj", "u1")
    s.part("u1", 1, 10, b"first")
    second = s.part("u1", 1, 11, b"second")
    replayed = SpoolState(MARKERS)
    for rec in s.state.snapshot_records():
        replayed.apply(rec)
    upload = replayed.uploads["u1"]
    assert upload.replaced[1].md5 == md5_hex(b"first") and upload.parts[1] == second
    assert replayed.bytes_on_disk == s.state.bytes_on_disk == 21
    assert replayed.referenced_files() == s.state.referenced_files()


def test_multipart_etag_of_one_part_still_carries_the_part_count() -> None:
    md5 = md5_hex(b"only")
    expected = hashlib.md5(bytes.fromhex(md5), usedforsecurity=False).hexdigest()
    assert multipart_etag([md5]) == f'"{expected}-1"'


def test_complete_accepts_part_etags_with_or_without_quotes() -> None:
    s = Spool()
    upload = s.create("obj", "u1")
    s.part("u1", 1, MIN_PART_BYTES)
    s.part("u1", 2, 1)
    rec = s.state.complete_record(upload, [(1, part_etag(1).strip('"')), (2, f" {part_etag(2)} ")], WALL0)
    assert rec.part_numbers == (1, 2)


BAD_ETAG = '"00000000000000000000000000000000"'


@pytest.mark.parametrize(
    ("requested", "error"),
    [
        ([], MalformedXML),
        ([(2, part_etag(2)), (1, part_etag(1))], InvalidPartOrder),
        ([(1, part_etag(1)), (1, part_etag(1))], InvalidPartOrder),
        ([(1, part_etag(1)), (9, part_etag(9))], InvalidPart),
        ([(1, BAD_ETAG)], InvalidPart),
        ([(1, part_etag(2))], InvalidPart),
        ([(3, part_etag(3)), (4, part_etag(4))], EntityTooSmall),
        ([(1, part_etag(1)), (3, part_etag(3)), (4, part_etag(4))], EntityTooSmall),
    ],
)
def test_complete_rejects_bad_part_lists_without_touching_the_state(
    requested: list[tuple[int, str]], error: type[S3Error]
) -> None:
    s = Spool()
    upload = s.create("obj", "u1")
    s.part("u1", 1, MIN_PART_BYTES)
    s.part("u1", 2, MIN_PART_BYTES)
    s.part("u1", 3, MIN_PART_BYTES - 1)
    s.part("u1", 4, 1)
    seq_before = s.state.last_seq
    with pytest.raises(error):
        s.state.complete_record(upload, requested, WALL0)
    assert s.state.last_seq == seq_before
    assert sorted(s.state.uploads["u1"].parts) == [1, 2, 3, 4]


def test_entity_too_small_names_the_offending_part() -> None:
    s = Spool()
    upload = s.create("obj", "u1")
    s.part("u1", 1, MIN_PART_BYTES)
    s.part("u1", 2, 10)
    s.part("u1", 3, 1)
    with pytest.raises(EntityTooSmall) as info:
        s.state.complete_record(upload, [(1, part_etag(1)), (2, part_etag(2)), (3, part_etag(3))], WALL0)
    assert info.value.extra == {
        "ProposedSize": "10",
        "MinSizeAllowed": str(MIN_PART_BYTES),
        "PartNumber": "2",
    }


def test_single_small_part_or_small_last_part_is_allowed() -> None:
    s = Spool()
    s.create("a", "u1")
    s.part("u1", 1, 1)
    assert s.complete("u1", [1]).size == 1
    s.create("b", "u2")
    s.part("u2", 1, MIN_PART_BYTES)
    s.part("u2", 2, 1)
    assert s.complete("u2", [1, 2]).size == MIN_PART_BYTES + 1


def test_abort_frees_every_part_and_a_late_part_record_is_garbage_at_once() -> None:
    s = Spool()
    s.create("obj", "u1")
    p1 = s.part("u1", 1, MIN_PART_BYTES)
    p2 = s.part("u1", 2, 3)
    assert s.apply(SpoolState.abort_record("u1")) == Applied(garbage=(p1.file, p2.file))
    assert s.state.uploads == {} and s.state.bytes_on_disk == 0
    late = s.part("u1", 3, 4)
    assert s.last == Applied(garbage=(late.file,))
    assert s.state.bytes_on_disk == 0
    assert s.apply(SpoolState.abort_record("u1")) == Applied()  # a second abort is a no-op
    s.assert_files_accounted()
    assert set(s.garbage) == set(s.written)


def test_completing_a_multipart_upload_supersedes_the_keys_older_entry() -> None:
    s = Spool()
    old = s.put("obj")
    s.state.start_upload(old)
    s.create("obj", "u1")
    s.part("u1", 1, 5)
    unused = s.part("u1", 2, 6)
    entry = s.complete("u1", [1])
    assert s.last == Applied(garbage=(unused.file,), cancel=(old.seq,), removed=(old,))
    assert s.state.lookup(B, "obj") is entry
    s.assert_files_accounted()


def test_completion_record_of_an_unknown_upload_is_a_journal_error() -> None:
    s = Spool()
    upload = s.create("obj", "u1")
    s.part("u1", 1, 5)
    rec = s.state.complete_record(upload, [(1, part_etag(1))], WALL0)
    s.apply(SpoolState.abort_record("u1"))
    with pytest.raises(ValueError, match="unknown upload"):
        s.state.apply(rec)


# -- retries -----------------------------------------------------------------------------------------------


def test_failed_upload_backs_off_until_not_before() -> None:
    s = Spool()
    a = s.put("k")
    assert s.state.next_retry_at(T0) is None  # pending, but not backing off
    s.state.start_upload(a)
    assert s.state.next_retry_at(T0) is None  # nothing pending
    assert s.state.upload_failed(a, T0 + 30.0, "503 SlowDown") == Applied()
    assert a.state is EntryState.PENDING and a.not_before == T0 + 30.0
    assert a.attempts == 1 and a.last_error == "503 SlowDown"
    assert s.state.lookup(B, "k") is a
    assert s.state.drainable(T0 + 29.9, 10) == []
    assert s.state.next_retry_at(T0) == T0 + 30.0
    assert seqs(s.state.drainable(T0 + 30.0, 10)) == [a.seq]

    b = s.put("j")
    s.state.start_upload(b)
    s.state.upload_failed(b, T0 + 10.0, "timeout")
    assert s.state.next_retry_at(T0) == T0 + 10.0
    assert seqs(s.state.drainable(T0 + 10.0, 10)) == [b.seq]
    s.state.start_upload(a)
    assert a.attempts == 2
    s.state.start_upload(b)
    assert s.state.next_retry_at(T0) is None


def test_backoff_of_one_key_does_not_hold_back_younger_keys() -> None:
    s = Spool()
    a = s.put("a")
    b = s.put("b")
    s.state.start_upload(a)
    s.state.upload_failed(a, T0 + 60.0, "503")
    assert seqs(s.state.drainable(T0, 10)) == [b.seq]


def test_illegal_transitions_raise() -> None:
    s = Spool()
    a = s.put("k")
    with pytest.raises(IllegalTransition):
        s.state.upload_failed(a, T0, "never started")
    with pytest.raises(IllegalTransition):
        s.state.upload_succeeded(a)
    s.state.start_upload(a)
    with pytest.raises(IllegalTransition):
        s.state.start_upload(a)
    s.state.upload_succeeded(a)
    with pytest.raises(IllegalTransition):
        s.state.start_upload(a)
    with pytest.raises(IllegalTransition):
        s.state.upload_failed(a, T0, "too late")


def test_unknown_record_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown journal record"):
        SpoolState().apply({"t": "bogus"})


# -- queries -----------------------------------------------------------------------------------------------


def test_pending_queries_count_entries_not_yet_on_the_backend() -> None:
    s = Spool()
    a = s.put("ckpt/s1/a", size=10)
    s.put("ckpt/s1/b", size=20)
    s.put("ckpt/s2/a", size=40)
    s.delete("ckpt/s1/b")
    s.put("top", size=1, bucket="other")
    assert s.state.oldest_acked_at() == a.acked_at
    assert s.state.pending_under(B, "ckpt/s1/") == (2, 10, a.acked_at)  # the put and the tombstone
    assert s.state.pending_under(B, "ckpt/") == (3, 50, a.acked_at)
    assert s.state.pending_under(B, "ckpt/", max_seq=a.seq) == (1, 10, a.acked_at)
    assert s.state.pending_under(B, "nothing/") == (0, 0, None)
    assert s.state.pending_by_prefix() == {(B, "ckpt/"): 50, ("other", ""): 1}
    assert s.state.pending_by_prefix(depth=2) == {(B, "ckpt/s1/"): 10, (B, "ckpt/s2/"): 40, ("other", ""): 1}
    assert sorted(e.key for e in s.state.live_under(B, "ckpt/s1/")) == ["ckpt/s1/a", "ckpt/s1/b"]
    assert s.state.has_bucket_prefix(B, "ckpt/s2/") and not s.state.has_bucket_prefix("other", "ckpt/")
    s.ship(a)
    assert s.state.pending_under(B, "ckpt/s1/")[0] == 1


def test_snapshot_keeps_sequence_numbers_growing() -> None:
    s = Spool()
    a = s.put("k")
    s.put("j")
    s.ship(a)
    fresh = SpoolState(MARKERS)
    for rec in s.state.snapshot_records():
        fresh.apply(rec)
    assert fresh.last_seq == s.state.last_seq
    assert fresh.next_seq() == s.state.next_seq()


# -- replay and compaction equivalence (model-based) -------------------------------------------------------

IDENTS: tuple[Ident, ...] = (
    ("b1", "ckpt/s1/shard-a"),
    ("b1", "ckpt/s1/shard-b"),
    ("b1", "ckpt/s1/.metadata"),
    ("b1", "ckpt/s1/sub/shard-c"),
    ("b1", "ckpt/s2/shard-a"),
    ("b1", "ckpt/s2/COMMIT"),
    ("b1", "COMMIT"),
    ("b2", "ckpt/s1/shard-a"),
    ("b2", "ckpt/s1/.metadata"),
)
PICK = st.integers(0, 1_000)


def entry_view(e: Entry) -> tuple[Any, ...]:
    return (
        e.seq,
        e.kind,
        e.bucket,
        e.key,
        e.etag,
        e.size,
        e.files,
        e.part_sizes,
        e.part_md5s,
        e.meta,
        e.marker,
        e.acked_at,
        e.access_key,
        e.lane,
    )


def upload_view(u: Upload) -> tuple[Any, ...]:
    return (u.upload_id, u.seq, u.bucket, u.key, u.access_key, u.lane, u.created_at, u.meta, u.parts)


def rebuilt(records: Sequence[Record]) -> SpoolState:
    fresh = SpoolState(MARKERS)
    for rec in records:
        fresh.apply(rec)
    return fresh


def assert_equivalent(live: SpoolState, fresh: SpoolState) -> None:
    """``fresh`` (rebuilt from records) holds what ``live`` holds, minus what only the drain knows: which
    entries are in flight, and the superseded ones that stay only until their upload ends."""
    kept = [e for e in live.entries.values() if not e.superseded]
    assert [entry_view(e) for e in fresh.entries.values()] == [entry_view(e) for e in kept]
    assert all(e.state is EntryState.PENDING and not e.superseded for e in fresh.entries.values())
    assert {u: upload_view(v) for u, v in fresh.uploads.items()} == {
        u: upload_view(v) for u, v in live.uploads.items()
    }
    for ident in IDENTS:
        lf, ll = fresh.lookup(*ident), live.lookup(*ident)
        assert (lf and entry_view(lf)) == (ll and entry_view(ll))
    assert fresh.last_seq == live.last_seq
    superseded = [e for e in live.entries.values() if e.superseded]
    assert fresh.bytes_on_disk == live.bytes_on_disk - sum(e.size for e in superseded)
    assert fresh.referenced_files() == live.referenced_files() - {f for e in superseded for f in e.files}
    assert fresh.wires == live.wires


@settings(max_examples=examples(200), stateful_step_count=100, deadline=None)
class SpoolMachine(RuleBasedStateMachine):
    """Random operations against a live SpoolState, with a drainer that starts, fails and finishes uploads.
    After every step the journal so far (which may begin with an earlier compaction) and a fresh snapshot
    must each rebuild an equivalent state, and the ordering and accounting invariants must hold."""

    def __init__(self) -> None:
        super().__init__()
        self.s = Spool()
        self.now = T0
        self.inflight: dict[int, Entry] = {}
        self.succeeded: dict[int, Entry] = {}  # on the backend, done record not yet journaled
        self.cancelled: set[int] = set()
        self.model: dict[Ident, tuple[int, str, str, int, tuple[str, ...]]] = {}
        self.open_uploads: dict[str, Ident] = {}
        self.closed_uploads: list[str] = []
        self._upload_ids = itertools.count(1)

    @property
    def state(self) -> SpoolState:
        return self.s.state

    def _superseded(self, old: Entry | None, applied: Applied) -> None:
        if old is None:
            assert applied.cancel == () and applied.removed == ()
            return
        assert applied.removed == (old,)
        if old.seq in self.inflight:
            assert applied.cancel == (old.seq,)
            event("superseded an upload in flight")
            assert not set(old.files) & set(applied.garbage)
            self.cancelled.add(old.seq)
        else:
            assert applied.cancel == ()
            assert set(old.files) <= set(applied.garbage)

    def _acked(self, entry: Entry) -> None:
        self.model[(entry.bucket, entry.key)] = (entry.seq, entry.kind, entry.etag, entry.size, entry.files)

    @rule(i=st.integers(0, len(IDENTS) - 1), size=st.sampled_from([0, 1, 1000]))
    def put(self, i: int, size: int) -> None:
        bucket, key = IDENTS[i]
        old = self.state.lookup(bucket, key)
        entry = self.s.put(key, bucket=bucket, size=size)
        self._superseded(old, self.s.last)
        self._acked(entry)

    @rule(pick=PICK, tombstone=st.booleans())
    def overwrite_in_flight(self, pick: int, tombstone: bool) -> None:
        """A new version (or a delete) of a key while the drainer is uploading an older one."""
        if not self.inflight:
            return
        uploading = self.inflight[sorted(self.inflight)[pick % len(self.inflight)]]
        old = self.state.lookup(uploading.bucket, uploading.key)
        if tombstone and old is not None:
            entry = self.s.delete(uploading.key, bucket=uploading.bucket)
        else:
            entry = self.s.put(uploading.key, bucket=uploading.bucket, size=7)
        self._superseded(old, self.s.last)
        self._acked(entry)

    @rule(i=st.integers(0, len(IDENTS) - 1))
    def delete(self, i: int) -> None:
        bucket, key = IDENTS[i]
        old = self.state.lookup(bucket, key)
        if old is None:
            return
        entry = self.s.delete(key, bucket=bucket)
        self._superseded(old, self.s.last)
        self._acked(entry)

    @rule(
        i=st.integers(0, len(IDENTS) - 1),
        sizes=st.lists(st.sampled_from([1, MIN_PART_BYTES]), max_size=3),
    )
    def create_upload(self, i: int, sizes: list[int]) -> None:
        """A multipart upload, and its first parts (numbered from 1)."""
        bucket, key = IDENTS[i]
        upload_id = f"u{next(self._upload_ids)}"
        self.s.create(key, upload_id, bucket=bucket)
        self.open_uploads[upload_id] = (bucket, key)
        assert self.s.last == Applied()
        for number, size in enumerate(sizes, start=1):
            self.s.part(upload_id, number, size)
            assert self.s.last == Applied()

    @rule(
        pick=PICK,
        number=st.integers(1, 4),
        size=st.sampled_from([1, MIN_PART_BYTES, MIN_PART_BYTES + 1]),
        stale=st.booleans(),
    )
    def part(self, pick: int, number: int, size: int, stale: bool) -> None:
        if stale and self.closed_uploads:
            late = self.s.part(self.closed_uploads[pick % len(self.closed_uploads)], number, size)
            assert self.s.last == Applied(garbage=(late.file,))
            return
        if not self.open_uploads:
            return
        upload_id = sorted(self.open_uploads)[pick % len(self.open_uploads)]
        # A re-uploaded part is kept (the store completes with either); the one it had replaced goes.
        older = self.state.uploads[upload_id].replaced.get(number)
        old = self.state.uploads[upload_id].parts.get(number)
        self.s.part(upload_id, number, size, data=f"{upload_id}/{number}/{size}/{pick}".encode())
        assert self.s.last == Applied(garbage=(older.file,) if old and older else ())

    @rule(pick=PICK, mask=st.integers(0, 15), unknown=st.sampled_from([None, None, None, 1, 5]))
    def complete(self, pick: int, mask: int, unknown: int | None) -> None:
        """Complete with the parts picked by ``mask`` (plus, sometimes, a part number never uploaded)."""
        if not self.open_uploads:
            return
        upload_id = sorted(self.open_uploads)[pick % len(self.open_uploads)]
        upload = self.state.uploads[upload_id]
        numbers = {n for i, n in enumerate(sorted(upload.parts)) if mask & (1 << i)}
        if unknown is not None and unknown not in upload.parts:
            numbers.add(unknown)
        chosen = sorted(numbers)
        requested = [(n, upload.parts[n].etag if n in upload.parts else BAD_ETAG) for n in chosen]
        expected: type[S3Error] | None = None
        if not chosen:
            expected = MalformedXML
        elif any(n not in upload.parts for n in chosen):
            expected = InvalidPart
        elif any(upload.parts[n].size < MIN_PART_BYTES for n in chosen[:-1]):
            expected = EntityTooSmall
        try:
            rec = self.state.complete_record(upload, requested, self.s.wall())
        except S3Error as exc:
            assert expected is not None and type(exc) is expected, (exc, expected)
            event(f"complete rejected: {exc.code}")
            return
        assert expected is None
        event(f"completed with {len(chosen)} of {len(upload.parts)} parts")
        parts = dict(upload.parts)
        replaced = {p.file for p in upload.replaced.values()}
        old = self.state.lookup(upload.bucket, upload.key)
        applied = self.s.apply(rec)
        entry = self.state.entries[rec.seq]
        self._superseded(old, applied)
        unused = {p.file for n, p in parts.items() if n not in numbers}
        old_files = set(old.files) if old is not None and old.seq not in self.inflight else set()
        assert set(applied.garbage) == unused | replaced | old_files
        assert entry.files == tuple(parts[n].file for n in chosen)
        assert entry.etag == multipart_etag([parts[n].md5 for n in chosen])
        del self.open_uploads[upload_id]
        self.closed_uploads.append(upload_id)
        self._acked(entry)

    @rule(pick=PICK)
    def abort(self, pick: int) -> None:
        if not self.open_uploads:
            return
        upload_id = sorted(self.open_uploads)[pick % len(self.open_uploads)]
        files = {p.file for p in self.state.uploads[upload_id].all_parts()}
        applied = self.s.apply(SpoolState.abort_record(upload_id))
        assert set(applied.garbage) == files and len(applied.garbage) == len(files)
        del self.open_uploads[upload_id]
        self.closed_uploads.append(upload_id)

    @rule(limit=st.integers(1, 3))
    def start(self, limit: int) -> None:
        drained = self.state.drainable(self.now, limit)
        assert len(drained) <= limit
        for entry in drained:
            if entry.marker:
                event("marker started")
            self.state.start_upload(entry)
            self.inflight[entry.seq] = entry
            if self.state.wire_needed(entry):  # the drainer journals it before the completing request
                self.s.apply(SpoolState.wire_record(entry))

    @rule(pick=PICK, delay_s=st.sampled_from([0.0, 1.0, 30.0]))
    def fail(self, pick: int, delay_s: float) -> None:
        if not self.inflight:
            return
        entry = self.inflight.pop(sorted(self.inflight)[pick % len(self.inflight)])
        if self.state.unwire_needed(entry):  # answered, or cut before the last byte: off the wire
            self.s.apply(SpoolState.unwire_record(entry))
        applied = self.s.track(self.state.upload_failed(entry, self.now + delay_s, "boom"))
        if entry.superseded:
            event("cancelled upload failed")
            assert applied == Applied(garbage=entry.files, removed=(entry,))
            assert entry.seq not in self.state.entries
        else:
            assert applied == Applied()
            assert entry.not_before == self.now + delay_s

    @rule(pick=PICK)
    def succeed(self, pick: int) -> None:
        if not self.inflight:
            return
        entry = self.inflight.pop(sorted(self.inflight)[pick % len(self.inflight)])
        self.state.upload_succeeded(entry)
        self.succeeded[entry.seq] = entry
        if entry.superseded:
            event("cancelled upload succeeded")

    @rule(pick=PICK)
    def done(self, pick: int) -> None:
        if not self.succeeded:
            return
        entry = self.succeeded.pop(sorted(self.succeeded)[pick % len(self.succeeded)])
        present = entry.seq in self.state.entries
        applied = self.s.done(entry)
        assert applied == (Applied(garbage=entry.files, removed=(entry,)) if present else Applied())
        ident = (entry.bucket, entry.key)
        if ident in self.model and self.model[ident][0] == entry.seq:
            del self.model[ident]

    @rule()
    def compact(self) -> None:
        """The shell rewrites the journal as a snapshot; later records are appended to it."""
        self.s.records = self.state.snapshot_records()

    @rule(dt_s=st.sampled_from([0.5, 2.0, 40.0]))
    def tick(self, dt_s: float) -> None:
        self.now += dt_s

    @invariant()
    def live_entries_match_the_model(self) -> None:
        live = [(e.bucket, e.key) for e in self.state.entries.values() if not e.superseded]
        assert len(live) == len(set(live)), "two live entries of one key"
        for ident in IDENTS:
            got = self.state.lookup(*ident)
            want = self.model.get(ident)
            assert (got and (got.seq, got.kind, got.etag, got.size, got.files)) == want
        superseded = {e.seq for e in self.state.entries.values() if e.superseded}
        assert superseded == {s for s in self.cancelled if s in self.inflight or s in self.succeeded}

    @invariant()
    def drainable_keeps_the_ordering_rules(self) -> None:
        drained = self.state.drainable(self.now, 100)
        idents = [(e.bucket, e.key) for e in drained]
        assert len(idents) == len(set(idents))
        busy = {(e.bucket, e.key) for e in self.inflight.values()}
        for entry in drained:
            assert (entry.bucket, entry.key) not in busy
            assert entry.state is EntryState.PENDING and not entry.superseded
            assert entry.not_before <= self.now
            if entry.marker:
                older = [
                    e
                    for e in self.state.entries.values()
                    if e.seq < entry.seq and e.bucket == entry.bucket and e.key.startswith(entry.dir_prefix)
                ]
                assert older == [], (entry.key, [e.key for e in older])

    @invariant()
    def a_crash_leaves_every_key_with_a_request_possibly_on_the_wire_in_doubt(self) -> None:
        after_crash = rebuilt(self.s.records)
        after_crash.recovered()
        for entry in self.inflight.values():  # answered ones (succeeded) are off the wire
            assert (entry.bucket, entry.key) in after_crash.in_doubt, entry

    @invariant()
    def files_and_bytes_are_accounted(self) -> None:
        self.s.assert_files_accounted()
        live = sum(e.size for ident in IDENTS if (e := self.state.lookup(*ident)) is not None)
        parts = sum(u.size for u in self.state.uploads.values())
        in_flight_superseded = sum(e.size for e in self.state.entries.values() if e.superseded)
        assert self.state.bytes_on_disk == live + parts + in_flight_superseded

    @invariant()
    def journal_replay_and_snapshot_rebuild_the_same_state(self) -> None:
        assert_equivalent(self.state, rebuilt(self.s.records))
        assert_equivalent(self.state, rebuilt(self.state.snapshot_records()))

    def teardown(self) -> None:
        for entry in list(self.inflight.values()):
            if entry.superseded:
                self.s.track(self.state.upload_failed(entry, self.now, "cancelled"))
            else:
                self.state.upload_succeeded(entry)
                self.succeeded[entry.seq] = entry
        self.inflight.clear()
        for entry in self.succeeded.values():
            self.s.done(entry)
        for upload_id in list(self.open_uploads):
            self.s.apply(SpoolState.abort_record(upload_id))
        for _ in range(len(self.state.entries) + 1):
            drained = self.state.drainable(FAR, 100)
            if not drained:
                break
            for entry in drained:
                self.s.ship(entry)
        assert self.state.entries == {}, "entries left that never became drainable"
        assert self.state.uploads == {} and self.state.bytes_on_disk == 0
        assert set(self.s.garbage) == set(self.s.written)
        self.s.assert_files_accounted()


TestReplayAndCompactionRebuildTheLiveState = SpoolMachine.TestCase


# -- what the backend sees ---------------------------------------------------------------------------------


@dataclass
class DictBackend:
    """A dict backend fed by a drainer that keeps several uploads in flight and finishes them in any order."""

    spool: Spool
    rng: random.Random
    now: float = T0
    objects: dict[Ident, str] = field(default_factory=dict)  # ident -> etag
    landed_seq: dict[Ident, int] = field(default_factory=dict)
    landed: set[int] = field(default_factory=set)
    acked: list[tuple[int, Ident, str, str]] = field(default_factory=list)  # seq, ident, kind, etag
    inflight: dict[int, Entry] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    done_due: list[Entry] = field(default_factory=list)

    def ack(self, entry: Entry) -> None:
        self.acked.append((entry.seq, (entry.bucket, entry.key), entry.kind, entry.etag))
        self.cancelled.update(self.spool.last.cancel)

    def land(self, entry: Entry) -> None:
        ident = (entry.bucket, entry.key)
        assert entry.seq > self.landed_seq.get(ident, 0), f"{ident}: an older version overwrote a newer one"
        if entry.marker:
            for seq, other, _, _ in self.acked:
                if seq >= entry.seq or other[0] != entry.bucket or not other[1].startswith(entry.dir_prefix):
                    continue
                superseded = any(s > seq and o == other for s, o, _, _ in self.acked)
                assert seq in self.landed or superseded, f"marker {entry.key} landed before {other[1]}"
        self.landed_seq[ident] = entry.seq
        self.landed.add(entry.seq)
        if entry.kind == "del":
            self.objects.pop(ident, None)
        else:
            self.objects[ident] = entry.etag

    def step(self, *, failures: bool = True) -> None:
        state = self.spool.state
        roll = self.rng.random()
        if roll < 0.4 and len(self.inflight) < 4:
            drained = state.drainable(self.now, self.rng.randint(1, 3))
            keys = [(e.bucket, e.key) for e in drained]
            assert len(keys) == len(set(keys))
            busy = {(e.bucket, e.key) for e in self.inflight.values()}
            for entry in drained:
                assert (entry.bucket, entry.key) not in busy
                state.start_upload(entry)
                self.inflight[entry.seq] = entry
        elif roll < 0.8 and self.inflight:
            entry = self.inflight.pop(self.rng.choice(sorted(self.inflight)))
            if failures:
                p_fail = 0.7 if entry.seq in self.cancelled else 0.2  # a cancel usually wins its race
            else:
                p_fail = 1.0 if entry.superseded else 0.0  # winding down: only cancels fail
            if self.rng.random() < p_fail:
                self.spool.track(state.upload_failed(entry, self.now + self.rng.choice([0.0, 1.0, 5.0]), "x"))
            else:
                self.land(entry)
                state.upload_succeeded(entry)
                self.done_due.append(entry)
        elif self.done_due:
            self.spool.done(self.done_due.pop(self.rng.randrange(len(self.done_due))))
        self.now += self.rng.choice([0.0, 0.5, 2.0])

    def finish(self) -> None:
        state = self.spool.state
        for _ in range(10_000):
            if not state.entries and not self.inflight and not self.done_due:
                return
            if not self.inflight and not self.done_due and not state.drainable(FAR, 1):
                raise AssertionError(f"stuck: {[(e.key, e.state) for e in state.entries.values()]}")
            self.step(failures=False)  # also moves time on, past every backoff eventually
        raise AssertionError("drain did not finish")


OPS = st.lists(
    st.tuples(st.sampled_from(["put", "put", "del", "drain", "drain"]), st.integers(0, len(IDENTS) - 1)),
    min_size=20,
    max_size=80,
)


@settings(max_examples=examples(300), deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_backend_ends_with_the_last_acknowledged_operation_per_key_and_markers_land_last(
    ops: list[tuple[str, int]], seed: int
) -> None:
    rng = random.Random(seed)  # the drainer's choices: which uploads finish first, and which fail
    spool = Spool()
    backend = DictBackend(spool, rng)
    for op, i in ops:
        bucket, key = IDENTS[i]
        if op == "put":
            backend.ack(spool.put(key, bucket=bucket))
        elif op == "del" and spool.state.lookup(bucket, key) is not None:
            backend.ack(spool.delete(key, bucket=bucket))
        else:
            for _ in range(rng.randint(1, 4)):
                backend.step()
    backend.finish()

    expected: dict[Ident, str] = {}
    for _, ident, kind, etag in backend.acked:
        if kind == "del":
            expected.pop(ident, None)
        else:
            expected[ident] = etag
    assert backend.objects == expected
    assert spool.state.bytes_on_disk == 0
    assert set(spool.garbage) == set(spool.written)
    spool.assert_files_accounted()


# -- space -------------------------------------------------------------------------------------------------


def space() -> SpoolSpace:
    return SpoolSpace(capacity_bytes=1000, high_water=0.9, low_water=0.7)


def test_space_becomes_full_above_high_water_and_stays_full_until_below_low_water() -> None:
    sp = space()
    assert sp.admit(900) is Admission.SPOOL
    assert not sp.full and sp.level == 0.9  # at high water is not above it
    assert sp.admit(10) is Admission.SPOOL
    assert sp.full
    assert sp.admit(1) is Admission.FULL
    sp.set_used(910)  # the writes landed (the shell counts them as used, then drops the reservation)
    sp.release(910)
    assert sp.full
    sp.set_used(800)  # drained below high water but not below low water
    assert sp.full and sp.admit(1) is Admission.FULL
    sp.set_used(700)  # at low water is not below it
    assert sp.full
    sp.set_used(699)
    assert not sp.full
    assert sp.admit(100) is Admission.SPOOL
    assert sp.reserved_bytes == 100 and sp.level == pytest.approx(0.799)


def test_space_reports_too_big_for_a_write_that_cannot_fit() -> None:
    sp = space()
    assert sp.admit(1001) is Admission.TOO_BIG
    assert sp.admit(1000) is Admission.SPOOL  # exactly the capacity fits
    assert sp.reserved_bytes == 1000
    sp.release(1000)
    sp.set_used(500)
    assert sp.admit(501) is Admission.TOO_BIG
    assert sp.reserved_bytes == 0  # a refused write reserves nothing


def test_space_admits_must_writes_above_high_water_but_never_beyond_capacity() -> None:
    sp = space()
    sp.set_used(950)
    assert not sp.full  # bytes on disk alone never latch full: admission judges high water
    assert sp.admit(10) is Admission.FULL
    assert sp.full
    assert sp.admit(40, must=True) is Admission.SPOOL
    assert sp.admit(10, must=True) is Admission.SPOOL  # exactly at capacity
    assert sp.admit(1, must=True) is Admission.TOO_BIG
    assert sp.reserved_bytes == 50 and sp.level == 1.0


def test_space_level_of_a_zero_capacity_spool_is_full() -> None:
    sp = SpoolSpace(capacity_bytes=0, high_water=0.9, low_water=0.7)
    assert sp.level == 1.0
    assert sp.admit(1) is Admission.TOO_BIG


def test_drain_upload_intents_are_journaled_snapshotted_and_counted_as_open_work() -> None:
    state = SpoolState()
    entry = Entry(
        seq=7, kind="put", bucket="b", key="ckpt/x", access_key="AK", lane="checkpoint", acked_at=100.0
    )
    state.apply(SpoolState.backend_intent_record("t1", entry, 100.0))
    assert state.backend_intents == {"t1": ("b", "ckpt/x", "AK", "checkpoint", 100.0)}
    assert state.open_backend_work("b", "ckpt/") == 1 and state.open_backend_work("b", "other/") == 0
    # An intent of an entry still pending is counted as that entry, not twice.
    state.entries[7] = entry
    state.apply(SpoolState.backend_intent_record("s7", entry, 100.0))
    assert state.open_backend_work("b") == 1
    del state.entries[7]
    assert state.open_backend_work("b") == 2
    state.apply(SpoolState.backend_intent_end_record("s7"))
    # A compaction keeps the open intent; replaying the snapshot rebuilds it.
    again = SpoolState()
    for rec in state.snapshot_records():
        again.apply(rec)
    assert again.backend_intents == state.backend_intents
    # The upload id arrives with the intent's end, in one batch.
    state.apply(SpoolState.backend_upload_record("up-1", entry))
    state.apply(SpoolState.backend_intent_end_record("t1"))
    assert state.backend_intents == {} and set(state.backend_uploads) == {"up-1"}
    assert state.open_backend_work() == 1
    state.apply(SpoolState.backend_upload_end_record("up-1"))
    assert state.open_backend_work() == 0


def test_a_wire_record_puts_its_key_in_doubt_after_a_crash_until_a_done_of_that_seq_or_a_newer_one() -> None:
    sp = Spool()
    old = sp.put("ckpt/a")
    sp.state.start_upload(old)
    assert sp.state.wire_needed(old)
    sp.apply(SpoolState.wire_record(old))
    assert not sp.state.wire_needed(old)  # a retry of the same entry journals nothing more
    newer = sp.delete("ckpt/a")  # acknowledged while the old PUT may be on the wire
    other = sp.put("ckpt/b")
    crashed = rebuilt(sp.records)
    assert crashed.recovered() == 1 and crashed.in_doubt == {(B, "ckpt/a")}
    assert not crashed.is_in_doubt(crashed.entries[other.seq])
    assert crashed.is_in_doubt(crashed.entries[newer.seq])
    sp.state.upload_failed(old, 0.0, "cut")  # superseded: gone without a done record
    sp.state.start_upload(newer)
    sp.apply(SpoolState.wire_record(newer))
    # The old seq's done never comes; the newer entry's done settles every wire of the key up to it ...
    sp.state.upload_succeeded(newer)
    sp.done(newer)
    assert sp.state.wires == {}
    after = rebuilt(sp.records)
    assert after.recovered() == 0 and after.in_doubt == set()


def test_a_done_does_not_settle_the_wire_of_a_newer_entry_journaled_before_it() -> None:
    """The done of a drained entry is queued while the key's next entry may already have journaled its
    wire: that wire must survive the done, or a crash would lose the newer request's doubt."""
    sp = Spool()
    first = sp.put("k")
    sp.state.start_upload(first)
    sp.apply(SpoolState.wire_record(first))
    sp.state.upload_succeeded(first)
    second = sp.put("k")
    sp.state.start_upload(second)
    sp.apply(SpoolState.wire_record(second))
    sp.done(first)
    assert sp.state.wires == {(B, "k"): {second.seq}}
    assert sp.state.wire_needed(second) is False
    again = rebuilt(sp.state.snapshot_records())
    assert again.wires == sp.state.wires
    again.recovered()
    assert again.in_doubt == {(B, "k")}


def test_an_old_journal_without_wire_records_replays_with_nothing_in_doubt() -> None:
    sp = Spool()
    sp.put("k")
    sp.delete("k")
    old = rebuilt(sp.records)
    assert old.recovered() == 0 and old.wires == {} and old.in_doubt == set()


def test_an_unwire_settles_only_its_own_entry_and_never_while_the_key_is_in_doubt() -> None:
    sp = Spool()
    a = sp.put("k")
    sp.state.start_upload(a)
    sp.apply(SpoolState.wire_record(a))
    sp.state.in_doubt.add((B, "k"))  # an earlier attempt of the entry went unanswered
    assert not sp.state.unwire_needed(a)
    sp.state.in_doubt.clear()
    assert sp.state.unwire_needed(a)
    sp.apply(SpoolState.unwire_record(a))  # the attempt was answered (or cut): nothing of it on the wire
    assert sp.state.wires == {} and not sp.state.unwire_needed(a)
    crashed = rebuilt(sp.records)
    assert crashed.recovered() == 0


def test_a_keyless_done_record_of_an_unknown_entry_changes_nothing() -> None:
    s = Spool()
    before = s.state.snapshot_records()
    assert s.apply(Done(12345)) == Applied()  # an older journal's done record for an entry replay dropped
    assert s.state.snapshot_records() == before


def test_unwiring_one_of_two_requests_on_the_wire_keeps_the_other() -> None:
    s = Spool()
    s.apply(Wire("b", "k", 1))
    s.apply(Wire("b", "k", 2))
    s.apply(Unwire("b", "k", 1))
    assert s.state.wires == {("b", "k"): {2}}
    s.apply(Unwire("b", "k", 2))
    assert s.state.wires == {}
