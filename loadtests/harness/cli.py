"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def size_picker(p: argparse.ArgumentParser, quick: bool) -> Callable[[int | None, int, int], int]:
    """``pick(value, full, quick_value)``: an option's ``value`` if given, else its default for a full run or
    for a ``--quick`` one; not positive, an error of ``p`` (it exits)."""

    def pick(value: int | None, full: int, quick_value: int) -> int:
        chosen = value if value is not None else (quick_value if quick else full)
        if chosen <= 0:
            p.error("sizes, counts and rounds must be positive")
        return chosen

    return pick
