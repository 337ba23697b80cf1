"""Resume from the checkpoint that ``examples/train_loop.py`` last completed.

    python examples/restore.py --bucket demo

Reads the ``latest`` pointer, then loads model and optimizer with PyTorch Distributed Checkpoint in the
restore lane (ranged GETs of the ``.distcp`` objects, adjacent items coalesced). Point
``S3LANES_ENDPOINT_URL`` at the store itself instead of the gateway and the same code reads the backend
directly: after ``wait_durable`` the checkpoint is there, complete.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from s3lanes_client import ClientConfig, GatewayClient, Lane
from s3lanes_client.torch import S3StorageReader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_loop import make_model  # the same model definition as the writer

warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--ckpt-prefix", default="ckpt/example-run/")
    args = p.parse_args(argv)

    client = GatewayClient(ClientConfig.from_env())
    latest = client.get_bytes(args.bucket, f"{args.ckpt_prefix}latest", lane=Lane.RESTORE).decode()
    uri = f"s3://{args.bucket}/{args.ckpt_prefix}{latest}"

    model, optimizer = make_model()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp_load(state, storage_reader=S3StorageReader(uri, client=client))  # fills the dicts in place
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    client.close()

    weights = sum(float(t.abs().sum()) for t in model.state_dict().values() if isinstance(t, torch.Tensor))
    print(f"restored {uri}: step {state['step']}, |weights| {weights:.3f}", flush=True)


if __name__ == "__main__":
    main()
