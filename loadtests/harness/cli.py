"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def bench_parser(module: str, description: str, quick: str) -> argparse.ArgumentParser:
    """The parser of ``python -m loadtests.<module>`` with the options the benchmarks share: ``--quick``
    (``quick`` says what such a run is) and ``--tmp-dir``."""
    p = argparse.ArgumentParser(prog=f"python -m loadtests.{module}", description=description)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--tmp-dir", type=Path, help="parent of the temporary state directory (default: $TMPDIR)")
    return p


def positive(text: str) -> int:
    """An argparse ``type``: a whole number above zero (sizes, counts and rounds)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def parse_sized(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p.parse_args(argv)`` for a benchmark with a ``--quick`` flag, whose sizes, counts and rounds are the
    options with a whole-number default, or a pair of them: ``default=(full run, quick run)``. Each of these
    takes a whole number above zero (:func:`positive`), and its help ends with its defaults; a value given on
    the command line wins over both."""
    quick_defaults: dict[str, int] = {}
    for action in p._actions:
        if type(action.default) is int or type(action.default) is tuple:
            full, quick = action.default if type(action.default) is tuple else (action.default,) * 2
            also = f"; quick {quick}" if quick != full else ""
            action.help = f"{action.help} (default {full}{also})"
            action.type, action.default, quick_defaults[action.dest] = positive, full, quick
    if p.parse_known_args(argv)[0].quick:
        p.set_defaults(**quick_defaults)
    return p.parse_args(argv)


def from_namespace(cls: type[T], a: argparse.Namespace, **given: Any) -> T:
    """The dataclass ``cls`` with each field from ``given`` if there, else from the parsed option of the same
    name; a field with neither keeps its default."""
    parsed = {f.name: getattr(a, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(a, f.name)}
    return cls(**(parsed | given))
