"""Journals written by an earlier build replay to the same state: the on-disk format is a promise.

``data/journal-v1.bin`` is a journal the spool wrote (group commits, every record kind, a replaced part, a
completed and an aborted multipart upload, wires, drain uploads and intents, an old-style ``done`` without a
key, non-ASCII keys); ``data/journal-v1-compacted.bin`` is what compaction wrote for the same state. Both were
written by the code of that build and are kept byte for byte: a codec or record change that reads them
differently fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from s3lanes.core.journal import BATCH_KEY, encode_batch, file_header, replay
from s3lanes.core.journal_records import Complete, Delete, Done, Put, decode
from s3lanes.core.spool_state import EntryState, SpoolState

DATA = Path(__file__).parent / "data"
MARKERS = (".metadata",)
KINDS = {
    "put": ("Put", "Complete"),
    "del": ("Delete",),
    "mpu": ("CreateUpload",),
    "part": ("Part",),
    "abort": ("Abort",),
    "done": ("Done",),
    "wire": ("Wire",),
    "unwire": ("Unwire",),
    "bmpu": ("BackendUpload",),
    "bmpu_end": ("BackendUploadEnd",),
    "bmpi": ("BackendIntent",),
    "bmpi_end": ("BackendIntentEnd",),
    "seq": ("SeqMark",),
}


def _state(name: str) -> tuple[SpoolState, list[dict[str, object]]]:
    result = replay((DATA / name).read_bytes())
    assert result.torn_bytes == 0
    state = SpoolState(MARKERS)
    for rec in result.records:
        state.apply(rec)
    return state, result.records


def _check(state: SpoolState) -> None:
    assert [(e.bucket, e.key) for e in state.entries.values()] == [
        ("b", "big"),
        ("b", "ckpt/.metadata"),
        ("b", "uni/é/🙂"),
    ]
    big = state.lookup("b", "big")
    assert big is not None and big.multipart and big.state is EntryState.PENDING
    assert big.files == ("p1", "p2") and big.part_sizes == (5 * 1024 * 1024, 7)
    assert big.part_checksums == ("AAAAAA==", "AAAAAQ==")
    assert big.etag == '"11308b87f771b64f158b8f5f513210c2-2"'
    marker = state.lookup("b", "ckpt/.metadata")
    assert marker is not None and marker.marker and marker.lane == "bulk" and marker.seq == 8
    uni = state.lookup("b", "uni/é/🙂")
    assert uni is not None and uni.meta == (("x-amz-meta-ü", "ß"),) and uni.acked_at == 1_700_000_010.5
    assert state.lookup("b", "ckpt/a") is None and state.lookup("b", "gone") is None
    assert list(state.uploads) == ["s3lanes-u3"]
    assert [(p.number, p.file, p.size) for p in state.uploads["s3lanes-u3"].all_parts()] == [(3, "p4", 6)]
    assert state.backend_uploads == {"bu-2": ("b", "ckpt/a", "AK", "checkpoint")}
    assert state.backend_intents == {"s9": ("b", "ckpt/a", "AK", "checkpoint", 1_700_000_008.5)}
    assert state.wires == {("b", "big"): {5}}
    assert state.last_seq == 9
    assert state.bytes_on_disk == 5 * 1024 * 1024 + 7 + 5 + 1 + 6
    assert state.referenced_files() == {"p1", "p2", "p4", "f3", "f4"}


def test_a_journal_written_by_an_earlier_build_replays_to_its_state() -> None:
    state, records = _state("journal-v1.bin")
    assert len(records) == 27
    assert [r[BATCH_KEY] for r in records][-3:] == [22, 23, 24]
    _check(state)
    assert state.recovered() == 1 and state.in_doubt == {("b", "big")}


def test_a_compacted_journal_written_by_an_earlier_build_replays_to_the_same_state() -> None:
    state, _ = _state("journal-v1-compacted.bin")
    _check(state)


def test_compaction_still_writes_the_bytes_it_wrote() -> None:
    state, _ = _state("journal-v1.bin")
    written = (DATA / "journal-v1-compacted.bin").read_bytes()
    assert file_header() + encode_batch([r.encode() for r in state.snapshot_records()]) == written


@pytest.mark.parametrize("name", ["journal-v1.bin", "journal-v1-compacted.bin"])
def test_every_record_decodes_to_its_class_and_encodes_back_to_the_same_bytes(name: str) -> None:
    data = (DATA / name).read_bytes()
    maps = []
    for raw in replay(data).records:
        record = decode(raw)
        assert type(record).__name__ in KINDS[raw["t"]]
        again = record.encode()
        if BATCH_KEY in raw:
            again[BATCH_KEY] = raw[BATCH_KEY]  # the shell's, not the record's
        assert again == raw
        maps.append(again)
    assert file_header() + encode_batch(maps) == data  # the same keys, in the same order: the same bytes


def test_records_of_older_journals_take_their_defaults() -> None:
    at = 1.0
    deleted = decode({"t": "del", "seq": 3, "b": "b", "k": "k", "ak": "AK", "at": at})
    assert isinstance(deleted, Delete) and deleted.lane == "checkpoint"
    assert decode({"t": "done", "s": 4}) == Done(4)
    put = decode(
        {"t": "put", "seq": 1, "b": "b", "k": "k", "ak": "AK", "at": at, "f": ["f"], "sz": 1, "etag": '"e"'}
    )
    assert isinstance(put, Put) and put.meta == () and put.lane == "checkpoint" and put.part_sizes == ()
    with pytest.raises(ValueError, match="unknown journal record type"):
        decode({"t": "bogus"})
    with pytest.raises(KeyError):
        decode({"t": "wire", "b": "b", "k": "k"})


def test_optional_fields_are_written_only_when_set() -> None:
    put = Put(
        seq=1,
        bucket="b",
        key="k",
        access_key="AK",
        lane="checkpoint",
        at=1.0,
        files=("f1", "f2"),
        size=10,
        etag='"e-2"',
        part_sizes=(5, 5),
        part_md5s=("m1", "m2"),
    )
    rec = put.encode()
    assert rec["ps"] == [5, 5] and rec["pm"] == ["m1", "m2"] and "pc" not in rec  # no part checksums
    assert decode(rec) == put
    complete = Complete(
        seq=2,
        upload_id="u",
        part_numbers=(1, 2),
        bucket="b",
        key="k",
        etag='"e-2"',
        access_key="AK",
        lane="checkpoint",
        at=1.0,
    )
    rec = complete.encode()
    assert "po" not in rec  # no older parts replaced
    assert decode(rec) == complete
