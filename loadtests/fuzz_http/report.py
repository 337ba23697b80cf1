"""The report: the summary printed at the end of a run."""

from __future__ import annotations

import dataclasses
from collections import Counter

from loadtests.fuzz_http.endchecks import traceback_kind
from loadtests.fuzz_http.run import Result, _severity, git_commit

# --------------------------------------------------------------------------------------------------------
# Report


def summary(result: Result) -> str:
    f = result.figures
    lines = [
        f"s3lanes hostile-input fuzz: {result.opts.command}",
        f"commit {git_commit()}, started {result.started_utc}, {result.seconds:.0f} s",
        "",
        "| figure | value | must be 0 |",
        "|---|---:|:---:|",
    ]
    for fld in dataclasses.fields(f):
        name = fld.name
        mark = "yes" if name in f.MUST_BE_ZERO else ""
        flag = " **FAIL**" if name in f.MUST_BE_ZERO and getattr(f, name) else ""
        lines.append(f"| {name} | {getattr(f, name)}{flag} | {mark} |")
    lines += ["", "| case kind | cases | answers |", "|---|---:|---|"]
    for kind, n in sorted(result.run.kinds.items()):
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(result.run.answers.get(kind, Counter()).items()))
        lines.append(f"| {kind} | {n} | {answers} |")
    r = result.report
    lines += [
        "",
        f"backend: {r.backend_objects} objects, ledger {r.ledger_objects}, "
        f"normalised keys {len(r.normalised)}, "
        f"deliberately open uploads {r.deliberate_uploads}; flush {r.flush.get('http_status')} "
        f"durable={r.flush.get('durable')}; gateway exit code {r.gateway_exit_code}",
    ]
    if r.unattributed_new_entries:
        lines.append(
            "new entries in /tmp or the cwd not named after the run (not counted): "
            f"{r.unattributed_new_entries[:10]}"
        )
    findings = sorted(result.run.findings.values(), key=lambda x: (-_severity(x.category), -x.count))
    if findings:
        lines += ["", "findings (worst first):"]
        for x in findings[:40]:
            lines.append(
                f"  [{x.category}] {x.kind} / {x.step}: {x.status} {x.code or ''} x{x.count}"
                f" (e.g. case {x.examples[0]['case'] if x.examples else '?'})"
            )
    for name, items in (("partial", r.partial), ("missing", r.missing), ("open uploads", r.open_uploads)):
        if items:
            shown_items = [{k: _short(v) for k, v in item.items()} for item in items[:5]]
            lines.append(f"{name} ({len(items)}): {shown_items}")
    if r.new_files:
        lines.append(f"files outside the spool ({len(r.new_files)}): {r.new_files[:10]}")
    for crash in r.crashes[:5]:
        last = (crash.get("log_tail") or ["?"])[-1]
        lines.append(
            f"crash (exit code {crash['exit_code']}, cases in flight {crash.get('in_flight')}): {last}"
        )
    groups: Counter[tuple[str, str]] = Counter()
    first: dict[tuple[str, str], str] = {}
    for tb in r.tracebacks:
        ident = (tb["origin"], traceback_kind(tb["excerpt"]))
        groups[ident] += 1
        first.setdefault(ident, tb["excerpt"])
    if groups:
        lines += ["", "tracebacks in the gateway log, by exception:"]
        lines += [f"  {n:5d}  [{origin}] {kind}" for (origin, kind), n in groups.most_common(20)]
    for (origin, _), excerpt_text in list(first.items())[:8]:
        if origin == "gateway":
            lines += ["", excerpt_text]
    lines += ["", "RESULT: " + ("ok" if result.ok else "FAILED: " + ", ".join(f.failed()))]
    return "\n".join(lines)


def _short(value: str, limit: int = 100) -> str:
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} chars)"
