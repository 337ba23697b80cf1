"""The run's shared state: the figures, the findings and the ledger every case reports to (:class:`Run`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loadtests.fuzz_http.findings import Expect, Figures, Finding
from loadtests.fuzz_http.ledger import Ledger
from loadtests.fuzz_http.options import MAX_EXAMPLES_PER_FINDING, Options
from loadtests.fuzz_http.rawhttp import Answer, answer_source, excerpt

if TYPE_CHECKING:
    from loadtests.fuzz_http.case import Case


# --------------------------------------------------------------------------------------------------------
# The run: figures, findings, the ledger


class Run:
    def __init__(
        self, opts: Options, host: str, port: int, bucket: str, marker: str, secret_key: str
    ) -> None:
        self.opts = opts
        self.host = host
        self.port = port
        self.host_header = f"{host}:{port}"
        self.bucket = bucket
        self.marker = marker
        self.secret_key = secret_key
        self.figures = Figures()
        self.ledger = Ledger()
        self.findings: dict[tuple[str, str, str, int | None, str | None, str], Finding] = {}
        self.kinds: Counter[str] = Counter()
        self.answers: dict[str, Counter[str]] = {}
        self.gateway_alive: Callable[[], bool] = lambda: True
        self.crashes: list[dict[str, Any]] = []
        self.in_flight: set[int] = set()
        self.generation = 0  # gateway restarts so far
        self.stopped = ""  # why the run stopped early, if it did

    def classify(self, case: Case, step: str, method: str, data: bytes, ans: Answer, exp: Expect) -> None:
        f = self.figures
        f.requests += 1
        label = str(ans.status) if ans.status is not None else ans.error.split(":")[0]
        self.answers.setdefault(case.kind, Counter())[label] += 1
        if self.opts.verbose:
            print(f"--- case {case.index} {case.kind} / {step}\n>>> {excerpt(data, 4000)}")
            print(f"<<< {ans.describe()} {excerpt(ans.body, 600)}")
        if ans.status is None and (case.generation != self.generation or not self.gateway_alive()):
            f.no_answer_gateway_down += 1
            return
        if ans.status is None:
            if ans.error == "timeout":
                f.timeouts += 1
                self._finding("timeout", case, step, data, ans)
            elif not exp.no_answer:
                case.saw_no_answer = True  # perhaps a gateway dying: see run_cases
                f.no_answer += 1
                self._finding("no answer", case, step, data, ans)
            return
        code = ans.error_code() if ans.status >= 400 else None
        if ans.status == 500:
            f.answers_500 += 1
            self._finding("500 answer", case, step, data, ans)
        elif ans.status == 503:
            f.answers_503 += 1
            self._finding("503 answer", case, step, data, ans)
        elif ans.status > 500:
            f.answers_other_5xx += 1
        if ans.status >= 400 and method != "HEAD" and code is None:
            if ans.from_handler:
                f.errors_without_xml += 1
                self._finding("error without S3 XML", case, step, data, ans)
            else:
                f.parser_answers += 1
                self._finding("HTTP parser answer", case, step, data, ans)
        if not exp.matches(ans.status, code, method):
            f.unexpected_answers += 1
            if answer_source(ans) == "backend":
                f.unexpected_from_backend += 1
            want = sorted(exp.statuses) if len(exp.statuses) < 10 else "any"
            codes = sorted(exp.codes) if exp.codes is not None else "any"
            self._finding("unexpected answer", case, step, data, ans, f"expected {want} {codes}")

    def problem(self, figure: str, case: Case, step: str, data: bytes, ans: Answer, note: str = "") -> None:
        """Count a must-be-0 problem found by a case's own checks (lost write, desync, wrong answer)."""
        setattr(self.figures, figure, getattr(self.figures, figure) + 1)
        self._finding(figure.replace("_", " "), case, step, data, ans, note)

    def _finding(
        self, category: str, case: Case, step: str, data: bytes, ans: Answer, note: str = ""
    ) -> None:
        code = ans.error_code() if ans.status is not None and ans.status >= 400 else None
        source = answer_source(ans)
        ident = (category, case.kind, step, ans.status, code, source)
        finding = self.findings.get(ident)
        if finding is None:
            finding = self.findings[ident] = Finding(category, case.kind, step, ans.status, code, source)
        finding.count += 1
        if len(finding.examples) < MAX_EXAMPLES_PER_FINDING:
            finding.examples.append(
                {
                    "case": case.index,
                    "request": excerpt(data),
                    "answer": ans.describe(),
                    "answer_body": excerpt(ans.body, 400),
                    "note": note,
                }
            )

    def harness_error(self, case: Case, exc: BaseException) -> None:
        self.figures.harness_errors += 1
        self._finding("harness error", case, type(exc).__name__, b"", Answer(None, error=repr(exc)[:300]))
