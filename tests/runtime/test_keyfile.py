"""Client keys that change while the gateway runs (s3lanes/runtime/keyfile.py): the shared tables and the
watcher's handling of a rotated, a broken and an unchanged file."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3lanes.config import Credential
from s3lanes.runtime.keyfile import CredentialsFileWatcher, KeyTables

FIXED = Credential("FIXED", "fixed-secret", "FIXED", "fixed-secret")


def cred(ak: str, sk: str = "s") -> Credential:
    return Credential(ak, sk, ak, sk)


def test_removed_keys_stop_authenticating_but_stay_known_for_their_writes() -> None:
    tables = KeyTables([FIXED, cred("A")], frozenset({"A"}))
    live, known, secrets = tables.live, tables.known, tables.secrets  # consumers hold these references
    added, removed, changed = tables.replace_file_keys([cred("B"), cred("A", "new")])
    assert (added, removed, changed) == (["B"], [], ["A"])
    assert secrets["A"] == "new"
    assert tables.replace_file_keys([cred("B")]) == ([], ["A"], [])
    assert set(live) == {"FIXED", "B"} and set(secrets) == {"FIXED", "B"}
    assert set(known) == {"FIXED", "A", "B"}
    with pytest.raises(ValueError, match="also in"):
        tables.replace_file_keys([cred("FIXED")])
    assert set(live) == {"FIXED", "B"}  # a refused update changes nothing


async def test_the_watcher_applies_a_swapped_symlink_and_keeps_the_keys_through_a_broken_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "v1").write_text("A:sa\n")
    link = tmp_path / "credentials"
    link.symlink_to("v1")
    tables = KeyTables([FIXED, cred("A", "sa")], frozenset({"A"}))
    watcher = CredentialsFileWatcher(link, tables)
    assert await watcher.check() is False  # unchanged
    (tmp_path / "v2").write_text("B:sb\n")
    (tmp_path / "tmp").symlink_to("v2")
    (tmp_path / "tmp").replace(link)
    assert await watcher.check() is True
    assert set(tables.live) == {"FIXED", "B"}
    (tmp_path / "v2").write_text("B-without-secret\n")
    assert await watcher.check() is False
    assert watcher.last_error is not None and "expected access_key:secret_key" in watcher.last_error
    assert set(tables.live) == {"FIXED", "B"} and watcher.reloads == 1
