"""Which backend serves a bucket, and under what name: the routing table of storage pools (docs/pools.md).

Pure: no I/O. ``[[routes]]`` map a client-visible bucket to a named backend and the bucket's name there;
every other bucket lives on the default backend under its own name. The gateway keeps one namespace for its
clients: ListBuckets shows each client-visible bucket once, whichever store holds it, and the names inside
answers (``<Name>`` of a listing, ``<Bucket>`` of a multipart answer, ``Location``) are the client's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

DEFAULT_BACKEND = "default"


@dataclass(frozen=True, slots=True)
class Route:
    backend: str
    bucket: str  # the client-visible name
    backend_bucket: str  # its name on the backend

    @property
    def renamed(self) -> bool:
        return self.bucket != self.backend_bucket


class RouteTable:
    def __init__(self, routes: Iterable[tuple[str, str, str]] = ()) -> None:
        """``routes``: (client bucket, backend name, backend bucket) triples, validated by the config."""
        self._by_bucket: dict[str, Route] = {}
        self._by_target: dict[tuple[str, str], Route] = {}
        for bucket, backend, backend_bucket in routes:
            route = Route(backend, bucket, backend_bucket)
            self._by_bucket[bucket] = route
            self._by_target[(backend, backend_bucket)] = route

    @property
    def empty(self) -> bool:
        return not self._by_bucket

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(self._by_bucket.values())

    def resolve(self, bucket: str) -> Route:
        """Where ``bucket`` lives: its route, or the default backend under the same name."""
        route = self._by_bucket.get(bucket)
        return route if route is not None else Route(DEFAULT_BACKEND, bucket, bucket)

    def client_name(self, backend: str, backend_bucket: str) -> str | None:
        """The client-visible name of a backend's bucket, None if clients cannot see it: a named backend
        shows only its routed buckets; the default backend hides a bucket whose name is routed elsewhere (the
        route wins) and shows a routed one under its client name."""
        route = self._by_target.get((backend, backend_bucket))
        if route is not None:
            return route.bucket
        if backend != DEFAULT_BACKEND:
            return None
        if backend_bucket in self._by_bucket:
            return None  # the client name belongs to a route (to another store or another backend bucket)
        return backend_bucket

    def merge_bucket_lists(
        self, per_backend: Mapping[str, Iterable[tuple[str, str]]]
    ) -> list[tuple[str, str]]:
        """ListBuckets across stores: (name, creation date) per backend -> the client's list, sorted by name,
        each client-visible bucket once."""
        out: dict[str, str] = {}
        for backend, buckets in per_backend.items():
            for name, created in buckets:
                client = self.client_name(backend, name)
                if client is not None and client not in out:
                    out[client] = created
        return sorted(out.items())

    def backends_to_list(self) -> list[str]:
        """The backends a ListBuckets must ask: the default one and every backend with a route."""
        return [DEFAULT_BACKEND, *sorted({r.backend for r in self._by_bucket.values()} - {DEFAULT_BACKEND})]


def split_copy_source(value: str) -> tuple[str, str]:
    """``x-amz-copy-source`` (``[/]bucket/key[?versionId=v]``, URL-encoded) -> (bucket, the rest after the
    bucket as sent, from its ``/``)."""
    body = value[1:] if value.startswith("/") else value
    bucket, sep, rest = body.partition("/")
    return unquote(bucket), sep + rest


def rename_copy_source(value: str, backend_bucket: str) -> str:
    """The same copy source with the bucket replaced by its backend name (the key part kept byte for byte)."""
    _bucket, rest = split_copy_source(value)
    return "/" + quote(backend_bucket, safe="") + rest


# Elements of S3 answers that carry the bucket's name: ListObjects(V2)/ListObjectVersions <Name>,
# Initiate/CompleteMultipartUpload, ListParts and ListMultipartUploads <Bucket>, errors <BucketName>.
_NAME_ELEMENTS = ("Name", "Bucket", "BucketName")


def rename_in_xml(body: bytes, backend_bucket: str, client_bucket: str) -> bytes:
    """Replace the backend's bucket name by the client's in an S3 XML answer: in the bucket-name elements,
    and as a path segment of ``<Location>``/``<Resource>`` URLs or paths. Keys and other text are untouched
    (a key that happens to equal the bucket name stays as it is)."""
    if backend_bucket == client_bucket or not body:
        return body
    old = _xml_escape(backend_bucket).encode()
    new = _xml_escape(client_bucket).encode()
    for element in _NAME_ELEMENTS:
        tag = element.encode()
        body = body.replace(
            b"<" + tag + b">" + old + b"</" + tag + b">", b"<" + tag + b">" + new + b"</" + tag + b">"
        )

    def fix_path(m: re.Match[bytes]) -> bytes:
        return m.group(1) + _rename_segment(m.group(2), old, new) + m.group(3)

    return re.sub(rb"(<(?:Location|Resource)>)(.*?)(</(?:Location|Resource)>)", fix_path, body, flags=re.S)


def rename_location(value: str, backend_bucket: str, client_bucket: str) -> str:
    """A ``Location`` header (``/bucket`` or a URL) with the backend bucket replaced by the client's."""
    if backend_bucket == client_bucket:
        return value
    return _rename_segment(value.encode(), backend_bucket.encode(), client_bucket.encode()).decode()


def _rename_segment(text: bytes, old: bytes, new: bytes) -> bytes:
    """``/old`` as a whole path segment (or ``//old.host`` in a virtual-hosted URL) becomes ``/new``."""
    text = re.sub(rb"(?<=/)" + re.escape(old) + rb"(?=/|$|\?)", new, text)
    return re.sub(rb"(?<=//)" + re.escape(old) + rb"(?=\.)", new, text)


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
