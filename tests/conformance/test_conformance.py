"""Differential S3 conformance: each scenario of the corpus against the store and four gateway set-ups.

Targets (docs/compatibility.md): the store (SeaweedFS, the reference), ``spool-off`` (the gateway proxies),
``spool-held`` (spool on, drain paused with ``POST /_s3lanes/drain?pause=1``: everything stays in the
spool), ``spool-draining`` (spool on, the drain runs as it likes), ``spool-flushed`` (spool on, the
scenario's ``settle()`` flushes after its writes). One gateway process per spool setting for the module,
a fresh bucket per scenario and target. The normal suite runs the ``fast`` subset; ``make conformance``
(``S3LANES_CONFORMANCE=full``) runs the whole corpus and writes the report
(``S3LANES_CONFORMANCE_REPORT``); ``S3LANES_CONFORMANCE_ONLY`` (comma-separated fnmatch patterns over scenario
names) narrows either to some families.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import secrets
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import expectations as ex
from tests.conformance.harness import Target, diff
from tests.conformance.scenarios import SCENARIOS, Scenario
from tests.conftest import Backend, _delete_bucket_and_contents, s3_client
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway

pytestmark = pytest.mark.e2e

FULL = os.environ.get("S3LANES_CONFORMANCE", "") == "full"
REPORT = os.environ.get("S3LANES_CONFORMANCE_REPORT", "")
ONLY = [p for p in os.environ.get("S3LANES_CONFORMANCE_ONLY", "").split(",") if p]
SELECTED = [
    s
    for s in SCENARIOS.values()
    if (FULL or s.fast) and (not ONLY or any(fnmatch.fnmatchcase(s.name, p) for p in ONLY))
]
TARGETS = (ex.OFF, ex.HELD, ex.DRAINING, ex.FLUSHED)
FLUSH_TIMEOUT_S = 60.0


@dataclass
class Outcome:
    scenario: str
    target: str
    verdict: str  # identical | deliberate | expected-to-differ | differs | fixed? | error
    detail: str = ""


@dataclass
class Run:
    baseline: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def admin_post(gw: Gateway, path: str, query: dict[str, str], timeout_s: float = 30.0) -> tuple[int, Any]:
    url = f"{gw.http_url}{path}?{urllib.parse.urlencode(query)}"
    req = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s + 30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def flush(gw: Gateway, bucket: str) -> bool:
    status, doc = admin_post(
        gw, "/_s3lanes/flush", {"bucket": bucket, "timeout": str(FLUSH_TIMEOUT_S)}, FLUSH_TIMEOUT_S
    )
    if status == 404 and doc.get("pending_objects") == 0:
        return True  # the scenario deleted its bucket: nothing of it is left to drain
    return status == 200 and bool(doc.get("durable"))


def hold(gw: Gateway, paused: bool) -> None:
    status, doc = admin_post(gw, "/_s3lanes/drain", {"pause" if paused else "resume": "1"})
    assert status == 200 and doc == {"paused": paused}, (status, doc)


@pytest.fixture(scope="module")
def gateways(seaweed: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    started = []
    try:
        for name, enabled in (("off", "false"), ("on", "true")):
            tmp = tmp_path_factory.mktemp(f"conformance-{name}")
            proc, gw = start_plain_gateway(
                tmp,
                seaweed,
                backend_endpoint=seaweed.endpoint_url,
                extra_toml=f"\n[spool]\nenabled = {enabled}\n",
            )
            started.append((proc, gw))
        yield {"off": started[0][1], "on": started[1][1]}
    finally:
        # Exit status only: a traceback the corpus provokes is a finding of the run (its scenario differs),
        # and is reported there rather than failing the module's teardown.
        for proc, gw in started:
            code = stop_gateway(proc)
            assert code == 0, gw.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    result = Run()
    yield result
    if REPORT:
        Path(REPORT).write_text(render_report(result))


@pytest.fixture(scope="module")
def store(seaweed: Backend) -> Iterator[Any]:
    client = s3_client(seaweed)
    yield client
    client.close()


def _nothing(_bucket: str) -> None:
    return None


def _bucket(target: str) -> str:
    """Same length for every target: bucket names show in XML documents and their lengths."""
    return f"cf-{secrets.token_hex(8)}"


def run_scenario(
    scn: Scenario,
    name: str,
    endpoint: str,
    seaweed: Backend,
    store: Any,
    *,
    settle: Callable[[str], None] = _nothing,
    drain: Callable[[str], None] = _nothing,
    unblock: Callable[[bool], None] | None = None,
) -> list[dict[str, Any]]:
    """Run one scenario in a fresh bucket (created on the store); afterwards everything the scenario left
    is put on the store (``drain``) and the bucket is emptied and deleted there."""
    bucket = _bucket(name)
    store.create_bucket(Bucket=bucket)
    # No flexible checksum unless a scenario asks for one (the checksum family does): boto3's default CRC32
    # on every PUT would make one checksum difference show in every scenario.
    client = s3_client(
        dataclasses.replace(seaweed, endpoint_url=endpoint),
        retries={"max_attempts": 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    t = Target(
        name=name,
        s3=client,
        endpoint=endpoint,
        access_key=seaweed.admin.access_key,
        secret_key=seaweed.admin.secret_key,
        bucket=bucket,
        settle_hook=settle,
        drain_hook=drain,
        unblock_hook=unblock,
    )
    try:
        scn.run(t)
    except Exception as exc:  # a scenario that breaks is an observation too (the store must break alike)
        t.observations.append({"step": "scenario raised", "exception": type(exc).__name__})
    finally:
        client.close()
        drain(bucket)
        _delete_bucket_and_contents(store, bucket)
    return t.observations


def baseline(run: Run, scn: Scenario, seaweed: Backend, store: Any) -> list[dict[str, Any]]:
    if scn.name not in run.baseline:
        run.baseline[scn.name] = run_scenario(scn, "store", seaweed.endpoint_url, seaweed, store)
    return run.baseline[scn.name]


def classify(
    scn: Scenario, target: str, expected: list[dict[str, Any]], actual: list[dict[str, Any]]
) -> Outcome:
    """identical; deliberate (equal once the store's observations are turned into the documented
    behaviour); expected-to-differ (a listed bug); differs (fails); fixed? (a strict listed bug that no
    longer differs)."""
    raw = diff(expected, actual, target)
    deliberate = ex.deliberate_for(scn.name, target)
    for d in deliberate:
        expected = d.expect(expected)
        if d.both:
            actual = d.expect(actual)
    text = diff(expected, actual, target)
    bugs = ex.known_bugs_for(scn.name, target)
    if not text:
        strict = [b for b in bugs if b.strict]
        if strict:
            return Outcome(
                scn.name, target, "fixed?", f"listed as expected to differ ({strict[0].what}) but identical"
            )
        if raw:
            return Outcome(
                scn.name, target, "deliberate", "; ".join(d.behaviour for d in deliberate) + "\n" + raw
            )
        return Outcome(scn.name, target, "identical")
    if bugs:
        return Outcome(scn.name, target, "expected-to-differ", "; ".join(b.what for b in bugs) + "\n" + text)
    return Outcome(scn.name, target, "differs", text)


@pytest.mark.timeout(3000 if FULL else int(os.environ.get("S3LANES_CONFORMANCE_TIMEOUT", "300")))
@pytest.mark.parametrize("target", TARGETS)
def test_gateway_matches_the_store(
    target: str, gateways: dict[str, Gateway], run: Run, seaweed: Backend, store: Any
) -> None:
    """Every selected scenario observes the same through ``target`` as against the store, except for the
    differences listed in tests/conformance/expectations.py."""
    gw = gateways["off" if target == ex.OFF else "on"]
    settle: Callable[[str], None] = _nothing
    drain: Callable[[str], None] = _nothing
    if target != ex.OFF:

        def drain(bucket: str) -> None:
            if target == ex.HELD:
                hold(gw, False)
            if not flush(gw, bucket):
                pytest.fail(f"flush of {bucket} timed out")
            if target == ex.HELD:
                hold(gw, True)

    if target == ex.FLUSHED:
        settle = drain
    if target == ex.HELD:
        hold(gw, True)
    started = time.monotonic()
    outcomes = []
    try:
        for scn in SELECTED:
            expected = baseline(run, scn, seaweed, store)
            actual = run_scenario(
                scn,
                target,
                gw.http_url,
                seaweed,
                store,
                settle=settle,
                drain=drain,
                unblock=(lambda go: hold(gw, not go)) if target == ex.HELD else None,
            )
            outcomes.append(classify(scn, target, expected, actual))
    finally:
        if target == ex.HELD:
            hold(gw, False)
    run.outcomes[target] = outcomes
    run.seconds[target] = time.monotonic() - started
    bad = [o for o in outcomes if o.verdict in ("differs", "fixed?")]
    if bad:
        shown = "\n\n".join(f"== {o.scenario} [{o.verdict}]\n{o.detail[:3000]}" for o in bad[:15])
        pytest.fail(
            f"{len(bad)} of {len(outcomes)} scenarios differ from the store through {target}:\n{shown}"
        )


def test_drain_hold_keeps_writes_in_the_spool(
    gateways: dict[str, Gateway], store: Any, seaweed: Backend
) -> None:
    """The switch target (c) relies on: while held, an acknowledged PUT is readable through the gateway but
    not on the store; resumed, it drains."""
    gw = gateways["on"]
    bucket = _bucket("hold")
    store.create_bucket(Bucket=bucket)
    client = s3_client(dataclasses.replace(seaweed, endpoint_url=gw.http_url))
    try:
        hold(gw, True)
        client.put_object(Bucket=bucket, Key="k", Body=b"held")
        time.sleep(0.5)
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"held"
        assert store.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
        assert admin_post(gw, "/_s3lanes/drain", {})[1] == {"paused": True}
        hold(gw, False)
        assert flush(gw, bucket)
        assert store.get_object(Bucket=bucket, Key="k")["Body"].read() == b"held"
    finally:
        hold(gw, False)
        client.close()
        _delete_bucket_and_contents(store, bucket)


def render_report(run: Run) -> str:
    lines = ["# Conformance report", ""]
    lines.append(
        f"Corpus: {'full' if FULL else 'fast subset'}, {len(SELECTED)} scenarios, store = SeaweedFS."
    )
    lines.append("")
    lines.append("| target | run | identical | deliberate | expected to differ (bugs) | differs | seconds |")
    lines.append("|---|---|---|---|---|---|---|")
    for target, outcomes in run.outcomes.items():
        count = {
            v: sum(1 for o in outcomes if o.verdict == v)
            for v in ("identical", "deliberate", "expected-to-differ")
        }
        other = len(outcomes) - sum(count.values())
        lines.append(
            f"| {target} | {len(outcomes)} | {count['identical']} | {count['deliberate']} | "
            f"{count['expected-to-differ']} | {other} | {run.seconds.get(target, 0):.0f} |"
        )
    for target, outcomes in run.outcomes.items():
        for o in outcomes:
            if o.verdict == "identical":
                continue
            lines += ["", f"## {target}: {o.scenario} ({o.verdict})", "", "```diff", o.detail, "```"]
    return "\n".join(lines) + "\n"
