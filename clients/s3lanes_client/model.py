"""Plain records the clients return, and what a stream needs of its client. A leaf: the modules that share
these types (errors, durability, the streams, the clients) import it, never the other way round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from s3lanes_client.retry import Failure, RetryPolicy

# "No per-call lane given": the client's default lane applies (None or "" means: send no lane hint).
UNSET: Any = object()


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


@dataclass(frozen=True, slots=True)
class DurabilityStatus:
    """What the gateway reported. ``gateway`` is False against plain S3 (``durable`` is then True: a store
    that acknowledged a write has it)."""

    durable: bool
    bucket: str
    prefix: str
    gateway: bool = True
    pending_objects: int = 0
    pending_bytes: int = 0
    oldest_pending_age_s: float | None = None
    waited_s: float = 0.0


class ObjectClient(Protocol):
    """What :class:`s3lanes_client.multipart.MultipartWriter` and :class:`s3lanes_client.reader.ObjectReader`
    need of their client (:class:`s3lanes_client.sync.GatewayClient` is one): a retried boto3 call, a HEAD and
    a ranged GET."""

    def call(
        self,
        operation: str,
        /,
        *,
        lane: str | None = UNSET,
        write_through: bool = False,
        policy: RetryPolicy | None = None,
        **params: Any,
    ) -> dict[str, Any]: ...

    def head(self, bucket: str, key: str, *, lane: str | None = UNSET) -> ObjectInfo | None: ...

    def get_bytes(
        self,
        bucket: str,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        lane: str | None = UNSET,
    ) -> bytes: ...
