"""Where a server listens: host and port, from a URL."""

from __future__ import annotations

from dataclasses import dataclass

from yarl import URL


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        u = URL(url)
        assert u.host is not None and u.port is not None, url
        return cls(u.host, u.port)

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"
