"""``s3lanes``: the command line. Loads config, installs uvloop, wires the pieces and runs them."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from s3lanes import __version__
from s3lanes.clock import SystemClock
from s3lanes.config import Config, Credential, load_config
from s3lanes.core.journal import JournalCorrupt
from s3lanes.durable import replace_file
from s3lanes.errors import ConfigError, StartupError
from s3lanes.http.admin import METRICS_PATH
from s3lanes.http.app import (
    ADMIN_KEY,
    ADMIN_URL_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    PROBE_KEY,
    ListenSockets,
    bind_listen_sockets,
    build_app,
    check_listen_addresses,
    drain_for_shutdown,
    sock_url,
    start_listeners,
    tls_context,
)
from s3lanes.http.status_page import PAGE_PATH
from s3lanes.logsetup import configure_logging
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.cluster import Board
from s3lanes.runtime.spool_lock import SpoolDirLock, lock_spool_dir
from s3lanes.runtime.wiring import spool_dir

log = logging.getLogger("s3lanes")

# How long the start waits for every backend's first answer before announcing itself (it serves anyway).
STARTUP_PROBE_WAIT_S = 3.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s3lanes", description="S3 gateway for GPU training clusters.")
    p.add_argument("--version", action="version", version=f"s3lanes {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, help="TOML configuration file")
    serve.add_argument("--listen", help="HTTP listener host:port (default 127.0.0.1:9000; '' disables)")
    serve.add_argument("--https-listen", help="HTTPS listener host:port (needs --tls-cert and --tls-key)")
    serve.add_argument("--tls-cert", help="PEM certificate chain for the HTTPS listener")
    serve.add_argument("--tls-key", help="PEM private key for the HTTPS listener")
    serve.add_argument(
        "--backend-endpoint", help="S3 endpoint URL of the backend (default: embedded SeaweedFS)"
    )
    serve.add_argument("--backend-region", help="region the backend expects in signatures")
    serve.add_argument("--state-dir", help="where the gateway keeps its state (embedded backend data, spool)")
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    serve.add_argument(
        "--ready-file",
        type=Path,
        help="write the bound endpoints as JSON to this file once serving (for scripts)",
    )
    status = sub.add_parser("status", help="show lanes, rates and queues of a running gateway")
    status.add_argument(
        "--url",
        default="http://127.0.0.1:9000",
        help="the gateway's endpoint (default http://127.0.0.1:9000)",
    )
    status.add_argument("--json", action="store_true", help="print the raw status document")
    status.add_argument(
        "--token",
        default=os.environ.get("S3LANES_SERVER_ADMIN_TOKEN"),
        help="the gateway's [server] admin_token, needed from another host"
        " (default: $S3LANES_SERVER_ADMIN_TOKEN)",
    )
    flush = sub.add_parser(
        "flush", help="wait until what the gateway's spool holds under bucket/prefix is on the backend"
    )
    flush.add_argument("--url", default="http://127.0.0.1:9000", help="the gateway's endpoint")
    flush.add_argument("--bucket", required=True)
    flush.add_argument("--prefix", default="", help="key prefix (default: the whole bucket)")
    flush.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    flush.add_argument(
        "--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), help="region to sign for"
    )
    return p


def flush_command(url: str, bucket: str, prefix: str, timeout_s: float, region: str) -> int:
    """POST /_s3lanes/flush; exit 0 when durable, 3 on timeout, 1 when the gateway cannot be asked.

    Signed with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY when they are set (needed from another host);
    loopback peers may flush unsigned.
    """
    import urllib.error
    import urllib.parse
    import urllib.request

    from s3lanes.core.sigv4 import EMPTY_SHA256, sign_headers

    query = urllib.parse.urlencode(
        {"bucket": bucket, "prefix": prefix, "timeout": f"{timeout_s:g}"}, quote_via=urllib.parse.quote
    )
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    path = "/_s3lanes/flush"
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256}
    access_key, secret_key = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if access_key and secret_key:
        headers.update(
            sign_headers(
                "POST",
                path,
                query,
                headers,
                access_key=access_key,
                secret_key=secret_key,
                region=region,
                payload_hash=EMPTY_SHA256,
                now_wall=time.time(),
            )
        )
    req = urllib.request.Request(
        f"{parts.scheme}://{parts.netloc}{path}?{query}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s + 30) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        if exc.code != 504:
            try:
                why = str(json.loads(body)["error"])
            except (ValueError, KeyError, TypeError):
                why = body[:300].decode(errors="replace").strip()
            print(f"s3lanes flush: {url} answered {exc.code}: {why}", file=sys.stderr)
            return 1
        doc = json.loads(body)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"s3lanes flush: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    where = f"s3://{bucket}/{prefix}"
    if doc.get("durable"):
        print(f"{where}: durable on the backend (waited {doc['waited_s']:.1f} s)")
        return 0
    age = doc.get("oldest_pending_age_s")
    print(
        f"{where}: NOT durable after {doc['waited_s']:.1f} s: {doc['pending_objects']} objects,"
        f" {doc['pending_bytes']} bytes pending" + (f", oldest acknowledged {age:.0f} s ago" if age else ""),
        file=sys.stderr,
    )
    return 3


def status_command(url: str, as_json: bool, token: str | None = None) -> int:
    """Fetch /_s3lanes/status and print it as a table (admin endpoints answer loopback peers, and others
    with the admin token)."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url.rstrip("/") + "/_s3lanes/status", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        why = exc.read()[:500].decode(errors="replace").strip()
        print(f"s3lanes status: {url} answered {exc.code}: {why}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"s3lanes status: cannot read {url}/_s3lanes/status: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    print(render_status(doc))
    return 0


# `s3lanes status` shows what the status page (s3lanes/http/ui/status.html) shows, under the same names and
# in the same units: these mirror the page's bytes(), rate(), pct() and secs() (binary units, one or two
# decimals), so a figure reads the same in a terminal and in the browser.
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
NONE = "\u2013"  # the page's en dash for "no figure"
TIMES = "\u00d7"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return NONE
    value, i = float(n), 0
    while abs(value) >= 1024 and i < len(_UNITS) - 1:
        value /= 1024
        i += 1
    digits = 0 if i == 0 else (2 if value < 10 else 1)
    return f"{value:.{digits}f} {_UNITS[i]}"


def fmt_rate(bps: float | None) -> str:
    return NONE if bps is None else fmt_bytes(bps) + "/s"


def fmt_pct(x: float | None) -> str:
    return NONE if x is None else f"{100 * x:.1f} %"


def fmt_secs(s: float | None) -> str:
    if s is None:
        return NONE
    if s < 60:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.1f} h"


def _guard_text(s: dict[str, Any]) -> str:
    g = float(s["guard_multiplier"])
    ttfb = s.get("read_baseline_ttfb_s")
    base = "" if ttfb is None else f", baseline TTFB {1000 * ttfb:.1f} ms"
    return (f"pacing writes {TIMES}{g:.2f}" if g < 1 else "not pacing") + base


def _failing(drain: dict[str, Any]) -> str:
    n = len(drain.get("failing") or ())
    return "20+" if n >= 20 else str(n)  # the status document lists at most 20


LANE_COLUMNS = ("lane", "queued", "in flight", "granted", "share", "allocation", "reservation", "ceiling")


def lane_cells(ln: dict[str, Any]) -> list[str]:
    """One lane's row, cell for cell as on the page (without its "delivered" column, a rate between two
    polls, and its notes)."""
    return [
        ln["name"],
        f"{ln['queued_tickets']} ({fmt_bytes(ln['queued_bytes'])})",
        f"{ln['inflight_tickets']} ({fmt_bytes(ln['inflight_bytes'])})",
        fmt_rate(ln["granted_rate_bps"]),
        fmt_pct(ln["achieved_share"]),
        fmt_rate(ln["allocation_bps"]),
        fmt_rate(ln["reservation_bps"]),
        "none" if ln["limit_bps"] is None else fmt_rate(ln["limit_bps"]),
    ]


def render_status(doc: dict[str, Any]) -> str:
    """The status document as text, with the status page's names, units and figures."""
    s = doc["scheduler"]
    cap_kind = "configured" if s["capacity_configured"] else "estimated"
    max_bytes = s.get("inflight_bytes_max")
    w = doc.get("worker")
    lines = [
        f"s3lanes v{doc['version']}"
        + ("" if w is None else f" (worker {w['index']} of {w['count']}, pid {w['pid']})"),
        f"Backend capacity: {fmt_rate(s['capacity_bps'])} ({cap_kind})",
        f"Reads active: {'yes' if s['reads_active'] else 'no'}",
        f"Write cap mode: {s['write_cap_mode']}",
        f"Latency guard: {_guard_text(s)}",
        f"Backend in flight: {s['inflight_tickets']} req, {fmt_bytes(s['inflight_bytes'])}"
        + ("" if max_bytes is None else f" of {fmt_bytes(max_bytes)}"),
    ]
    d = doc.get("dispatcher")
    if d is not None:
        lines.append(f"Waiting in the gateway: {d['waiting']} waiting, {d['in_flight']} granted")
    lines.append("")
    rows = [list(LANE_COLUMNS)] + [lane_cells(ln) for ln in s["lanes"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(LANE_COLUMNS))]
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    sp = doc.get("spool") or {}
    if sp.get("unavailable"):
        lines += ["", f"Write spool (held by worker {sp.get('owner_worker', 0)}): {sp['unavailable']}"]
    elif sp.get("enabled"):
        state = "degraded" if sp.get("degraded") else "full" if sp["full"] else "ok"
        cap = sp["capacity_bytes"]
        level = sp["used_bytes"] / cap if cap > 0 else 1.0
        reserved = sp.get("reserved_bytes") or 0
        drain = sp.get("drain") or None
        age = sp.get("oldest_pending_age_s")
        lines += [
            "",
            f"Write spool {sp['dir']}",
            f"  Used / capacity: {fmt_bytes(sp['used_bytes'])} of {fmt_bytes(cap)} ({fmt_pct(level)})"
            + (f" (+{fmt_bytes(reserved)} being written)" if reserved > 0 else ""),
            f"  State: {state}",
            f"  Pending objects: {sp['pending_objects']}",
            f"  Pending bytes: {fmt_bytes(sp['pending_bytes'])}",
            f"  Oldest pending: {'none' if age is None else fmt_secs(age)}",
            f"  Drain rate: {fmt_rate(sp.get('drain_rate_bps'))}",
            f"  Drain in flight: {NONE if drain is None else drain['in_flight']}",
            f"  Retrying (last error): {NONE if drain is None else _failing(drain)}",
            f"  Failed uploads (total): {NONE if drain is None else drain['uploads_failed']}",
            f"  Open multipart uploads: {sp['open_uploads']}",
        ]
        if sp.get("degraded"):
            lines.append(f"  DEGRADED: {sp['degraded']}")
        deadline = (drain or {}).get("deadline")
        if deadline:
            lines.append(f"  durability deadline: {deadline['status']}")
        for item in sp.get("pending_by_prefix", [])[:10]:
            lines.append(f"  s3://{item['bucket']}/{item['prefix']}: {fmt_bytes(item['bytes'])} pending")
    elif "spool" in doc:
        lines += ["", "Write spool: off"]
    return "\n".join(lines)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    server: dict[str, Any] = {}
    backend: dict[str, Any] = {}
    for flag, key in (
        ("listen", "listen"),
        ("https_listen", "https_listen"),
        ("tls_cert", "tls_cert"),
        ("tls_key", "tls_key"),
        ("state_dir", "state_dir"),
        ("log_level", "log_level"),
    ):
        value = getattr(args, flag)
        if value is not None:
            server[key] = value
    if args.backend_endpoint is not None:
        backend["endpoint"] = args.backend_endpoint
    if args.backend_region is not None:
        backend["region"] = args.backend_region
    return {"server": server, "backend": backend}


def embedded_credentials(state_dir: Path) -> tuple[Credential, ...]:
    """The key pair of the embedded backend: made once, kept (mode 0600) so restarts keep working clients."""
    path = state_dir / "embedded-credentials.json"
    if path.exists():
        doc = json.loads(path.read_text())
    else:
        state_dir.mkdir(parents=True, exist_ok=True)
        doc = {"access_key": "s3lanes-" + secrets.token_hex(6), "secret_key": secrets.token_urlsafe(30)}
        replace_file(path, json.dumps(doc).encode(), mode=0o600, tmp=path.with_suffix(".tmp"))
    return (Credential(doc["access_key"], doc["secret_key"], doc["access_key"], doc["secret_key"]),)


def _embedded_store(cfg: Config) -> tuple[Config, Any]:
    """The embedded SeaweedFS (not started yet) and the config with its credentials."""
    from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
    from s3lanes.seaweed.process import SeaweedProcess

    if not cfg.credentials:
        cfg = cfg.with_credentials(embedded_credentials(cfg.server.state_dir))
    identities = tuple(
        SeaweedIdentity(name=f"user{i}", access_key=c.backend_access_key, secret_key=c.backend_secret_key)
        for i, c in enumerate(cfg.credentials)
    )
    weed = SeaweedProcess(
        SeaweedOptions(
            state_dir=cfg.server.state_dir / "seaweedfs",
            identities=identities,
            s3_port=cfg.embedded.s3_port,
            startup_timeout_s=cfg.embedded.startup_timeout_s,
        )
    )
    log.info("starting embedded SeaweedFS in %s", cfg.server.state_dir / "seaweedfs")
    return cfg, weed


def _write_ready_file(ready_file: Path, doc: dict[str, Any]) -> None:
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, ready_file)


async def serve(
    cfg: Config,
    ready_file: Path | None,
    *,
    sockets: ListenSockets | None = None,
    ready_fd: int | None = None,
    cluster_board: Board | None = None,
    worker: tuple[int, int, int] | None = None,
) -> int:
    """Run the gateway until SIGTERM/SIGINT. A worker of a supervisor (s3lanes.runtime.workers) gets its
    listening ``sockets``, writes a byte to ``ready_fd`` once it serves, prints no banner and writes no
    ready file; its lanes share the node's budget through ``cluster_board`` (or the cluster's Redis);
    ``worker`` = (supervisor pid, index, count): its /metrics are the node's (NodeMetrics)."""
    clock = SystemClock()
    if sockets is None:
        # A taken port or an unreadable TLS key fails here, before anything starts (StartupError).
        check_listen_addresses(cfg)
    tls_context(cfg)
    if worker is not None and worker[1] != 0 and cfg.spool.enabled:
        # Worker 0 owns the spool; this one forwards what may touch it (s3lanes.http.forward).
        cfg = replace(cfg, spool=replace(cfg.spool, enabled=False))
        spooled_lanes: frozenset[str] | None = frozenset(cfg.spool.lanes)
    else:
        spooled_lanes = None
    # One gateway per spool directory, held until the process exits: before the store starts or the journal
    # is read, so a second gateway on the same spool changes nothing (StartupError).
    spool_lock: SpoolDirLock | None = lock_spool_dir(spool_dir(cfg)) if cfg.spool.enabled else None
    try:
        return await _serve_locked(
            cfg,
            ready_file,
            clock,
            sockets=sockets,
            ready_fd=ready_fd,
            cluster_board=cluster_board,
            worker=worker,
            spooled_lanes=spooled_lanes,
        )
    finally:
        if spool_lock is not None:
            spool_lock.release()


async def _serve_locked(
    cfg: Config,
    ready_file: Path | None,
    clock: SystemClock,
    *,
    sockets: ListenSockets | None,
    ready_fd: int | None,
    cluster_board: Board | None,
    worker: tuple[int, int, int] | None,
    spooled_lanes: frozenset[str] | None = None,
) -> int:
    weed = None
    endpoint = cfg.backend.endpoint
    if endpoint is None:
        cfg, weed = _embedded_store(cfg)
        await weed.astart()
        endpoint = weed.endpoint_url
        log.info("embedded SeaweedFS ready at %s (pid %s)", endpoint, weed.pid)

    backend = Backend(cfg.backend, endpoint, clock)
    forwarder = summary_path = unix_path = None
    if worker is not None and worker[2] > 1 and (cfg.spool.enabled or spooled_lanes is not None):
        from s3lanes.http.forward import Forwarder, owner_address
        from s3lanes.runtime.spool_summary import SummaryReader

        summary_path = cfg.server.state_dir / SPOOL_SUMMARY_FILE
        if spooled_lanes is not None:
            reader = SummaryReader(summary_path)
            forwarder = Forwarder(owner_address(worker[0]), reader, spooled_lanes, cfg.spool.retry_after_s)
            summary_path = None
        else:
            unix_path = owner_address(worker[0])
    app = build_app(
        cfg, backend, clock, cluster_board=cluster_board, forwarder=forwarder, summary_path=summary_path
    )
    runner = None
    node_metrics = None
    try:
        if worker is not None:
            from s3lanes.runtime.workers import NodeMetrics

            node_metrics = NodeMetrics(*worker, render=app[METRICS_KEY].render)
            await node_metrics.start()
            app[ADMIN_KEY].gather_metrics = node_metrics.gather
            app[ADMIN_KEY].worker = {"index": worker[1], "count": worker[2], "pid": os.getpid()}
        runner, urls = await start_listeners(cfg, app, sockets, unix_path=unix_path)
        await app[PROBE_KEY].wait_first_round(STARTUP_PROBE_WAIT_S)  # warns if a backend does not answer
        admin_url = app[ADMIN_URL_KEY].get("url")
        if ready_fd is None:
            _banner(
                cfg,
                urls,
                endpoint,
                embedded=weed is not None,
                silent=app[PROBE_KEY].never_answered(),
                admin_url=admin_url,
            )
        if ready_file is not None:
            doc = {"endpoints": urls, "backend": endpoint, "pid": os.getpid(), "admin": admin_url}
            _write_ready_file(ready_file, doc)

        app[LIFECYCLE_KEY].state = "ready"
        if ready_fd is not None:
            os.write(ready_fd, b"r")
            os.close(ready_fd)
        stop = asyncio.Event()
        again = asyncio.Event()  # a second signal skips the drain

        def on_signal() -> None:
            if stop.is_set():
                again.set()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        if weed is not None:
            waiters.append(asyncio.ensure_future(weed.wait_exit()))
        _done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        code = 0
        if not stop.is_set():
            log.error(
                "the embedded SeaweedFS exited unexpectedly; shutting down (logs in %s)",
                weed and weed.log_dir,
            )
            code = 1
        log.info("shutting down")
        if code == 0 and cfg.server.drain_on_shutdown_s > 0:
            await drain_for_shutdown(app, cfg.server.drain_on_shutdown_s, again)
        app[LIFECYCLE_KEY].state = "stopping"
        return code
    finally:
        if runner is not None:
            await runner.cleanup()
        if node_metrics is not None:
            await node_metrics.close()
        if weed is not None:
            await weed.astop()


# The spool summary of several workers (s3lanes.runtime.spool_summary), under [server] state_dir.
SPOOL_SUMMARY_FILE = "spool-summary"
# How long the supervisor waits for its workers to serve before it gives up.
WORKERS_START_TIMEOUT_S = 120.0


def supervise(cfg: Config, ready_file: Path | None) -> int:
    """``[server] workers`` > 1: bind the listeners, start the embedded store if any, run the workers on
    the listeners until SIGTERM (s3lanes.runtime.workers). No event loop runs in this process."""
    import uvloop

    from s3lanes.runtime.workers import FileBoard, Supervisor, clear_board

    tls_context(cfg)
    sockets = bind_listen_sockets(cfg)  # a taken port fails here (StartupError), before anything starts
    weed = None
    socket_dir: str | None = None
    try:
        if cfg.backend.endpoint is None:
            cfg, weed = _embedded_store(cfg)
            weed.start()
            cfg = replace(cfg, backend=replace(cfg.backend, endpoint=weed.endpoint_url))
            log.info("embedded SeaweedFS ready at %s (pid %s)", weed.endpoint_url, weed.pid)
        endpoint = cfg.backend.endpoint
        assert endpoint is not None
        board_dir = cfg.server.state_dir / "workers-board"
        clear_board(board_dir)
        if cfg.spool.enabled:
            from s3lanes.http.forward import make_socket_dir
            from s3lanes.runtime.spool_summary import create_summary

            create_summary(cfg.server.state_dir / SPOOL_SUMMARY_FILE)
            socket_dir = make_socket_dir(os.getpid())
        shared = tuple(lane for lane in cfg.cluster.lanes if lane in cfg.lanes)
        supervisor_pid = os.getpid()

        def run_worker(index: int, ready_fd: int) -> int:
            wcfg = replace(
                cfg, cluster=replace(cfg.cluster, node_id=f"{cfg.cluster.node_id}.w{index}", lanes=shared)
            )
            # The node's board; with [cluster] redis_url beside it (the cluster's write budget).
            board = FileBoard(board_dir, SystemClock()) if shared else None
            return int(
                uvloop.run(
                    serve(
                        wcfg,
                        None,
                        sockets=sockets,
                        ready_fd=ready_fd,
                        cluster_board=board,
                        worker=(supervisor_pid, index, cfg.server.workers),
                    )
                )
            )

        s = cfg.server
        sup = Supervisor(
            s.workers, run_worker, stop_timeout_s=s.shutdown_grace_s + s.drain_on_shutdown_s + 15.0
        )
        sup.start()
        if not sup.wait_ready(WORKERS_START_TIMEOUT_S):
            log.error("the workers did not all start; stopping")
            sup.stop()
            return 1
        urls = [
            sock_url(sock, scheme)
            for sock, scheme in ((sockets.http, "http"), (sockets.https, "https"))
            if sock is not None
        ]
        _banner(cfg, urls, endpoint, embedded=weed is not None, silent=[])
        print(f"{s.workers} workers (pids {', '.join(map(str, sup.pids()))})", flush=True)
        if ready_file is not None:
            _write_ready_file(
                ready_file,
                {"endpoints": urls, "backend": endpoint, "pid": os.getpid(), "workers": sup.pids()},
            )
        code = sup.run(should_stop=lambda: weed is not None and weed.returncode is not None)
        if weed is not None and weed.returncode is not None:
            log.error("the embedded SeaweedFS exited unexpectedly; stopped (logs in %s)", weed.log_dir)
            code = 1
        return code
    finally:
        sockets.close()
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
        if weed is not None:
            weed.stop()


def _banner(
    cfg: Config,
    urls: list[str],
    backend: str,
    *,
    embedded: bool,
    silent: list[str],
    admin_url: str | None = None,
) -> None:
    url = urls[0]
    admin = admin_url or url
    lines = [
        f"s3lanes {__version__} serving S3 on " + ", ".join(urls),
        f"backend: {backend}" + (" (embedded SeaweedFS)" if embedded else ""),
        f"status page: {admin}{PAGE_PATH}  metrics: {admin}{METRICS_PATH}"
        "  (loopback peers: docs/operations.md)",
    ]
    if silent:
        ready = "not ready until they do" if cfg.server.ready_requires_backend else "ready anyway"
        lines.append(f"WARNING: no answer yet from backend {', '.join(silent)}; {ready} (see the log)")
    if embedded:
        c = cfg.credentials[0]
        lines += [
            "credentials of the embedded backend (paste into a shell):",
            f"  export AWS_ACCESS_KEY_ID={shlex.quote(c.access_key)}"
            f" AWS_SECRET_ACCESS_KEY={shlex.quote(c.secret_key)} AWS_ENDPOINT_URL={shlex.quote(url)}",
            "  aws s3 mb s3://demo",
        ]
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        return status_command(args.url, args.json, args.token)
    if args.command == "flush":
        return flush_command(args.url, args.bucket, args.prefix, args.timeout, args.region)
    try:
        cfg = load_config(args.config, overrides=_overrides(args))
    except ConfigError as exc:
        if len(exc.problems) == 1:
            print(f"s3lanes: invalid configuration: {exc.problems[0]}", file=sys.stderr)
        else:
            print(f"s3lanes: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.server.log_level, cfg.server.log_format)
    import uvloop

    try:
        if cfg.server.workers > 1:
            return supervise(cfg, args.ready_file)
        return int(uvloop.run(serve(cfg, args.ready_file)))
    except StartupError as exc:
        print(f"s3lanes: {exc}", file=sys.stderr)
        return 2
    except JournalCorrupt as exc:
        log.critical(
            "the spool journal is damaged (%s). Refusing to start: acknowledged writes could be lost."
            " Inspect %s (move its journal aside to start empty, losing what it held).",
            exc,
            spool_dir(cfg),
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
