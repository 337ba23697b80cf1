"""PyTorch integration: datasets, ``torch.save``/``torch.load`` checkpoints, Distributed Checkpoint storage.

Needs the ``torch`` extra (``pip install 's3lanes[torch]'``). Importing :mod:`clients` never imports torch;
importing this package does. The Lightning ``CheckpointIO`` lives in :mod:`s3lanes_client.torch.lightning`
(imported on its own, so Lightning is loaded only by those who use it).
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (fail here, with the hint, rather than deep inside a submodule)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("s3lanes_client.torch needs PyTorch: pip install 's3lanes[torch]'") from exc

from s3lanes_client.torch.checkpoint import S3Checkpoint, load_checkpoint, save_checkpoint
from s3lanes_client.torch.datasets import (
    S3Item,
    S3IterableDataset,
    S3MapDataset,
    Sample,
    identity,
    key_and_bytes,
)
from s3lanes_client.torch.dcp import S3StorageReader, S3StorageWriter

__all__ = [
    "S3Checkpoint",
    "S3Item",
    "S3IterableDataset",
    "S3MapDataset",
    "S3StorageReader",
    "S3StorageWriter",
    "Sample",
    "identity",
    "key_and_bytes",
    "load_checkpoint",
    "save_checkpoint",
]
