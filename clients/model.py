"""Plain records the clients return."""

from __future__ import annotations

from dataclasses import dataclass

from clients.retry import Failure


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a listing or a HEAD. ``etag`` keeps S3's quotes stripped."""

    key: str
    size: int
    etag: str = ""


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """Reported to a client's ``on_retry`` callback before it sleeps: ``operation`` failed with ``failure``
    and attempt number ``attempt`` follows after ``delay_s`` seconds."""

    operation: str
    attempt: int
    delay_s: float
    failure: Failure
