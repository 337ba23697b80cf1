"""PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``) storage on s3lanes or plain S3.

Layout, identical to ``FileSystemWriter``'s so either side can read the other's checkpoints once copied:
under ``s3://bucket/prefix/`` each rank writes ``__{rank}_{n}.distcp`` objects (``thread_count`` per rank,
tensors balanced by size), each holding its items back to back (``torch.save`` per tensor, raw bytes for
``BytesIO`` items); the coordinator then writes ``.metadata``, the pickled ``Metadata`` whose storage data
(torch's own ``_StorageInfo``: object name, offset, length) locates every item.

Ordering. ``.metadata`` is written last and directly (one PutObject, atomic on S3; no ``.metadata.tmp`` copy
and delete), after every data object of every rank has been completed: DCP calls ``finish`` on the coordinator
only after all ranks' ``write_data`` results are gathered. A reader that finds ``.metadata`` finds every
object it names. Through an s3lanes gateway with a write spool, ``.metadata`` is also a commit marker: the
gateway drains it to the backend only after everything spooled before it under the prefix, so a restore
reading the backend directly never sees a manifest that points at missing shards.

Writes go in the checkpoint lane as streamed parallel multipart uploads (bounded memory, see
``s3lanes_client.multipart``); reads in the restore lane as ranged GETs, adjacent items coalesced into one
request of at most ``coalesce_bytes`` and up to ``max_inflight_reads`` requests in flight. Stream-transform
extensions (torch's experimental ``_extensions``) are not supported.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import IO, Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from s3lanes_client.config import ClientConfig, MiB
from s3lanes_client.sync import GatewayClient
from s3lanes_client.uri import S3URI, parse_s3_uri

METADATA_NAME = ".metadata"
DATA_SUFFIX = ".distcp"


def _metadata_name(rank: int | None) -> str:
    return METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"


class _ClientHolder:
    """A client created on first use (or the one given); storage objects stay cheap to construct."""

    def __init__(self, client: GatewayClient | None, config: ClientConfig | None) -> None:
        self._client = client
        self._config = config

    def get(self) -> GatewayClient:
        if self._client is None:
            self._client = GatewayClient(self._config)
        return self._client


class _S3Storage:
    """What the writer and the reader share: where the checkpoint lives (``s3://bucket/prefix``), the client
    that reaches it, and the rank DCP set them up for."""

    def __init__(self, uri: str, client: GatewayClient | None, config: ClientConfig | None) -> None:
        super().__init__()
        self._uri: S3URI = parse_s3_uri(uri)
        self._clients = _ClientHolder(client, config)
        self.rank: int | None = None
        self.use_collectives = True

    @property
    def checkpoint_id(self) -> str:
        return str(self._uri)

    def _move_to(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        """``reset(checkpoint_id)``: a new location if one is given."""
        if checkpoint_id:
            self._uri = parse_s3_uri(str(checkpoint_id))

    def _set_up(self, kwargs: dict[str, Any]) -> None:
        """The ``set_up_storage_*`` keyword arguments both sides read."""
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, str) and checkpoint_id.startswith("s3://")


def _item_bytes(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    n = 1
    for dim in item.tensor_data.size:
        n *= dim
    return n * item.tensor_data.properties.dtype.itemsize


def _split_by_size(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """Spread the items over ``bins`` objects: bytes items round-robin, tensors largest first onto the
    lightest bin (as FileSystemWriter does)."""
    if bins <= 1:
        return [items]
    out: list[list[WriteItem]] = [[] for _ in range(bins)]
    sizes = [0] * bins
    bytes_items = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensor_items = sorted(
        (i for i in items if i.type != WriteItemType.BYTE_IO), key=_item_bytes, reverse=True
    )
    for n, item in enumerate(bytes_items):
        out[n % bins].append(item)
    for item in tensor_items:
        lightest = min(range(bins), key=sizes.__getitem__)
        out[lightest].append(item)
        sizes[lightest] += _item_bytes(item)
    return [b for b in out if b]


class S3StorageWriter(_S3Storage, StorageWriter):
    """``torch.distributed.checkpoint.save(state_dict,
    storage_writer=S3StorageWriter("s3://b/ckpt/step_100"))``.

    ``thread_count`` objects are written in parallel per rank; each is a multipart upload of
    ``part_size_bytes`` parts with at most ``max_inflight_parts`` in flight. ``overwrite=False`` refuses a
    prefix that already holds a ``.metadata``.
    """

    def __init__(
        self,
        uri: str,
        *,
        client: GatewayClient | None = None,
        config: ClientConfig | None = None,
        thread_count: int = 1,
        part_size_bytes: int = 16 * MiB,
        max_inflight_parts: int = 4,
        overwrite: bool = True,
        lane: str | None = "checkpoint",
        write_through: bool = False,
    ) -> None:
        if thread_count < 1:
            raise ValueError("thread_count must be at least 1")
        super().__init__(uri, client, config)
        self.thread_count = thread_count
        self.part_size_bytes = part_size_bytes
        self.max_inflight_parts = max_inflight_parts
        self.overwrite = overwrite
        self.lane = lane
        self.write_through = write_through
        self.save_id = str(uuid.uuid4())

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._move_to(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._set_up(kwargs)

    def _local_rank_for_names(self) -> int | None:
        return self.rank if not self.use_collectives and self.rank is not None else None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not self.overwrite:
            name = _metadata_name(0 if not self.use_collectives else None)
            if self._clients.get().head(self._uri.bucket, self._uri.join(name).key, lane="metadata"):
                raise RuntimeError(f"a checkpoint already exists at {self._uri} and overwrite=False")
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_"))
            if plan.storage_data is None
            else plan
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = cast(_StoragePrefix, plan.storage_data).prefix
        jobs = [
            (f"{prefix}{n}{DATA_SUFFIX}", items)
            for n, items in enumerate(_split_by_size(self.thread_count, plan.items))
        ]
        results: list[WriteResult] = []
        if len(jobs) <= 1:
            for name, items in jobs:
                results += self._write_object(name, items, planner)
        else:
            with ThreadPoolExecutor(len(jobs), thread_name_prefix="s3lanes-dcp-write") as pool:
                futures = [pool.submit(self._write_object, name, items, planner) for name, items in jobs]
                for fut in futures:
                    results += fut.result()
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def _write_object(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        results: list[WriteResult] = []
        ordered = [i for i in items if i.type == WriteItemType.BYTE_IO]
        ordered += [i for i in items if i.type != WriteItemType.BYTE_IO]
        with self._clients.get().open_writer(
            self._uri.bucket,
            self._uri.join(name).key,
            part_size_bytes=self.part_size_bytes,
            max_inflight_parts=self.max_inflight_parts,
            lane=self.lane,
            write_through=self.write_through,
        ) as out:
            for item in ordered:
                offset = out.tell()
                data = planner.resolve_data(item)  # lazily, one item at a time: it may allocate
                if item.type == WriteItemType.BYTE_IO:
                    if not isinstance(data, io.BytesIO):
                        raise TypeError(f"{item.index.fqn}: BYTE_IO data must be io.BytesIO")
                    out.write(data.getbuffer())
                else:
                    tensor = cast(torch.Tensor, data).detach().cpu()
                    if tensor.untyped_storage().size() != tensor.nbytes:
                        tensor = tensor.clone()  # a view: save only its own elements, not the whole storage
                    torch.save(tensor, cast(IO[bytes], out))
                length = out.tell() - offset
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_StorageInfo(relative_path=name, offset=offset, length=length),
                    )
                )
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for per_rank in results for wr in per_rank}
        metadata.storage_meta = self.storage_meta()
        key = self._uri.join(_metadata_name(self._local_rank_for_names())).key
        self._clients.get().put_bytes(
            self._uri.bucket, key, pickle.dumps(metadata), lane=self.lane, write_through=self.write_through
        )

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)


@dataclass(frozen=True, slots=True)
class _Span:
    """One ranged GET: bytes ``[start, end)`` of ``name``, covering ``items``."""

    name: str
    start: int
    end: int
    items: tuple[ReadItem, ...]


class S3StorageReader(_S3Storage, StorageReader):
    """``torch.distributed.checkpoint.load(state_dict,
    storage_reader=S3StorageReader("s3://b/ckpt/step_100"))``."""

    def __init__(
        self,
        uri: str,
        *,
        client: GatewayClient | None = None,
        config: ClientConfig | None = None,
        lane: str | None = "restore",
        max_inflight_reads: int = 8,
        coalesce_bytes: int = 32 * MiB,
    ) -> None:
        if max_inflight_reads < 1 or coalesce_bytes < 1:
            raise ValueError("max_inflight_reads and coalesce_bytes must be positive")
        super().__init__(uri, client, config)
        self.lane = lane
        self.max_inflight_reads = max_inflight_reads
        self.coalesce_bytes = coalesce_bytes
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self.load_id = str(uuid.uuid4())

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage_data = {}
        self._move_to(checkpoint_id)
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        key = self._uri.join(_metadata_name(kwargs.get("rank"))).key
        raw = self._clients.get().get_bytes(self._uri.bucket, key, lane=self.lane)
        # The same trust model as FileSystemReader: the checkpoint's own pickled metadata.
        metadata = pickle.loads(raw)
        if not isinstance(metadata, Metadata):
            raise TypeError(f"s3://{self._uri.bucket}/{key} does not hold DCP metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise ValueError("the checkpoint's metadata has no storage data")
        self.storage_data = metadata.storage_data
        self._set_up(kwargs)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _spans(self, items: list[ReadItem]) -> Iterator[_Span]:
        per_object: dict[str, list[tuple[_StorageInfo, ReadItem]]] = {}
        for item in items:
            info = self.storage_data[item.storage_index]
            if info.transform_descriptors:
                raise ValueError(
                    f"{item.storage_index.fqn}: written with stream transforms {info.transform_descriptors}, "
                    "which S3StorageReader does not support"
                )
            per_object.setdefault(info.relative_path, []).append((info, item))
        for name, entries in per_object.items():
            entries.sort(key=lambda e: e[0].offset)
            group: list[ReadItem] = []
            start = end = 0
            for info, item in entries:
                item_end = info.offset + info.length
                # Several read items may share one stored item (resharding): overlaps merge too.
                if group and (info.offset > end or max(end, item_end) - start > self.coalesce_bytes):
                    yield _Span(name, start, end, tuple(group))
                    group = []
                if group:
                    end = max(end, item_end)
                else:
                    start, end = info.offset, item_end
                group.append(item)
            if group:
                yield _Span(name, start, end, tuple(group))

    def _fetch(self, span: _Span) -> bytes:
        return self._clients.get().get_bytes(
            self._uri.bucket, self._uri.join(span.name).key, start=span.start, end=span.end, lane=self.lane
        )

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        spans = iter(self._spans(plan.items))
        with ThreadPoolExecutor(self.max_inflight_reads, thread_name_prefix="s3lanes-dcp-read") as pool:
            pending: deque[tuple[_Span, ThreadFuture[bytes]]] = deque(
                (span, pool.submit(self._fetch, span)) for span in islice(spans, self.max_inflight_reads)
            )
            try:
                while pending:
                    span, fut = pending.popleft()
                    data = memoryview(fut.result())
                    nxt = next(spans, None)
                    if nxt is not None:
                        pending.append((nxt, pool.submit(self._fetch, nxt)))
                    for item in span.items:  # planner calls stay on this thread
                        info = self.storage_data[item.storage_index]
                        at = info.offset - span.start
                        self._load_item(planner, item, data[at : at + info.length])
            finally:
                for _, fut in pending:
                    fut.cancel()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @staticmethod
    def _load_item(planner: LoadPlanner, item: ReadItem, data: memoryview) -> None:
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data))
            return
        tensor = cast(torch.Tensor, torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"{item.storage_index.fqn}: stored size {tensor.size()} != target {target.size()}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)
