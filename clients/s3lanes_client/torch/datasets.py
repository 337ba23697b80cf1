"""Map-style and iterable PyTorch datasets over S3 objects (or byte ranges of them), read in the dataset lane.

Theory of operation. A dataset holds only plain data: a :class:`ClientConfig`, the bucket, what to read (a
prefix, explicit keys, or explicit byte ranges) and the user's transform. The S3 client is created lazily, in
the process that reads, and never pickled; a dataset handed to ``DataLoader(num_workers=N)`` therefore works
with both fork and spawn, and each worker opens its own connections.

Samples. Every item is one object, or one byte range of one (``record_bytes`` cuts every object into
fixed-size records read with ``Range`` GETs: many small samples packed into a few large objects). The user's
transform gets a :class:`Sample` (bucket, key, offset, bytes) and returns what the DataLoader collates; the
default returns ``(key, bytes)``. With ``as_reader=True`` the transform gets an :class:`ObjectReader`
instead: a lazy, seekable file over the sample (nothing is fetched until it reads, then ranged GETs through a
small read-ahead buffer), so a large sample or a tar of many members (``tarfile.open(fileobj=reader,
mode="r|*")``, or ``mode="r:"`` to seek past members) is never read whole unless the transform does.

Iterable sharding and read-ahead. :class:`S3IterableDataset` orders the items (key order, or a seeded shuffle
per epoch identical in every process), then keeps shard ``rank * num_workers + worker_id`` of
``world_size * num_workers`` (``s3lanes_client.sharding``): each sample is read once per epoch across all
ranks and DataLoader workers. The rank and world size come from ``torch.distributed`` when it is initialised,
else from the ``RANK``/``WORLD_SIZE`` environment variables, else 0/1. Within a worker, up to ``readahead``
items are fetched ahead by ``readahead_threads`` threads; the queue of futures is bounded, so memory is at
most ``readahead`` samples, and samples come out in order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any, Generic, TypeVar

import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from s3lanes_client.config import ClientConfig, MiB, config_for
from s3lanes_client.reader import ObjectReader
from s3lanes_client.sharding import epoch_order, shard_indices
from s3lanes_client.sync import GatewayClient
from s3lanes_client.uri import parse_s3_uri

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


def identity(sample: Any) -> Any:
    """The transform of ``from_prefix``/``from_objects`` (as s3torchconnector's): the reader itself."""
    return sample


def _bucket_and_keys(object_uris: str | Iterable[str]) -> tuple[str, list[str]]:
    uris = [object_uris] if isinstance(object_uris, str) else list(object_uris)
    if not uris:
        raise ValueError("from_objects needs at least one object URI")
    parsed = [parse_s3_uri(u) for u in uris]
    buckets = {p.bucket for p in parsed}
    if len(buckets) != 1:
        raise ValueError(f"from_objects reads one bucket per dataset, got {sorted(buckets)}")
    if any(not p.key for p in parsed):
        raise ValueError("every object URI needs a key")
    return parsed[0].bucket, [p.key for p in parsed]


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
        as_reader: bool = False,
        reader_block_bytes: int = MiB,
    ) -> None:
        if reader_block_bytes < 1:
            raise ValueError("reader_block_bytes must be positive")
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
        self.as_reader = as_reader
        self.reader_block_bytes = reader_block_bytes
        # Object sizes a listing told us, so a reader over a whole object needs no HEAD.
        self._sizes: dict[str, int] = {}
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
            self._sizes = {key: size for key, size in sized if size is not None}
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

    def fetch(self, client: GatewayClient, item: S3Item) -> Sample | ObjectReader:
        """The sample's bytes, or (``as_reader``) a lazy reader over them that has fetched nothing yet."""
        if self.as_reader:
            return client.open_reader(
                self.bucket,
                item.key,
                lane=self.lane,
                block_bytes=self.reader_block_bytes,
                size=self._sizes.get(item.key) if item.end is None else None,
                start=item.start or 0,
                end=item.end,
            )
        data = client.get_bytes(self.bucket, item.key, start=item.start, end=item.end, lane=self.lane)
        return Sample(self.bucket, item.key, data, item.start or 0)

    def fetch_ahead(self, client: GatewayClient, item: S3Item) -> Sample | ObjectReader:
        """:meth:`fetch` for a read-ahead thread: a reader comes back with its first block already fetched."""
        sample = self.fetch(client, item)
        if isinstance(sample, ObjectReader):
            sample.prefetch()
        return sample


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
        transform: Callable[[Any], T_co] = key_and_bytes,  # type: ignore[assignment]
        config: ClientConfig | None = None,
        lane: str | None = "dataset",
        as_reader: bool = False,
        reader_block_bytes: int = MiB,
    ) -> None:
        self._source = _Source(
            bucket,
            prefix=prefix,
            keys=keys,
            items=items,
            record_bytes=record_bytes,
            config=config,
            lane=lane,
            as_reader=as_reader,
            reader_block_bytes=reader_block_bytes,
        )
        self.transform = transform

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3MapDataset[Any]:
        """Every object under ``s3://bucket/prefix``."""
        parsed = parse_s3_uri(uri)
        return S3MapDataset(parsed.bucket, prefix=parsed.key, **kwargs)

    @classmethod
    def from_prefix(
        cls,
        s3_uri: str,
        *,
        region: str | None = None,
        endpoint: str | None = None,
        transform: Callable[[Any], Any] = identity,
        config: ClientConfig | None = None,
        **kwargs: Any,
    ) -> S3MapDataset[Any]:
        """s3torchconnector's spelling: every object under ``s3_uri``; the transform gets a lazy reader
        (``as_reader=False`` in ``kwargs`` hands it a :class:`Sample` instead)."""
        parsed = parse_s3_uri(s3_uri)
        kwargs.setdefault("as_reader", True)
        return S3MapDataset(
            parsed.bucket,
            prefix=parsed.key,
            transform=transform,
            config=config_for(config, region, endpoint),
            **kwargs,
        )

    @classmethod
    def from_objects(
        cls,
        object_uris: str | Iterable[str],
        *,
        region: str | None = None,
        endpoint: str | None = None,
        transform: Callable[[Any], Any] = identity,
        config: ClientConfig | None = None,
        **kwargs: Any,
    ) -> S3MapDataset[Any]:
        """s3torchconnector's spelling: the listed objects (``s3://bucket/key`` URIs, all in one bucket), in
        the order given; the transform gets a lazy reader unless ``as_reader=False``."""
        bucket, keys = _bucket_and_keys(object_uris)
        kwargs.setdefault("as_reader", True)
        return S3MapDataset(
            bucket, keys=keys, transform=transform, config=config_for(config, region, endpoint), **kwargs
        )

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
        transform: Callable[[Any], T_co] = key_and_bytes,  # type: ignore[assignment]
        config: ClientConfig | None = None,
        lane: str | None = "dataset",
        as_reader: bool = False,
        reader_block_bytes: int = MiB,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        readahead: int = 8,
        readahead_threads: int = 4,
        sharding: bool = True,
    ) -> None:
        if readahead < 0 or readahead_threads < 1:
            raise ValueError("readahead must be >= 0 and readahead_threads >= 1")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        self._source = _Source(
            bucket,
            prefix=prefix,
            keys=keys,
            items=items,
            record_bytes=record_bytes,
            config=config,
            lane=lane,
            as_reader=as_reader,
            reader_block_bytes=reader_block_bytes,
        )
        self.transform = transform
        self.sharding = sharding
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

    @classmethod
    def from_prefix(
        cls,
        s3_uri: str,
        *,
        region: str | None = None,
        endpoint: str | None = None,
        transform: Callable[[Any], Any] = identity,
        config: ClientConfig | None = None,
        enable_sharding: bool = True,
        **kwargs: Any,
    ) -> S3IterableDataset[Any]:
        """s3torchconnector's spelling: every object under ``s3_uri``; the transform gets a lazy reader
        (``as_reader=False`` in ``kwargs`` hands it a :class:`Sample`). ``enable_sharding=False`` makes every
        worker and rank read every object, as s3torchconnector does by default."""
        parsed = parse_s3_uri(s3_uri)
        kwargs.setdefault("as_reader", True)
        return S3IterableDataset(
            parsed.bucket,
            prefix=parsed.key,
            transform=transform,
            config=config_for(config, region, endpoint),
            sharding=enable_sharding,
            **kwargs,
        )

    @classmethod
    def from_objects(
        cls,
        object_uris: str | Iterable[str],
        *,
        region: str | None = None,
        endpoint: str | None = None,
        transform: Callable[[Any], Any] = identity,
        config: ClientConfig | None = None,
        enable_sharding: bool = True,
        **kwargs: Any,
    ) -> S3IterableDataset[Any]:
        """s3torchconnector's spelling: the listed objects (one bucket), in the order given."""
        bucket, keys = _bucket_and_keys(object_uris)
        kwargs.setdefault("as_reader", True)
        return S3IterableDataset(
            bucket,
            keys=keys,
            transform=transform,
            config=config_for(config, region, endpoint),
            sharding=enable_sharding,
            **kwargs,
        )

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
        if not self.sharding:
            order = epoch_order(len(items), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
            return [items[i] for i in order]
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
        fetch = self._source.fetch_ahead
        try:
            upcoming = iter(shard)
            pending: deque[Future[Sample | ObjectReader]] = deque(
                pool.submit(fetch, client, item) for item in islice(upcoming, self.readahead)
            )
            while pending:
                sample = pending.popleft().result()
                nxt = next(upcoming, None)
                if nxt is not None:
                    pending.append(pool.submit(fetch, client, nxt))
                yield self.transform(sample)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
