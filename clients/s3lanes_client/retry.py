"""Retry policy: which failures are retried, how long to wait, and when to give up. Pure: no I/O, no clock.

Theory of operation. botocore's own retries are switched off (one attempt, standard mode) so that exactly one
loop decides, and that loop is driven by :class:`RetryState`: the shell (``GatewayClient``,
``AsyncGatewayClient``) makes an attempt, turns a failure into a :class:`Failure`
(``s3lanes_client._failures``) and asks ``on_failure(failure, now)``. The answer is data: :class:`Retry`
(sleep ``delay_s``, then try again) or :class:`GiveUp` (raise ``RetriesExhausted``). Time comes in as ``now``
and randomness from an injected ``random.Random``, so tests pin every decision without sleeping.

The waits:

* A server that says when to come back (``503 SlowDown`` with ``Retry-After: N`` from a gateway whose write
  spool is above its high-water mark) is obeyed: the wait is ``N`` (capped at ``max_retry_after_s``) stretched
  by a random factor in ``[1, 1 + retry_after_jitter]``, so that the writers of a whole cluster, all told the
  same ``N``, do not come back in the same millisecond.
* Otherwise exponential backoff with full jitter (as botocore's standard mode and the AWS architecture blog's
  "Exponential Backoff And Jitter"): ``uniform(0, min(max_delay_s, base_delay_s * 2**(n-1)))`` after the
  ``n``-th failure.

The bound: an operation gives up after ``max_attempts`` attempts, or as soon as the next wait would end after
``total_timeout_s`` measured from the first attempt. It never sleeps past that deadline, so an operation fails
at most ``total_timeout_s`` plus one attempt's own duration (itself bounded by the connect and read timeouts)
after it started: a checkpoint save fails in bounded time, it never hangs on a full spool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How retryable failures are retried. The defaults suit checkpoint writes to a busy gateway: patient
    enough to ride out a spool that drains within a minute or two, bounded so a stuck store is reported."""

    max_attempts: int = 20
    total_timeout_s: float = 120.0
    base_delay_s: float = 0.1
    max_delay_s: float = 10.0
    # A server's Retry-After is honoured up to this many seconds (a misconfigured server cannot park us).
    max_retry_after_s: float = 30.0
    # Retry-After waits are stretched by a random factor in [1, 1 + this].
    retry_after_jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.total_timeout_s < 0:
            raise ValueError(f"total_timeout_s must not be negative, got {self.total_timeout_s}")
        if not 0 < self.base_delay_s <= self.max_delay_s:
            raise ValueError(
                f"need 0 < base_delay_s <= max_delay_s, got {self.base_delay_s} and {self.max_delay_s}"
            )
        if self.max_retry_after_s < 0 or self.retry_after_jitter < 0:
            raise ValueError("max_retry_after_s and retry_after_jitter must not be negative")

    @classmethod
    def no_retries(cls) -> RetryPolicy:
        """One attempt only: every failure is raised at once (as ``RetriesExhausted`` if it was retryable)."""
        return cls(max_attempts=1)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt as the policy sees it. ``code`` is the S3 error code (``SlowDown``) or the transport
    failure's class name (``EndpointConnectionError``); ``status`` is the HTTP status when there was one."""

    code: str
    status: int | None = None
    retry_after_s: float | None = None
    message: str = ""

    def describe(self) -> str:
        parts = [self.code]
        if self.status is not None:
            parts.append(f"(HTTP {self.status})")
        if self.retry_after_s is not None:
            parts.append(f"Retry-After {self.retry_after_s:g}s")
        if self.message:
            parts.append(f"- {self.message}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait ``delay_s`` seconds, then make attempt number ``attempt``."""

    delay_s: float
    attempt: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


@dataclass(slots=True)
class RetryState:
    """The retry bookkeeping of one operation (not shared between operations or threads)."""

    policy: RetryPolicy
    started_at: float
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0  # failed attempts so far
    failures: list[Failure] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        return self.started_at + self.policy.total_timeout_s

    def elapsed_s(self, now: float) -> float:
        return max(0.0, now - self.started_at)

    def on_failure(self, failure: Failure, now: float) -> Retry | GiveUp:
        """Record a failed attempt (made before ``now``) and decide what comes next."""
        self.attempts += 1
        self.failures.append(failure)
        p = self.policy
        if self.attempts >= p.max_attempts:
            return GiveUp(f"{self.attempts} of at most {p.max_attempts} attempts made")
        delay_s = self.delay_s(failure)
        if now + delay_s > self.deadline:
            return GiveUp(
                f"the next attempt, in {delay_s:.2f}s, would end past the total time bound of "
                f"{p.total_timeout_s:g}s"
            )
        return Retry(delay_s=delay_s, attempt=self.attempts + 1)

    def delay_s(self, failure: Failure) -> float:
        """The wait after the ``attempts``-th failure (random: call once per decision)."""
        p = self.policy
        if failure.retry_after_s is not None:
            wait = min(max(failure.retry_after_s, 0.0), p.max_retry_after_s)
            return wait * (1.0 + self.rng.uniform(0.0, p.retry_after_jitter))
        ceiling = min(p.max_delay_s, p.base_delay_s * 2.0 ** (self.attempts - 1))
        return self.rng.uniform(0.0, ceiling)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds. Only the delta-seconds form is understood (what S3 gateways send); an
    HTTP-date or garbage yields None, which falls back to backoff rather than to an error."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):  # NaN, negative, infinite
        return None
    return seconds
