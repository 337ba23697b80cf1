"""The operator page at ``/_s3lanes/`` in headless Chromium, against real ``s3lanes serve`` processes.

The browser is Debian's ``chromium`` (``apt-get install -y chromium``) driven by Playwright; the suite never
runs ``playwright install`` (it downloads a browser build, and CI has no network for that). A missing
Chromium fails the tests with that instruction rather than skipping them.

Three gateways: the session ``spool_gateway`` (page loads clean, shows the live lanes), a module gateway
whose backend bandwidth is low so spooled writes stay pending for seconds (the page's counts move without a
reload), and one per test with the spool off, stopped by pid (the page says it is stale). Access (403 to a
non-loopback peer) is checked in-process with aiohttp's mocked requests: every listener here is loopback.

Screenshots go to ``results/`` (git-ignored) for a human to look at.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, sync_playwright

from s3lanes.clock import SystemClock
from s3lanes.config import load_config
from s3lanes.http.app import build_app
from s3lanes.runtime.backend import Backend
from tests.e2e.conftest import Gateway, slow_spool_toml, start_plain_gateway, stop_and_check, stop_gateway

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RESULTS = Path(__file__).resolve().parents[2] / "results"
# The page polls once a second; a value must show within a few polls (the machine is small and shared).
SHOWS_WITHIN_MS = 8_000

# The slow gateway: 2 MB/s to the backend and one drain upload at a time, so SLOW_OBJECTS objects of
# SLOW_OBJECT_BYTES stay pending for about 4 s, several polls. Latency target as in test_spool.py: the
# 2-core machine cannot miss it by CPU contention alone, so the guard does not cut the checkpoint lane.
SLOW_RATE_BPS = 2_000_000
SLOW_OBJECTS = 4
SLOW_OBJECT_BYTES = 2 * MiB
SLOW_TOML = slow_spool_toml(SLOW_RATE_BPS, drain_concurrency=1)
NO_SPOOL_TOML = """
[spool]
enabled = false
"""


# --- browser -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} not found: the status page tests need Debian's chromium package"
            " (apt-get install -y chromium)",
            pytrace=False,
        )
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page and what went wrong on it: console errors, uncaught exceptions, failed or refused requests."""

    page: Page
    problems: list[str] = field(default_factory=list)
    navigations: int = 0

    def check_clean(self) -> None:
        assert self.problems == [], self.problems


def open_page(browser: Browser, url: str) -> Watched:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    w = Watched(page)

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type in ("error", "warning"):
            w.problems.append(f"console {msg.type}: {msg.text}")

    def on_response(resp: Response) -> None:
        if resp.status >= 400:
            w.problems.append(f"HTTP {resp.status} for {resp.url}")

    def on_failed(req: Request) -> None:
        w.problems.append(f"request failed: {req.url}: {req.failure}")

    def on_navigated(frame: Any) -> None:
        if frame == page.main_frame:
            w.navigations += 1

    page.on("console", on_console)
    page.on("pageerror", lambda exc: w.problems.append(f"page error: {exc}"))
    page.on("response", on_response)
    page.on("requestfailed", on_failed)
    page.on("framenavigated", on_navigated)
    page.goto(url)
    wait_live(page)
    return w


def wait_live(page: Page) -> None:
    page.wait_for_selector("#conn[data-state='live']", timeout=SHOWS_WITHIN_MS)


def value(page: Page, selector: str) -> str:
    got = page.locator(selector).get_attribute("data-value")
    assert got is not None, selector
    return got


def wait_value(page: Page, element_id: str, condition: str) -> None:
    """Wait until ``Number(data-value)`` of ``#element_id`` satisfies ``condition`` (a JS expression in v)."""
    page.wait_for_function(
        f"() => {{ const el = document.getElementById({element_id!r});"
        " if (!el || el.dataset.value === '') return false;"
        f" const v = Number(el.dataset.value); return {condition}; }}",
        timeout=SHOWS_WITHIN_MS,
    )


def screenshot(page: Page, name: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    page.screenshot(path=str(RESULTS / name), full_page=True)


# --- access and routing, in-process (every real listener here is loopback) ----------------------------------


def _app(*, admin_open: bool) -> web.Application:
    endpoint = "http://127.0.0.1:9"  # never contacted: the app is not started
    cfg = load_config(
        None,
        env={"S3LANES_CREDENTIALS": "AKSTATUSPAGE:not-a-secret"},
        overrides={
            "backend": {"endpoint": endpoint},
            "spool": {"enabled": False},
            "server": {"admin_open": admin_open},
        },
    )
    clock = SystemClock()
    return build_app(cfg, Backend(cfg.backend, endpoint, clock), clock)


async def _get(app: web.Application, path: str, peer_ip: str) -> web.StreamResponse:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer_ip, 40000) if name == "peername" else default
    )
    request = make_mocked_request("GET", path, app=app, transport=transport)
    match = await app.router.resolve(request)
    # The page's own route answers, not the catch-all S3 route ("_s3lanes" is never a bucket name).
    assert match.route.resource is not None and match.route.resource.canonical == path
    return await match.handler(request)


async def test_page_answers_403_to_a_non_loopback_peer_unless_admin_is_open_like_the_status_json() -> None:
    closed, opened = _app(admin_open=False), _app(admin_open=True)
    for path in ("/_s3lanes/", "/_s3lanes"):
        assert (await _get(closed, path, "10.20.30.40")).status == 403
        assert (await _get(closed, path, "192.168.1.7")).status == 403
        assert (await _get(closed, path, "127.0.0.1")).status in (200, 301)
        assert (await _get(closed, path, "::1")).status in (200, 301)
        assert (await _get(opened, path, "10.20.30.40")).status in (200, 301)

    page = await _get(closed, "/_s3lanes/", "127.0.0.1")
    assert isinstance(page, web.Response) and isinstance(page.text, str)
    assert page.content_type == "text/html"
    csp = page.headers["Content-Security-Policy"]
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", csp)
    assert nonce is not None, csp
    assert f"style-src 'nonce-{nonce.group(1)}'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "connect-src 'self'" in csp
    assert page.text.count(f'nonce="{nonce.group(1)}"') == 2
    assert page.headers["Cache-Control"] == "no-store"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    again = await _get(closed, "/_s3lanes/", "127.0.0.1")
    assert nonce.group(1) not in again.headers["Content-Security-Policy"], (
        "the nonce must change per response"
    )
    # No external asset of any kind: clusters are often air-gapped.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text)

    redirect = await _get(closed, "/_s3lanes", "127.0.0.1")
    assert redirect.status == 301 and redirect.headers["Location"] == "_s3lanes/"


# --- in the browser ----------------------------------------------------------------------------------------


def test_page_loads_clean_and_shows_the_lanes_and_spool_of_the_live_status_json(
    spool_gateway: Gateway, browser: Browser
) -> None:
    # The bare path redirects to the page, which polls the JSON at the relative URL "status".
    w = open_page(browser, f"{spool_gateway.http_url}/_s3lanes")
    page = w.page
    try:
        assert page.url == f"{spool_gateway.http_url}/_s3lanes/"
        doc = spool_gateway.status()
        lanes = [ln["name"] for ln in doc["scheduler"]["lanes"]]
        assert set(lanes) >= {"dataset", "checkpoint"}
        rows = page.locator("#lanes tbody tr")
        assert [rows.nth(i).get_attribute("data-lane") for i in range(rows.count())] == lanes
        for name in lanes:
            assert page.locator(f"#lanes tr[data-lane='{name}'] td").first.inner_text() == name
        assert value(page, "#version") == doc["version"]
        assert float(value(page, "#capacity")) == pytest.approx(doc["scheduler"]["capacity_bps"], rel=0.5)
        dataset = next(ln for ln in doc["scheduler"]["lanes"] if ln["name"] == "dataset")
        target = dataset["reservation_bps"] / doc["scheduler"]["capacity_bps"]
        assert float(value(page, "#read-target")) == pytest.approx(target, rel=0.01)
        assert page.locator("#spool").get_attribute("data-enabled") == "true"
        assert page.locator("#spool-on").is_visible() and not page.locator("#spool-off").is_visible()
        assert value(page, "#spool-state") == "ok"
        assert (
            "MiB" in page.locator("#capacity").inner_text() or "GiB" in page.locator("#capacity").inner_text()
        )
        # A few more polls, each drawing a point of history, still without an error or a failed request.
        page.wait_for_function(
            "() => Number(document.getElementById('hist-drain').dataset.points) >= 3", timeout=SHOWS_WITHIN_MS
        )
        w.check_clean()
    finally:
        page.close()


@pytest.fixture(scope="module")
def slow_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("status-page-slow-gateway")
    proc, gw = start_plain_gateway(tmp, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=SLOW_TOML)
    try:
        yield gw
    finally:
        stop_and_check(proc, gw)


def test_pending_checkpoint_writes_show_on_the_open_page_and_go_back_to_zero_after_the_drain(
    slow_gateway: Gateway, browser: Browser, bucket: str
) -> None:
    gw = slow_gateway
    w = open_page(browser, f"{gw.http_url}/_s3lanes/")
    page = w.page
    try:
        wait_value(page, "spool-pending-objects", "v === 0")
        page.evaluate("() => { window.notReloaded = true; }")
        s3 = gw.client()
        for n in range(SLOW_OBJECTS):
            resp = s3.put_object(
                Bucket=bucket, Key=f"ckpt/step-1/shard-{n}", Body=os.urandom(SLOW_OBJECT_BYTES)
            )
            assert resp["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"
            assert resp["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-lane") == "checkpoint"

        wait_value(page, "spool-pending-objects", "v > 0")
        wait_value(page, "spool-pending-bytes", f"v > 0 && v <= {SLOW_OBJECTS * SLOW_OBJECT_BYTES}")
        wait_value(page, "spool-oldest", "v > 0")
        wait_value(page, "spool-drain-rate", "v > 0")
        assert "MiB" in page.locator("#spool-pending-bytes").inner_text()
        assert int(value(page, "#drain-in-flight")) <= 1
        ckpt = "#lanes tr[data-lane='checkpoint'] td[data-field='granted']"
        page.wait_for_function(
            f'() => Number(document.querySelector("{ckpt}").dataset.value) > 0', timeout=SHOWS_WITHIN_MS
        )
        assert gw.status()["spool"]["pending_objects"] > 0, (
            "the drain finished before the checks: not pending"
        )
        screenshot(page, "status_page_draining.png")

        gw.flush(bucket)
        wait_value(page, "spool-pending-objects", "v === 0")
        wait_value(page, "spool-pending-bytes", "v === 0")
        assert page.locator("#spool-oldest").inner_text() == "none"
        assert page.evaluate("() => window.notReloaded === true"), "the page was reloaded"
        assert w.navigations == 1
        assert int(page.locator("#hist-drain").get_attribute("data-points") or 0) >= 3
        w.check_clean()
    finally:
        page.close()


def test_page_without_a_spool_says_so_and_marks_itself_stale_when_the_gateway_stops(
    seaweed: Any, browser: Browser, tmp_path: Path
) -> None:
    proc, gw = start_plain_gateway(
        tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=NO_SPOOL_TOML
    )
    try:
        w = open_page(browser, f"{gw.http_url}/_s3lanes/")
    except BaseException:
        stop_gateway(proc)
        raise
    page = w.page
    try:
        assert page.locator("#spool").get_attribute("data-enabled") == "false"
        assert page.locator("#spool-off").is_visible() and not page.locator("#spool-on").is_visible()
        assert page.locator("#hist-drain").get_attribute("data-points") == "0"
        assert "no spool" in page.locator("#hist-drain-max").inner_text()
        assert page.locator("#lanes tbody tr").count() == len(gw.status()["scheduler"]["lanes"])
        w.check_clean()
        assert page.locator("#conn").get_attribute("data-state") == "live"

        assert stop_gateway(proc) == 0
        page.wait_for_selector("#conn[data-state='stale']", timeout=SHOWS_WITHIN_MS)
        assert "STALE" in page.locator("#conn").inner_text()
        assert "stale" in (page.locator("body").get_attribute("class") or "")
        # The last values stay on screen (dimmed), so the operator sees what was last known.
        assert page.locator("#lanes tbody tr").count() > 0
        screenshot(page, "status_page_stale.png")
    finally:
        page.close()
        stop_gateway(proc)
    assert "Traceback" not in gw.log_path.read_text(errors="replace")


# --- the page and `s3lanes status` read one document the same way ------------------------------------------


def _with_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The live document with figures in every unit range (B to GiB, seconds to hours) and a cut guard."""
    s = doc["scheduler"]
    s.update(capacity_bps=123_456_789, guard_multiplier=0.5, inflight_tickets=3, inflight_bytes=7 * MiB + 5)
    for i, ln in enumerate(s["lanes"]):
        ln.update(
            queued_tickets=i + 2,
            queued_bytes=(i + 1) * 3 * MiB + 17,
            inflight_tickets=i,
            inflight_bytes=(i + 1) * 900,
            granted_rate_bps=(i + 1) * 12_345_678,
            achieved_share=0.1234 * (i + 1) % 1,
            allocation_bps=(i + 1) * 20_000_000,
            reservation_bps=(i + 1) * 5_000_000,
            limit_bps=None if i == 0 else 99_000_000,
        )
    doc["spool"].update(
        used_bytes=5 * 2**30 + 3 * MiB,
        capacity_bytes=40 * 2**30,
        reserved_bytes=0,
        full=False,
        degraded=None,
        pending_objects=1234,
        pending_bytes=3 * 2**30 + 1234,
        oldest_pending_age_s=5432.1,
        drain_rate_bps=45_678_901,
    )
    return doc


def test_cli_status_and_the_page_show_the_same_figures_for_one_document(
    spool_gateway: Gateway, browser: Browser
) -> None:
    from s3lanes.__main__ import LANE_COLUMNS, render_status

    doc = _with_figures(spool_gateway.status())
    assert doc["spool"]["enabled"] and doc["spool"].get("drain") is not None
    text = render_status(doc)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        # The page reads this very document instead of the live one.
        page.route("**/_s3lanes/status", lambda route: route.fulfill(json=doc))
        page.goto(f"{spool_gateway.http_url}/_s3lanes/")
        wait_live(page)
        wait_value(page, "spool-pending-objects", "v === 1234")
        lines = text.splitlines()
        # Every figure of the page's scheduler and spool panels, under the page's own label, in the CLI text.
        for dd in page.locator("dl dd[id]").all():
            label = dd.evaluate(
                "el => el.previousElementSibling ? el.previousElementSibling.textContent : ''"
            )
            if not label:
                continue
            shown = dd.inner_text()
            assert any(line.strip() == f"{label}: {shown}" for line in lines), (label, shown, text)
        for needle in ("1234", "3.00 GiB", "1.5 h", "43.6 MiB/s", "117.7 MiB/s (", "writes \u00d70.50"):
            assert needle in text
        # The lanes table: the same column names, and the same cells for every lane.
        heads = [th.inner_text() for th in page.locator("#lanes thead th").all()]
        assert [h for h in heads if h in LANE_COLUMNS] == list(LANE_COLUMNS)
        for ln in doc["scheduler"]["lanes"]:
            row = page.locator(f"#lanes tr[data-lane='{ln['name']}']")
            cli_row = next(line for line in lines if re.split(r"\s{2,}", line.strip())[0] == ln["name"])
            cells = [row.locator("td").nth(0).inner_text()] + [
                row.locator(f"td[data-field='{f.replace(' ', '_')}']").inner_text() for f in LANE_COLUMNS[1:]
            ]
            assert re.split(r"\s{2,}", cli_row.strip()) == cells
    finally:
        page.close()
