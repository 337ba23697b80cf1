"""A case: its randomness, its keys, its connection, and the exchanges it makes (:class:`Case`)."""

from __future__ import annotations

import hashlib
import hmac
import random
import time
from collections.abc import Sequence
from urllib.parse import quote

from loadtests.fuzz_http.findings import OK, Expect, expect
from loadtests.fuzz_http.ledger import Stored
from loadtests.fuzz_http.options import ACCESS_KEY, REGION, SMALL_BODY_BYTES, WRITE_THROUGH, T
from loadtests.fuzz_http.rawhttp import Answer, Conn, Req, md5_hex, sha256_hex
from loadtests.fuzz_http.runstate import Run
from s3lanes.core.sigv4 import (
    UNSIGNED_PAYLOAD,
    canonical_query,
    canonical_uri,
    sign_headers,
    signing_key,
)

# --------------------------------------------------------------------------------------------------------
# A case: its randomness, its keys, its connection, and the exchanges it makes


class Case:
    """One case: a few exchanges on one connection, all on keys under ``<marker>/c<index>/``."""

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.index = index
        self.rng = random.Random(f"{run.opts.seed}-{index}")
        self.prefix = f"{run.marker}/c{index:05d}/"
        self.kind = ""
        self._conn: Conn | None = None
        self.uploads: list[tuple[str, str]] = []  # (key, upload id) of every upload this case created
        self.generation = run.generation  # gateway restarts before this case began
        self.saw_no_answer = False

    # -- names and bodies ------------------------------------------------------------------------------------

    def key(self, name: str = "obj") -> str:
        return self.prefix + name

    def size(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.75:
            return self.rng.randint(1, 4096)
        if r < 0.92:
            return self.rng.randint(4097, 64 * 1024)
        if r < 0.985:
            return self.rng.randint(SMALL_BODY_BYTES + 1, 600 * 1024)  # the streaming (held-back) path
        return self.rng.randint(1024 * 1024, 2 * 1024 * 1024)

    def body(self, size: int | None = None) -> bytes:
        n = self.size() if size is None else size
        return self.rng.randbytes(n)

    def path(self, key: str | None, bucket: str | None = None) -> str:
        out = "/" + (bucket or self.run.bucket)
        if key is not None:
            out += "/" + quote(key, safe="/~", errors="surrogateescape")
        return out

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    # -- building requests -----------------------------------------------------------------------------------

    def signed(
        self,
        method: str,
        key: str | None = None,
        *,
        query: str = "",
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        payload: str | None = None,
        raw_path: str | None = None,
        host: str | None = None,
        when: float | None = None,
        access_key: str = ACCESS_KEY,
        secret: str | None = None,
        bucket: str | None = None,
        content_length: bool | None = None,
    ) -> Req:
        """A SigV4-signed request (header auth) as a well-behaved client sends it."""
        raw_path = raw_path if raw_path is not None else self.path(key, bucket)
        host = host if host is not None else self.run.host_header
        lowered = {"host": host}
        for name, value in headers:
            lowered[name.lower()] = value
        payload_hash = payload if payload is not None else sha256_hex(body)
        auth = sign_headers(
            method,
            raw_path,
            query,
            lowered,
            access_key=access_key,
            secret_key=secret if secret is not None else self.run.secret_key,
            region=REGION,
            payload_hash=payload_hash,
            now_wall=when if when is not None else time.time(),
        )
        out = [("Host", host), *headers]
        out += [
            ("x-amz-date", auth["x-amz-date"]),
            ("x-amz-content-sha256", auth["x-amz-content-sha256"]),
            ("Authorization", auth["authorization"]),
        ]
        if content_length or (content_length is None and (body or method in ("PUT", "POST"))):
            out.append(("Content-Length", str(len(body))))
        target = raw_path + (f"?{query}" if query else "")
        return Req(method, target, out, body)

    def presigned(
        self,
        method: str,
        key: str,
        *,
        expires_s: int = 300,
        when: float | None = None,
        extra_query: str = "",
        secret: str | None = None,
    ) -> Req:
        """A presigned-URL request (query auth, ``UNSIGNED-PAYLOAD``), as botocore's presigned URLs are."""
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when if when is not None else time.time()))
        scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
        params = [
            ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            ("X-Amz-Credential", f"{ACCESS_KEY}/{scope}"),
            ("X-Amz-Date", amz_date),
            ("X-Amz-Expires", str(expires_s)),
            ("X-Amz-SignedHeaders", "host"),
        ]
        query = "&".join(f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in params)
        if extra_query:
            query += "&" + extra_query
        raw_path = self.path(key)
        host = self.run.host_header
        creq = "\n".join(
            [
                method,
                canonical_uri(raw_path),
                canonical_query(query),
                f"host:{host}\n",
                "host",
                UNSIGNED_PAYLOAD,
            ]
        )
        sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{sha256_hex(creq.encode())}"
        skey = signing_key(secret if secret is not None else self.run.secret_key, amz_date[:8], REGION, "s3")
        signature = hmac.new(skey, sts.encode(), hashlib.sha256).hexdigest()
        query += f"&X-Amz-Signature={signature}"
        return Req(method, f"{raw_path}?{query}", [("Host", host)])

    # -- exchanges -------------------------------------------------------------------------------------------

    async def connection(self, fresh: bool = False) -> Conn:
        if self._conn is not None and (fresh or not self._conn.usable):
            await self._conn.close()
            self._conn = None
        if self._conn is None:
            self._conn = await Conn.open(self.run.host, self.run.port)
        return self._conn

    @property
    def conn_usable(self) -> bool:
        return self._conn is not None and self._conn.usable

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def x(
        self,
        step: str,
        req: Req | bytes,
        exp: Expect,
        *,
        method: str | None = None,
        half_close: bool = False,
        fresh: bool = False,
    ) -> Answer:
        """Send one request (as it is) and read its answer; classify the answer."""
        data = req.wire() if isinstance(req, Req) else req
        verb = method or (req.method if isinstance(req, Req) else "GET")
        conn = await self.connection(fresh)
        await conn.send(data, half_close=half_close)
        ans = await conn.answer(verb)
        if half_close:
            conn.usable = False
        self.run.classify(self, step, verb, data, ans, exp)
        return ans

    async def pipeline(self, step: str, reqs: Sequence[Req], exps: Sequence[Expect]) -> list[Answer]:
        """Send several requests in one write, then read their answers in order."""
        conn = await self.connection(fresh=True)
        data = b"".join(r.wire() for r in reqs)
        await conn.send(data)
        answers = []
        for i, (r, exp) in enumerate(zip(reqs, exps, strict=True)):
            ans = await conn.answer(r.method) if conn.usable else Answer(None, error="closed")
            self.run.classify(self, f"{step}[{i}]", r.method, r.wire(), ans, exp)
            answers.append(ans)
        return answers

    # -- valid operations and the checks that nothing was lost ----------------------------------------------

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        write_through: bool = False,
        step: str = "put",
        headers: Sequence[tuple[str, str]] = (),
        payload: str | None = None,
    ) -> bool:
        """A valid PUT; recorded in the ledger once acknowledged."""
        hdrs = [*headers, *([WRITE_THROUGH] if write_through else [])]
        ans = await self.x(step, self.signed("PUT", key, headers=hdrs, body=body, payload=payload), OK)
        return self.after_write(key, body, ans)

    def after_write(self, key: str, body: bytes, ans: Answer, *, etag: str | None = None) -> bool:
        if ans.status is not None and 200 <= ans.status < 300:
            self.run.ledger.put(key, md5_hex(body), etag or md5_hex(body), len(body), self.index)
            return True
        if ans.status is None:
            self.run.ledger.maybe(key, md5_hex(body))
        return False

    async def check(self, key: str, step: str = "read-back", *, same_conn: bool = True) -> None:
        """GET ``key`` and compare with the ledger: the object a valid write left, or 404.

        On a connection a hostile request used before, this is also the desynchronisation probe: a wrong
        answer there that a fresh connection does not repeat means the hostile request's bytes were taken
        for (part of) this one.
        """
        ledger = self.run.ledger
        if key in ledger.uncertain:
            return
        stored = ledger.objects.get(key)
        exp = OK if stored is not None else expect(404, codes=["NoSuchKey"])
        reused = same_conn and self.conn_usable
        req = self.signed("GET", key)
        ans = await self.x(step, req, exp, fresh=not reused)
        if ans.status is None or self._read_back_ok(ans, stored):
            return  # no answer is no verdict (and is counted as such)
        if reused:
            again = await self.x(step + " (fresh connection)", self.signed("GET", key), exp, fresh=True)
            if again.status is None:
                return
            if self._read_back_ok(again, stored):
                if ans.from_handler and ans.status in (200, 404):
                    # The handler answered this very GET, only with what the key held a moment earlier.
                    note = "stale read: the same GET a moment later, on a fresh connection, reads it right"
                    self.run.problem("read_back_mismatch", self, step, req.wire(), ans, note)
                else:
                    note = "a fresh connection reads it right"
                    self.run.problem("desynced", self, step, req.wire(), ans, note)
                return
            ans = again
        note = f"expected {'MD5 ' + stored.md5 if stored else '404'}"
        if ans.status == 200:
            note += f", got MD5 {md5_hex(ans.body)} ({len(ans.body)} bytes)"
        self.run.problem("read_back_mismatch", self, step, req.wire(), ans, note)

    @staticmethod
    def _read_back_ok(ans: Answer, stored: Stored | None) -> bool:
        if stored is None:
            return ans.status == 404
        return ans.status == 200 and md5_hex(ans.body) == stored.md5
