"""Raw HTTP: answers read byte for byte (:class:`Answer`), keep-alive connections (:class:`Conn`), requests
(:class:`Req`) and the digests valid requests carry."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree

from loadtests.fuzz_http.options import (
    CONNECT_TIMEOUT_S,
    EXCERPT_BYTES,
    MAX_ANSWER_BODY_BYTES,
    MAX_ANSWER_HEAD_BYTES,
    READ_TIMEOUT_S,
)

# --------------------------------------------------------------------------------------------------------
# Raw HTTP


@dataclass(slots=True)
class Answer:
    """One HTTP answer as read off the wire, or why there was none (``status is None``)."""

    status: int | None
    reason: str = ""
    version: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    interim: list[int] = field(default_factory=list)
    error: str = ""  # "timeout", "closed" (EOF or reset before a whole answer), "bad-answer: ..."
    closes: bool = False  # the server will close the connection after this answer

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def from_handler(self) -> bool:
        """Answered by the gateway's S3 handler (it stamps every answer with a request id)."""
        return self.header("x-amz-request-id") is not None

    def error_code(self) -> str | None:
        return xml_error_code(self.body)

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        code = self.error_code() if self.status >= 400 else None
        text = f"{self.status} {self.reason}".strip()
        return f"{text} [{code}]" if code else text


def answer_source(ans: Answer) -> str:
    """Who produced an answer: the HTTP parser below the S3 handler, the handler itself, the spool, or the
    backend (relayed: the gateway echoes the store's request id in x-s3lanes-backend-request-id)."""
    if ans.status is None:
        return "none"
    if not ans.from_handler:
        return "parser"
    if ans.header("x-s3lanes-source") == "spool":
        return "spool"
    if ans.header("x-s3lanes-backend-request-id") is not None:
        return "backend"
    return "gateway"


def xml_error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document, None if ``body`` is not one."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    if root.tag.rpartition("}")[2] != "Error":
        return None
    for child in root:
        if child.tag.rpartition("}")[2] == "Code" and child.text and child.text.strip():
            return child.text.strip()
    return None


class Conn:
    """One client connection: write bytes as they are, read answers as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.usable = True

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_ANSWER_HEAD_BYTES)
        return cls(reader, writer)

    async def send(self, data: bytes, *, half_close: bool = False) -> str:
        """Write ``data``; ``half_close`` then shuts our side (the server sees EOF). '' or why it failed."""
        try:
            self.writer.write(data)
            async with asyncio.timeout(READ_TIMEOUT_S):
                await self.writer.drain()
            if half_close and self.writer.can_write_eof():
                self.writer.write_eof()
        except TimeoutError:
            self.usable = False
            return "send timeout"
        except (ConnectionError, OSError) as exc:
            self.usable = False
            return f"send failed: {type(exc).__name__}"
        return ""

    async def answer(self, method: str, *, stop_at_interim: bool = False) -> Answer:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                ans = await self._answer(method, stop_at_interim)
        except TimeoutError:
            self.usable = False
            return Answer(None, error="timeout")
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.usable = False
            return Answer(None, error="closed")
        except (asyncio.LimitOverrunError, ValueError) as exc:
            self.usable = False
            return Answer(None, error=f"bad-answer: {exc}")
        if ans.closes:
            self.usable = False
        return ans

    async def _answer(self, method: str, stop_at_interim: bool) -> Answer:
        interim: list[int] = []
        while True:
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head[:-4].decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            status_text, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or not status_text.isdigit():
                raise ValueError(f"status line {lines[0][:80]!r}")
            status = int(status_text)
            headers = []
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise ValueError(f"header line {line[:80]!r}")
                headers.append((name.strip(), value.strip()))
            if 100 <= status < 200 and status != 101:
                interim.append(status)
                if stop_at_interim:
                    return Answer(status, reason, version, headers, interim=interim)
                continue
            break
        ans = Answer(status, reason, version, headers, interim=interim)
        connection = (ans.header("connection") or "").lower()
        ans.closes = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if method == "HEAD" or status in (204, 304):
            return ans
        if "chunked" in (ans.header("transfer-encoding") or "").lower():
            ans.body = await self._chunked_body()
        elif (length := ans.header("content-length")) is not None:
            if not length.isdigit() or int(length) > MAX_ANSWER_BODY_BYTES:
                raise ValueError(f"content-length {length!r}")
            ans.body = await self.reader.readexactly(int(length))
        else:
            ans.body = await self.reader.read(MAX_ANSWER_BODY_BYTES)
            ans.closes = True
        return ans

    async def _chunked_body(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = await self.reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            if await self.reader.readexactly(2) != b"\r\n":
                raise ValueError("chunk not followed by CRLF")

    async def close(self) -> None:
        self.usable = False
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def _wire(text: str) -> bytes:
    """UTF-8, with lone surrogates standing for the raw bytes they came from (surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


@dataclass(slots=True)
class Req:
    """A request before it is put on the wire; cases edit it (drop, duplicate, corrupt parts) first."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    version: str = "HTTP/1.1"
    # Body bytes actually sent; None: all of ``body`` (a truncated upload sends fewer than promised).
    sent_body: bytes | None = None

    def set(self, name: str, value: str) -> Req:
        self.drop(name)
        self.headers.append((name, value))
        return self

    def drop(self, name: str) -> Req:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()]
        return self

    def get(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def head_bytes(self) -> bytes:
        lines = [_wire(f"{self.method} {self.target} {self.version}")]
        lines += [_wire(f"{k}: {v}") for k, v in self.headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def wire(self) -> bytes:
        return self.head_bytes() + (self.body if self.sent_body is None else self.sent_body)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def multipart_etag(part_md5s: Sequence[str]) -> str:
    joined = b"".join(bytes.fromhex(m) for m in part_md5s)
    return f"{hashlib.md5(joined).hexdigest()}-{len(part_md5s)}"


def excerpt(data: bytes, limit: int = EXCERPT_BYTES) -> str:
    """Request bytes for a report: printable ASCII kept, everything else escaped (a bytes literal body)."""
    cut = data[:limit]
    text = repr(cut)[2:-1]
    return text + (f"... ({len(data)} bytes in all)" if len(data) > limit else "")
