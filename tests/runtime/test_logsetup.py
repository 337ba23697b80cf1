"""Log formatting: JSON lines with the current request id, text with ``[rid=...]``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from s3lanes.logsetup import REQUEST_ID, configure_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_request_id_extra_fields_and_exceptions(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log = logging.getLogger("s3lanes.test")
    log.debug("not at INFO")
    token = REQUEST_ID.set("ABCDEF0123456789")
    try:
        log.warning("backend said %d", 503, extra={"bucket": "b", "lane": "dataset"})
    finally:
        REQUEST_ID.reset(token)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == "backend said 503"
    assert first["level"] == "WARNING" and first["logger"] == "s3lanes.test"
    assert first["request_id"] == "ABCDEF0123456789"
    assert first["bucket"] == "b" and first["lane"] == "dataset"
    assert first["ts"].endswith("Z") and first["ts"][10] == "T"
    assert "request_id" not in second
    assert "ValueError: boom" in second["exc"]


def test_request_ids_do_not_leak_between_tasks(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log = logging.getLogger("s3lanes.test")

    async def serve(rid: str) -> None:
        REQUEST_ID.set(rid)
        await asyncio.sleep(0)
        log.warning("done %s", rid)

    async def main() -> None:
        await asyncio.gather(*(serve(f"{i:016X}") for i in range(5)))
        log.warning("outside")

    asyncio.run(main())
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    for rec in records[:-1]:
        assert rec["msg"] == f"done {rec['request_id']}"
    assert "request_id" not in records[-1]


def test_text_format_appends_the_request_id(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("WARNING", "text", stream=out)
    token = REQUEST_ID.set("00000000000000AA")
    try:
        logging.getLogger("s3lanes.test").warning("slow backend")
    finally:
        REQUEST_ID.reset(token)
    line = out.getvalue().strip()
    assert line.endswith("s3lanes.test: slow backend [rid=00000000000000AA]"), line
