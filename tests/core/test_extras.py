"""The optional extras of pyproject.toml match the client's optional integrations."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    extras: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    return extras


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_lightning_checkpoint_io_has_an_extra_with_lightning_2_and_torch() -> None:
    # The module where the client package is imported from (the working tree, or the installed wheel when
    # the tests run from a copy); found without importing s3lanes_client.torch, which needs torch.
    spec = importlib.util.find_spec("clients")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "torch" / "lightning.py").read_text()
    assert "from lightning.pytorch" in source  # the module the extra provides
    extras = _extras()
    assert "lightning" in extras
    assert "lightning>=2" in extras["lightning"]
    # s3lanes_client.torch.lightning imports torch: the extra brings what the torch extra brings.
    assert _names(extras["torch"]) <= _names(extras["lightning"])
    assert [r for r in extras["lightning"] if r.startswith("torch")] == [
        r for r in extras["torch"] if r.startswith("torch")
    ]
