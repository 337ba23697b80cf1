"""Client key pairs that change while the gateway runs: the tables every lookup uses, and the watcher of
``[server] credentials_file``.

The file is the Kubernetes Secret-as-volume pattern: the kubelet writes a new version of the Secret beside
the old one and swaps a symlink, so the path reads either the old or the new content, never a mix. The
watcher re-reads the path every :data:`POLL_S` seconds (following symlinks, in a worker thread) and applies
a changed key set at once: new keys authenticate from the next request, removed keys are refused
(InvalidAccessKeyId). A removed key's backend identity is kept for what it already wrote: its spooled writes
still drain, and their readers are still authorised as before. A file that does not parse (half-written by a
tool that does not swap atomically, or a typo) keeps the previous keys and logs a warning; the next good
version is applied.

Not a secret store: the tables live in memory only, and keys from ``[[credentials]]`` or
``S3LANES_CREDENTIALS`` never change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from s3lanes.config import Credential, read_credentials_file

log = logging.getLogger("s3lanes.credentials")

POLL_S = 2.0


class KeyTables:
    """The client keys, shared by reference (dicts updated in place) with the authenticator (``live``), the
    admin endpoints (``secrets``) and the spool (``known``: live keys and removed ones, for their writes)."""

    def __init__(self, credentials: Iterable[Credential], file_access_keys: frozenset[str]) -> None:
        creds = list(credentials)
        self._fixed = {c.access_key: c for c in creds if c.access_key not in file_access_keys}
        self._from_file = {c.access_key: c for c in creds if c.access_key in file_access_keys}
        self.live: dict[str, Credential] = {c.access_key: c for c in creds}
        self.known: dict[str, Credential] = dict(self.live)
        self.secrets: dict[str, str] = {c.access_key: c.secret_key for c in creds}

    def file_credentials(self) -> tuple[Credential, ...]:
        return tuple(self._from_file.values())

    def replace_file_keys(self, creds: Iterable[Credential]) -> tuple[list[str], list[str], list[str]]:
        """Make ``creds`` the file's keys; return (added, removed, changed) access keys. Raises ValueError
        (changing nothing) if one of them is also a fixed key or appears twice."""
        new: dict[str, Credential] = {}
        for c in creds:
            if c.access_key in self._fixed:
                raise ValueError(f"access key {c.access_key!r} is also in [[credentials]]")
            if c.access_key in new:
                raise ValueError(f"access key {c.access_key!r} appears twice")
            new[c.access_key] = c
        old = self._from_file
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        changed = sorted(k for k in set(new) & set(old) if new[k] != old[k])
        for key in removed:
            del self.live[key]
            del self.secrets[key]
        for key, c in new.items():
            self.live[key] = c
            self.known[key] = c
            self.secrets[key] = c.secret_key
        self._from_file = new
        return added, removed, changed


class CredentialsFileWatcher:
    """Re-reads ``path`` every ``poll_s`` and applies a changed key set to ``tables``. :meth:`run` never
    raises (but CancelledError): every failure is logged and the previous keys stay."""

    def __init__(self, path: Path, tables: KeyTables, *, poll_s: float = POLL_S) -> None:
        self.path = path
        self.tables = tables
        self.poll_s = poll_s
        self.reloads = 0
        self.last_error: str | None = None
        self._applied = tables.file_credentials()

    async def check(self) -> bool:
        """Read the file once; apply it if it changed. True if keys changed."""
        try:
            creds = tuple(await asyncio.to_thread(read_credentials_file, self.path))
            if creds == self._applied:
                self.last_error = None
                return False
            added, removed, changed = self.tables.replace_file_keys(creds)
        except ValueError as exc:
            if str(exc) != self.last_error:
                log.warning("credentials file %s not applied (keeping the previous keys): %s", self.path, exc)
            self.last_error = str(exc)
            return False
        self._applied = creds
        self.last_error = None
        self.reloads += 1
        log.info(
            "credentials file %s reloaded: %d keys (added %s; removed %s; changed %s)",
            self.path,
            len(creds),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
            ", ".join(changed) or "none",
        )
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.check()
