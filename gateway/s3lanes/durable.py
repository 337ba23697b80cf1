"""The one recipe for writing files that must survive a crash, used by everything that persists state.

Two shapes, and only these:

* **replace a whole file** (:func:`replace_file`): write a temporary file next to it, ``fsync`` it, rename
  it over the old one, ``fsync`` the directory. A crash at any point leaves the old file or the new one,
  never a mix, and once the call returns the new one is on disk (its data by the file ``fsync``, its name by
  the directory's). Used for journal compaction, the spool's journal rewrite when it heals, the embedded
  store's credentials and its S3 configuration.
* **append to a file** (:func:`append`): write all the bytes at the end, then ``fdatasync``. The journal's
  group commit; the caller decides what a failure means (the spool truncates back and stops acknowledging).

Files whose *creation* must be durable (the spool's data files) are ``fsync``ed themselves and their
directory is ``fsync``ed before anything refers to them (:func:`fsync_dir`, once per journal batch).

Blocking: call these from an I/O thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["append", "fsync_close", "fsync_dir", "replace_file", "write_all"]


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until every byte is written (a write may be short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    tmp: Path | None = None,
    sync: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replace ``path`` with ``data`` atomically: tmp, fsync, rename, fsync the directory.

    ``tmp``: the temporary file (default ``.<name>.tmp.<pid>`` beside ``path``; it must be on the same
    filesystem). ``mode`` is set with ``fchmod`` too, since ``O_CREAT``'s mode is masked by the umask and
    ignored for a file that exists. ``sync=False`` (a file that only matters while the machine stays up, a
    pid file) skips both fsyncs; ``sync_dir=False`` skips the directory's (a file regenerated at every start).
    On any failure the temporary file is removed and ``path`` is left as it was.
    """
    tmp = tmp if tmp is not None else path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync and sync_dir:
        fsync_dir(path.parent)


def append(fd: int, data: bytes | memoryview) -> None:
    """Append ``data`` to ``fd`` (opened with ``O_APPEND``) and ``fdatasync`` it."""
    write_all(fd, data)
    os.fdatasync(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_close(fd: int) -> None:
    """``fsync`` then close ``fd`` (closed even when the fsync fails)."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
