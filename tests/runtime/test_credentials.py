"""The backend identity from the AWS credential chain (s3lanes/runtime/credentials.py), in the shell: what a
request towards the store carries when the chain hands out temporary credentials with a session token.

The store here is a small aiohttp server that records the request and checks its signature with the
gateway's own verifier (SeaweedFS refuses session tokens it did not issue; the end-to-end refresh against
SeaweedFS is tests/e2e/test_backend_credentials.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from s3lanes.clock import SystemClock
from s3lanes.config import BackendConfig, Credential
from s3lanes.core.sigv4 import RequestView, parse_auth, verify
from s3lanes.errors import StartupError
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.credentials import (
    REFRESH_MAX_INTERVAL_S,
    REFRESH_MIN_INTERVAL_S,
    ChainCredentials,
    SigningIdentity,
)

CLIENT = Credential("client-ak", "client-sk", "client-backend-ak", "client-backend-sk")
SECRETS = {
    "ROTAK": "rotated-secret",
    "ENVAK": "env-secret",
    "STATICAK": "static-secret",
    "client-backend-ak": "client-backend-sk",
}


@pytest.fixture
def chain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
async def store() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A recording endpoint that answers 200 when the SigV4 signature verifies, 403 otherwise."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        view = RequestView(request.method, request.raw_path.partition("?")[0], request.query_string, headers)
        auth = parse_auth(view)
        assert auth is not None
        verify(view, auth, SECRETS[auth.access_key], SystemClock().wall())
        seen.append({"headers": headers, "access_key": auth.access_key, "signed": auth.signed_headers})
        return web.Response(status=200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def _get(backend: Backend) -> None:
    await backend.start()
    try:
        resp = await backend.request("GET", backend.target("b", "k", ""), {}, CLIENT)
        assert resp.status == 200
        resp.release()
    finally:
        await backend.close()


async def test_a_session_token_from_the_chain_is_sent_and_signed(
    chain_env: None, monkeypatch: pytest.MonkeyPatch, store: tuple[str, list[dict[str, Any]]]
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVAK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "the-session-token")
    url, seen = store
    await _get(Backend(BackendConfig(endpoint=url, credential_source="aws"), url, SystemClock()))
    (req,) = seen
    assert req["access_key"] == "ENVAK"
    assert req["headers"]["x-amz-security-token"] == "the-session-token"
    assert "x-amz-security-token" in req["signed"]


async def test_each_request_is_signed_with_the_snapshot_current_when_it_is_sent(
    chain_env: None, monkeypatch: pytest.MonkeyPatch, store: tuple[str, list[dict[str, Any]]]
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVAK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    url, seen = store
    backend = Backend(BackendConfig(endpoint=url, credential_source="aws"), url, SystemClock())
    await backend.start()
    try:
        for rotate in (False, True):
            if rotate:  # what a refresh does: a new snapshot, all three values at once
                assert backend.chain is not None
                backend.chain._snapshot = SigningIdentity("ROTAK", "rotated-secret", "token-2")
            resp = await backend.request("GET", backend.target("b", "k", ""), {}, CLIENT)
            assert resp.status == 200
            resp.release()
    finally:
        await backend.close()
    assert [r["access_key"] for r in seen] == ["ENVAK", "ROTAK"]
    assert "x-amz-security-token" not in seen[0]["headers"]
    assert seen[1]["headers"]["x-amz-security-token"] == "token-2"


async def test_static_keys_in_the_config_win_over_the_chain(
    chain_env: None, monkeypatch: pytest.MonkeyPatch, store: tuple[str, list[dict[str, Any]]]
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVAK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    url, seen = store
    cfg = BackendConfig(
        endpoint=url, credential_source="aws", access_key="STATICAK", secret_key="static-secret"
    )
    await _get(Backend(cfg, url, SystemClock()))
    (req,) = seen
    assert req["access_key"] == "STATICAK"
    assert "x-amz-security-token" not in req["headers"]


async def test_without_a_source_requests_are_signed_as_the_client_keys_backend_identity(
    store: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = store
    await _get(Backend(BackendConfig(endpoint=url), url, SystemClock()))
    assert seen[0]["access_key"] == "client-backend-ak"


async def test_an_empty_chain_is_a_startup_error_naming_the_backend(chain_env: None) -> None:
    chain = ChainCredentials("archive")
    with pytest.raises(StartupError, match=r"\[backends.archive\] credential_source = 'aws': no AWS cred"):
        await chain.start()


def test_refresh_checks_come_at_half_the_remaining_lifetime_within_bounds() -> None:
    chain = ChainCredentials("default")
    assert chain.next_check_in(0.0) is None  # nothing resolved / static: never

    class Expiring:
        def __init__(self, at: float) -> None:
            import datetime

            self._expiry_time = datetime.datetime.fromtimestamp(at, datetime.UTC)

    chain._creds = Expiring(1000.0)
    assert chain.next_check_in(990.0) == 5.0
    assert chain.next_check_in(999.5) == REFRESH_MIN_INTERVAL_S
    assert chain.next_check_in(0.0) == REFRESH_MAX_INTERVAL_S
