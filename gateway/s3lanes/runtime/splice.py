"""Zero-copy sends: a response body from one TCP socket to another with ``splice(2)``, and a file into a
socket with ``sendfile(2)`` (Linux).

A large GET relayed through Python costs the gateway about 1 CPU-second per GB on top of the kernel's own
work (the HTTP parser's copy, stream buffers, one write per piece); on a node whose cores also feed GPUs
that halves what a reader gets. Splicing moves the bytes socket -> pipe -> socket inside the kernel, the
pages handed over by reference: the gateway's part drops to the syscalls themselves
(``docs/benchmarks.md``, "Zero-copy GET relay").

Theory of operation
-------------------
- The caller owns both sockets' protocol state: it has sent the response headers, taken what its HTTP
  parser already buffered of the body (written first, with plain ``send``), stopped the event loop reading
  the source, and will close the source connection afterwards (its parser never sees the spliced bytes).
- :class:`SpliceRelay` works on *duplicates* of the two descriptors: the loop's transports keep theirs and
  know nothing of the relay, and readiness waits register the duplicates (a loop refuses a reader on a
  descriptor its transport owns). Both sockets are already non-blocking (the duplicates share that flag).
- The pipe is non-blocking too and never asked to take more than its free space, so ``EAGAIN`` from a
  splice into it always means "the source has nothing yet" and from a splice out of it "the destination's
  send buffer is full": each is answered by waiting for exactly that readiness.
- :meth:`move` moves exactly ``n`` bytes and returns once they are in the destination socket. Waiting for
  the source is bounded by ``read_timeout_s`` (the store's silence, as for a relayed read); waiting for the
  destination is not (a slow reader is paced by TCP, as ``StreamResponse.write`` would be).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

PIPE_BYTES = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
# sendfile(2) errors that are the file's, not the socket's: raised as they are.
_FILE_ERRNOS = frozenset({errno.EIO, errno.EBADF, errno.EINVAL, errno.ENOMEM, errno.EOVERFLOW})


def splice_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "splice")


def plain_socket(transport: Any) -> socket.socket | None:
    """The transport's socket when it carries plain TCP (no TLS layer above it), else None."""
    if transport is None or transport.is_closing():
        return None
    if (
        transport.get_extra_info("sslcontext") is not None
        or transport.get_extra_info("ssl_object") is not None
    ):
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM:
        return None
    return sock  # type: ignore[no-any-return]


class SourceEnded(ConnectionError):
    """The source closed before the promised bytes arrived."""


class SourceTimeout(TimeoutError):
    """The source was silent for longer than the read timeout."""


class DestinationGone(ConnectionError):
    """The destination refused more bytes (reset, closed, broken pipe)."""


class SpliceRelay:
    """Moves bytes from ``src_fd`` to ``dst_fd`` through a pipe, on the running loop. Call :meth:`close`."""

    __slots__ = ("_cap", "_dst", "_in_pipe", "_loop", "_pr", "_pw", "_read_timeout_s", "_src", "delivered")

    def __init__(self, src_fd: int, dst_fd: int, read_timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._read_timeout_s = read_timeout_s
        self._src = self._dst = self._pr = self._pw = -1
        try:
            self._src = os.dup(src_fd)
            self._dst = os.dup(dst_fd)
            self._pr, self._pw = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except BaseException:
            self.close()
            raise
        # A capped pipe-max-size leaves the default pipe (64 KiB): it still works, with more syscalls.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._pw, _F_SETPIPE_SZ, PIPE_BYTES)
        self._cap = fcntl.fcntl(self._pw, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        self._in_pipe = 0
        self.delivered = 0  # bytes handed to the destination socket so far

    def close(self) -> None:
        for name in ("_src", "_dst", "_pr", "_pw"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    async def send(self, data: bytes | memoryview) -> None:
        """Write ``data`` to the destination (bytes the caller's parser had already read from the source)."""
        view = memoryview(data)
        while view:
            try:
                sent = os.write(self._dst, view)
            except BlockingIOError:
                await self._wait(want_read=False, want_write=True)
                continue
            except OSError as exc:
                raise DestinationGone(exc.errno, f"client connection: {exc.strerror}") from None
            view = view[sent:]
            self.delivered += sent

    async def move(self, n: int) -> None:
        """Move exactly ``n`` bytes from the source into the destination socket."""
        to_read = n
        while to_read or self._in_pipe:
            progressed = False
            if to_read and self._in_pipe < self._cap:
                try:
                    got = os.splice(
                        self._src, self._pw, min(to_read, self._cap - self._in_pipe), flags=_FLAGS
                    )
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise SourceEnded(exc.errno, f"store connection: {exc.strerror}") from None
                else:
                    if got == 0:
                        raise SourceEnded(errno.EPIPE, f"store closed the body {to_read} bytes short")
                    to_read -= got
                    self._in_pipe += got
                    progressed = True
            if self._in_pipe:
                try:
                    put = os.splice(self._pr, self._dst, self._in_pipe, flags=_FLAGS)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise DestinationGone(exc.errno, f"client connection: {exc.strerror}") from None
                else:
                    self._in_pipe -= put
                    self.delivered += put
                    progressed = progressed or put > 0
            if not progressed:
                can_read = bool(to_read) and self._in_pipe < self._cap
                await self._wait(want_read=can_read, want_write=self._in_pipe > 0)

    async def _wait(self, *, want_read: bool, want_write: bool) -> None:
        """Until the source is readable or the destination writable (whichever is asked for)."""
        if want_read and not want_write:
            try:
                await wait_ready(self._loop, read_fd=self._src, timeout_s=self._read_timeout_s)
            except TimeoutError:
                raise SourceTimeout(f"store sent nothing for {self._read_timeout_s:g} s") from None
        else:
            await wait_ready(
                self._loop,
                read_fd=self._src if want_read else None,
                write_fd=self._dst if want_write else None,
            )


async def wait_ready(
    loop: asyncio.AbstractEventLoop,
    *,
    read_fd: int | None = None,
    write_fd: int | None = None,
    timeout_s: float | None = None,
) -> None:
    """Until ``read_fd`` is readable or ``write_fd`` writable (an error or hang-up counts as ready: the next
    call on the descriptor reports it). Raises ``TimeoutError`` after ``timeout_s``."""
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if read_fd is not None:
        loop.add_reader(read_fd, ready)
    if write_fd is not None:
        loop.add_writer(write_fd, ready)
    try:
        async with asyncio.timeout(timeout_s):
            await fut
    finally:
        if read_fd is not None:
            loop.remove_reader(read_fd)
        if write_fd is not None:
            loop.remove_writer(write_fd)


async def run_settled(work: Awaitable[T]) -> T:
    """Await thread work that uses descriptors the caller closes once it returns. A cancelled caller cannot
    stop the thread, and closing a descriptor under a running ``sendfile(2)`` or ``pread(2)`` hands its
    number to the next file or socket opened, which the call then writes or reads. So the work goes on
    (shielded) and the cancellation is raised only once it is done; the wait is short (one call on a
    non-blocking socket or a page-cache read), and a repeated cancellation does not cut it."""
    job = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        while not job.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((job,))
        if not job.cancelled():
            job.exception()  # retrieved: the cancellation is what the caller sees
        raise


async def send_file(
    dst_fd: int,
    file_fd: int,
    offset: int,
    count: int,
    run_blocking: Callable[..., Awaitable[int]],
    *,
    on_sent: Callable[[int], object] | None = None,
) -> None:
    """Send ``count`` bytes of ``file_fd`` from ``offset`` into the socket ``dst_fd`` with ``sendfile(2)``.

    The loop's own ``sendfile`` is not there under uvloop, hence this. Each ``sendfile`` call runs through
    ``run_blocking`` (a thread: a page-cache miss must not stall the event loop), moves what the socket
    takes, and a full socket is waited for on the loop, on a duplicate of ``dst_fd`` (as in
    :class:`SpliceRelay`). Raises :class:`DestinationGone` when the peer refuses more, :class:`SourceEnded`
    when the file is shorter than promised.

    ``on_sent`` is told the bytes each ``sendfile`` call moved, as it returns: also for the call a
    cancellation waited for (:func:`run_settled`), whose bytes are on the wire all the same. An HTTP client
    cancels a request's body writer as soon as the answer is in, which may be before the coroutine here
    resumed after the call that sent the last bytes; a count kept by the caller after ``send_file`` returns
    would miss them."""
    loop = asyncio.get_running_loop()
    dst = os.dup(dst_fd)
    try:
        while count > 0:
            job = asyncio.ensure_future(run_blocking(os.sendfile, dst, file_fd, offset, count))
            try:
                sent = await run_settled(job)
            except asyncio.CancelledError:
                if on_sent is not None and not job.cancelled() and job.exception() is None:
                    on_sent(job.result())
                raise
            except BlockingIOError:
                await wait_ready(loop, write_fd=dst)
                continue
            except OSError as exc:
                if exc.errno in _FILE_ERRNOS:
                    raise
                raise DestinationGone(exc.errno, f"client connection: {exc.strerror}") from None
            if sent == 0:
                raise SourceEnded(errno.EPIPE, f"file ended {count} bytes short")
            if on_sent is not None:
                on_sent(sent)
            offset += sent
            count -= sent
    finally:
        os.close(dst)
