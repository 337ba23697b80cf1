"""Every logger of the gateway is ``s3lanes`` or a child of it, and the configured handler sees them all."""

from __future__ import annotations

import ast
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import s3lanes
from s3lanes.logsetup import configure_logging

GATEWAY = Path(s3lanes.__file__).parent
# logsetup configures the root logger and third-party ones (aiohttp); it is the one place allowed to.
EXEMPT = {GATEWAY / "logsetup.py"}


def _get_logger_calls() -> list[tuple[str, int, ast.expr | None]]:
    calls: list[tuple[str, int, ast.expr | None]] = []
    for path in sorted(GATEWAY.rglob("*.py")):
        if path in EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
            ):
                arg = node.args[0] if node.args else None
                calls.append((str(path.relative_to(GATEWAY.parent)), node.lineno, arg))
    return calls


def _names() -> set[str]:
    calls = _get_logger_calls()
    return {a.value for _, _, a in calls if isinstance(a, ast.Constant) and isinstance(a.value, str)}


def test_every_gateway_logger_is_s3lanes_or_a_child() -> None:
    calls = _get_logger_calls()
    assert len(calls) > 5, "the scan found the gateway's loggers"
    bad = [
        f"{path}:{line}: {ast.unparse(arg) if arg is not None else '<root>'}"
        for path, line, arg in calls
        if not (
            isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and (arg.value == "s3lanes" or arg.value.startswith("s3lanes."))
        )
    ]
    assert bad == []


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_configured_handler_catches_every_gateway_logger(restore_root: None) -> None:
    names = _names()
    assert "s3lanes.seaweed" in names
    out = io.StringIO()
    configure_logging("INFO", "text", stream=out)
    for name in sorted(names):
        logging.getLogger(name).info("hello from %s", name)
    text = out.getvalue()
    for name in sorted(names):
        assert f"INFO {name}: hello from {name}" in text
