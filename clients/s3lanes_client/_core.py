"""What :class:`~s3lanes_client.sync.GatewayClient` and :class:`~s3lanes_client.aio.AsyncGatewayClient` share:
everything but their I/O. No sockets, no sleeping, no clock of its own.

Theory of operation. The two clients are thin shells over the same decisions, taken here: the parameters of
each request (lane hints, the ``Range`` header, a listing page), the reading of its answer (a HEAD, a listing
page), whether a failed attempt is retried and after how long (:class:`Attempts`), and where a
``wait_durable`` stands after each answer of the flush API (:class:`FlushWait`). A shell makes the call,
reads its clock and sleeps, one with blocking calls, the other with ``await``; what it does next is decided
here from the answer and ``now``, so both clients behave alike by construction and tests drive the decisions
in virtual time.

This is not :mod:`s3lanes_client.model`: that leaf holds the records every module shares (errors and
durability import it), while this module sits above errors, durability and retry, which it combines.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import botocore.handlers
from botocore.exceptions import ClientError

from s3lanes_client._failures import failure_from_exception
from s3lanes_client.config import ClientConfig
from s3lanes_client.durability import FlushOutcome, Transient, poll_timeout_s
from s3lanes_client.errors import NotDurableError, RetriesExhausted
from s3lanes_client.hints import LANE_PARAM, WRITE_THROUGH_PARAM, HintHooks, check_lane
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.retry import Failure, GiveUp, RetryPolicy, RetryState

# -- requests and answers ------------------------------------------------------------------------------------


def range_header(start: int | None, end: int | None) -> str | None:
    """The ``Range`` header for bytes ``[start, end)`` (``end`` exclusive, None = to the end)."""
    if start is None and end is None:
        return None
    first = start or 0
    if end is None:
        return f"bytes={first}-"
    if end <= first:
        raise ValueError(f"empty or negative range [{first}, {end})")
    return f"bytes={first}-{end - 1}"


def hint_params(lane: Any, write_through: bool) -> dict[str, Any]:
    """The extra API parameters the hint hooks turn into headers (``lane=UNSET``: the client default)."""
    params: dict[str, Any] = {}
    if lane is not UNSET:
        params[LANE_PARAM] = check_lane(lane) or ""
    if write_through:
        params[WRITE_THROUGH_PARAM] = True
    return params


@dataclass(frozen=True, slots=True)
class Call:
    """One operation as a shell sends it: the boto3 parameters (hints included), the retry policy (None: the
    client's) and what to do before each retry (rewind the body)."""

    params: dict[str, Any]
    policy: RetryPolicy | None
    before_retry: Callable[[], None] | None = None


def plan_call(params: dict[str, Any], *, lane: Any, write_through: bool, policy: RetryPolicy | None) -> Call:
    """``params`` with the hints added. A file-like ``Body`` is rewound to where it stood before each retry;
    one that cannot seek gets a single attempt (a retry would send what is left of it)."""
    params = {**params, **hint_params(lane, write_through)}
    body = params.get("Body")
    if body is None or not hasattr(body, "read"):
        return Call(params, policy)
    if not _seekable(body):
        return Call(params, RetryPolicy.no_retries())
    position = body.tell()
    return Call(params, policy, lambda: body.seek(position))


def get_params(
    bucket: str, key: str, *, start: int | None, end: int | None, lane: Any
) -> dict[str, Any] | None:
    """The GetObject parameters for bytes ``[start, end)``; None when the range is empty (nothing to ask)."""
    if start is not None and end is not None and end == start:
        return None
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, **hint_params(lane, False)}
    rng = range_header(start, end)
    if rng is not None:
        params["Range"] = rng
    return params


def is_not_found(exc: ClientError) -> bool:
    """A HEAD's "no such object" (a HEAD answer has no body, so only its status tells)."""
    return bool(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404)


def head_info(key: str, response: dict[str, Any]) -> ObjectInfo:
    """A HeadObject answer as an :class:`ObjectInfo`."""
    return ObjectInfo(key=key, size=int(response["ContentLength"]), etag=_etag(response))


class Listing:
    """The pages of one ListObjectsV2 walk: :meth:`next_params` for the next request (None: done), and
    :meth:`objects` to read each answer (which also notes where the next page starts, if one does)."""

    def __init__(self, bucket: str, prefix: str, page_size: int) -> None:
        self._params: dict[str, Any] | None = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}

    def next_params(self) -> dict[str, Any] | None:
        return None if self._params is None else dict(self._params)

    def objects(self, page: dict[str, Any]) -> list[ObjectInfo]:
        token = page.get("NextContinuationToken")
        if self._params is not None:
            if page.get("IsTruncated") and token:
                self._params["ContinuationToken"] = token
            else:
                self._params = None
        contents = page.get("Contents", [])
        return [ObjectInfo(key=obj["Key"], size=int(obj["Size"]), etag=_etag(obj)) for obj in contents]


# -- retries -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``delay_s`` seconds, then go on. ``retry`` is set when what follows retries a failed attempt (the
    client counts it and reports it to its ``on_retry`` callback first)."""

    delay_s: float
    retry: RetryEvent | None = None


class Attempts:
    """The retries of one operation: each failure in, the :class:`Pause` before the next attempt out, or the
    exception that ends the operation."""

    def __init__(self, what: str, policy: RetryPolicy, *, now: float, rng: random.Random) -> None:
        self.what = what
        self._state = RetryState(policy, started_at=now, rng=rng)

    def failed(self, exc: Exception, now: float) -> Pause:
        """After an attempt raised ``exc``: raises ``exc`` itself when no retry can fix it."""
        failure = failure_from_exception(exc)
        if failure is None:
            raise exc
        return self.retry(failure, now, cause=exc)

    def retry(self, failure: Failure, now: float, *, cause: BaseException | None = None) -> Pause:
        """After a retryable failure; :class:`RetriesExhausted` (``cause`` chained) once the policy gives
        up."""
        decision = self._state.on_failure(failure, now)
        if isinstance(decision, GiveUp):
            raise RetriesExhausted(
                self.what,
                attempts=self._state.attempts,
                elapsed_s=self._state.elapsed_s(now),
                last_failure=failure,
                reason=decision.reason,
            ) from cause
        return Pause(decision.delay_s, RetryEvent(self.what, decision.attempt, decision.delay_s, failure))


# -- wait_durable --------------------------------------------------------------------------------------------


class FlushWait:
    """One ``wait_durable``: the ``timeout`` of each flush request, and after each answer (or failure to get
    one) the :class:`Pause` before the next, until :attr:`status` is set: the final answer. At the deadline
    :class:`NotDurableError` when ``raise_on_timeout``, else the last answer (``durable=False``). Failures of
    the request itself are retried with the client's backoff, within the same ``timeout_s``. Without a
    gateway endpoint (AWS S3 itself: nothing stands between us and the store) it is done at once."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        timeout_s: float,
        *,
        gateway: bool,
        policy: RetryPolicy,
        now: float,
        rng: random.Random,
        raise_on_timeout: bool,
    ) -> None:
        self.status: DurabilityStatus | None = None
        if not gateway:
            self.status = DurabilityStatus(durable=True, bucket=bucket, prefix=prefix, gateway=False)
        self._started = now
        self._deadline = now + timeout_s
        self._raise_on_timeout = raise_on_timeout
        self._attempts = Attempts(
            f"flush s3://{bucket}/{prefix}", replace(policy, total_timeout_s=timeout_s), now=now, rng=rng
        )
        self._wait_s = 0

    def request_timeout_s(self, now: float) -> int:
        """The ``timeout`` of the request about to be sent (whole seconds, 0: answer at once)."""
        self._wait_s = poll_timeout_s(self._deadline - now)
        return self._wait_s

    def failed(self, exc: Exception, now: float) -> Pause:
        """The request raised ``exc`` (raised again when no retry can fix it)."""
        return self._attempts.failed(exc, now)

    def answered(self, outcome: FlushOutcome, now: float) -> Pause:
        """The flush API's answer, as :func:`s3lanes_client.durability.interpret` read it."""
        if isinstance(outcome, Transient):
            return self._attempts.retry(outcome.failure, now)
        if isinstance(outcome, DurabilityStatus):
            self.status = replace(outcome, waited_s=now - self._started)
            return Pause(0.0)
        remaining_s = self._deadline - now
        if remaining_s <= 0 or (self._wait_s == 0 and remaining_s < 0.05):
            self.status = replace(outcome.status, waited_s=now - self._started)
            if self._raise_on_timeout:
                raise NotDurableError(self.status)
            return Pause(0.0)
        # Under a second left, the gateway answered at once: do not spin.
        return Pause(min(0.25, remaining_s) if self._wait_s == 0 else 0.0)


# -- the clients' common state -------------------------------------------------------------------------------


class ClientCore:
    """What both clients hold besides their connections: the config, the injected clock and random source,
    the retry callback and the count of retries made (all operations, for metrics and tests)."""

    def __init__(
        self,
        config: ClientConfig | None,
        on_retry: Callable[[RetryEvent], None] | None,
        clock: Callable[[], float],
        rng: random.Random | None,
    ) -> None:
        self.config = config if config is not None else ClientConfig.from_env()
        self._on_retry = on_retry
        self._clock = clock
        self._rng = rng or random.Random()
        self.retries = 0

    def _s3_client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``session.client("s3", ...)`` (boto3 and aioboto3 alike)."""
        return {
            "endpoint_url": self.config.endpoint_url,
            "config": self.config.botocore_config(),
            "verify": self.config.verify,
        }

    def _install_hooks(self, events: Any) -> None:
        """Set up a new S3 client's event hooks: lane hints, and no ``Expect: 100-continue`` when the config
        turns it off."""
        HintHooks(self.config.lane).register(events)
        if not self.config.expect_100_continue:
            events.unregister("before-call.s3", botocore.handlers.add_expect_header)

    def _attempts(self, what: str, policy: RetryPolicy | None = None) -> Attempts:
        return Attempts(what, policy or self.config.retry, now=self._clock(), rng=self._rng)

    def _flush_wait(self, bucket: str, prefix: str, timeout_s: float, raise_on_timeout: bool) -> FlushWait:
        return FlushWait(
            bucket,
            prefix,
            timeout_s,
            gateway=self.config.endpoint_url is not None,
            policy=self.config.retry,
            now=self._clock(),
            rng=self._rng,
            raise_on_timeout=raise_on_timeout,
        )

    def _delay_s(self, pause: Pause) -> float:
        """Count and report ``pause``'s retry, if it is one; the seconds to sleep."""
        if pause.retry is not None:
            self.retries += 1
            if self._on_retry is not None:
                self._on_retry(pause.retry)
        return pause.delay_s


def _etag(response: dict[str, Any]) -> str:
    return str(response.get("ETag", "")).strip('"')


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable()) if hasattr(stream, "seekable") else isinstance(stream, io.IOBase)
    except (OSError, ValueError):
        return False
