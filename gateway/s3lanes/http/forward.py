"""Several workers, one spool: the requests a worker hands to the worker that owns the spool.

Theory of operation
-------------------
With ``[server] workers = N`` and ``[spool] enabled``, worker 0 owns the spool, its journal and its drainer
(one process writes the journal, and ordering per key needs one place that sees every write of the key). It
also serves on an abstract unix socket (:func:`owner_address`), the same application as on the TCP listeners.
Every other worker authenticates a request as always (SigV4, limits), then asks :meth:`Forwarder.wants`
whether the spool may be involved; if so it relays the client's request to the owner unchanged (method,
target, headers, body bytes as they arrive) plus :data:`FORWARDED_HEADER`, and relays the owner's answer
back. The owner verifies the request again (the signature still holds: nothing signed changed) and answers it
as if it had arrived on its own listener: from the spool, into the spool, or from the store.

What is forwarded: writes in the spooled lanes, operations on the spool's multipart uploads (upload ids
``s3lanes-``), ListMultipartUploads (the drain's own uploads are hidden there), listings continuing one of the
spool's tokens, and any request of a bucket (or copy source) the spool may hold data of, according to the
summary the owner publishes in shared memory (``s3lanes.runtime.spool_summary``). Reads of buckets the spool
holds nothing of (the common case: dataset reads) are answered locally, with no round trip.

The owner trusts :data:`FORWARDED_HEADER` (the request id of the forwarding worker, kept in the logs and the
answer, and the client's address, which the admin endpoints' loopback rule looks at) only on its unix socket;
on a TCP listener the header means nothing, and it is never passed on to the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from s3lanes.core.routing import split_copy_source
from s3lanes.core.s3request import query_names
from s3lanes.errors import SlowDown
from s3lanes.runtime.spool_summary import SummaryReader, SummaryWriter

if TYPE_CHECKING:
    from s3lanes.core.s3request import S3Target
    from s3lanes.core.sigv4 import RequestView

log = logging.getLogger("s3lanes.forward")

FORWARDED_HEADER = "x-s3lanes-forwarded"
SPOOL_UPLOAD_PREFIX = "s3lanes-"  # s3lanes.http.spool_front.UPLOAD_ID_PREFIX
# Not relayed: hop-by-hop headers, and Expect (the forwarding worker answered 100-continue already).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        FORWARDED_HEADER,
    }
)
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length"}
RELAY_CHUNK_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 5.0
STATUS_TIMEOUT_S = 5.0


def owner_address(supervisor_pid: int) -> str:
    """The spool owner's unix socket, in a directory only this user can enter (:func:`make_socket_dir`).
    Not an abstract socket: aiohttp's client on uvloop cannot connect to those."""
    return os.path.join(socket_dir(supervisor_pid), "spool.sock")


def socket_dir(supervisor_pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"s3lanes-{os.getuid()}-{supervisor_pid}")


def make_socket_dir(supervisor_pid: int) -> str:
    """Create the directory of the owner's socket (mode 0700; the supervisor, before it forks). One left by a
    previous process of the same pid is reused only if it is ours and private."""
    _remove_stale_socket_dirs()
    path = socket_dir(supervisor_pid)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise OSError(f"{path} exists and is not a private directory of this user") from None
    return path


def _remove_stale_socket_dirs() -> None:
    """Socket directories of this user's supervisors that are gone (killed: nothing removed them)."""
    prefix = f"s3lanes-{os.getuid()}-"
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            pid = name[len(prefix) :]
            if not name.startswith(prefix) or not pid.isdigit() or _alive(int(pid)):
                continue
            path = os.path.join(tmp, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == os.getuid():
                    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def on_unix_socket(request: web.Request) -> bool:
    if request.transport is None:
        return False
    sockname = request.transport.get_extra_info("sockname")
    return isinstance(sockname, (str, bytes))


def _forwarded(request: web.Request) -> dict[str, str]:
    """The fields of :data:`FORWARDED_HEADER` on a request relayed on the owner's unix socket, else none."""
    value = request.headers.get(FORWARDED_HEADER)
    if value is None or not on_unix_socket(request):
        return {}
    fields = (part.partition("=") for part in value.split(";"))
    return {k.strip(): v.strip() for k, _, v in fields}


def forwarded_request_id(request: web.Request) -> str | None:
    """The forwarding worker's request id, from a request relayed on the owner's unix socket (else None)."""
    rid = _forwarded(request).get("rid", "")
    return rid if rid.isalnum() and len(rid) <= 64 else None


def forwarded_peer(request: web.Request) -> str | None:
    """The client's address, as the forwarding worker saw it (a request relayed on the unix socket only): the
    admin endpoints' loopback rule applies to the client, not to the relay."""
    return _forwarded(request).get("peer") or None


def write_hold(
    summary: SummaryWriter | None, bucket: str | None, method: str
) -> contextlib.AbstractContextManager[None]:
    """On the spool's owner: a request that may write marks its bucket in the summary until it is answered
    (GET and HEAD write nothing)."""
    if summary is None or bucket is None or method in ("GET", "HEAD"):
        return contextlib.nullcontext()
    return summary.hold(bucket)


class Forwarder:
    """A worker's relay to the spool's owner (see the module docstring)."""

    def __init__(
        self, address: str, summary: SummaryReader, spool_lanes: frozenset[str], retry_after_s: int
    ) -> None:
        self._address = address
        self._summary = summary
        self._lanes = spool_lanes
        self._retry_after_s = retry_after_s
        self._session: aiohttp.ClientSession | None = None

    def wants(self, t: S3Target, view: RequestView, lane: str) -> bool:
        """Whether the spool may be involved in this request (authenticated, in ``lane``): then the owner
        answers it."""
        if t.bucket is None:
            return False
        q = query_names(view.raw_query)
        if q.get("uploadId", "").startswith(SPOOL_UPLOAD_PREFIX) or t.operation == "ListMultipartUploads":
            return True
        if q.get("list-type") == "2" and q.get("continuation-token"):
            return True  # possibly one of the spool's tokens (merged listings): the owner tells
        if self._summary.may_hold(t.bucket):
            return True
        copy_source = view.headers.get("x-amz-copy-source")
        if copy_source is not None and self._summary.may_hold(split_copy_source(copy_source)[0]):
            return True
        if view.method in ("GET", "HEAD"):
            return False
        return lane in self._lanes

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._address, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def relay(self, request: web.Request, request_id: str) -> web.StreamResponse:
        """Send ``request`` to the owner as it came, stream the owner's answer back."""
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        client = peer[0] if isinstance(peer, (tuple, list)) and peer else ""
        headers.append((FORWARDED_HEADER, f"rid={request_id};peer={client}"))
        has_body = request.body_exists and request.method not in ("GET", "HEAD")
        try:
            resp = await self._client().request(
                request.method,
                f"http://spool-owner{request.raw_path}",
                headers=CIMultiDict(headers),
                data=_body(request) if has_body else None,
                allow_redirects=False,
                compress=False,
                chunked=None,
            )
        except aiohttp.ClientConnectorError as exc:
            # Not connected: the owner saw nothing of the request, so it is honest to say "retry".
            if request.body_exists and not request.content.is_eof() and request.transport is not None:
                # Part of the body may be gone: the connection cannot carry another request.
                request.transport.close()
            log.warning("the spool's worker did not take a forwarded request: %r", exc)
            raise SlowDown(
                "The worker holding the gateway's spool is not answering (restarting?); retry.",
                retry_after_s=self._retry_after_s,
            ) from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            # The owner went away with the request: it may have acknowledged (journaled) it or not. As a
            # crashed gateway would, cut the client's connection: its outcome is unknown, not refused.
            log.warning("the spool's worker went away during a forwarded request: %r", exc)
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("the spool's worker went away") from None
        try:
            out = web.StreamResponse(status=resp.status, reason=resp.reason)
            for name, value in resp.headers.items():
                if name.lower() not in _DROP_RESPONSE:
                    out.headers.add(name, value)
            if resp.content_length is not None:
                out.content_length = resp.content_length
            if request.body_exists and not request.content.is_eof():
                out.force_close()
            await out.prepare(request)
            if request.method != "HEAD" and resp.status not in (204, 304):
                try:
                    async for chunk, _ in resp.content.iter_chunks():
                        await out.write(chunk)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    log.warning("a forwarded answer failed mid-stream: %r", exc)
                    if request.transport is not None:
                        request.transport.abort()
                    return out
            await out.write_eof()
            return out
        finally:
            resp.release()

    async def owner_spool_status(self) -> dict[str, Any]:
        """The ``spool`` section of the owner's status (its own request on the unix socket)."""
        headers = {FORWARDED_HEADER: "rid=status;peer=127.0.0.1", "Host": "spool-owner"}
        try:
            async with self._client().get(
                "http://spool-owner/_s3lanes/status",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S),
            ) as resp:
                doc = await resp.json(content_type=None)
            spool = doc["spool"]
            if not isinstance(spool, dict):
                raise ValueError("no spool section")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as exc:
            return {"enabled": True, "owner_worker": 0, "unavailable": f"worker 0 does not answer: {exc!r}"}
        return {**spool, "owner_worker": 0}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._summary.close()


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    while True:
        chunk = await request.content.read(RELAY_CHUNK_BYTES)
        if not chunk:
            return
        yield chunk
