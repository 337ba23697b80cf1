"""The state machines' tables: a listed move passes, any other raises, and a table must list every state."""

from __future__ import annotations

import enum

import pytest

from s3lanes.core.transitions import IllegalTransition, Transitions


class Light(enum.Enum):
    RED = 1
    GREEN = 2
    AMBER = 3


MOVES = Transitions({Light.RED: {Light.GREEN}, Light.GREEN: [Light.AMBER], Light.AMBER: (Light.RED,)})


def test_a_listed_move_passes_and_every_other_raises_naming_what_moved() -> None:
    for old in Light:
        for new in Light:
            legal = (old, new) in {
                (Light.RED, Light.GREEN),
                (Light.GREEN, Light.AMBER),
                (Light.AMBER, Light.RED),
            }
            assert MOVES.allows(old, new) is legal
            if legal:
                MOVES.check(old, new, "light", 7)
            else:
                with pytest.raises(IllegalTransition, match=rf"^light 7: illegal transition {old.name} -> "):
                    MOVES.check(old, new, "light", 7)


def test_an_illegal_move_is_a_bug_and_names_its_enum_when_not_told_what_moved() -> None:
    with pytest.raises(AssertionError, match=r"^Light: illegal transition RED -> AMBER$"):
        MOVES.check(Light.RED, Light.AMBER)


def test_a_table_must_list_every_state_even_a_final_one() -> None:
    with pytest.raises(ValueError, match="at least one state"):
        Transitions({})
    with pytest.raises(ValueError, match=r"\['AMBER'\]"):
        Transitions({Light.RED: {Light.GREEN}, Light.GREEN: {Light.RED}})
    final = Transitions({Light.RED: {Light.AMBER}, Light.GREEN: (), Light.AMBER: ()})
    assert not any(final.allows(Light.GREEN, s) for s in Light)
