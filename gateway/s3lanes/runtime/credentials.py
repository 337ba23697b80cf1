"""A backend's own identity from the standard AWS credential chain, current at every signature.

botocore resolves the chain (``botocore.session.Session.get_credentials``: environment, shared config and
credentials files with their profiles, assume-role and SSO profiles, web identity / IRSA, container
credentials, instance metadata) and refreshes temporary credentials before they expire
(``RefreshableCredentials``). This module is not a credential provider of its own: it only runs botocore's
at the right moments, off the event loop.

Why a background task: botocore's refresh blocks (an HTTP call to a metadata endpoint or to STS), and the
signer must not wait on the loop. So a task asks botocore for a frozen snapshot in a worker thread, well
before the current one expires (half the remaining lifetime, at least every minute), and every request is
signed with the latest snapshot (:meth:`ChainCredentials.current`: key, secret and session token taken
together, never mixed across a rotation). A failed refresh keeps the previous snapshot, logs, and tries
again a few seconds later; the store answers a request signed with expired credentials with its own 403,
which the drainer retries like any other.

Not for the embedded store (it knows only the ``[[credentials]]`` keys) and not for clients (their keys are
the gateway's own, ``[[credentials]]``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from s3lanes.errors import StartupError
from s3lanes.runtime.tasks import cancel_and_wait

log = logging.getLogger("s3lanes.credentials")

# Bounds of the wait between two refresh checks: at most a minute (a credential is never older than botocore
# would let it become), at least a second (short-lived credentials do not turn into a busy loop).
REFRESH_MAX_INTERVAL_S = 60.0
REFRESH_MIN_INTERVAL_S = 1.0
# Wait after a failed refresh before the next attempt.
REFRESH_RETRY_S = 5.0


class SigningIdentity(NamedTuple):
    """One frozen snapshot of a key pair and its session token (``None`` or ``""``: none)."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # never print secrets
        return f"SigningIdentity(access_key={self.access_key!r}, token={'yes' if self.token else 'no'})"


class ChainCredentials:
    """The AWS credential chain for one backend. :meth:`start` resolves it once (a clear error if it finds
    nothing) and keeps the snapshot fresh until :meth:`close`. Lives on the gateway's event loop."""

    def __init__(
        self, backend_name: str, profile: str | None = None, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.backend_name = backend_name
        self._wall = wall  # the Clock's wall time: expiries are wall-clock instants
        self.profile = profile
        self._creds: Any = None  # botocore Credentials or RefreshableCredentials
        self._snapshot: SigningIdentity | None = None
        self.method: str | None = None  # botocore's name of the provider that answered ("env", "iam-role"...)
        self.refreshes = 0  # snapshots taken (the first included)
        self.refresh_failures = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def current(self) -> SigningIdentity:
        """The snapshot to sign with, now (no I/O, never waits)."""
        assert self._snapshot is not None, "ChainCredentials.start() was not awaited"
        return self._snapshot

    @property
    def expires_at(self) -> float | None:
        """Wall time the current credentials expire, or None for credentials that do not (static keys)."""
        expiry = getattr(self._creds, "_expiry_time", None)  # botocore keeps it there, as a datetime
        return float(expiry.timestamp()) if expiry is not None else None

    async def start(self) -> None:
        """Resolve the chain and take the first snapshot (StartupError if that fails), then keep it fresh
        in a background task until :meth:`close`."""
        await self._first_snapshot()
        self._task = asyncio.create_task(self.run(), name=f"credentials-{self.backend_name}")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _first_snapshot(self) -> None:
        where = f"[backend{'s.' + self.backend_name if self.backend_name != 'default' else ''}]"
        try:
            self._creds = await asyncio.to_thread(self._resolve)
        except Exception as exc:
            raise StartupError(
                f"{where} credential_source = 'aws': the AWS credential chain failed: {_one_line(exc)}"
            ) from None
        if self._creds is None:
            raise StartupError(
                f"{where} credential_source = 'aws': no AWS credentials found (environment, shared config"
                f"{' profile ' + repr(self.profile) if self.profile else ''}, web identity, container or"
                " instance metadata)"
            )
        self.method = str(getattr(self._creds, "method", None) or "unknown")
        try:
            await self._refresh()
        except Exception as exc:
            raise StartupError(
                f"{where} credential_source = 'aws': reading credentials from {self.method} failed:"
                f" {_one_line(exc)}"
            ) from None
        log.info(
            "backend %s: credentials from the AWS chain (%s, access key %s%s)",
            self.backend_name,
            self.method,
            self.current().access_key,
            "" if self.expires_at is None else f", expiring in {self.expires_at - self._wall():.0f} s",
        )

    def _resolve(self) -> Any:
        import botocore.session  # the chain's providers; imported here, only backends that use it pay

        return botocore.session.Session(profile=self.profile).get_credentials()

    async def _refresh(self) -> None:
        frozen = await asyncio.to_thread(self._creds.get_frozen_credentials)
        snapshot = SigningIdentity(frozen.access_key, frozen.secret_key, frozen.token or None)
        if self._snapshot is not None and snapshot.access_key != self._snapshot.access_key:
            log.info(
                "backend %s: credentials rotated to access key %s", self.backend_name, snapshot.access_key
            )
        self._snapshot = snapshot
        self.refreshes += 1

    def next_check_in(self, now_wall: float) -> float | None:
        """Seconds until the next refresh check (None: these credentials never expire)."""
        expires = self.expires_at
        if expires is None:
            return None
        half = (expires - now_wall) / 2
        return min(REFRESH_MAX_INTERVAL_S, max(REFRESH_MIN_INTERVAL_S, half))

    async def run(self) -> None:
        """Refresh before expiry until cancelled. Never raises otherwise: a failure is logged and retried."""
        while True:
            wait_s = self.next_check_in(self._wall())
            if wait_s is None:
                return
            await asyncio.sleep(wait_s)
            try:
                await self._refresh()
                self.last_error = None
            except Exception as exc:
                self.refresh_failures += 1
                self.last_error = _one_line(exc)
                log.warning(
                    "backend %s: refreshing credentials from %s failed (%s); keeping the current ones,"
                    " retrying in %.0f s",
                    self.backend_name,
                    self.method,
                    self.last_error,
                    REFRESH_RETRY_S,
                )
                await asyncio.sleep(REFRESH_RETRY_S)

    def status(self) -> dict[str, object]:
        """For the status page: where the identity comes from, which key, until when (never the secret)."""
        snap = self._snapshot
        return {
            "source": "aws",
            "method": self.method,
            "profile": self.profile,
            "access_key": snap.access_key if snap is not None else None,
            "session_token": bool(snap and snap.token),
            "expires_at": self.expires_at,
            "refreshes": self.refreshes,
            "refresh_failures": self.refresh_failures,
            "last_error": self.last_error,
        }


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
