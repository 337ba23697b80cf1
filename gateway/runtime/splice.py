"""Zero-copy relay of a response body from one TCP socket to another with ``splice(2)`` (Linux).

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
import sys

PIPE_BYTES = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


def splice_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "splice")


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
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        if want_read:
            self._loop.add_reader(self._src, ready)
        if want_write:
            self._loop.add_writer(self._dst, ready)
        try:
            if want_read and not want_write:
                try:
                    async with asyncio.timeout(self._read_timeout_s):
                        await fut
                except TimeoutError:
                    raise SourceTimeout(f"store sent nothing for {self._read_timeout_s:g} s") from None
            else:
                await fut
        finally:
            if want_read:
                self._loop.remove_reader(self._src)
            if want_write:
                self._loop.remove_writer(self._dst)
