"""Before the write spool acknowledges a write: the bucket exists, and the writer's backend identity may
use it.

One HEAD of the bucket per (backend identity, bucket), cached for ``BUCKET_CHECK_TTL_S`` and shared by the
requests that arrive while it is on its way (four writers starting a checkpoint make one HEAD, not four). A
bucket seen before, or with spooled data, keeps absorbing writes while the store cannot be asked.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from s3lanes.clock import Clock
from s3lanes.config import Credential
from s3lanes.errors import AccessDenied, NoSuchBucket, S3Error, ServiceUnavailable
from s3lanes.runtime.spool import Spool

BUCKET_CHECK_TTL_S = 30.0


class Signed(Protocol):
    """A request as the check sees it: who signs the HEAD."""

    @property
    def credential(self) -> Credential: ...


C = TypeVar("C", bound=Signed)


class BucketCheck(Generic[C]):
    """``head(ctx, bucket)`` sends HEAD bucket as the request's backend identity and gives its status (an
    S3Error when the store cannot be reached)."""

    def __init__(self, spool: Spool, clock: Clock, head: Callable[[C, str], Awaitable[int]]) -> None:
        self.spool = spool
        self._clock = clock
        self._head = head
        # (backend identity, bucket) -> monotonic time until which the bucket is known to be there for it
        self._bucket_ok: dict[tuple[str, str], float] = {}
        self._bucket_checks: dict[tuple[str, str], asyncio.Future[None]] = {}  # HEADs on their way

    def remember(self, backend_access_key: str, bucket: str) -> None:
        """A bucket known to be there (checked when its spooled data was acknowledged, before a restart)."""
        self._bucket_ok.setdefault((backend_access_key, bucket), 0.0)

    async def check(self, ctx: C, bucket: str) -> None:
        """The bucket exists and this identity may use it (HEAD bucket, cached); required before an ack.
        Requests arriving while a check of the same (identity, bucket) is on its way share it."""
        ident = (ctx.credential.backend_access_key, bucket)
        until = self._bucket_ok.get(ident)
        if until is not None and until > self._clock.monotonic():
            return
        check = self._bucket_checks.get(ident)
        if check is None:
            check = asyncio.ensure_future(self._head_bucket(ctx, bucket, ident))
            self._bucket_checks[ident] = check
            check.add_done_callback(functools.partial(self._bucket_check_done, ident))
        await asyncio.shield(check)

    def _bucket_check_done(self, ident: tuple[str, str], task: asyncio.Future[None]) -> None:
        self._bucket_checks.pop(ident, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter got it, or none is left to

    async def _head_bucket(self, ctx: C, bucket: str, ident: tuple[str, str]) -> None:
        until = self._bucket_ok.get(ident)
        try:
            status = await self._head(ctx, bucket)
        except S3Error:
            # The backend is unreachable. A bucket seen before (or with spooled data) keeps absorbing
            # writes: that is what the spool is for. One never seen cannot be checked: refuse it promptly.
            if until is not None or self.spool.has_bucket_prefix(bucket, ""):
                return
            raise
        if status == 200:
            self._bucket_ok[ident] = self._clock.monotonic() + BUCKET_CHECK_TTL_S
            return
        if status == 404:
            raise NoSuchBucket(BucketName=bucket)
        if status == 403:
            raise AccessDenied()
        if until is not None or self.spool.has_bucket_prefix(bucket, ""):
            return
        raise ServiceUnavailable(f"The backend answered {status} to a bucket check.")
