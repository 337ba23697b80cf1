"""The spool shell on a real disk and event loop: durability order, recovery, compaction, I/O failures.

No S3 here: these tests drive :class:`~s3lanes.runtime.spool.Spool` directly (writers, journal commits,
flush waiters) and reopen the directory to see what a restart would find. Disk failures are injected by
replacing the ``os`` functions the spool's I/O threads call.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from s3lanes.clock import Clock, FakeClock, SystemClock
from s3lanes.config import SpoolConfig
from s3lanes.core.journal import file_header, replay
from s3lanes.core.journal_records import Put
from s3lanes.core.spool_state import Admission, Origin
from s3lanes.runtime.spool import FlushResult, Spool, SpoolWriteFailed
from s3lanes.runtime.spool.facade import ROOM_STEP_BYTES
from s3lanes.runtime.spool_metrics import spool_collector

CFG = SpoolConfig(capacity_bytes=64 * 1024 * 1024)


async def put(spool: Spool, key: str, data: bytes, bucket: str = "b") -> Put:
    """What the spool's front does for a PUT: in a reservation, stream into a writer (discarded on any
    error), then commit; the data file is discarded when the commit fails, except after a failed journal
    append, whose record may survive (the client is answered 503, nothing is acknowledged)."""
    async with spool.reserve(len(data), must=True) as room:
        writer = room.writer()
        await writer.open()
        try:
            for i in range(0, len(data), 100_000):
                await writer.write(data[i : i + 100_000])
            md5 = await writer.finish()
        except BaseException:
            await writer.discard()
            raise
        rec = spool.state.put_record(
            bucket=bucket,
            key=key,
            file=writer.file_id,
            size=writer.size,
            md5=md5,
            meta=[("content-type", "application/x-test")],
            origin=Origin("AK", "checkpoint", 1_700_000_000.0),
        )
        await room.commit(writer, rec)
    return rec


async def opened(root: Path, cfg: SpoolConfig = CFG, clock: Clock | None = None) -> Spool:
    spool = Spool(cfg, root, clock or SystemClock())
    await spool.open()
    return spool


async def test_acknowledged_writes_survive_a_reopen_byte_exact(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    blobs = {f"k{i}": os.urandom(1000 * i + 7) for i in range(6)}
    await asyncio.gather(*(put(spool, k, v) for k, v in blobs.items()))  # one group commit or a few
    await spool.close()

    again = await opened(tmp_path)
    try:
        assert again.recovery is not None and again.recovery.entries == len(blobs)
        for key, data in blobs.items():
            entry = again.state.lookup("b", key)
            assert entry is not None
            assert entry.etag == f'"{hashlib.md5(data).hexdigest()}"'
            assert again.file_path(entry.files[0]).read_bytes() == data
        assert again.space.used_bytes == sum(len(v) for v in blobs.values())
    finally:
        await again.close()


async def test_recovery_truncates_a_torn_tail_and_removes_unacknowledged_files(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    await put(spool, "kept", b"x" * 5000)
    await spool.close()
    journal = tmp_path / "journal"
    good = journal.read_bytes()
    journal.write_bytes(good + b"\xa5\x5a\x00\x00\x01")  # a frame header cut short by a crash
    orphan = tmp_path / "data" / ("f" * 32)
    orphan.write_bytes(b"written, never acknowledged")

    again = await opened(tmp_path)
    try:
        assert again.recovery is not None
        assert again.recovery.torn_bytes == 5
        assert again.recovery.orphans_removed == 1
        assert not orphan.exists()
        assert journal.read_bytes() == good
        assert again.state.lookup("b", "kept") is not None
    finally:
        await again.close()


async def test_a_file_lost_under_an_acknowledged_entry_is_reported_not_hidden(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    rec = await put(spool, "gone", b"y" * 3000)
    await spool.close()
    (tmp_path / "data" / rec.files[0]).unlink()

    again = await opened(tmp_path)
    try:
        assert again.recovery is not None and again.recovery.lost_entries == [str(rec.seq)]
        assert again.state.lookup("b", "gone") is None
    finally:
        await again.close()


async def test_compaction_keeps_exactly_the_live_state(tmp_path: Path) -> None:
    cfg = replace(CFG, journal_compact_bytes=4096)
    spool = await opened(tmp_path, cfg)
    for i in range(40):  # overwrites of few keys: most records become dead
        await put(spool, f"k{i % 3}", os.urandom(100 + i))
    done = spool.state.lookup("b", "k0")
    assert done is not None
    spool.state.start_upload(done)
    spool.state.upload_succeeded(done)
    await spool.commit([spool.state.done_record(done.seq)])
    live = {k: spool.state.lookup("b", k) for k in ("k1", "k2")}
    await spool.close()
    assert (tmp_path / "journal").stat().st_size < 4096 + 2048

    again = await opened(tmp_path, cfg)
    try:
        assert again.state.lookup("b", "k0") is None
        for key, entry in live.items():
            got = again.state.lookup("b", key)
            assert got is not None and entry is not None
            assert (got.seq, got.etag, got.files) == (entry.seq, entry.etag, entry.files)
        assert len(again.state.entries) == 2
        # Sequence numbers keep growing after a rewrite.
        rec = await put(again, "k9", b"z")
        assert rec.seq > max(e.seq for e in live.values() if e is not None)
    finally:
        await again.close()


async def test_disk_full_while_writing_fails_the_write_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    real_pwrite = os.pwrite

    def full(fd: int, data: Any, offset: int) -> int:
        if len(data) > 50_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full)
    try:
        with pytest.raises(SpoolWriteFailed) as exc:
            await put(spool, "big", os.urandom(2 * 1024 * 1024))
        assert exc.value.status == 503 and "full" in exc.value.message
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert spool.degraded is None  # a data file failing is that write's problem only
        assert spool.state.lookup("b", "big") is None
        assert os.listdir(tmp_path / "data") == []  # the partial file is gone
        await put(spool, "small", b"ok")
        entry = spool.state.lookup("b", "small")
        assert entry is not None and os.listdir(tmp_path / "data") == [entry.files[0]]
    finally:
        await spool.close()


async def test_a_failed_journal_sync_takes_the_spool_out_of_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    await put(spool, "before", b"a" * 100)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    try:
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "during", b"b" * 100)
        assert spool.degraded is not None and "journal" in spool.degraded
        assert spool.state.lookup("b", "during") is None  # never applied, never acknowledged
        with pytest.raises(SpoolWriteFailed):
            await spool.commit(
                [spool.state.delete_record(bucket="b", key="before", origin=Origin("AK", "c", 0.0))]
            )
        assert spool.state.lookup("b", "before") is not None  # what was acknowledged is still there
    finally:
        monkeypatch.undo()
        await spool.close()
    # On restart, the acknowledged entry is there; the failed one may or may not be (never acknowledged).
    again = await opened(tmp_path)
    try:
        assert again.state.lookup("b", "before") is not None
        assert again.degraded is None
    finally:
        await again.close()


async def flush_timing_out(spool: Spool, clock: FakeClock, prefix: str, timeout_s: float) -> FlushResult:
    """A flush that nothing drains for: it returns when its timeout has passed on the spool's clock."""
    task = asyncio.create_task(spool.flush("b", prefix, timeout_s))
    for _ in range(3):
        await asyncio.sleep(0)
    clock.advance(timeout_s - 1e-6)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done(), "returned before its timeout"
    clock.advance(1e-6)
    result = await asyncio.wait_for(task, 10)
    assert result.waited_s == pytest.approx(timeout_s)
    return result


async def test_flush_returns_when_the_prefix_is_drained_or_times_out(tmp_path: Path) -> None:
    clock = FakeClock()  # the flush timeouts pass when the test moves the clock
    spool = await opened(tmp_path, clock=clock)
    try:
        await put(spool, "ckpt/a", b"1")
        await put(spool, "other/b", b"2")
        quick = await flush_timing_out(spool, clock, "ckpt/", 0.05)
        assert not quick.durable and quick.pending_objects == 1 and quick.pending_bytes == 1

        flushing = asyncio.create_task(spool.flush("b", "ckpt/", 5.0))
        entry = spool.state.lookup("b", "ckpt/a")
        assert entry is not None
        spool.state.start_upload(entry)
        spool.state.upload_succeeded(entry)
        await spool.commit([spool.state.done_record(entry.seq)])
        done = await asyncio.wait_for(flushing, 10)
        assert done.durable and done.pending_objects == 0
        assert done.waited_s == 0.0, "returned on the drain, not at its timeout"
        # Another prefix is untouched.
        assert not (await flush_timing_out(spool, clock, "other/", 0.01)).durable
    finally:
        await spool.close()


async def test_flush_returns_as_soon_as_a_drain_upload_intent_left_open_is_resolved(tmp_path: Path) -> None:
    """A drain whose CreateMultipartUpload failed leaves an open intent, which flush counts as pending until
    the janitor ends it; the flush returns then, not at its timeout."""
    clock = FakeClock()
    spool = await opened(tmp_path, clock=clock)
    try:
        rec = await put(spool, "ckpt/a", b"1")
        entry = spool.state.entries[rec.seq]
        await spool.commit([spool.state.backend_intent_record("s1", entry, entry.acked_at)])
        spool.state.start_upload(entry)
        spool.state.upload_succeeded(entry)
        await spool.commit([spool.state.done_record(entry.seq)])
        assert not (await flush_timing_out(spool, clock, "ckpt/", 0.01)).durable  # the open intent
        flushing = asyncio.create_task(spool.flush("b", "ckpt/", 10.0))
        await spool.commit([spool.state.backend_intent_end_record("s1")])
        done = await asyncio.wait_for(flushing, 10)
        assert done.durable and done.waited_s == 0.0, "returned once the intent ended, not at its timeout"
    finally:
        await spool.close()


async def test_wait_empty_polls_on_the_spools_clock_and_gives_up_at_its_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = await opened(tmp_path, clock=clock)
    try:
        assert await spool.wait_empty(30.0), "an empty spool is empty at once"
        rec = await put(spool, "ckpt/a", b"1")
        t0 = clock.monotonic()
        waiting = asyncio.create_task(spool.wait_empty(30.0, poll_s=0.5))
        for _ in range(3):
            await asyncio.sleep(0)
        assert clock.next_timer_at() == t0 + 0.5  # its next look
        entry = spool.state.entries[rec.seq]
        spool.state.start_upload(entry)
        spool.state.upload_succeeded(entry)
        await spool.commit([spool.state.done_record(entry.seq)])
        assert not waiting.done(), "it polls: the drain is seen at the next look"
        clock.advance(0.5)
        assert await asyncio.wait_for(waiting, 10)
        # Nothing drains: it gives up once its timeout has passed, on the spool's clock.
        await put(spool, "ckpt/b", b"2")
        t0 = clock.monotonic()
        waiting = asyncio.create_task(spool.wait_empty(30.0, poll_s=0.5))
        while not waiting.done():
            for _ in range(3):
                await asyncio.sleep(0)
            next_at = clock.next_timer_at()
            if next_at is not None:
                clock.advance(next_at - clock.monotonic())
        assert not waiting.result()
        assert clock.monotonic() - t0 == pytest.approx(30.0)
    finally:
        await spool.close()


async def test_journal_on_disk_is_framed_and_replayable(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    await put(spool, "k", b"v")
    await spool.close()
    data = (tmp_path / "journal").read_bytes()
    assert data.startswith(file_header())
    assert [r["t"] for r in replay(data).records] == ["put"]


async def test_acks_do_not_queue_behind_readers_and_the_journal_not_behind_writers(tmp_path: Path) -> None:
    """Three pools: every reader thread busy (a drain reading a slow disk) must not hold up a PUT, and every
    data-writing thread busy must not hold up a journal commit."""
    spool = await opened(tmp_path)
    release = threading.Event()
    try:
        readers = [asyncio.ensure_future(spool.run_read_io(release.wait, 30)) for _ in range(4)]
        await asyncio.sleep(0.05)
        assert not any(r.done() for r in readers)
        await asyncio.wait_for(put(spool, "while-reading", os.urandom(300_000)), 10)
        writers = [asyncio.ensure_future(spool.run_io(release.wait, 30)) for _ in range(4)]
        await asyncio.sleep(0.05)
        rec = spool.state.create_upload_record(
            upload_id="s3lanes-u1",
            bucket="b",
            key="k",
            meta=[],
            origin=Origin("AK", "checkpoint", 1_700_000_000.0),
        )
        await asyncio.wait_for(spool.commit([rec]), 10)
        assert "s3lanes-u1" in spool.state.uploads
        assert not any(w.done() for w in writers)  # the commit did not need them
        release.set()
        await asyncio.gather(*readers, *writers)
        assert spool.state.lookup("b", "while-reading") is not None
    finally:
        release.set()
        await spool.close()


async def test_the_metrics_collector_reads_what_the_spool_holds(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = await opened(tmp_path, clock=clock)
    try:
        await put(spool, "ckpt/a", b"x" * 1000)
        await put(spool, "ckpt/b", b"y" * 24)
        clock.advance(5.0)
        gauges = {m.name: m.samples for m in spool_collector(spool, clock)()}
        value = {name: samples[0].value for name, samples in gauges.items() if len(samples) == 1}
        assert value["s3lanes_spool_pending_objects"] == 2
        assert value["s3lanes_spool_pending_bytes"] == 1024
        assert value["s3lanes_spool_used_bytes"] == 1024
        assert value["s3lanes_spool_open_uploads"] == 0
        assert value["s3lanes_spool_capacity_bytes"] == CFG.capacity_bytes
        assert value["s3lanes_spool_oldest_pending_age_seconds"] == clock.wall() - 1_700_000_000.0
        assert [(s.labels, s.value) for s in gauges["s3lanes_spool_prefix_pending_bytes"]] == [
            ({"bucket": "b", "prefix": "ckpt/"}, 1024.0)
        ]
    finally:
        await spool.close()


async def test_a_reservation_holds_its_room_until_its_block_ends_however_it_ends(tmp_path: Path) -> None:
    spool = await opened(tmp_path, replace(CFG, capacity_bytes=4 * ROOM_STEP_BYTES))
    try:
        async with spool.reserve(1000) as room:
            assert room.admitted and spool.space.reserved_bytes == 1000
            assert room.grow(ROOM_STEP_BYTES + 1)  # a body of unknown length: whole steps, as it arrives
            assert room.grown == 2 * ROOM_STEP_BYTES
            assert spool.space.reserved_bytes == 1000 + 2 * ROOM_STEP_BYTES
            assert not room.grow(4 * ROOM_STEP_BYTES)  # past the capacity: no more room
        assert spool.space.reserved_bytes == 0
        with pytest.raises(RuntimeError):
            async with spool.reserve(10, must=True) as room:
                assert spool.space.reserved_bytes == 10
                raise RuntimeError("the write failed")
        assert spool.space.reserved_bytes == 0
        async with spool.reserve(5 * ROOM_STEP_BYTES, must=True) as room:  # more than the spool holds
            assert room.admission is Admission.TOO_BIG and not room.admitted
            assert spool.space.reserved_bytes == 0
        assert spool.space.reserved_bytes == 0  # nothing held, nothing given back
    finally:
        await spool.close()


async def test_a_reservation_discards_the_file_of_a_commit_that_failed_before_the_journal(
    tmp_path: Path,
) -> None:
    spool = await opened(tmp_path)
    try:
        async with spool.reserve(3) as room:
            writer = room.writer()
            await writer.open()
            await writer.write(b"abc")
            md5 = await writer.finish()
            assert (spool.data_dir / writer.file_id).exists()
            rec = spool.state.put_record(
                bucket="b",
                key="k",
                file=writer.file_id,
                size=writer.size,
                md5=md5,
                meta=[],
                origin=Origin("AK", "checkpoint", 1_700_000_000.0),
            )
            spool.degraded = "a test"  # out of service: the commit fails before any append
            with pytest.raises(SpoolWriteFailed):
                await room.commit(writer, rec)
            spool.degraded = None
        assert not (spool.data_dir / writer.file_id).exists()
    finally:
        await spool.close()


async def test_unjournaled_answers_for_a_key_and_for_any_key_of_a_bucket(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    try:
        assert not spool.unjournaled("b") and not spool.unjournaled("b", "k")
        spool.forget_unjournaled("b", "k", (), 0)  # a drained entry whose done record was not journaled
        assert spool.unjournaled("b", "k") and spool.unjournaled("b")
        assert not spool.unjournaled("b", "other") and not spool.unjournaled("c")
    finally:
        await spool.close()
