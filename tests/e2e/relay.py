"""A byte-counting TCP relay for tests: sits between the gateway and SeaweedFS on loopback.

It measures what really crosses the wire to and from the backend, independently of the gateway's own
accounting: bytes towards the backend (uploads) and from it (downloads), bucketed by wall-clock window.
It runs its own event loop in a thread, so synchronous clients (boto3) can drive load at the same time.

It can also play a backend outage: :meth:`CountingRelay.pause` stops listening (connections are refused) and
aborts every open connection; :meth:`CountingRelay.resume` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import time

RELAY_READ_BYTES = 64 * 1024
SOCKET_BUFFER_BYTES = 128 * 1024


class CountingRelay:
    def __init__(self, target_host: str, target_port: int, window_s: float = 1.0) -> None:
        self._target = (target_host, target_port)
        self.window_s = window_s
        self._lock = threading.Lock()
        # window index -> [bytes up (to backend), bytes down (from backend)]
        self._windows: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
        self._by_peer: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # both legs of every relayed connection
        self._paused = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self.port = 0

    def start(self, port: int = 0) -> None:
        """Listen on ``port`` (0: a free one; see :attr:`port`)."""
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(port), self._loop)
        fut.result(10)

    async def _start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port, limit=RELAY_READ_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    def pause(self) -> None:
        """The backend goes away: stop listening (new connections are refused) and abort open connections."""

        async def _pause() -> None:
            self._paused = True
            if self._server is not None:
                self._server.close()
                self._server = None
            for writer in list(self._open):
                writer.transport.abort()
            self._open.clear()

        asyncio.run_coroutine_threadsafe(_pause(), self._loop).result(10)

    def resume(self) -> None:
        """The backend is back: listen again on the same port."""

        async def _resume() -> None:
            await self._start(self.port)
            self._paused = False

        asyncio.run_coroutine_threadsafe(_resume(), self._loop).result(10)

    def stop(self) -> None:
        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _count(self, direction: int, n: int, peer: str) -> None:
        w = int(time.monotonic() / self.window_s)
        with self._lock:
            self._windows[w][direction] += n
            self._by_peer[peer][direction] += n

    def bytes_by_peer(self) -> dict[str, tuple[int, int]]:
        """(up, down) bytes so far per client address (the gateway's source address: network planes)."""
        with self._lock:
            return {peer: (up, down) for peer, (up, down) in self._by_peer.items()}

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: int, peer: str
    ) -> None:
        try:
            while True:
                data = await reader.read(RELAY_READ_BYTES)
                if not data:
                    break
                self._count(direction, len(data), peer)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if self._paused:  # accepted just before the listener closed
            c_writer.transport.abort()
            return
        try:
            b_reader, b_writer = await asyncio.open_connection(*self._target, limit=RELAY_READ_BYTES)
        except OSError:
            c_writer.close()
            return
        if self._paused:
            c_writer.transport.abort()
            b_writer.transport.abort()
            return
        # Small buffers on both legs: bytes are counted when the relay moves them, so what the relay may
        # hold ahead of the gateway's pace must stay small next to a window's worth of traffic.
        for w in (c_writer, b_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            w.transport.set_write_buffer_limits(high=RELAY_READ_BYTES)
        self._open.update((c_writer, b_writer))
        try:
            peer = str(c_writer.get_extra_info("peername")[0])
            await asyncio.gather(
                self._pipe(c_reader, b_writer, 0, peer), self._pipe(b_reader, c_writer, 1, peer)
            )
        finally:
            self._open.difference_update((c_writer, b_writer))

    def windows(self, since: float, until: float) -> list[tuple[int, int]]:
        """(up, down) bytes for every whole window between two time.monotonic() instants."""
        first = int(since / self.window_s) + 1
        last = int(until / self.window_s) - 1
        with self._lock:
            return [tuple(self._windows.get(w, [0, 0])) for w in range(first, last + 1)]  # type: ignore[misc]
