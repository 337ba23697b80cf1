"""A synchronous checkpoint save, as ``torch.save`` or a blocking DCP save does: ``shards`` objects written as
multipart uploads by ``writers`` concurrent writers, then a small ``.metadata`` commit marker, the caller
blocked until all are acknowledged. The contention benchmark's trainer and the checkpoint save benchmark
save this way."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from loadtests.harness.s3client import S3, WorkloadError, pieces, retrying

METADATA_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CheckpointShape:
    """Where checkpoints go and what one is: checkpoint ``i`` is under ``{prefix}/step_{i:04d}/``."""

    bucket: str
    prefix: str
    shards: int
    shard_bytes: int
    part_bytes: int
    writers: int

    def step_prefix(self, index: int) -> str:
        return f"{self.prefix}/step_{index:04d}/"

    @property
    def bytes_total(self) -> int:
        return self.shards * self.shard_bytes + METADATA_BYTES


@dataclass(slots=True)
class CheckpointRecord:
    index: int
    prefix: str
    bytes_total: int
    save_start: float
    save_end: float = 0.0
    durable_at: float | None = None
    error: str | None = None
    flush: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "prefix": self.prefix,
            "bytes": self.bytes_total,
            "save_start": self.save_start,
            "save_end": self.save_end,
            "save_s": self.save_end - self.save_start,
            "durable_at": self.durable_at,
            "durable_s": None if self.durable_at is None else self.durable_at - self.save_start,
            "error": self.error,
            "flush": self.flush,
        }


def shard_key(prefix: str, shard: int) -> str:
    """Shard ``shard`` of the checkpoint under ``prefix``, named as a DCP save names its files."""
    return f"{prefix}__{shard}_0.distcp"


def marker_key(prefix: str) -> str:
    """The commit marker of the checkpoint under ``prefix``, written once every shard is acknowledged."""
    return f"{prefix}.metadata"


class CheckpointWriter:
    """Saves checkpoints of ``shape`` through ``s3``, every request retried (:func:`retrying`, retries
    counted in ``counters``). A subclass may write the shards and the marker with another client."""

    def __init__(self, s3: S3, shape: CheckpointShape, counters: dict[str, int]) -> None:
        self.s3 = s3
        self.shape = shape
        self.counters = counters

    async def write_shard(self, prefix: str, shard: int, seed: int) -> None:
        bucket, key = self.shape.bucket, shard_key(prefix, shard)
        size, part_bytes = self.shape.shard_bytes, self.shape.part_bytes

        async def create() -> str:
            return str(await self.s3.create_upload(bucket, key))

        upload_id: str = await retrying(f"create {key}", create, self.counters)
        etags: list[str] = []
        offset = 0
        number = 1
        while offset < size:
            n = min(part_bytes, size - offset)
            views = pieces(n, seed * 7919 + number)

            async def part(number: int = number, views: list[memoryview] = views) -> str:
                return str(await self.s3.upload_part(bucket, key, upload_id, number, views))

            etags.append(await retrying(f"part {number} of {key}", part, self.counters))
            offset += n
            number += 1

        async def complete() -> None:
            await self.s3.complete_upload(bucket, key, upload_id, etags)

        await retrying(f"complete {key}", complete, self.counters)

    async def put_marker(self, prefix: str, index: int) -> None:
        marker = pieces(METADATA_BYTES, index)

        async def put() -> None:
            await self.s3.put(self.shape.bucket, marker_key(prefix), marker)

        await retrying(marker_key(prefix), put, self.counters)

    async def save(self, index: int) -> CheckpointRecord:
        """One synchronous checkpoint: shards by ``writers`` concurrent writers, then the commit marker."""
        shape = self.shape
        prefix = shape.step_prefix(index)
        rec = CheckpointRecord(index, prefix, shape.bytes_total, time.monotonic())
        sem = asyncio.Semaphore(shape.writers)

        async def shard(i: int) -> None:
            async with sem:
                await self.write_shard(prefix, i, index * 100 + i)

        try:
            # Every shard runs to its end (a failed one does not cut the others short): each error counts.
            results = await asyncio.gather(*(shard(i) for i in range(shape.shards)), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                if not all(isinstance(r, WorkloadError) for r in failed):
                    raise next(r for r in failed if not isinstance(r, WorkloadError))
                raise failed[0]
            await self.put_marker(prefix, index)
        except WorkloadError as exc:
            rec.error = str(exc)[:500]
        rec.save_end = time.monotonic()
        return rec
