"""The spool's write failures: what a client is answered (503) when a write could not be made durable."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Any

from s3lanes.errors import ServiceUnavailable

log = logging.getLogger("s3lanes.spool")


class SpoolWriteFailed(ServiceUnavailable):
    """The spool could not make a write durable (disk full, I/O error): nothing was acknowledged."""

    default_message = "The gateway could not store the upload on its local spool. Please retry."


class JournalAppendFailed(SpoolWriteFailed):
    """The journal append of the write's record failed. The record may or may not be in the journal file
    (the gateway truncates it back when it can), so the write's data file must be kept: if the record did
    survive, recovery needs the data; if not, recovery removes the file as an orphan. Either outcome is one
    S3 allows for a request answered 503."""


def write_failed(exc: OSError) -> SpoolWriteFailed:
    if exc.errno == errno.ENOSPC:
        log.error("spool: disk full while writing an upload: %s", exc)
        return SpoolWriteFailed("The gateway's spool disk is full. Please retry.")
    log.error("spool: write failed: %s", exc)
    return SpoolWriteFailed()


def crash_on_failure(task: asyncio.Task[Any]) -> None:
    """A background task that dies takes the process down loudly: a journal committer or a
    drainer that silently stopped would leave writers waiting forever."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.critical("background task %s died: %r; exiting", task.get_name(), exc, exc_info=exc)
        os._exit(70)
