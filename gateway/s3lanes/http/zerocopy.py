"""The zero-copy path of a relayed GET: the store's body spliced into the client's socket.

:func:`splice_eligible` says whether a backend answer may take it: a GET answered 200 or 206 with a
Content-Length of at least ``[server] zero_copy_min_bytes``, plain TCP on both sides (TLS needs the bytes
in user space), Linux. :func:`relay_spliced` then moves the body with
:class:`s3lanes.runtime.splice.SpliceRelay`, paced chunk by chunk through the lane exactly as the copying
relay is, and closes the store connection afterwards (its HTTP parser never saw the spliced bytes, so it
cannot be reused; for bodies this large a new connection is cheap next to the copy it saves).

Taking over the connections happens in one synchronous step, with no ``await`` in between: what the
response parser already buffered is taken, then the store connection stops reading. Anything the loop
buffered after that would be lost to the relay, and nothing can be, because the loop runs no reads in
between.
"""

from __future__ import annotations

import logging

from aiohttp import web

from s3lanes.config import BackendConfig
from s3lanes.runtime.backend import BackendResponse
from s3lanes.runtime.dispatcher import StreamBudget
from s3lanes.runtime.splice import (
    DestinationGone,
    SourceEnded,
    SourceTimeout,
    SpliceRelay,
    plain_socket,
    splice_supported,
)

log = logging.getLogger("s3lanes.proxy")

_SPLICE_STATUSES = frozenset({200, 206})


def splice_eligible(request: web.Request, resp: BackendResponse, min_bytes: int) -> bool:
    if min_bytes <= 0 or request.method != "GET" or resp.status not in _SPLICE_STATUSES:
        return False
    length = resp.content_length
    if length is None or length < min_bytes or not splice_supported():
        return False
    if resp.headers.get("Transfer-Encoding") or resp.content.exception() is not None:
        return False
    conn = resp.connection
    if conn is None or conn.protocol is None:
        return False
    return plain_socket(request.transport) is not None and plain_socket(conn.transport) is not None


async def relay_spliced(
    request: web.Request,
    resp: BackendResponse,
    budget: StreamBudget,
    chunk_bytes: int,
    backend: BackendConfig,
    key: str | None,
) -> tuple[int, bool] | None:
    """Relay the body after ``out.prepare()``: returns (bytes moved, completed). Not completed means the
    store failed mid-body and the client connection was aborted (the only honest signal once the headers
    are out). Raises ``ConnectionResetError`` when the client went away (its connection aborted). Returns
    None *without touching anything* when the client transport still holds unsent bytes (the caller then
    relays by copying)."""
    client_tr = request.transport
    conn = resp.connection
    assert (
        client_tr is not None
        and conn is not None
        and conn.transport is not None
        and conn.protocol is not None
    )
    if client_tr.get_write_buffer_size() > 0:
        return None
    client_sock = plain_socket(client_tr)
    store_sock = plain_socket(conn.transport)
    if client_sock is None or store_sock is None:
        return None
    total = resp.content_length
    assert total is not None
    # --- one synchronous step: take what the parser holds, stop the loop reading the store ---
    prefix = resp.content.read_nowait(-1)
    conn.protocol.pause_reading()
    try:
        relay = SpliceRelay(store_sock.fileno(), client_sock.fileno(), backend.read_timeout_s)
    except BaseException:
        resp.close()
        raise
    # The store connection keeps its configured receive buffer ([backend] recv_buffer_bytes): widening it
    # to a chunk made each splice move 4x more (about 0.1 s/GB less CPU on the dev VM) but let every
    # stream run up to a chunk ahead of its grants on the wire, enough to push a 1 s window's read share
    # of a 40 MB/s store 5 points off. Pacing on the wire comes first; a larger buffer is a config choice.
    try:
        if prefix:
            await budget.take(len(prefix))
            await relay.send(prefix)
        while relay.delivered < total:
            n = min(chunk_bytes, total - relay.delivered)
            await budget.take(n)
            await relay.move(n)
        return relay.delivered, True
    except (SourceEnded, SourceTimeout) as exc:
        log.warning("backend body failed mid-stream for %s: %s", key, exc)
        client_tr.abort()
        return relay.delivered, False
    except DestinationGone as exc:
        client_tr.abort()
        raise ConnectionResetError(str(exc)) from None
    finally:
        relay.close()
        resp.close()
