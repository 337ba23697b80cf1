"""docs/configuration.md documents every setting declared in s3lanes.config.SETTINGS, and no other."""

from __future__ import annotations

import re
from pathlib import Path

from s3lanes.config import SETTINGS

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def documented_keys(text: str) -> dict[str, set[str]]:
    """``## [section]`` -> the keys in the first column of the tables under it (``a, b`` rows name two)."""
    out: dict[str, set[str]] = {}
    section: str | None = None
    for line in text.splitlines():
        heading = re.fullmatch(r"##+ (.*)", line)
        if heading:
            m = re.fullmatch(r"\[(\w+)\]", heading.group(1).strip())
            section = m.group(1) if m else None
            continue
        if section is None or not line.startswith("| "):
            continue
        first = line.split("|")[1].strip()
        if first in ("key", "---") or set(first) <= {"-"}:
            continue
        out.setdefault(section, set()).update(k.strip() for k in first.split(","))
    return out


def test_every_declared_setting_is_documented_and_every_documented_key_is_a_setting() -> None:
    declared: dict[str, set[str]] = {}
    for s in SETTINGS:
        declared.setdefault(s.section, set()).add(s.key)
    documented = documented_keys(DOC.read_text())
    for section in sorted(declared.keys() | documented.keys()):
        missing = declared.get(section, set()) - documented.get(section, set())
        extra = documented.get(section, set()) - declared.get(section, set())
        assert not missing, f"[{section}] settings missing in docs/configuration.md: {sorted(missing)}"
        assert not extra, f"[{section}] keys in docs/configuration.md that are no setting: {sorted(extra)}"


def test_the_table_reader_sees_a_two_key_row_and_ignores_other_headings() -> None:
    text = "## [spool]\n| key | default |\n|---|---|\n| high_water, low_water | 0.9 |\n### Sub\n| x | y |\n"
    assert documented_keys(text) == {"spool": {"high_water", "low_water"}}
