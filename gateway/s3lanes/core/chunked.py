"""Incremental decoder for ``Content-Encoding: aws-chunked`` request bodies.

Theory of operation
-------------------
The body is a sequence of chunks, each ``hex-size[;chunk-signature=<64 hex>]\\r\\n<data>\\r\\n``, ended by
a zero-size chunk, then (trailer modes) trailer lines ``name:value\\r\\n`` (signed trailer mode ends them
with ``x-amz-trailer-signature:<64 hex>\\r\\n``), then an empty line ``\\r\\n``. botocore's
``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` body for zero bytes is the 36 bytes
``0\\r\\nx-amz-checksum-crc32:AAAAAA==\\r\\n\\r\\n``.

:class:`AwsChunkedDecoder` is a push parser in the style of h11: the shell calls
:meth:`~AwsChunkedDecoder.feed` with whatever bytes arrived (any split, down to one byte at a time) and
gets back the decoded payload pieces, then calls :meth:`~AwsChunkedDecoder.finish` at EOF to get the
trailers. Payload bytes are passed through as soon as they arrive (sliced out of the input, never
buffered); the decoder only ever holds one partial chunk-header or trailer line. It does no I/O and
never reads a clock.

With a :class:`~s3lanes.core.sigv4.ChunkSignatureChain` every chunk's signature is checked as soon as the
chunk's data is complete (its SHA-256 is computed incrementally), and the trailer signature when it
arrives. The decoder may therefore hand out a chunk's bytes before that chunk's signature is checked:
the shell must not commit the upload until :meth:`~AwsChunkedDecoder.finish` has returned.

Errors, following what S3 answers (observed against AWS by the versitygw project, issues 1660/1666/1685):

- any malformed framing (bad hex size, missing ``\\r\\n``, missing or malformed ``chunk-signature``, an
  oversized header line, bytes after the end) and truncation: ``IncompleteBody`` "The request body
  terminated unexpectedly"; a chunk bigger than ``max_chunk_bytes`` or, when ``min_chunk_bytes`` is set,
  a non-final chunk smaller than it: ``InvalidChunkSizeError`` (with ``Chunk`` and ``BadChunkSize``);
- more payload than ``x-amz-decoded-content-length``: ``IncompleteBody`` (the framing disagrees with the
  header), raised as soon as the chunk header announces it; fewer: ``IncompleteBody`` from ``finish``;
- a trailer section that is not well formed, names a trailer not announced in ``x-amz-trailer``, repeats
  one, lacks the trailer signature in signed trailer mode or exceeds ``max_trailer_bytes``:
  ``MalformedTrailerError``;
- a chunk or trailer signature that does not match: ``SignatureDoesNotMatch``.

Leniency, for variants real SDKs produce: trailer lines may end in a bare ``\\n`` and carry blanks around
the ``:``; the final empty line after a complete trailer section may be missing at EOF; the signed trailer
is accepted whether the client hashed its lines as ``name:value\\n`` each (the S3 docs), as sent, or without
the last newline (aws-sdk-net, see minio/minio#17774). Chunk extensions are ignored when there is no chain.

This module does not verify checksums (``s3lanes.core.checksums`` does, from the trailers returned here),
and it is *not* a decoder for HTTP ``Transfer-Encoding: chunked``, which the HTTP server removes first.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping

from s3lanes.core.sigv4 import EMPTY_SHA256, ChunkSignatureChain, ChunkSigner
from s3lanes.core.transitions import Transitions
from s3lanes.errors import BodyError, IncompleteBody, InvalidChunkSizeError, MalformedTrailerError, S3Error

DEFAULT_MAX_CHUNK_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_TRAILER_BYTES = 16 * 1024
MAX_CHUNK_HEADER_BYTES = 1024  # "10000;chunk-signature=<64 hex>\r\n" is 88 bytes
S3_MIN_CHUNK_BYTES = 8192  # what S3 enforces for all but the last chunk; opt in with min_chunk_bytes
TRAILER_SIGNATURE = "x-amz-trailer-signature"

_MSG_TRUNCATED = "The request body terminated unexpectedly"
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
_HEX64 = re.compile(rb"[0-9a-fA-F]{64}")
_CHUNK_SIGNATURE = b"chunk-signature="
_CRLF = b"\r\n"


class _State(enum.Enum):
    HEADER = "reading a chunk-size line"
    DATA = "passing chunk data through"
    DATA_CRLF = "reading the CRLF after chunk data"
    TRAILER = "reading trailer lines"
    DONE = "complete"


_MOVES = Transitions(
    {
        _State.HEADER: {_State.DATA, _State.TRAILER},
        _State.DATA: {_State.DATA_CRLF},
        _State.DATA_CRLF: {_State.HEADER},
        _State.TRAILER: {_State.DONE},
        _State.DONE: (),
    }
)


def _framing_error(detail: str) -> BodyError:
    return IncompleteBody(f"{_MSG_TRUNCATED} ({detail}).")


class AwsChunkedDecoder:
    """Strips aws-chunked framing from a request body, verifying chunk signatures when given a chain.

    ``trailer_names`` are the trailers announced in ``x-amz-trailer`` (any case); ``decoded_length`` is
    ``x-amz-decoded-content-length`` when the client sent it. An error is final: every later call raises
    the same error again.
    """

    def __init__(
        self,
        *,
        chain: ChunkSignatureChain | None,
        trailer_names: tuple[str, ...],
        decoded_length: int | None,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        max_trailer_bytes: int = DEFAULT_MAX_TRAILER_BYTES,
        min_chunk_bytes: int = 0,
    ) -> None:
        self._chain = chain
        self._trailer_names = frozenset(name.strip().lower() for name in trailer_names)
        self._decoded_length = decoded_length
        self._max_chunk_bytes = max_chunk_bytes
        self._max_trailer_bytes = max_trailer_bytes
        self._min_chunk_bytes = min_chunk_bytes

        self._state = _State.HEADER
        self._line = bytearray()  # partial header or trailer line
        self._chunk_remaining_bytes = 0
        self._chunk_signature = ""
        self._chunk_hash: hashlib._Hash | None = None
        self._crlf_seen = 0
        self._chunk_index = 0  # 1-based index of the current chunk, as S3 reports it
        self._last_data_chunk_bytes: int | None = None
        self._decoded_bytes = 0
        self._trailer_bytes = 0
        self._trailers: dict[str, str] = {}
        self._trailer_lines: list[bytes] = []
        self._trailer_signed = False
        self._error: S3Error | None = None

    @property
    def complete(self) -> bool:
        """True once the final chunk and the trailer section (with its empty line) are fully parsed."""
        return self._state is _State.DONE

    @property
    def decoded_bytes(self) -> int:
        """Payload bytes handed out so far."""
        return self._decoded_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Consume the next bytes of the body; return the payload pieces they complete, in order."""
        if self._error is not None:
            raise self._error
        try:
            return self._feed(data)
        except S3Error as error:
            self._error = error
            raise

    def finish(self) -> dict[str, str]:
        """At EOF: the trailers (lower-case names, without the trailer signature).

        Raises ``IncompleteBody`` if the body stopped before its end or carried fewer payload bytes than
        ``decoded_length``.
        """
        if self._error is not None:
            raise self._error
        try:
            if not self._ended_cleanly():
                raise _framing_error(f"body ended while {self._state.value}")
            # The terminal chunk checks the length already (in _feed): kept as the end's own check.
            short = self._decoded_length is not None and self._decoded_bytes < self._decoded_length
            if short:  # pragma: no cover - unreachable, see above
                raise IncompleteBody(
                    f"{_MSG_TRUNCATED} ({self._decoded_bytes} of {self._decoded_length} decoded bytes)."
                )
        except S3Error as error:
            self._error = error
            raise
        return dict(self._trailers)

    # ---------------------------------------------------------------------------------------------

    def _ended_cleanly(self) -> bool:
        if self._state is _State.DONE:
            return True
        # Tolerated: a complete trailer section whose final empty line never came.
        return (
            self._state is _State.TRAILER
            and not self._line
            and bool(self._trailer_lines)
            and (self._trailer_signed or not self._signature_required())
        )

    def _go(self, state: _State) -> None:
        _MOVES.check(self._state, state, "aws-chunked decoder")
        self._state = state

    def _signature_required(self) -> bool:
        return self._chain is not None and bool(self._trailer_names)

    def _feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        pos = 0
        end = len(data)
        while pos < end:
            state = self._state
            if state is _State.DATA:
                take = min(self._chunk_remaining_bytes, end - pos)
                piece = data[pos : pos + take]
                pos += take
                out.append(piece)
                if self._chunk_hash is not None:
                    self._chunk_hash.update(piece)
                self._chunk_remaining_bytes -= take
                self._decoded_bytes += take
                if self._chunk_remaining_bytes == 0:
                    self._end_of_chunk_data()
            elif state is _State.DATA_CRLF:
                while pos < end and self._crlf_seen < 2:
                    if data[pos] != _CRLF[self._crlf_seen]:
                        raise _framing_error(f"chunk {self._chunk_index} is not followed by CRLF")
                    self._crlf_seen += 1
                    pos += 1
                if self._crlf_seen == 2:
                    self._go(_State.HEADER)
            elif state is _State.HEADER:
                pos = self._take_line(data, pos, MAX_CHUNK_HEADER_BYTES - len(self._line))
                if self._line.endswith(b"\n"):
                    line = bytes(self._line)
                    self._line.clear()
                    self._on_chunk_header(line)
            elif state is _State.TRAILER:
                before = pos
                pos = self._take_line(data, pos, self._max_trailer_bytes - self._trailer_bytes)
                self._trailer_bytes += pos - before
                if self._line.endswith(b"\n"):
                    line = bytes(self._line)
                    self._line.clear()
                    self._on_trailer_line(line)
            else:  # DONE
                raise _framing_error("bytes after the end of the aws-chunked body")
        return out

    def _take_line(self, data: bytes, pos: int, budget_bytes: int) -> int:
        """Append bytes up to and including the next LF to the line buffer; return the new position.

        ``budget_bytes`` is how many more bytes the current line (or trailer section) may take.
        """
        newline = data.find(b"\n", pos)
        stop = len(data) if newline < 0 else newline + 1
        if stop - pos > budget_bytes:
            if self._state is _State.TRAILER:
                raise MalformedTrailerError(f"The trailer section exceeds {self._max_trailer_bytes} bytes.")
            raise _framing_error(f"chunk header line longer than {MAX_CHUNK_HEADER_BYTES} bytes")
        self._line += data[pos:stop]
        return stop

    def _on_chunk_header(self, line: bytes) -> None:
        if not line.endswith(_CRLF):
            raise _framing_error("chunk header not terminated by CRLF")
        size_text, _, extensions = line[:-2].partition(b";")
        if not _HEX_SIZE.fullmatch(size_text):
            raise _framing_error(f"invalid chunk size {size_text[:32]!r}")
        size_bytes = int(size_text, 16)
        self._chunk_index += 1
        signature = self._chunk_signature_of(extensions)
        if size_bytes > self._max_chunk_bytes:
            raise InvalidChunkSizeError(
                f"Chunk size {size_bytes} exceeds the maximum of {self._max_chunk_bytes} bytes.",
                Chunk=str(self._chunk_index),
                BadChunkSize=str(size_bytes),
            )
        previous_bytes = self._last_data_chunk_bytes
        if size_bytes and previous_bytes is not None and previous_bytes < self._min_chunk_bytes:
            raise InvalidChunkSizeError(
                f"Only the last chunk is allowed to have a size less than {self._min_chunk_bytes} bytes.",
                Chunk=str(self._chunk_index - 1),
                BadChunkSize=str(previous_bytes),
            )
        if self._decoded_length is not None and self._decoded_bytes + size_bytes > self._decoded_length:
            raise _framing_error(
                f"chunks carry more than the {self._decoded_length} bytes of x-amz-decoded-content-length"
            )
        if size_bytes == 0:
            if self._chain is not None:
                self._chain.verify_chunk(EMPTY_SHA256, signature)
            if self._decoded_length is not None and self._decoded_bytes < self._decoded_length:
                raise IncompleteBody(
                    f"{_MSG_TRUNCATED} ({self._decoded_bytes} of {self._decoded_length} decoded bytes)."
                )
            self._go(_State.TRAILER)
            return
        self._last_data_chunk_bytes = size_bytes
        self._chunk_remaining_bytes = size_bytes
        self._chunk_signature = signature
        self._chunk_hash = hashlib.sha256() if self._chain is not None else None
        self._go(_State.DATA)

    def _chunk_signature_of(self, extensions: bytes) -> str:
        if self._chain is None:
            return ""  # unsigned modes: extensions carry nothing we check
        if not extensions.startswith(_CHUNK_SIGNATURE):
            raise _framing_error(f"chunk {self._chunk_index} has no chunk-signature")
        value = extensions[len(_CHUNK_SIGNATURE) :]
        if not _HEX64.fullmatch(value):
            raise _framing_error(f"chunk {self._chunk_index} has a malformed chunk-signature")
        return value.decode("ascii").lower()

    def _end_of_chunk_data(self) -> None:
        if self._chain is not None and self._chunk_hash is not None:
            self._chain.verify_chunk(self._chunk_hash.hexdigest(), self._chunk_signature)
        self._chunk_hash = None
        self._crlf_seen = 0
        self._go(_State.DATA_CRLF)

    def _on_trailer_line(self, line: bytes) -> None:
        text = line[:-2] if line.endswith(_CRLF) else line[:-1]
        if not text:
            if self._signature_required() and not self._trailer_signed:
                raise MalformedTrailerError(f"The trailer section has no {TRAILER_SIGNATURE}.")
            self._go(_State.DONE)
            return
        if self._trailer_signed:
            raise MalformedTrailerError(f"Trailer lines follow the {TRAILER_SIGNATURE}.")
        raw_name, colon, raw_value = text.partition(b":")
        name = raw_name.strip().decode("latin-1").lower()
        value = raw_value.strip().decode("latin-1")
        if not colon or not name:
            raise MalformedTrailerError()
        if name == TRAILER_SIGNATURE and self._chain is not None:
            self._check_trailer_signature(value)
            return
        if name not in self._trailer_names:
            raise MalformedTrailerError(f"The trailer {name!r} was not announced in x-amz-trailer.")
        if name in self._trailers:
            raise MalformedTrailerError(f"The trailer {name!r} appears more than once.")
        self._trailers[name] = value
        self._trailer_lines.append(text)

    def _check_trailer_signature(self, signature: str) -> None:
        assert self._chain is not None
        if not _HEX64.fullmatch(signature.encode("latin-1")):
            raise MalformedTrailerError(f"The {TRAILER_SIGNATURE} is not 64 hexadecimal digits.")
        canonical = "".join(f"{name}:{value}\n" for name, value in self._trailers.items()).encode("latin-1")
        as_sent = b"".join(line + b"\n" for line in self._trailer_lines)
        for candidate in (canonical, as_sent, as_sent[:-1]):
            if self._chain.trailer_signature_matches(candidate, signature):
                self._trailer_signed = True
                return
        self._chain.verify_trailer(canonical, signature)  # raises SignatureDoesNotMatch with details


def canonical_trailer(trailers: Mapping[str, str]) -> bytes:
    """The bytes a signed trailer's signature covers: ``name:value\\n`` per trailer, in order."""
    return "".join(f"{name}:{value}\n" for name, value in trailers.items()).encode("latin-1")


def encode_aws_chunked(
    chunks: Iterable[bytes],
    *,
    signer: ChunkSigner | None = None,
    trailers: Mapping[str, str] | None = None,
) -> bytes:
    """Frame ``chunks`` as an aws-chunked body (the inverse of :class:`AwsChunkedDecoder`).

    With ``signer`` every chunk carries a ``chunk-signature`` and trailers get an
    ``x-amz-trailer-signature``. Empty chunks in ``chunks`` are skipped; the final zero chunk is added.
    For tests and for our own clients; it builds the whole body in memory.
    """
    parts: list[bytes] = []
    for chunk in chunks:
        if chunk:
            parts.append(_chunk_header(len(chunk), signer.sign_chunk(chunk) if signer else None))
            parts += (chunk, _CRLF)
    parts.append(_chunk_header(0, signer.sign_chunk(b"") if signer else None))
    if trailers:
        parts += (f"{name}:{value}\r\n".encode("latin-1") for name, value in trailers.items())
        if signer is not None:
            signature = signer.sign_trailer(canonical_trailer(trailers))
            parts.append(f"{TRAILER_SIGNATURE}:{signature}\r\n".encode("ascii"))
    parts.append(_CRLF)
    return b"".join(parts)


def _chunk_header(size_bytes: int, signature: str | None) -> bytes:
    if signature is None:
        return f"{size_bytes:x}\r\n".encode("ascii")
    return f"{size_bytes:x};chunk-signature={signature}\r\n".encode("ascii")
