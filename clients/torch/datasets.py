"""Map-style and iterable PyTorch datasets over S3 objects (or byte ranges of them), read in the dataset lane.

Theory of operation. A dataset holds only plain data: a :class:`ClientConfig`, the bucket, what to read (a
prefix, explicit keys, or explicit byte ranges) and the user's transform. The S3 client is created lazily, in
the process that reads, and never pickled; a dataset handed to ``DataLoader(num_workers=N)`` therefore works
with both fork and spawn, and each worker opens its own connections.

Samples. Every item is one object, or one byte range of one (``record_bytes`` cuts every object into
fixed-size records read with ``Range`` GETs: many small samples packed into a few large objects). The user's
transform gets a :class:`Sample` (bucket, key, offset, bytes) and returns what the DataLoader collates; the
default returns ``(key, bytes)``.

Iterable sharding and read-ahead. :class:`S3IterableDataset` orders the items (key order, or a seeded shuffle
per epoch identical in every process), then keeps shard ``rank * num_workers + worker_id`` of
``world_size * num_workers`` (``clients.sharding``): each sample is read once per epoch across all ranks and
DataLoader workers. The rank and world size come from ``torch.distributed`` when it is initialised, else from
the ``RANK``/``WORLD_SIZE`` environment variables, else 0/1. Within a worker, up to ``readahead`` items are
fetched ahead by ``readahead_threads`` threads; the queue of futures is bounded, so memory is at most
``readahead`` samples, and samples come out in order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any, Generic, TypeVar

import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from clients.config import ClientConfig
from clients.sharding import epoch_order, shard_indices
from clients.sync import GatewayClient
from clients.uri import parse_s3_uri

T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class S3Item:
    """One sample's location: a whole object, or bytes ``[start, end)`` of it."""

    key: str
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """What a transform receives. ``offset`` is where ``data`` starts in the object."""

    bucket: str
    key: str
    data: bytes
    offset: int = 0


def key_and_bytes(sample: Sample) -> tuple[str, bytes]:
    """The default transform (module-level, so datasets using it pickle)."""
    return sample.key, sample.data


class _Source:
    """What to read and how; shared by both datasets. Pickles without its client."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str | None,
        keys: Sequence[str] | None,
        items: Sequence[S3Item] | None,
        record_bytes: int | None,
        config: ClientConfig | None,
        lane: str | None,
    ) -> None:
        if sum(x is not None for x in (prefix, keys, items)) != 1:
            raise ValueError("give exactly one of prefix, keys or items")
        if record_bytes is not None and (record_bytes < 1 or items is not None):
            raise ValueError("record_bytes must be positive, and applies to a prefix or keys, not items")
        self.bucket = bucket
        self.prefix = prefix
        self.keys = list(keys) if keys is not None else None
        self.record_bytes = record_bytes
        self.config = config if config is not None else ClientConfig.from_env()
        self.lane = lane
        self._items: list[S3Item] | None = list(items) if items is not None else None
        self._client: GatewayClient | None = None
        self._client_pid = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_pid"] = 0
        return state

    def client(self) -> GatewayClient:
        """This process's client (a fork inherits the parent's object, but must not use its sockets)."""
        if self._client is None or self._client_pid != os.getpid():
            self._client = GatewayClient(self.config)
            self._client_pid = os.getpid()
        return self._client

    def items(self) -> list[S3Item]:
        if self._items is None:
            self._items = self._resolve()
        return self._items

    def _resolve(self) -> list[S3Item]:
        client = self.client()
        sized: list[tuple[str, int | None]]
        if self.prefix is not None:
            sized = [(o.key, o.size) for o in client.list_objects(self.bucket, self.prefix, lane="metadata")]
        else:
            assert self.keys is not None
            sized = [(k, None) for k in self.keys]
        if self.record_bytes is None:
            return [S3Item(key) for key, _ in sized]
        items: list[S3Item] = []
        for key, size in sized:
            if size is None:
                info = client.head(self.bucket, key, lane="metadata")
                if info is None:
                    raise FileNotFoundError(f"s3://{self.bucket}/{key}")
                size = info.size
            items.extend(
                S3Item(key, start, min(start + self.record_bytes, size))
                for start in range(0, size, self.record_bytes)
            )
        return items

    def fetch(self, client: GatewayClient, item: S3Item) -> Sample:
        data = client.get_bytes(self.bucket, item.key, start=item.start, end=item.end, lane=self.lane)
        return Sample(self.bucket, item.key, data, item.start or 0)


class S3MapDataset(Dataset[T_co], Generic[T_co]):
    """Random access by index over the objects under a prefix, a list of keys, or explicit byte ranges.

    The item list is resolved (listed) on first use in the constructing process and pickled to the workers
    with the dataset, so workers do not list again. ``record_bytes`` cuts every object into records of that
    many bytes (the last one shorter), each read with a ranged GET.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str | None = None,
        keys: Sequence[str] | None = None,
        items: Sequence[S3Item] | None = None,
        record_bytes: int | None = None,
        transform: Callable[[Sample], T_co] = key_and_bytes,  # type: ignore[assignment]
        config: ClientConfig | None = None,
        lane: str | None = "dataset",
    ) -> None:
        self._source = _Source(
            bucket, prefix=prefix, keys=keys, items=items, record_bytes=record_bytes, config=config, lane=lane
        )
        self.transform = transform

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3MapDataset[Any]:
        """Every object under ``s3://bucket/prefix``."""
        parsed = parse_s3_uri(uri)
        return S3MapDataset(parsed.bucket, prefix=parsed.key, **kwargs)

    @property
    def items(self) -> list[S3Item]:
        return self._source.items()

    def __len__(self) -> int:
        return len(self._source.items())

    def __getitem__(self, index: int) -> T_co:
        item = self._source.items()[index]
        return self.transform(self._source.fetch(self._source.client(), item))


class S3IterableDataset(IterableDataset[T_co], Generic[T_co]):
    """Streams the objects under a prefix (or keys, or ranges), sharded by DataLoader worker and by rank.

    ``rank``/``world_size`` override what ``torch.distributed`` or the environment say. ``shuffle`` permutes
    the items with ``seed`` and the epoch set by :meth:`set_epoch` (the same permutation in every process).
    ``readahead`` items (0: none) are fetched ahead by ``readahead_threads`` threads.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str | None = None,
        keys: Sequence[str] | None = None,
        items: Sequence[S3Item] | None = None,
        record_bytes: int | None = None,
        transform: Callable[[Sample], T_co] = key_and_bytes,  # type: ignore[assignment]
        config: ClientConfig | None = None,
        lane: str | None = "dataset",
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        readahead: int = 8,
        readahead_threads: int = 4,
    ) -> None:
        if readahead < 0 or readahead_threads < 1:
            raise ValueError("readahead must be >= 0 and readahead_threads >= 1")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        self._source = _Source(
            bucket, prefix=prefix, keys=keys, items=items, record_bytes=record_bytes, config=config, lane=lane
        )
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.rank = rank
        self.world_size = world_size
        self.readahead = readahead
        self.readahead_threads = readahead_threads

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3IterableDataset[Any]:
        parsed = parse_s3_uri(uri)
        return S3IterableDataset(parsed.bucket, prefix=parsed.key, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """Call before each epoch (in the main process, before iterating the DataLoader) when shuffling."""
        self.epoch = epoch

    def rank_and_world_size(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    def shard(self) -> list[S3Item]:
        """The items this process (rank, DataLoader worker) reads this epoch, in order."""
        items = self._source.items()
        rank, world_size = self.rank_and_world_size()
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = epoch_order(len(items), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        picked = shard_indices(
            len(order), rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers
        )
        return [items[order[i]] for i in picked]

    def __iter__(self) -> Iterator[T_co]:
        shard = self.shard()
        client = self._source.client()
        if self.readahead == 0:
            for item in shard:
                yield self.transform(self._source.fetch(client, item))
            return
        pool = ThreadPoolExecutor(self.readahead_threads, thread_name_prefix="s3lanes-readahead")
        try:
            upcoming = iter(shard)
            pending: deque[Future[Sample]] = deque(
                pool.submit(self._source.fetch, client, item) for item in islice(upcoming, self.readahead)
            )
            while pending:
                sample = pending.popleft().result()
                nxt = next(upcoming, None)
                if nxt is not None:
                    pending.append(pool.submit(self._source.fetch, client, nxt))
                yield self.transform(sample)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
