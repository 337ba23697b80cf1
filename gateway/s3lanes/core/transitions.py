"""The legal moves of the cores' state machines: each machine declares one table of them, and every move is
checked against it. Pure.

The machines: aws-chunked decoding (:mod:`s3lanes.core.chunked`), a scheduler ticket
(:mod:`s3lanes.core.scheduler`), a node's cluster lease (:mod:`s3lanes.core.cluster_budget`) and a spool
entry (:mod:`s3lanes.core.spool_state`). A move the table does not allow is a bug in the module that made
it, never a reaction to input: it raises :class:`IllegalTransition`, an ``AssertionError``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(AssertionError):
    """A move its machine's table does not allow."""


class Transitions(Generic[S]):
    """One machine's table: for each state, the states it may move to (none: a final state). Every state of
    the enum must be listed, so that a state added later is not left without its moves by mistake."""

    __slots__ = ("_moves",)

    def __init__(self, moves: Mapping[S, Iterable[S]]) -> None:
        self._moves = {state: frozenset(targets) for state, targets in moves.items()}
        if not self._moves:
            raise ValueError("a table needs at least one state")
        states = set(type(next(iter(self._moves))))
        unlisted = states - self._moves.keys()
        if unlisted:
            raise ValueError(f"states without their moves: {sorted(s.name for s in unlisted)}")

    def allows(self, old: S, new: S) -> bool:
        return new in self._moves[old]

    def check(self, old: S, new: S, *about: object) -> None:
        """Raise :class:`IllegalTransition` unless ``old`` may move to ``new``; ``about`` names what moves
        (joined with spaces into the message)."""
        if new not in self._moves[old]:
            what = " ".join(map(str, about)) or type(old).__name__
            raise IllegalTransition(f"{what}: illegal transition {old.name} -> {new.name}")
