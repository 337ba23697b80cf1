"""The upload body pipeline: decode, verify, and decide which bytes may be forwarded yet. Pure; no I/O.

Theory of operation: an upload is verified as it streams (payload SHA-256, Content-MD5, x-amz-checksum-*,
aws-chunked framing and chunk signatures), but the verdict is only known at the end of the body. The
gateway must store nothing when the verdict is negative, not even a partial object, yet it must not buffer
whole objects. The trick is the hold-back: the last piece of decoded payload is never released before
:meth:`UploadBody.finish` has verified everything. The backend request carries an exact Content-Length, so
the backend cannot complete the object while one byte is missing; when verification fails the shell aborts
the backend connection and the backend discards the incomplete upload.

Memory: at most one piece (one socket read) is held back. Bodies of zero length have nothing to hold back,
which is why the shell reads small bodies whole and sends them only after ``finish()``.

A body of unknown length (``Transfer-Encoding: chunked`` without Content-Length or aws-chunked framing:
``expected_bytes`` None) is streamed on with chunked transfer coding; the chunk that ends it is written only
after the last piece, which is released only after ``finish()``, so a failed verdict still leaves the
backend with an unfinished body it discards.
"""

from __future__ import annotations

from typing import Any

from s3lanes.core.checksums import BodyVerifier
from s3lanes.core.chunked import AwsChunkedDecoder
from s3lanes.errors import IncompleteBody


class UploadBody:
    """Feed it the raw request body; it hands back decoded bytes that are safe to forward."""

    __slots__ = (
        "_decoder",
        "_delegated",
        "_expected_bytes",
        "_finished",
        "_held",
        "_seen_bytes",
        "_trailers",
        "_verifier",
    )

    def __init__(
        self,
        *,
        verifier: BodyVerifier,
        decoder: AwsChunkedDecoder | None,
        expected_bytes: int | None,
    ) -> None:
        self._verifier = verifier
        self._decoder = decoder
        self._expected_bytes = expected_bytes
        self._held: bytes = b""
        self._seen_bytes = 0
        self._finished = False
        self._delegated = False
        self._trailers: dict[str, str] = {}

    @property
    def expected_bytes(self) -> int | None:
        """Decoded payload length, which is what the backend request's Content-Length will say; None when
        the request did not say (a chunked body without Content-Length)."""
        return self._expected_bytes

    @property
    def seen_bytes(self) -> int:
        """Decoded payload bytes fed so far (after :meth:`finish`: the body's length)."""
        return self._seen_bytes

    @property
    def checksum_algorithm(self) -> str | None:
        """The flexible checksum algorithm the request promised (header or trailer), if any."""
        return self._verifier.checksum_algorithm

    @property
    def checksum_in_trailer(self) -> bool:
        """Whether the flexible checksum comes in an aws-chunked trailer (not in a header)."""
        return self._verifier.checksum_in_trailer

    @property
    def verified_checksum(self) -> tuple[str, str] | None:
        """After :meth:`finish`: the ``x-amz-checksum-*`` header name and value that were verified, if any."""
        return self._verifier.verified_checksum

    def feed(self, raw: bytes) -> list[bytes]:
        if self._finished:
            raise AssertionError("feed() after finish()")
        pieces = self._decoder.feed(raw) if self._decoder is not None else [raw]
        out: list[bytes] = []
        for piece in pieces:
            if not piece:
                continue
            self._seen_bytes += len(piece)
            if self._expected_bytes is not None and self._seen_bytes > self._expected_bytes:
                raise IncompleteBody("The request body is longer than its declared length.")
            self._verifier.update(piece)
            if self._held:
                out.append(self._held)
            self._held = piece
        return out

    def delegate_hashing(self) -> list[Any]:
        """The verifier's hash objects, for a caller that feeds them itself, off the event loop (see
        :meth:`BodyVerifier.delegate_hashing`). :meth:`finish` then checks the length and the trailers but
        verifies nothing: the caller calls :meth:`verify` once it has fed every byte. Only before the first
        :meth:`feed`."""
        hashers = self._verifier.delegate_hashing()
        self._delegated = True
        return hashers

    def verify(self) -> None:
        """After :meth:`finish`, with hashing delegated: check everything the request promised."""
        if not self._finished or not self._delegated:
            raise AssertionError("verify() is for a delegated body, after finish()")
        self._verifier.finish(self._trailers)

    def take_md5_check(self) -> str | None:
        """The ``Content-MD5`` check handed to a caller that hashes the body itself (see
        :meth:`BodyVerifier.take_md5_check`): its expected value, or None. Only before the first
        :meth:`feed`."""
        return self._verifier.take_md5_check()

    def finish(self) -> bytes:
        """At the end of the raw body: verify everything; return the held-back tail to forward last."""
        self._finished = True
        trailers = self._decoder.finish() if self._decoder is not None else {}
        if self._expected_bytes is not None and self._seen_bytes != self._expected_bytes:
            raise IncompleteBody(f"Received {self._seen_bytes} of the {self._expected_bytes} declared bytes.")
        if self._delegated:
            self._trailers = dict(trailers)
        else:
            self._verifier.finish(trailers)
        held, self._held = self._held, b""
        return held
