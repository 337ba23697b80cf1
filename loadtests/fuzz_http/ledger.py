"""The ledger: what valid requests completely wrote, deleted, or left with no certain outcome."""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------------------
# The ledger: what valid requests completely wrote


@dataclass(frozen=True, slots=True)
class Stored:
    md5: str
    etag: str  # without quotes
    size: int
    case: int


@dataclass(slots=True)
class Ledger:
    objects: dict[str, Stored] = field(default_factory=dict)
    # Keys whose last write has no certain outcome (no answer): any of these MD5s, or None for absent.
    uncertain: dict[str, set[str | None]] = field(default_factory=dict)
    # Backend multipart uploads a case left open on purpose: (key, upload id).
    open_uploads: set[tuple[str, str]] = field(default_factory=set)
    # Objects acknowledged under keys a store may normalise (dot segments, empty segments): by MD5.
    odd_by_md5: dict[str, str] = field(default_factory=dict)
    # Every key ever written that ends in "/": SeaweedFS stores PUT "a/b/" with data as "a/b/b" (or, for a
    # few bytes, as an empty directory marker "a/b/"), whatever the gateway does (see check_backend).
    trailing_slash: set[str] = field(default_factory=set)
    # Key prefixes of cases a crash cut short: an upload they created may never have reached them.
    crash_cut_prefixes: set[str] = field(default_factory=set)

    def put(self, key: str, body_md5: str, etag: str, size: int, case: int) -> None:
        self.objects[key] = Stored(body_md5, etag, size, case)
        if key.endswith("/"):
            self.trailing_slash.add(key)
        self.uncertain.pop(key, None)
        if odd_key(key):
            self.odd_by_md5[body_md5] = key

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)
        self.uncertain.pop(key, None)

    def maybe(self, key: str, body_md5: str | None) -> None:
        """A write whose outcome is unknown: the key may hold the old object or the new one."""
        options = self.uncertain.setdefault(key, set())
        old = self.objects.get(key)
        options.add(old.md5 if old is not None else None)
        options.add(body_md5)


def odd_key(key: str) -> bool:
    segments = key.replace("\\", "/").split("/")
    return key.startswith("/") or any(seg in ("", ".", "..") for seg in segments)
