"""One gateway per spool directory: an exclusive ``flock`` on ``<spool dir>/lock``, held for its life.

Two gateways appending to one journal would corrupt it, and each would drain (and delete) the other's data
files. The lock is taken before anything reads the spool (before the embedded store starts and before journal
replay), so a second gateway on the same directory is refused with one line and touches nothing.

``flock`` locks belong to the open file description: the kernel releases the lock when the process exits,
however it exits (``kill -9`` included), so a crashed gateway never leaves a stale lock behind, and the file
itself stays (it is not a pid file; its content is informative only). The descriptor is opened
non-inheritable (Python's default), so the embedded SeaweedFS child does not keep the lock alive after the
gateway dies. ``flock`` is advisory and local: on a network filesystem (NFS) it may not exclude a gateway on
another host; the spool belongs on local disk anyway (docs/spool.md).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from s3lanes.errors import StartupError

LOCK_NAME = "lock"


class SpoolDirLock:
    """The held lock on one spool directory; :meth:`release` (or process exit) gives it up."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor of the open file drops the flock


def lock_spool_dir(root: Path) -> SpoolDirLock:
    """Take the spool directory's lock, creating the directory if needed, or raise :class:`StartupError`
    naming the directory and, when it can be read, the pid of the gateway that holds it. Blocking file I/O:
    call it before the event loop serves anything."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        path = root / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StartupError(
            f"cannot use the spool directory {root}: {(exc.strerror or str(exc)).lower()}; "
            "choose another with [spool] dir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise StartupError(
            f"the spool directory {root} is in use by another gateway{holder}; "
            "two gateways cannot share a spool: stop the other one, or give this one another [spool] dir"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise StartupError(
            f"cannot lock the spool directory {root}: {(exc.strerror or str(exc)).lower()}"
        ) from None
    # Informative only (who holds it): the lock is the flock, not this content.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return SpoolDirLock(path, fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""
