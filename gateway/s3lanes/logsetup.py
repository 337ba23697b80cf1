"""Logging: human text or one JSON object per line, with the request id of the request being served.

The request id is the one the gateway echoes in ``x-amz-request-id`` and in S3 error bodies; it is held in a
context variable that the HTTP layer sets at the start of each request, so every record logged while serving
it (by any module) carries it without passing it around. aiohttp runs each request in its own task, and tasks
copy the context they are created in, so ids never leak between requests.

Steady state is quiet at INFO: start, stop, recovery and configuration changes are logged; a request is
logged only when it fails on the gateway's side (5xx) or the backend misbehaves.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("s3lanes_request_id", default=None)

# LogRecord attributes that are not "extra" fields given by the caller.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "request_id", "taskName"}
)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id"?, "exc"?, ...extra}``, one line per record.

    ``ts`` is RFC 3339 UTC with milliseconds. Fields passed with ``extra=`` are included as they are (made
    JSON-safe with ``str`` where needed)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> [rid=<request id>]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{text} [rid={rid}]" if rid else text


class _QuietBadRequests(logging.Filter):
    """aiohttp logs every request its HTTP parser rejects at ERROR with a traceback, so any client could fill
    the log. Those become one line at DEBUG (dropped unless DEBUG is on); the client got its 400 anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "aiohttp.server" or not record.exc_info or record.exc_info[1] is None:
            return True
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1]
        if not isinstance(exc, HttpProcessingError):
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.msg, record.args = "rejected a malformed HTTP request: %s", (str(exc).strip()[:200],)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def configure_logging(level: str, fmt: str = "text", stream: Any = None) -> None:
    """Install one stderr handler on the root logger (replacing any), at ``level``, as text or JSON."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_QuietBadRequests())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log is off (the runner is built with access_log=None); its server errors stay.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _rfc3339(ts: float) -> str:
    secs = int(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int((ts - secs) * 1000):03d}Z"
