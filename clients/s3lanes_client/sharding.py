"""Which samples a DataLoader worker of a rank reads. Pure: no torch, no I/O.

Shard ``rank * num_workers + worker_id`` of ``world_size * num_workers`` takes every sample whose index is
congruent to it: the shards partition the index space, so across all ranks and workers each sample is read
exactly once per epoch. Shards differ in length by at most one sample.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def shard_indices(n: int, *, rank: int, world_size: int, worker_id: int, num_workers: int) -> range:
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be positive, got {world_size} and {num_workers}")
    if not (0 <= rank < world_size and 0 <= worker_id < num_workers):
        raise ValueError(f"rank {rank}/{world_size} or worker {worker_id}/{num_workers} out of range")
    return range(rank * num_workers + worker_id, n, world_size * num_workers)


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> Sequence[int]:
    """The order of the samples in an epoch: identical in every rank and worker (same seed and epoch), so
    sharding it still partitions the samples."""
    if not shuffle:
        return range(n)
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order
