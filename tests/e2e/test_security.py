"""Security basics: TLS verification towards an https backend, and secrets kept out of logs, metrics, status
pages and error bodies."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import s3_client
from tests.e2e.conftest import start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e


class TlsFront:
    """TLS in front of SeaweedFS's plain S3 port, with a certificate from the test CA (a real chain)."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self._target_port = target_port
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(str(cert), str(key))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self._ctx)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            br, bw = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            w.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(r, bw), pipe(br, w))

    def stop(self) -> None:
        async def _stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module")
def tls_backend(seaweed: Any, tls_ca: tuple[Path, Path, Path]) -> Iterator[str]:
    _ca, cert, key = tls_ca
    front = TlsFront(int(seaweed.endpoint_url.rsplit(":", 1)[1]), cert, key)
    front.start()
    try:
        yield f"https://127.0.0.1:{front.port}"
    finally:
        front.stop()


@pytest.mark.parametrize("mode", ["default", "ca_file", "verify_off"])
def test_https_backend_certificates_are_verified_by_default(
    seaweed: Any, tls_backend: str, tls_ca: tuple[Path, Path, Path], tmp_path: Path, mode: str, bucket: str
) -> None:
    ca, _cert, _key = tls_ca
    extra = {"default": "", "ca_file": f'ca_file = "{ca}"\n', "verify_off": "verify_tls = false\n"}[mode]
    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=tls_backend, extra_toml=extra)
    try:
        s3 = gw.client()
        if mode == "default":
            # The test CA is not in the system's trust store: the gateway refuses the store's certificate.
            with pytest.raises(ClientError) as info:
                s3.head_bucket(Bucket=bucket)
            assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        else:
            s3.put_object(Bucket=bucket, Key="tls", Body=b"over tls", **{"ContentType": "text/plain"})
            gw.flush(bucket)
            assert s3.get_object(Bucket=bucket, Key="tls")["Body"].read() == b"over tls"
    finally:
        stop_and_check(proc, gw)
    if mode == "default":
        assert "certificate" in gw.log_path.read_text().lower()


ADMIN_TOKEN = "admin-token-" + os.urandom(8).hex()


def test_secrets_never_appear_in_logs_metrics_status_or_errors(
    seaweed: Any, tmp_path: Path, bucket: str
) -> None:
    proc, gw = start_plain_gateway(
        tmp_path,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        server_toml=f'log_level = "DEBUG"\nlog_format = "json"\nadmin_token = "{ADMIN_TOKEN}"\n',
    )
    wrong_secret = "wrong-" + os.urandom(12).hex()
    seen: list[str] = []
    try:
        s3 = gw.client()
        s3.put_object(Bucket=bucket, Key="k", Body=b"data")
        gw.flush(bucket)
        s3.get_object(Bucket=bucket, Key="k")["Body"].read()
        bad = gw.client(secret=wrong_secret)
        for call in (
            lambda: bad.get_object(Bucket=bucket, Key="k"),
            lambda: bad.put_object(Bucket=bucket, Key="k2", Body=b"x"),
            lambda: s3.get_object(Bucket=bucket, Key="missing"),
        ):
            with pytest.raises(ClientError) as info:
                call()
            seen.append(json.dumps(info.value.response, default=str))
        presigned = gw.client(secret=wrong_secret, signature_version="s3v4").generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "k"}
        )
        try:
            urllib.request.urlopen(presigned, timeout=10)
        except urllib.error.HTTPError as exc:
            with exc:
                seen.append(exc.read().decode(errors="replace"))
        for path in ("/_s3lanes/metrics", "/_s3lanes/status", "/metrics"):
            req = urllib.request.Request(
                gw.http_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                seen.append(resp.read().decode())
    finally:
        stop_and_check(proc, gw)
    seen.append(gw.log_path.read_text(errors="replace"))
    seen.append((tmp_path / "ready.json").read_text())
    everything = "\n".join(seen)
    assert "SignatureDoesNotMatch" in everything  # the failures did happen and were answered
    for secret in (gw.secret_key, wrong_secret, ADMIN_TOKEN, seaweed.admin.secret_key):
        assert secret not in everything, "a secret leaked"
    # And the backend itself never saw the wrong secret's requests as accepted ones.
    assert s3_client(seaweed).get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"


@pytest.mark.parametrize(
    ("target", "headers", "code"),
    [
        ("/{bucket}/huge", {"Content-Length": str(6 * 1024**3)}, "EntityTooLarge"),
        ("/{bucket}/part?partNumber=10001&uploadId=x", {"Content-Length": "1"}, "InvalidArgument"),
        (
            "/{bucket}/many",
            {**{f"x-amz-meta-h{i}": "v" for i in range(150)}, "Content-Length": "1"},
            "RequestHeaderSectionTooLarge",
        ),
    ],
    ids=["object-over-5GiB", "part-number-10001", "150-headers"],
)
def test_limits_answer_s3_errors_before_any_upload(
    gateway: Any, backend: Any, bucket: str, target: str, headers: dict[str, str], code: str
) -> None:
    from tests.e2e import s3raw

    path = target.format(bucket=bucket)
    signed = s3raw.sign(
        "PUT",
        gateway.http_url,
        path,
        headers,
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash="UNSIGNED-PAYLOAD",
    )
    resp = s3raw.send(gateway.http_url, "PUT", path, signed, b"x")
    assert (resp.status, resp.error_code) == (400, code), resp.body[:400]
    assert "Contents" not in backend.list_objects_v2(Bucket=bucket)
