"""A training loop that reads its data set through s3lanes and checkpoints every N steps.

    export S3LANES_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...
    python examples/train_loop.py --bucket demo --make-dataset 512 --steps 40 --every 10

* Samples are objects under ``s3://BUCKET/DATA_PREFIX``, streamed by ``S3IterableDataset`` in the dataset
  lane, sharded across DataLoader workers (and across ranks, from ``RANK``/``WORLD_SIZE`` or
  torch.distributed).
* Every ``--every`` steps the model and optimizer are saved with PyTorch Distributed Checkpoint to
  ``s3://BUCKET/CKPT_PREFIX/step_N/`` in the checkpoint lane (``.metadata`` last), then a small ``latest``
  object names that step. Through a gateway with a write spool the save returns at local-disk speed; the
  previous checkpoint is waited for (``wait_durable``) before the next one is written, so at most one
  checkpoint is ever in flight to the store and the job learns of a store that cannot keep up.
* ``examples/restore.py`` resumes from ``latest``.
"""

from __future__ import annotations

import argparse
import hashlib
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.utils.data import DataLoader

from s3lanes_client import ClientConfig, GatewayClient, Lane
from s3lanes_client.torch import S3IterableDataset, S3StorageWriter, Sample

FEATURES = 64
CLASSES = 4

# One process here, no process group: DCP says so with a warning on every save.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


def to_example(sample: Sample) -> tuple[torch.Tensor, int]:
    """Bytes -> (features, label): the first FEATURES bytes scaled to [0, 1], the label from the key."""
    raw = sample.data[:FEATURES].ljust(FEATURES, b"\0")
    features = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float() / 255.0
    return features, int(sample.key.rsplit("-", 1)[-1].split(".")[0]) % CLASSES


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_dataset(client: GatewayClient, bucket: str, prefix: str, count: int) -> None:
    for i in range(count):
        blob = hashlib.sha256(str(i).encode()).digest() * 8
        client.put_bytes(bucket, f"{prefix}sample-{i:06d}.bin", blob, lane=Lane.DATASET)  # not spooled


def save(client: GatewayClient, bucket: str, prefix: str, step: int, model: Any, optimizer: Any) -> None:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    uri = f"s3://{bucket}/{prefix}step_{step}"
    dcp_save(
        {"model": model_sd, "optim": optim_sd, "step": step},
        storage_writer=S3StorageWriter(uri, client=client),
    )
    # The pointer is written after the checkpoint it names; the gateway drains it after it, too.
    client.put_bytes(bucket, f"{prefix}latest", f"step_{step}".encode(), lane=Lane.CHECKPOINT)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--data-prefix", default="train/")
    p.add_argument("--ckpt-prefix", default="ckpt/example-run/")
    p.add_argument(
        "--make-dataset", type=int, default=0, metavar="N", help="upload N synthetic samples first"
    )
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--durable-timeout", type=float, default=600.0, help="seconds to wait for a checkpoint")
    args = p.parse_args(argv)

    config = ClientConfig.from_env()
    client = GatewayClient(config)
    if args.make_dataset:
        make_dataset(client, args.bucket, args.data_prefix, args.make_dataset)

    dataset: S3IterableDataset[tuple[torch.Tensor, int]] = S3IterableDataset(
        args.bucket, prefix=args.data_prefix, transform=to_example, config=config, shuffle=True
    )
    model, optimizer = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    step, epoch, pending = 0, 0, ""
    while step < args.steps:
        dataset.set_epoch(epoch)
        for features, labels in DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers):
            optimizer.zero_grad()
            loss = loss_fn(model(features), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.every == 0:
                if pending:  # the previous checkpoint must be on the store before we write another
                    client.wait_durable(args.bucket, pending, timeout_s=args.durable_timeout)
                save(client, args.bucket, args.ckpt_prefix, step, model, optimizer)
                pending = f"{args.ckpt_prefix}step_{step}/"
                print(
                    f"step {step}: loss {loss.item():.4f}, checkpoint s3://{args.bucket}/{pending}",
                    flush=True,
                )
            if step >= args.steps:
                break
        epoch += 1
    status = client.wait_durable(args.bucket, args.ckpt_prefix, timeout_s=args.durable_timeout)
    print(f"done after {step} steps; checkpoints durable on the store: {status.durable}", flush=True)
    client.close()


if __name__ == "__main__":
    main()
