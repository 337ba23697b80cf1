"""The one durable-write recipe (s3lanes.durable) on a real directory: a failed replace leaves the old
file and no temporary file; the new file gets its mode even where it existed; append writes every byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from s3lanes import durable


def test_replace_file_writes_the_new_bytes_with_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    path.chmod(0o644)
    durable.replace_file(path, b"new" * 1000)
    assert path.read_bytes() == b"new" * 1000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_failed_replace_leaves_the_old_file_and_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        durable.replace_file(path, b"new", tmp=tmp_path / "f.tmp")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_replace_file_syncs_the_file_and_its_directory_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bool] = []
    real = os.fsync

    def watched(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", watched)
    durable.replace_file(tmp_path / "a", b"x")
    assert synced == [False, True]  # the file, then the directory
    synced.clear()
    durable.replace_file(tmp_path / "b", b"x", sync_dir=False)
    assert synced == [False]
    synced.clear()
    durable.replace_file(tmp_path / "c", b"x", sync=False)
    assert synced == []


def test_append_writes_every_byte_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(b"head")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        durable.append(fd, b"a" * 3_000_000)
        durable.append(fd, memoryview(b"tail"))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + b"a" * 3_000_000 + b"tail"
