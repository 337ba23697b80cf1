"""The journal codec: frame layout, round trips, torn tails at every offset, mid-file corruption, headers."""

from __future__ import annotations

import pickle
import random
import struct
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import msgpack
import pytest
from awscrt import checksums
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.journal import (
    FILE_MAGIC,
    FRAME_HEADER_BYTES,
    FRAME_MAGIC,
    HEADER_BYTES,
    MAX_RECORD_BYTES,
    JournalCorrupt,
    Replay,
    encode_batch,
    encode_record,
    file_header,
    replay,
)
from s3lanes.errors import GatewayError
from tests.budget import examples

# ~20 records of varied shapes and sizes: empty, tiny, fixmap/map16 boundaries, str8/str16 and bin8/bin16
# lengths, nesting. Kept to a few KiB so truncating at every byte offset stays fast.
RECORDS: list[dict[str, Any]] = [
    {},
    {"op": "put", "key": "bucket/a", "size": 0},
    {"op": "put", "key": "bucket/" + "k" * 40, "size": 2**40, "etag": "d41d8cd98f00b204e9800998ecf8427e"},
    {"op": "commit", "id": 7},
    {"blob": b"\x00" * 31},
    {"blob": b"\xa5\x5a" * 150},  # the frame magic inside a payload must not confuse the scan
    {f"k{i}": i for i in range(16)},  # map16
    {"nested": {"a": [1, 2, {"b": None}], "c": {"d": {"e": [b"x", "y", 3.5]}}}},
    {"text": "ünïcødé ✓ 日本語", "ключ": "значение"},
    {"neg": -1, "min": -(2**63), "max": 2**64 - 1},
    {"flag": True, "other": False, "none": None},
    {"float": 1.5, "tiny": 5e-324, "inf": float("inf")},
    {"s": "x" * 200},  # str8
    {"s": "y" * 300},  # str16
    {"b": bytes(range(256)) * 3},  # bin16
    {"list": list(range(40))},
    {"op": "delete", "key": "bucket/z"},
    {"empty": {}, "empty_list": [], "empty_bytes": b"", "empty_str": ""},
    {"op": "put", "key": "bucket/" + "q" * 1000, "size": 12345},
    {"last": 1},
]


def journal(records: Sequence[dict[str, Any]]) -> bytes:
    return file_header() + encode_batch(records)


def frame_bounds(records: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """(start, end) of each record's frame in ``journal(records)``."""
    bounds = []
    pos = HEADER_BYTES
    for record in records:
        end = pos + len(encode_record(record))
        bounds.append((pos, end))
        pos = end
    return bounds


def raw_frame(payload: bytes, *, length: int | None = None, magic: bytes = FRAME_MAGIC) -> bytes:
    """A frame around arbitrary bytes with a correct CRC: lets a test reach the checks after the CRC."""
    length_bytes = struct.pack(">I", len(payload) if length is None else length)
    crc = checksums.crc32c(payload, checksums.crc32c(length_bytes))
    return magic + length_bytes + struct.pack(">I", crc) + payload


def typed(value: Any) -> Any:
    """``value`` with every leaf tagged by its type, so that True != 1 and b"a" != "a" in comparisons."""
    if isinstance(value, dict):
        return {typed(k): typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def expected_torn(records: Sequence[dict[str, Any]], damaged: bytes) -> Replay:
    """What replay must say about ``journal(records)`` damaged only at its end: keep the intact frames.

    A frame counts as intact when its bytes are unchanged, which includes the case where the zeros or junk
    after a cut happen to be exactly the bytes that were cut off (a record ending in a 0 byte, cut before
    that byte and padded with zeros, is whole again).
    """
    original = journal(records)
    if damaged[:HEADER_BYTES] != original[:HEADER_BYTES]:
        return Replay([], 0, len(damaged))
    count, valid = 0, HEADER_BYTES
    for start, end in frame_bounds(records):
        if damaged[start:end] != original[start:end]:
            break
        count, valid = count + 1, end
    return Replay(list(records[:count]), valid, len(damaged) - valid)


# --------------------------------------------------------------------------------------------------
# Format and round trips


def test_file_header_is_magic_and_version_one() -> None:
    assert FILE_MAGIC == b"S3LJ\x01"
    assert HEADER_BYTES == 5
    assert file_header() == FILE_MAGIC


def test_crc32c_is_castagnoli() -> None:
    # The standard check value of CRC-32C; pins the checksum family the frames use.
    assert checksums.crc32c(b"123456789") == 0xE3069283


def test_frame_is_magic_length_crc_over_length_and_payload_then_payload() -> None:
    record = {"op": "put", "key": "b/k", "data": b"\x00\x01"}
    payload = msgpack.packb(record, use_bin_type=True)
    length = struct.pack(">I", len(payload))
    crc = checksums.crc32c(length + payload)
    assert encode_record(record) == b"\xa5\x5a" + length + struct.pack(">I", crc) + payload
    assert FRAME_HEADER_BYTES == 10


@pytest.mark.parametrize("record", RECORDS, ids=range(len(RECORDS)))
def test_record_round_trips_with_types_preserved(record: dict[str, Any]) -> None:
    result = replay(file_header() + encode_record(record))
    assert typed(result.records) == typed([record])
    assert (result.valid_bytes, result.torn_bytes, result.torn) == (
        HEADER_BYTES + len(encode_record(record)),
        0,
        False,
    )


def test_batch_is_the_concatenated_frames_and_replays_in_order() -> None:
    assert encode_batch(RECORDS) == b"".join(encode_record(r) for r in RECORDS)
    assert encode_batch([]) == b""
    data = journal(RECORDS)
    assert replay(data) == Replay(RECORDS, len(data), 0)


def test_large_record_with_a_length_over_64k_round_trips() -> None:
    record = {"blob": bytes(range(256)) * 400}
    frame = encode_record(record)
    assert struct.unpack(">I", frame[2:6])[0] > 65536
    data = file_header() + frame + encode_record({"after": 1})
    assert replay(data).records == [record, {"after": 1}]
    assert replay(data[:-5]).records == [record]


def test_mapping_that_is_not_a_dict_is_encoded_as_a_map() -> None:
    assert replay(file_header() + encode_record(MappingProxyType({"a": 1}))).records == [{"a": 1}]


def test_record_at_exactly_the_size_limit_is_accepted_and_one_byte_more_is_not() -> None:
    overhead = 1 + 2 + 5  # fixmap marker, fixstr "b", bin32 header
    at_limit = {"b": bytes(MAX_RECORD_BYTES - overhead)}
    frame = encode_record(at_limit)
    assert len(frame) == FRAME_HEADER_BYTES + MAX_RECORD_BYTES
    assert len(replay(file_header() + frame).records) == 1
    with pytest.raises(ValueError, match="limit"):
        encode_record({"b": bytes(MAX_RECORD_BYTES - overhead + 1)})


def test_record_with_a_non_str_key_is_refused() -> None:
    with pytest.raises(TypeError, match="keys must be str"):
        encode_record({b"key": 1})  # type: ignore[dict-item]


def test_record_that_would_not_decode_back_is_refused_at_append_time() -> None:
    # msgpack packs an int map key, but replay decodes with strict_map_key: refuse it now, not at recovery.
    with pytest.raises(ValueError, match="does not decode back"):
        encode_record({"nested": {1: "one"}})


def test_record_with_an_unpackable_value_is_refused() -> None:
    with pytest.raises(TypeError):
        encode_record({"x": object()})


# --------------------------------------------------------------------------------------------------
# Headers


def test_empty_input_is_a_journal_whose_header_never_landed() -> None:
    assert replay(b"") == Replay([], 0, 0)


def test_header_only_is_an_empty_clean_journal() -> None:
    assert replay(file_header()) == Replay([], HEADER_BYTES, 0)


@pytest.mark.parametrize("cut", range(1, HEADER_BYTES))
def test_partial_header_is_torn(cut: int) -> None:
    assert replay(FILE_MAGIC[:cut]) == Replay([], 0, cut)
    assert replay(FILE_MAGIC[:cut] + bytes(4096)) == Replay([], 0, cut + 4096)


@pytest.mark.parametrize("size", [1, HEADER_BYTES, 4096])
def test_all_zero_file_is_a_torn_header(size: int) -> None:
    assert replay(bytes(size)) == Replay([], 0, size)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"S3LX\x01", "not an s3lanes journal"),
        (b"\x00S3LJ", "not an s3lanes journal"),
        (b"PK\x03\x04\x14", "not an s3lanes journal"),
        (b"XY", "not an s3lanes journal"),
        (b"S3LJ\x02", "unsupported journal version 2"),
        (b"S3LJ\xff", "unsupported journal version 255"),
    ],
)
def test_foreign_or_unknown_version_header_is_corrupt_at_offset_zero(header: bytes, reason: str) -> None:
    for data in (header, header + encode_batch(RECORDS[:3])):
        with pytest.raises(JournalCorrupt) as caught:
            replay(data)
        assert (caught.value.offset, caught.value.reason) == (0, reason)


@pytest.mark.parametrize("torn_header", [bytes(HEADER_BYTES), b"S3L\x00\x00", b"S3LJ\x00"])
def test_torn_header_followed_by_good_frames_is_corrupt(torn_header: bytes) -> None:
    with pytest.raises(JournalCorrupt) as caught:
        replay(torn_header + encode_batch(RECORDS[:3]))
    assert caught.value.offset == 0
    assert caught.value.next_valid_offset == HEADER_BYTES


# --------------------------------------------------------------------------------------------------
# Torn tails


def test_truncation_at_every_offset_keeps_exactly_the_whole_records_before_the_cut() -> None:
    data = journal(RECORDS)
    ends = [end for _, end in frame_bounds(RECORDS)]
    assert ends[-1] == len(data)
    for cut in range(len(data) + 1):
        if cut < HEADER_BYTES:
            expected = Replay([], 0, cut)
        else:
            count = sum(end <= cut for end in ends)
            valid = ends[count - 1] if count else HEADER_BYTES
            expected = Replay(RECORDS[:count], valid, cut - valid)
        assert replay(data[:cut]) == expected, cut


def test_truncation_followed_by_zeros_is_torn_at_every_offset() -> None:
    # A filesystem may extend the file with zeros before the data lands.
    data = journal(RECORDS)
    for cut in range(len(data) + 1):
        damaged = data[:cut] + bytes(4096)
        assert replay(damaged) == expected_torn(RECORDS, damaged), cut


def garbage_without_a_valid_frame(seed: int) -> bytes:
    """Random bytes sprinkled with things that look like frames but are not valid ones."""
    rng = random.Random(seed)
    good = encode_record({"looks": "good"})
    pieces = [
        rng.randbytes(300),
        FRAME_MAGIC + rng.randbytes(8),  # a header with random length and CRC
        FRAME_MAGIC + struct.pack(">II", 5, 0) + b"\x81\xa1a\x01\x02",  # plausible, wrong CRC
        raw_frame(msgpack.packb([1, 2, 3])),  # CRC ok, but a list, not a map
        raw_frame(msgpack.packb({b"k": 1}, use_bin_type=True)),  # CRC ok, but a bytes key
        raw_frame(b"\xc1"),  # CRC ok, not msgpack
        raw_frame(b"\x81\xa1a\x01\x02"),  # CRC ok, trailing bytes after the map
        raw_frame(b"", length=MAX_RECORD_BYTES + 1),  # length over the limit
        good[:-1],  # a good frame, torn
        good[:5] + bytes([good[5] ^ 1]) + good[6:],  # a good frame with its length damaged
        rng.randbytes(300),
    ]
    return b"".join(pieces)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_truncation_followed_by_garbage_without_a_valid_frame_is_torn(seed: int) -> None:
    data = journal(RECORDS)
    garbage = garbage_without_a_valid_frame(seed)
    for cut in range(HEADER_BYTES, len(data) + 1):
        damaged = data[:cut] + garbage
        assert replay(damaged) == expected_torn(RECORDS, damaged), cut


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({b"k": 1}, use_bin_type=True), "bytes key"),
        (msgpack.packb({1: 1}), "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (b"", "not valid msgpack"),
        (b"\x81\xa1a", "not valid msgpack"),
        (b"\x80\x80", "not valid msgpack"),
        (b"\x91" * 5000, "not valid msgpack"),
        (b"\xdf\xff\xff\xff\xff", "not valid msgpack"),  # a map32 claiming 4 billion entries
    ],
)
def test_frame_with_a_good_crc_but_a_bad_payload_is_bad(payload: bytes, reason: str) -> None:
    prefix = journal(RECORDS[:2])
    # As the last frame it is a torn tail ...
    assert replay(prefix + raw_frame(payload)) == Replay(RECORDS[:2], len(prefix), len(raw_frame(payload)))
    # ... and followed by a good frame it is corruption, with the reason in the message.
    with pytest.raises(JournalCorrupt, match=reason) as caught:
        replay(prefix + raw_frame(payload) + encode_record({"after": 1}))
    assert caught.value.offset == len(prefix)


def test_frame_longer_than_the_limit_is_bad_even_if_it_fits() -> None:
    prefix = journal(RECORDS[:1])
    oversized = raw_frame(b"\x80" + bytes(MAX_RECORD_BYTES))
    assert replay(prefix + oversized) == Replay(RECORDS[:1], len(prefix), len(oversized))
    with pytest.raises(JournalCorrupt, match="exceeds"):
        replay(prefix + oversized + encode_record({"after": 1}))


# --------------------------------------------------------------------------------------------------
# Corruption in the middle


SMALL = RECORDS[1:7]


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_damage_to_any_byte_of_a_frame_followed_by_good_frames_is_corrupt_at_that_frame(mask: int) -> None:
    data = journal(SMALL)
    bounds = frame_bounds(SMALL)
    for index, (start, end) in enumerate(bounds[:-1]):
        for pos in range(start, end):
            damaged = bytearray(data)
            damaged[pos] ^= mask
            with pytest.raises(JournalCorrupt) as caught:
                replay(bytes(damaged))
            assert caught.value.offset == start, (index, pos)
            assert caught.value.next_valid_offset == bounds[index + 1][0], (index, pos)


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_damage_to_any_byte_of_the_last_frame_drops_it_as_torn(mask: int) -> None:
    data = journal(SMALL)
    start, end = frame_bounds(SMALL)[-1]
    for pos in range(start, end):
        damaged = bytearray(data)
        damaged[pos] ^= mask
        assert replay(bytes(damaged)) == Replay(SMALL[:-1], start, end - start), pos


@pytest.mark.parametrize("mask", [0x01, 0xFF])
def test_damage_to_any_header_byte_is_corrupt_at_offset_zero(mask: int) -> None:
    data = journal(SMALL)
    for pos in range(HEADER_BYTES):
        damaged = bytearray(data)
        damaged[pos] ^= mask
        with pytest.raises(JournalCorrupt) as caught:
            replay(bytes(damaged))
        assert caught.value.offset == 0


def test_garbage_between_good_frames_is_corrupt_at_the_garbage() -> None:
    prefix = journal(SMALL[:2])
    data = prefix + b"\x00\x17junk" + encode_batch(SMALL[2:])
    with pytest.raises(JournalCorrupt) as caught:
        replay(data)
    assert caught.value.offset == len(prefix)
    assert caught.value.next_valid_offset == len(prefix) + 6


def test_zeroed_block_in_the_middle_is_corrupt() -> None:
    data = bytearray(journal(RECORDS))
    start, _ = frame_bounds(RECORDS)[3]
    data[start : start + 64] = bytes(64)
    with pytest.raises(JournalCorrupt) as caught:
        replay(bytes(data))
    assert caught.value.offset == start


def test_journal_corrupt_names_offset_and_reason_and_survives_pickling() -> None:
    error = JournalCorrupt(1234, "frame CRC32C mismatch", 1300)
    assert isinstance(error, GatewayError)
    assert "1234" in str(error)
    assert "frame CRC32C mismatch" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.offset, copy.reason, copy.next_valid_offset) == (1234, "frame CRC32C mismatch", 1300)


# --------------------------------------------------------------------------------------------------
# Input types


def test_memoryview_input_replays_like_bytes_and_is_released() -> None:
    data = journal(RECORDS)
    buffer = bytearray(data[:-3])
    view = memoryview(buffer)
    assert replay(view) == replay(bytes(buffer))
    view.release()
    buffer.extend(b"x")  # would raise BufferError if replay still held an export of the buffer


def test_memoryview_is_released_even_when_corruption_is_raised() -> None:
    buffer = bytearray(b"S3LJ\x09" + encode_batch(SMALL))
    view = memoryview(buffer)
    with pytest.raises(JournalCorrupt) as caught:
        replay(view)
    view.release()
    buffer.extend(b"x")
    assert caught.value.offset == 0


def test_non_byte_memoryview_is_read_as_bytes() -> None:
    data = journal(SMALL)
    padded = data + bytes(-len(data) % 4)
    words = memoryview(padded).cast("I")
    assert replay(words) == replay(padded)


# --------------------------------------------------------------------------------------------------
# Properties

values = st.recursive(
    st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=5),
    max_leaves=10,
)
records_strategy = st.lists(st.dictionaries(st.text(max_size=10), values, max_size=6), max_size=12)


def check_replay_contract(data: bytes) -> None:
    """replay either returns a consistent Replay or raises JournalCorrupt; nothing else escapes."""
    try:
        result = replay(data)
    except JournalCorrupt as error:
        assert 0 <= error.offset < len(data)
        return
    assert result.valid_bytes + result.torn_bytes == len(data)
    assert result.valid_bytes == 0 or HEADER_BYTES <= result.valid_bytes <= len(data)
    assert all(isinstance(r, dict) and all(isinstance(k, str) for k in r) for r in result.records)


@settings(max_examples=examples(300))
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_replay_or_raise_journal_corrupt(data: bytes) -> None:
    check_replay_contract(data)


@settings(max_examples=examples(300))
@given(st.binary(max_size=300))
def test_arbitrary_bytes_after_a_header_only_replay_or_raise_journal_corrupt(tail: bytes) -> None:
    check_replay_contract(file_header() + tail)


@settings(max_examples=examples(300))
@given(st.binary(max_size=200), st.booleans())
def test_arbitrary_payload_in_a_crc_valid_frame_never_escapes(payload: bytes, followed: bool) -> None:
    # The CRC is right, so msgpack really sees the garbage: whatever it raises must be caught.
    data = file_header() + raw_frame(payload) + (encode_record({"after": 1}) if followed else b"")
    check_replay_contract(data)


@settings(max_examples=examples(100))
@given(records_strategy, st.binary(max_size=64))
def test_good_frames_then_arbitrary_tail_only_replay_or_raise_journal_corrupt(
    records: list[dict[str, Any]], tail: bytes
) -> None:
    data = journal(records) + tail
    check_replay_contract(data)


@settings(max_examples=examples(100))
@given(records_strategy)
def test_generated_records_round_trip(records: list[dict[str, Any]]) -> None:
    data = journal(records)
    assert replay(data) == Replay(records, len(data), 0)


@settings(max_examples=examples(100))
@given(records_strategy, st.data())
def test_generated_journal_cut_anywhere_keeps_the_whole_records(
    records: list[dict[str, Any]], data: st.DataObject
) -> None:
    encoded = journal(records)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    assert replay(encoded[:cut]) == expected_torn(records, encoded[:cut])


def test_a_hole_inside_the_last_batch_is_a_torn_tail() -> None:
    """Pages of the unsynced last batch may land out of order: a hole, then a frame of the same batch."""
    synced = [{"t": "put", "seq": i, "_b": 1} for i in range(3)]
    last = [{"t": "put", "seq": 10 + i, "_b": 2, "pad": "x" * 200} for i in range(3)]
    head = file_header() + encode_batch(synced)
    tail = encode_batch(last)
    first = len(encode_record(last[0]))
    holed = head + b"\0" * first + tail[first:]
    out = replay(holed)
    assert out.records == synced
    assert out.valid_bytes == len(head)
    assert out.torn_bytes == len(holed) - len(head)


def test_a_hole_before_an_older_or_mixed_batch_is_damage() -> None:
    first_batch = [{"t": "put", "seq": 1, "_b": 1}, {"t": "put", "seq": 2, "_b": 1}]
    second_batch = [{"t": "put", "seq": 3, "_b": 2}]
    data = file_header() + encode_batch(first_batch) + encode_batch(second_batch)
    first_len = len(encode_record(first_batch[0]))
    start = len(file_header())
    holed = data[:start] + b"\0" * first_len + data[start + first_len :]
    with pytest.raises(JournalCorrupt):
        replay(holed)
