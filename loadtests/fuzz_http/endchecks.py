"""End checks: the backend against the ledger, uploads left open, files, the log."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.fuzz_http.ledger import Ledger, Stored
from loadtests.fuzz_http.options import (
    _TRACEBACK,
    FLUSH_STALL_WINDOWS,
    FLUSH_TIMEOUT_S,
    FLUSH_WINDOW_S,
    BackendSpec,
)
from loadtests.fuzz_http.rawhttp import Answer, Conn, Req, excerpt, md5_hex
from loadtests.fuzz_http.runstate import Run
from loadtests.fuzz_http.stack import s3_client

# --------------------------------------------------------------------------------------------------------
# End checks: the backend against the ledger, uploads left open, files, the log


@dataclass(slots=True)
class EndReport:
    flush: dict[str, Any] = field(default_factory=dict)
    backend_objects: int = 0
    ledger_objects: int = 0
    normalised: list[dict[str, str]] = field(default_factory=list)
    mangled: list[dict[str, str]] = field(default_factory=list)  # the store's own key mangling (see Ledger)
    partial: list[dict[str, str]] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    open_uploads: list[dict[str, str]] = field(default_factory=list)
    deliberate_uploads: int = 0
    new_files: list[str] = field(default_factory=list)
    unattributed_new_entries: list[str] = field(default_factory=list)
    tracebacks: list[dict[str, str]] = field(default_factory=list)
    gateway_exit_code: int | None = None
    crashes: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: str = ""
    gateway_logs: list[str] = field(default_factory=list)
    cleanup_error: str = ""
    spool_status: dict[str, Any] = field(default_factory=dict)  # when the flush did not end durable


async def exchange(run: Run, req: Req) -> Answer:
    """One request to the gateway on a connection of its own, and its answer."""
    conn = await Conn.open(run.host, run.port)
    try:
        await conn.send(req.wire())
        return await conn.answer(req.method)
    finally:
        await conn.close()


async def spool_status(run: Run) -> dict[str, Any]:
    """The gateway's own view of what is still pending (``GET /_s3lanes/status``, its spool section)."""
    ans = await exchange(run, Req("GET", "/_s3lanes/status", [("Host", run.host_header)]))
    try:
        doc = json.loads(ans.body)
    except ValueError:
        return {"http_status": ans.status, "body": excerpt(ans.body, 500)}
    return dict(doc.get("spool") or doc) if isinstance(doc, dict) else {"body": doc}


async def flush(run: Run) -> dict[str, Any]:
    """Wait until the spool has drained the run's bucket: ``POST /_s3lanes/flush`` in short windows, until
    it reports durable, or the pending count stops falling (an entry the drain can never upload: counted
    as missing by the backend check), or ``FLUSH_TIMEOUT_S`` is up."""
    began = time.monotonic()
    best: int | None = None
    stalled = 0
    doc: dict[str, Any] = {}
    while time.monotonic() - began < FLUSH_TIMEOUT_S:
        target = f"/_s3lanes/flush?bucket={run.bucket}&timeout={FLUSH_WINDOW_S:.0f}"
        ans = await exchange(run, Req("POST", target, [("Host", run.host_header), ("Content-Length", "0")]))
        try:
            doc = json.loads(ans.body)
        except ValueError:
            doc = {"body": excerpt(ans.body, 500)}
        doc["http_status"] = ans.status
        if doc.get("durable"):
            break
        pending = doc.get("pending_objects")
        if not isinstance(pending, int):
            break
        if best is None or pending < best:
            best, stalled = pending, 0
        else:
            stalled += 1
            if stalled >= FLUSH_STALL_WINDOWS:
                doc["stalled"] = True
                break
    doc["waited_s"] = round(time.monotonic() - began, 1)
    return doc


def check_backend(run: Run, backend: BackendSpec, report: EndReport) -> None:
    """Every object on the backend must be one a valid request completely wrote; nothing acknowledged
    may be missing; no multipart upload may be open that no case left open on purpose."""
    s3 = s3_client(backend)
    ledger = run.ledger
    seen: set[str] = set()
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=run.bucket):
            for obj in page.get("Contents", []):
                key, etag = obj["Key"], obj["ETag"].strip('"')
                report.backend_objects += 1
                stored = ledger.objects.get(key) if key not in ledger.uncertain else None
                if _mangled_by_store(ledger, key, obj["Size"], stored):
                    report.mangled.append({"key": key, "etag": etag, "size": str(obj["Size"])})
                    seen.add(key)
                    seen.update(
                        k for k in ledger.trailing_slash if key in (k, k + k.rstrip("/").rsplit("/", 1)[-1])
                    )
                    continue
                if stored is not None:
                    seen.add(key)
                    if etag == stored.etag:
                        continue
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                    if md5 == stored.md5:
                        continue
                    report.partial.append(
                        {"key": key, "etag": etag, "expected": stored.etag, "case": str(stored.case)}
                    )
                    continue
                if key in ledger.uncertain:
                    allowed = ledger.uncertain[key]
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                    if md5 in allowed:
                        seen.add(key)
                        continue
                    report.partial.append(
                        {"key": key, "etag": etag, "expected": f"one of {sorted(map(str, allowed))}"}
                    )
                    continue
                # Not in the ledger under this name: a store may keep odd keys under a normalised name.
                md5 = etag if re.fullmatch(r"[0-9a-f]{32}", etag) else ""
                if not md5:
                    md5 = md5_hex(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                original = ledger.odd_by_md5.get(md5)
                if original is not None and original in ledger.objects:
                    seen.add(original)
                    report.normalised.append({"sent": original, "stored": key})
                    continue
                report.partial.append(
                    {"key": key, "etag": etag, "expected": "no object (no valid write made it)"}
                )
        for key, stored in ledger.objects.items():
            if key not in seen and key not in ledger.trailing_slash and key not in ledger.uncertain:
                report.missing.append({"key": key, "md5": stored.md5, "case": str(stored.case)})
        for key, allowed in ledger.uncertain.items():
            if key not in seen and None not in allowed and key not in ledger.objects:
                report.missing.append({"key": key, "md5": f"one of {sorted(map(str, allowed))}", "case": "?"})
        open_ok = {upload_id for _, upload_id in ledger.open_uploads}
        report.deliberate_uploads = len(open_ok)
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=run.bucket):
            for up in page.get("Uploads", []):
                if up["UploadId"] not in open_ok and not up["Key"].startswith(
                    tuple(ledger.crash_cut_prefixes)
                ):
                    report.open_uploads.append({"key": up["Key"], "upload_id": up["UploadId"]})
    finally:
        s3.close()
    report.ledger_objects = len(ledger.objects)


def _mangled_by_store(ledger: Ledger, key: str, size: int, stored: Stored | None) -> bool:
    """SeaweedFS (4.x) keeps PUT "a/b/" with data as "a/b/b", and with a few bytes as an empty "a/b/"."""
    if key.endswith("/"):
        return key in ledger.trailing_slash and size == 0 and (stored is None or stored.size > 0)
    parent, _, name = key.rpartition("/")
    return bool(name) and parent.rpartition("/")[2] == name and parent + "/" in ledger.trailing_slash


def cleanup_bucket(backend: BackendSpec, bucket: str) -> str:
    """Empty and delete the run's bucket (when the store outlives the run). Best effort: '' or what failed.

    Keys go one by one (in the URL): a DeleteObjects document cannot carry keys with control characters.
    """
    s3 = s3_client(backend)
    try:
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for up in page.get("Uploads", []):
                s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    except Exception as exc:  # leftovers in a test store must not hide the run's figures
        return f"{type(exc).__name__}: {exc}"
    finally:
        s3.close()
    return ""


_LOG_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# A traceback of aiohttp's HTTP parser refusing bytes that are not HTTP: logged by aiohttp itself.
_PARSER_TRACEBACK = re.compile(
    r"_parser\.feed_data|http_exceptions\.(BadHttpMessage|BadStatusLine|LineTooLong|"
    r"InvalidHeader|BadHttpMethod|TransferEncodingError|ContentLengthError)"
)


_EXCEPTION_LINE = re.compile(r"^((?:[a-z_]\w*\.)*[A-Z]\w*)(?::\s*(.*))?$")


def traceback_kind(excerpt_text: str) -> str:
    """The last exception of a traceback and the start of its message (request ids and offsets dropped)."""
    lines = excerpt_text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _EXCEPTION_LINE.match(lines[i])
        if m:
            message = m.group(2) or ""
            if message.endswith("message:") and i + 1 < len(lines):  # aiohttp's: the reason is below
                message = lines[i + 1].strip()
            message = re.sub(r"\[rid=\w+\]|position \d+(-\d+)?|'\\udc[0-9a-f]{2}'", "", message)
            return f"{m.group(1)}: {message[:70]}".rstrip(": ")
    return lines[-1][:80] if lines else "?"


def scan_log(path: Path) -> list[dict[str, str]]:
    """Every log record of the gateway that carries a traceback: where it comes from, and an excerpt."""
    if not path.exists():
        return []
    records: list[list[str]] = []
    for line in path.read_text(errors="replace").splitlines():
        if _LOG_RECORD_START.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    out = []
    for rec in records:
        text = "\n".join(rec)
        if _TRACEBACK not in text:
            continue
        # aiohttp's server refusing bytes before any handler ran: logged from data_received.
        parser = "in data_received" in text and _PARSER_TRACEBACK.search(text) is not None
        origin = "aiohttp HTTP parser" if parser else "gateway"
        lines = rec if len(rec) <= 14 else [*rec[:3], "    ...", *rec[-10:]]
        out.append({"origin": origin, "excerpt": "\n".join(lines)[:3000]})
    return out
