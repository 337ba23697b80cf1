"""The differential S3 conformance harness: run one scenario against a target, normalize what it saw.

A scenario (``scenarios.py``) is a function of a :class:`Target`: it makes calls through ``t.call`` (boto3)
or ``t.raw`` (a signed request sent byte for byte, for what boto3 cannot send), each of which records one
normalized observation, and ``t.note`` for a derived fact (e.g. "Last-Modified did not move"). The same
scenario runs against the store directly and against the gateway in four set-ups; the observation lists
must be equal. Normalization keeps what S3 documents and a client can rely on (status, error code, the
documented headers, body hash, listing contents), and drops what legitimately differs per request (request
ids, dates, upload ids: those become ordinal names, opaque continuation tokens: present or not).
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from botocore.exceptions import ClientError

from tests.e2e import s3raw

# Response headers S3 documents and clients rely on; everything else (Date, Server, request ids, ...) is
# ignored. x-amz-meta-* and x-amz-checksum-* are kept by prefix.
DOCUMENTED_HEADERS = frozenset(
    {
        "etag",
        "content-length",
        "content-type",
        "content-encoding",
        "content-disposition",
        "content-language",
        "content-range",
        "expires",
        "cache-control",
        "accept-ranges",
        "x-amz-mp-parts-count",
        "x-amz-checksum-type",
        "x-amz-checksum-algorithm",
        "x-amz-version-id",
        "x-amz-delete-marker",
        "x-amz-copy-source-version-id",
    }
)
KEPT_PREFIXES = ("x-amz-meta-", "x-amz-checksum-")
# Ordinal-mapped identifiers: the same id seen twice gets the same name, different ids different names.
ID_FIELDS = frozenset({"UploadId", "UploadIdMarker", "NextUploadIdMarker", "VersionId", "VersionIdMarker"})
ID_FIELDS |= {"NextVersionIdMarker", "x-amz-version-id", "x-amz-copy-source-version-id"}
# Opaque per-server tokens: only whether one is there is compared.
PRESENCE_FIELDS = frozenset({"NextContinuationToken", "ContinuationToken", "Location", "Owner", "Initiator"})
# Operations that answer in headers (the object, or an empty body): their headers are compared in full.
OBJECT_READ_OPS = frozenset({"get_object", "head_object"})
HEADER_ANSWER_OPS = frozenset({"get_object", "head_object", "put_object", "upload_part", "delete_object"})
DROPPED_FIELDS = frozenset({"ResponseMetadata", "LastModified", "Initiated", "RequestCharged", "Expiration"})


@dataclass
class Target:
    """What a scenario talks to. ``settle()`` is called by scenarios after their writes: a no-op except on
    the "after flush" target, where it waits until the spool has put everything on the store. ``drain()``
    makes everything reach the store on every target (resuming a held drain for the while)."""

    name: str
    s3: Any  # a boto3 S3 client
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    settle_hook: Callable[[str], None] = lambda _bucket: None
    drain_hook: Callable[[str], None] = lambda _bucket: None
    # Held drain only: a call still unanswered after ``blocked_after_s`` waits for the drain (DeleteBucket of
    # a bucket with spooled keys does); the drain is let run until it returns, and the step records that.
    unblock_hook: Callable[[bool], None] | None = None
    blocked_after_s: float = 2.5
    # Written objects get this Content-Type unless the call names one: what a store puts there when the
    # client sends none is its own scenario family (content.default_type*, object.put_get_*), and would
    # otherwise show in every scenario. None: send none.
    content_type: str | None = "application/octet-stream"
    observations: list[dict[str, Any]] = field(default_factory=list)
    _ids: dict[str, str] = field(default_factory=dict)

    # ---- hooks -------------------------------------------------------------------------------------------
    def settle(self) -> None:
        self.settle_hook(self.bucket)

    def drain(self) -> None:
        self.drain_hook(self.bucket)

    # ---- recording ---------------------------------------------------------------------------------------
    def note(self, label: str, value: Any) -> None:
        self.observations.append({"step": label, "note": self._norm(value)})

    def call(self, label: str, op: str, **params: Any) -> dict[str, Any]:
        """Call boto3 ``op`` (Bucket defaults to the scenario's bucket); record status and normalized answer.
        Returns the parsed response ({} on an error) so later steps can use ETags, upload ids, ..."""
        if op not in ("list_buckets",):
            params.setdefault("Bucket", self.bucket)
        if op in ("put_object", "create_multipart_upload") and self.content_type is not None:
            params.setdefault("ContentType", self.content_type)
        obs: dict[str, Any] = {"step": label, "op": op}
        try:
            with self._watch(obs):
                resp = getattr(self.s3, op)(**params)
        except ClientError as exc:
            err = exc.response
            meta = err.get("ResponseMetadata", {})
            headers = meta.get("HTTPHeaders", {})
            obs["status"] = meta.get("HTTPStatusCode")
            obs["error"] = err.get("Error", {}).get("Code")
            obs["headers"] = self._headers(headers, document=True)
            obs["request_id"] = _request_id_check(meta.get("RequestId"), headers.get("x-amz-request-id"))
            self.observations.append(obs)
            return {}
        meta = resp.get("ResponseMetadata", {})
        obs["status"] = meta.get("HTTPStatusCode")
        obs["headers"] = self._headers(
            meta.get("HTTPHeaders", {}), document=op not in HEADER_ANSWER_OPS, read=op in OBJECT_READ_OPS
        )
        body_fields = self._body_fields(op, resp)
        if "Body" in resp:
            data = resp["Body"].read()
            resp["_bytes"] = data
            obs["body"] = _digest(data)
        if body_fields:
            obs["result"] = self._norm(body_fields)
        self.observations.append(obs)
        return dict(resp)

    def raw(
        self,
        label: str,
        method: str,
        key: str | None = None,
        *,
        query: Mapping[str, str] | str = "",
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        payload_hash: str | None = None,
        content_length: bool = True,
        bucket: str | None = None,
    ) -> s3raw.Response:
        """A signed request sent exactly as given (tests/e2e/s3raw.py); records status, code, headers, body
        digest (or the listing's shape for XML bodies) and whether an error's RequestId is the header's."""
        q = query if isinstance(query, str) else urlencode(query, quote_via=quote)
        target = s3raw.key_path(bucket or self.bucket, key) + (f"?{q}" if q else "")
        obs: dict[str, Any] = {"step": label, "raw": method}
        with self._watch(obs):
            resp = self._send(method, target, headers, body, payload_hash, content_length)
        obs["status"] = resp.status
        obs["headers"] = self._headers(
            {k.lower(): v for k, v in resp.headers.items()},
            document="xml" in (resp.header("Content-Type") or "") or resp.status >= 300,
            read=method in ("GET", "HEAD") and key is not None,
        )
        if resp.status >= 300 and resp.body:
            try:
                fields = s3raw.error_fields(resp.body)
            except Exception:
                obs["body"] = _digest(resp.body)
            else:
                obs["error"] = fields.get("Code")
                obs["request_id"] = _request_id_check(
                    fields.get("RequestId"), resp.header("x-amz-request-id")
                )
        elif resp.body:
            obs["body"] = (
                _xml_shape(resp.body, self.bucket) if resp.body.startswith(b"<?xml") else _digest(resp.body)
            )
        self.observations.append(obs)
        return resp

    def _send(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str] | None,
        body: bytes,
        payload_hash: str | None,
        content_length: bool,
    ) -> s3raw.Response:
        return s3raw.signed_request(
            self.endpoint,
            method,
            target,
            access_key=self.access_key,
            secret_key=self.secret_key,
            body=body,
            headers=headers,
            payload_hash=payload_hash,
            content_length=content_length,
        )

    @contextlib.contextmanager
    def _watch(self, obs: dict[str, Any]) -> Iterator[None]:
        hook = self.unblock_hook
        if hook is None:
            yield
            return
        fired = threading.Event()

        def fire() -> None:
            fired.set()
            hook(True)

        timer = threading.Timer(self.blocked_after_s, fire)
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()
            if fired.is_set():
                obs["blocked"] = "until the held drain was let run"
                hook(False)

    # ---- normalization -----------------------------------------------------------------------------------
    def ordinal(self, value: str) -> str:
        if value in ("null", ""):
            return value
        if value not in self._ids:
            self._ids[value] = f"<id{len(self._ids) + 1}>"
        return self._ids[value]

    def _headers(
        self, headers: Mapping[str, str], *, document: bool = False, read: bool = False
    ) -> dict[str, str]:
        """The documented headers. ``document``: the body is an XML document naming the bucket, request ids,
        ..., so its Content-Length says nothing comparable."""
        out: dict[str, str] = {}
        for name, value in headers.items():
            low = name.lower()
            if document and low == "content-length":
                continue
            if low == "accept-ranges" and not read:
                continue  # S3 documents it for object reads only (SeaweedFS sends it on every answer)
            if document and low == "etag":
                continue  # S3 documents it for object reads and PUT/UploadPart only
            if low in DOCUMENTED_HEADERS or low.startswith(KEPT_PREFIXES):
                out[low] = self.ordinal(value) if low in ID_FIELDS else value
        return dict(sorted(out.items()))

    def _body_fields(self, op: str, resp: Mapping[str, Any]) -> dict[str, Any]:
        """The response members that come from the body (headers are recorded raw, above)."""
        name = self.s3.meta.method_to_api_mapping.get(op, op)
        shape = self.s3.meta.service_model.operation_model(name).output_shape
        if shape is None:
            return {}
        out = {}
        for member, mshape in shape.members.items():
            if mshape.serialization.get("location") in ("header", "headers", "statusCode"):
                continue
            if member in resp and member != "Body":
                out[member] = resp[member]
        return out

    def _norm(self, value: Any, key: str = "") -> Any:
        if key in PRESENCE_FIELDS:
            return "<present>" if value else "<absent>"
        if key in ID_FIELDS and isinstance(value, str):
            return self.ordinal(value)
        if isinstance(value, Mapping):
            return {k: self._norm(v, k) for k, v in sorted(value.items()) if k not in DROPPED_FIELDS}
        if isinstance(value, list | tuple):
            return [self._norm(v, key) for v in value]
        if isinstance(value, datetime.datetime):
            return "<date>"
        if isinstance(value, bytes):
            return _digest(value)
        if isinstance(value, str) and self.bucket in value:
            return value.replace(self.bucket, "<bucket>")
        return value


def _request_id_check(body_id: str | None, header_id: str | None) -> str:
    if not header_id:
        return "no header"
    if body_id is None:
        return "not in body"
    return "matches header" if body_id == header_id else "differs from header"


def _digest(data: bytes) -> str:
    if len(data) <= 48 and all(32 <= b < 127 for b in data):
        return f"{len(data)}:{data.decode()}"
    return f"{len(data)}:sha256:{hashlib.sha256(data).hexdigest()[:16]}"


_XML_DROP = re.compile(
    rb"<(LastModified|Initiated|RequestId|HostId|Owner|Initiator|NextContinuationToken|Location)>.*?</\1>",
    re.S,
)


def _xml_shape(body: bytes, bucket: str) -> str:
    return _XML_DROP.sub(rb"<\1/>", body).decode(errors="replace").replace(bucket, "<bucket>")


# ---- comparison ------------------------------------------------------------------------------------------
def render(observations: Iterable[Mapping[str, Any]]) -> list[str]:
    return [json.dumps(o, sort_keys=True, default=str) for o in observations]


def diff(expected: list[dict[str, Any]], actual: list[dict[str, Any]], target: str) -> str:
    """A readable unified diff of two observation lists ('' if equal)."""
    a, b = render(expected), render(actual)
    if a == b:
        return ""
    return "\n".join(difflib.unified_diff(a, b, "store", target, n=1, lineterm=""))
