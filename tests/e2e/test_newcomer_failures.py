"""What a new user runs into, as they run it: ``s3lanes`` as a subprocess, and for each mistake one clear line
on stderr, exit status 2 for a gateway that cannot start, no traceback and no "Unclosed client session"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from s3lanes.__main__ import _banner
from s3lanes.config import Config, Credential
from tests.e2e.conftest import Gateway, start_gateway, start_plain_gateway, stop_and_check, stop_gateway

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NOISE = ("Traceback", "Unclosed", "invalid literal", "could not convert")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``s3lanes serve`` with an external (closed) backend and one key, plus ``args`` and ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("S3LANES_")}
    full_env.update(
        S3LANES_BACKEND_ENDPOINT=f"http://127.0.0.1:{closed_port()}",
        S3LANES_CREDENTIALS="AKNEWCOMER:newcomer-secret",
        S3LANES_SERVER_STATE_DIR=str(tmp / "state"),
        **(env or {}),
    )
    return subprocess.run(
        [sys.executable, "-m", "s3lanes", "serve", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


def assert_one_clear_line(out: subprocess.CompletedProcess[str], expected: str, code: int = 2) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    for noise in NOISE:
        assert noise not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("s3lanes")]
    assert len(errors) == 1, out.stderr
    assert expected in errors[0], out.stderr


def test_a_port_already_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = serve(tmp_path, "--listen", f"127.0.0.1:{port}")
    assert_one_clear_line(out, f"s3lanes: cannot listen on 127.0.0.1:{port}: the address is already in use")
    assert "--listen" in out.stderr
    assert "spool recovery" not in out.stderr  # refused before anything started


@pytest.mark.parametrize("problem", ["garbage", "mismatch"])
def test_a_garbage_tls_key_or_one_of_another_certificate(tmp_path: Path, problem: str) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    if problem == "garbage":
        key_path.write_text("not a key\n")
        expected = "cannot load them: not a PEM certificate chain and its PEM private key"
    else:
        ca.issue_cert("other").private_key_pem.write_to_path(str(key_path))
        expected = "cannot load them: the key does not match the certificate"
    out = serve(
        tmp_path,
        "--listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--tls-cert",
        str(cert_path),
        "--tls-key",
        str(key_path),
    )
    assert_one_clear_line(out, f"s3lanes: [server] tls_cert {cert_path}, tls_key {key_path}: {expected}")


def test_config_pointing_at_a_directory(tmp_path: Path) -> None:
    out = serve(tmp_path, "--config", str(tmp_path))
    assert_one_clear_line(
        out, f"s3lanes: invalid configuration: {tmp_path}: is a directory; --config takes a TOML file"
    )


def test_a_misspelled_environment_variable_is_refused_like_a_toml_typo(tmp_path: Path) -> None:
    out = serve(tmp_path, env={"S3LANES_SEVER_LISTEN": "127.0.0.1:0"})
    assert_one_clear_line(
        out,
        "environment S3LANES_SEVER_LISTEN: unknown setting (did you mean S3LANES_SERVER_LISTEN?)",
    )


def test_config_errors_speak_of_settings_not_python(tmp_path: Path) -> None:
    out = serve(
        tmp_path,
        env={"S3LANES_SERVER_MAX_HEADER_BYTES": "8k", "S3LANES_SPOOL_MAX_AGE_S": "soon"},
    )
    assert out.returncode == 2
    for noise in NOISE:
        assert noise not in out.stderr, out.stderr
    assert "[server].max_header_bytes: expected a whole number, got '8k'" in out.stderr
    assert "[spool].max_age_s: expected a number, got 'soon'" in out.stderr
    assert out.stderr.count("got ") == 2, out.stderr


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_an_unreachable_backend_is_warned_about_and_keeps_the_gateway_not_ready(tmp_path: Path) -> None:
    toml = f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp_path / "state"}"
shutdown_grace_s = 2

[backend]
endpoint = "http://127.0.0.1:{closed_port()}"

[[credentials]]
access_key = "AKNEWCOMER"
secret_key = "newcomer-secret"
"""
    proc, ready, log_path = start_gateway(tmp_path, toml)
    try:
        url = ready["endpoints"][0]
        assert http_get(f"{url}/_s3lanes/healthz")[0] == 200
        assert http_get(f"{url}/_s3lanes/readyz") == (503, "waiting for backend default to answer\n")
    finally:
        assert stop_gateway(proc) == 0
    log = log_path.read_text()
    assert "WARNING: no answer yet from backend default; not ready until they do" in log
    assert "backend default (http://127.0.0.1:" in log and "does not answer" in log
    assert "Traceback" not in log

    toml = toml.replace("shutdown_grace_s = 2", "shutdown_grace_s = 2\nready_requires_backend = false")
    proc, ready, log_path = start_gateway(tmp_path, toml)
    try:
        assert http_get(f"{ready['endpoints'][0]}/_s3lanes/readyz") == (200, "ready\n")
    finally:
        assert stop_gateway(proc) == 0


class FakeStatus:
    """An HTTP server that answers /_s3lanes/status only with the right bearer token, as a remote gateway
    does (loopback peers of a real gateway are always let in, so the token cannot be shown against one)."""

    def __init__(self, token: str) -> None:
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization")
                outer.seen.append(auth)
                if auth == f"Bearer {token}":
                    body, status = json.dumps({"version": "x", "state": "ready"}).encode(), 200
                else:
                    body, status = b"admin endpoints answer loopback peers, and others that send ...\n", 403
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_status_passes_the_admin_token_and_shows_the_403_text() -> None:
    fake = FakeStatus("t" * 20)
    try:
        base = [sys.executable, "-m", "s3lanes", "status", "--url", fake.url, "--json"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("S3LANES_")}
        ok = subprocess.run([*base, "--token", "t" * 20], env=env, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and json.loads(ok.stdout)["state"] == "ready", ok.stderr
        via_env = subprocess.run(
            base,
            env={**env, "S3LANES_SERVER_ADMIN_TOKEN": "t" * 20},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert via_env.returncode == 0, via_env.stderr
        refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
        assert_one_clear_line(refused, "answered 403: admin endpoints answer loopback peers", code=1)
        assert fake.seen == [f"Bearer {'t' * 20}", f"Bearer {'t' * 20}", None]
    finally:
        fake.close()


@pytest.fixture
def spool_gateway(seaweed: Any, tmp_path: Path) -> Iterator[Gateway]:
    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url)
    try:
        yield gw
    finally:
        stop_and_check(proc, gw)


def test_flush_of_a_bucket_that_does_not_exist_does_not_say_durable(
    spool_gateway: Gateway, unique_bucket: str
) -> None:
    base = [sys.executable, "-m", "s3lanes", "flush", "--url", spool_gateway.http_url, "--timeout", "5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("S3LANES_", "AWS_"))}
    missing = subprocess.run(
        [*base, "--bucket", "no-such-bucket-here"], env=env, capture_output=True, text=True, timeout=60
    )
    assert_one_clear_line(
        missing, "answered 404: no bucket named 'no-such-bucket-here' on the backend", code=1
    )
    assert "durable" not in missing.stdout
    there = subprocess.run(
        [*base, "--bucket", unique_bucket], env=env, capture_output=True, text=True, timeout=60
    )
    assert there.returncode == 0 and "durable on the backend" in there.stdout, there.stderr


def test_a_second_gateway_on_the_same_spool_directory_is_refused(
    spool_gateway: Gateway, tmp_path: Path, unique_bucket: str
) -> None:
    """The fixture's gateway holds tmp_path/state/spool; a second one on that state directory (another port)
    is refused with one line and exit 2, before it starts anything, and the first keeps serving."""
    lock = tmp_path / "state" / "spool" / "lock"
    assert lock.exists()
    out = serve(tmp_path, "--listen", "127.0.0.1:0")
    assert_one_clear_line(out, f"s3lanes: the spool directory {tmp_path / 'state' / 'spool'} is in use by")
    assert "two gateways cannot share a spool" in out.stderr
    assert "spool recovery" not in out.stderr  # refused before the journal was read
    assert lock.exists()  # the refused one takes nothing away
    s3 = spool_gateway.client()
    s3.put_object(Bucket=unique_bucket, Key="ckpt/after-refusal", Body=b"x")
    assert s3.get_object(Bucket=unique_bucket, Key="ckpt/after-refusal")["Body"].read() == b"x"


def test_the_spool_lock_is_released_when_the_gateway_exits(seaweed: Any, tmp_path: Path) -> None:
    """A stopped (here: killed) gateway leaves the lock file but not the lock: the next one starts."""
    proc, _ = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url)
    proc.kill()
    proc.wait(timeout=30)
    proc2, gw2 = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url)
    try:
        assert gw2.client().list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        stop_and_check(proc2, gw2)


def test_metrics_carry_build_info_and_no_created_series(spool_gateway: Gateway) -> None:
    status, text = http_get(f"{spool_gateway.http_url}/metrics")
    assert status == 200
    assert 's3lanes_build_info{python="' in text and 'version="' in text
    assert "_created" not in text


def test_the_banner_names_the_status_page_and_metrics_and_prints_pasteable_credentials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = Config(credentials=(Credential("s3lanes-ab12", "se/cr+et$x", "s3lanes-ab12", "se/cr+et$x"),))
    _banner(cfg, ["http://127.0.0.1:9000"], "http://127.0.0.1:8333", embedded=True, silent=[])
    out = capsys.readouterr().out
    assert "status page: http://127.0.0.1:9000/_s3lanes/" in out
    assert "metrics: http://127.0.0.1:9000/metrics" in out
    (export,) = [line.strip() for line in out.splitlines() if line.strip().startswith("export ")]
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f'{export}; printf "%s|%s|%s" "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" "$AWS_ENDPOINT_URL"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.stdout == "s3lanes-ab12|se/cr+et$x|http://127.0.0.1:9000"


def test_make_help_lists_the_targets() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for target in ("run", "test", "check", "conformance"):
        assert f"make {target} " in out.stdout


def test_the_state_directory_is_git_ignored() -> None:
    out = subprocess.run(
        ["git", "check-ignore", "-q", ".s3lanes/embedded-credentials.json"], cwd=REPO, timeout=30
    )
    assert out.returncode == 0
