"""``MultipartWriter``: a write-only stream that uploads an object while it is being produced.

Theory of operation. Bytes written are copied into the current part buffer; when it reaches
``part_size_bytes`` the buffer is handed, without another copy, to a small thread pool that uploads it as one
``UploadPart`` (each part retried on its own under the client's policy), and a fresh buffer starts. A
semaphore with ``max_inflight_parts`` slots is taken before a part is handed over, so a producer faster than
the network blocks in ``write()``: memory is bounded by ``(max_inflight_parts + 1) * part_size_bytes``
whatever the object size and however large a single ``write()`` is (a multi-GiB tensor is consumed part by
part). ``torch.save`` streaming into this writer therefore never holds the checkpoint twice.

An object smaller than one part is sent as a single ``PutObject`` at ``close()`` (no multipart round trips). A
failed part fails the next ``write()``/``close()``; the multipart upload is then aborted so the store keeps no
orphaned parts, and :class:`~s3lanes_client.errors.UploadFailed` is raised.

What this is not: an ``io.IOBase``. IOBase's finaliser calls ``close()``, which here means "commit": a writer
dropped after an error must never publish a truncated object, so there is no finaliser at all.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

from botocore.exceptions import ClientError

from s3lanes_client.errors import UploadFailed
from s3lanes_client.model import ObjectClient

MiB = 1024 * 1024
MIN_PART_BYTES = 5 * MiB  # S3's minimum for every part but the last
MAX_PARTS = 10_000


class MultipartWriter:
    def __init__(
        self,
        client: ObjectClient,
        bucket: str,
        key: str,
        *,
        part_size_bytes: int = 16 * MiB,
        max_inflight_parts: int = 4,
        lane: str | None = "checkpoint",
        write_through: bool = False,
        extra_args: dict[str, Any] | None = None,
    ) -> None:
        if part_size_bytes < MIN_PART_BYTES:
            raise ValueError(f"part_size_bytes must be at least {MIN_PART_BYTES} (S3's minimum part size)")
        if max_inflight_parts < 1:
            raise ValueError("max_inflight_parts must be at least 1")
        self._client = client
        self.bucket = bucket
        self.key = key
        self.part_size_bytes = part_size_bytes
        self._lane = lane
        self._write_through = write_through
        self._extra = dict(extra_args or {})
        self._buf = bytearray()
        self._written = 0
        self._upload_id: str | None = None
        self._next_part = 1
        self._futures: list[Future[tuple[int, str]]] = []
        self._slots = threading.Semaphore(max_inflight_parts)
        self._max_inflight = max_inflight_parts
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.etag: str | None = None  # the object's ETag once closed

    # -- stream interface ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing to do: bytes leave in whole parts; ``close()`` sends the rest."""

    def write(self, data: Any) -> int:
        if self._closed:
            raise ValueError("write to a closed MultipartWriter")
        view = memoryview(data).cast("B")
        n = len(view)
        pos = 0
        while pos < n:
            take = min(self.part_size_bytes - len(self._buf), n - pos)
            self._buf += view[pos : pos + take]
            pos += take
            if len(self._buf) == self.part_size_bytes:
                part, self._buf = self._buf, bytearray()
                self._submit(part)
        self._written += n
        return n

    def __enter__(self) -> MultipartWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- upload --------------------------------------------------------------------------------------------

    def _hint(self) -> dict[str, Any]:
        return {"lane": self._lane, "write_through": self._write_through}

    def _submit(self, part: bytearray) -> None:
        self._raise_if_failed()
        try:
            if self._upload_id is None:
                created = self._client.call(
                    "create_multipart_upload", Bucket=self.bucket, Key=self.key, **self._extra, **self._hint()
                )
                self._upload_id = str(created["UploadId"])
                self._pool = ThreadPoolExecutor(self._max_inflight, thread_name_prefix="s3lanes-part")
            if self._next_part > MAX_PARTS:
                raise ValueError(
                    f"s3://{self.bucket}/{self.key}: more than {MAX_PARTS} parts of {self.part_size_bytes} "
                    "bytes; use a larger part_size_bytes"
                )
        except Exception as exc:
            self._fail(exc)
        number = self._next_part
        self._next_part += 1
        self._slots.acquire()  # blocks while max_inflight_parts parts are uploading
        assert self._pool is not None
        fut = self._pool.submit(self._upload_part, number, part)
        fut.add_done_callback(lambda _f: self._slots.release())
        self._futures.append(fut)

    def _upload_part(self, number: int, part: bytearray) -> tuple[int, str]:
        r = self._client.call(
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=part,
            **self._hint(),
        )
        return number, str(r["ETag"])

    def _raise_if_failed(self) -> None:
        for fut in self._futures:
            if fut.done() and fut.exception() is not None:
                fut.result()  # raises, caught by the caller's _fail

    def close(self) -> None:
        """Send what is buffered and commit the object. After an error the upload is aborted and
        :class:`UploadFailed` raised. Closing twice is a no-op."""
        if self._closed:
            return
        try:
            if self._upload_id is None:
                r = self._client.call(
                    "put_object",
                    Bucket=self.bucket,
                    Key=self.key,
                    Body=bytes(self._buf),
                    **self._extra,
                    **self._hint(),
                )
            else:
                if self._buf:
                    part, self._buf = self._buf, bytearray()
                    self._submit(part)
                parts = sorted(fut.result() for fut in self._futures)
                r = self._client.call(
                    "complete_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in parts]},
                    **self._hint(),
                )
            self.etag = str(r.get("ETag", "")).strip('"')
        except UploadFailed:
            raise
        except Exception as exc:
            self._fail(exc)
        finally:
            self._buf = bytearray()
            self._closed = True
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def abort(self) -> None:
        """Give up: drop buffered bytes, stop part uploads and abort the multipart upload (best effort: an
        abort that itself fails leaves the parts to the bucket's lifecycle rules)."""
        self._closed = True
        self._buf = bytearray()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                self._client.call(
                    "abort_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=upload_id,
                    **self._hint(),
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                    raise

    def _fail(self, exc: Exception) -> NoReturn:
        try:
            self.abort()
        except Exception as abort_exc:  # the original error is the one to report
            exc.add_note(f"aborting the multipart upload failed too: {abort_exc!r}")
        raise UploadFailed(f"upload of s3://{self.bucket}/{self.key} failed: {exc}") from exc
