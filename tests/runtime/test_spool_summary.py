"""The spool summary the owner of the spool publishes to the other workers (s3lanes.runtime.spool_summary)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from s3lanes.http.forward import make_socket_dir, owner_address
from s3lanes.runtime.spool_summary import SummaryReader, SummaryWriter, create_summary


def test_every_bucket_counts_as_spooled_until_the_owner_publishes(tmp_path: Path) -> None:
    path = tmp_path / "summary"
    create_summary(path)
    reader = SummaryReader(path)
    assert not reader.published() and reader.may_hold("any")
    writer = SummaryWriter(path, lambda: ["ckpt"])
    assert writer.refresh() == 1
    assert reader.published()
    assert reader.may_hold("ckpt") and not reader.may_hold("datasets")


def test_a_write_marks_its_bucket_before_the_spool_has_it_and_a_refresh_clears_it_once_drained(
    tmp_path: Path,
) -> None:
    path = tmp_path / "summary"
    create_summary(path)
    spooled: list[str] = []
    writer = SummaryWriter(path, lambda: list(spooled))
    reader = SummaryReader(path)
    writer.refresh()
    with writer.hold("b"):
        assert reader.may_hold("b")  # before the spool's state has anything of b
        writer.refresh()  # a refresh meanwhile keeps it: the write is in flight
        assert reader.may_hold("b")
        spooled.append("b")  # the write spooled; its answer leaves after this
    writer.refresh()
    assert reader.may_hold("b")
    spooled.clear()  # drained
    writer.refresh()
    assert not reader.may_hold("b")


def test_a_restarted_owner_keeps_the_previous_marks_until_it_has_recovered(tmp_path: Path) -> None:
    path = tmp_path / "summary"
    create_summary(path)
    first = SummaryWriter(path, lambda: [])
    first.refresh()
    with first.hold("b"):
        pass  # the owner dies here, before a refresh
    reader = SummaryReader(path)
    assert reader.may_hold("b")
    second = SummaryWriter(path, lambda: [])  # recovery found nothing of b
    assert reader.may_hold("b")
    second.refresh()
    assert not reader.may_hold("b")


def test_the_socket_directory_is_private_and_a_dead_supervisors_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"s3lanes-{os.getuid()}-999999999"
    stale.mkdir()
    (stale / "spool.sock").write_bytes(b"")
    path = make_socket_dir(os.getpid())
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert owner_address(os.getpid()) == os.path.join(path, "spool.sock")
    assert not stale.exists()
    assert make_socket_dir(os.getpid()) == path  # ours, private: reused
    os.chmod(path, 0o755)
    with pytest.raises(OSError):
        make_socket_dir(os.getpid())
