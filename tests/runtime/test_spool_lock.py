"""The spool directory's lock (s3lanes.runtime.spool_lock): one holder at a time, released with its holder.

flock locks belong to the open file description, so a second open of the lock file in this same process
conflicts exactly as another gateway's would."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from s3lanes.errors import StartupError
from s3lanes.runtime.spool_lock import LOCK_NAME, lock_spool_dir


def test_a_second_lock_on_the_same_directory_is_refused_and_names_the_holder(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    held = lock_spool_dir(root)  # creates the directory
    try:
        assert (root / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        expected = re.escape(f"spool directory {root} is in use by another gateway (pid {os.getpid()})")
        with pytest.raises(StartupError, match=expected):
            lock_spool_dir(root)
    finally:
        held.release()
    again = lock_spool_dir(root)  # released: the next holder gets it, the file stays
    again.release()
    again.release()  # idempotent
    assert (root / LOCK_NAME).exists()


def test_an_unusable_directory_is_a_startup_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StartupError, match="cannot use the spool directory"):
        lock_spool_dir(blocker / "spool")
