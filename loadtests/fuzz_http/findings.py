"""What a step expects (:class:`Expect`, S3's statuses and codes for that input), findings and the figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------------------
# Expectations, findings and figures


@dataclass(frozen=True, slots=True)
class Expect:
    """The answers S3 would give (or that are acceptable) for one request.

    ``codes`` None: any code (or none) is fine. ``no_answer``: the server may close without answering
    (a body cut short, garbage that is not HTTP).
    """

    statuses: frozenset[int]
    codes: frozenset[str] | None = None
    no_answer: bool = False

    def matches(self, status: int, code: str | None, method: str = "GET") -> bool:
        if status not in self.statuses:
            return False
        # A HEAD answer has no body, so no code to compare.
        return self.codes is None or status < 300 or method == "HEAD" or code in self.codes


def expect(*statuses: int, codes: Sequence[str] | None = None, no_answer: bool = False) -> Expect:
    return Expect(frozenset(statuses), frozenset(codes) if codes is not None else None, no_answer)


OK = expect(200)
ANY = Expect(frozenset(range(100, 600)))
AUTH_ERRORS = (
    "AccessDenied",
    "AuthorizationHeaderMalformed",
    "AuthorizationQueryParametersError",
    "InvalidArgument",
    "InvalidRequest",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "RequestTimeTooSkewed",
)
AUTH_FAIL = expect(400, 403, codes=AUTH_ERRORS)
BODY_ERRORS = (
    "IncompleteBody",
    "InvalidChunkSizeError",
    "MalformedTrailerError",
    "SignatureDoesNotMatch",
    "XAmzContentSHA256Mismatch",
    "BadDigest",
    "InvalidDigest",
    "InvalidRequest",
    "InvalidArgument",
    "MissingContentLength",
)


@dataclass(slots=True)
class Finding:
    """Answers of one kind of problem (same case kind, step, category, status and code), with examples."""

    category: str
    kind: str
    step: str
    status: int | None
    code: str | None
    source: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Figures:
    cases_run: int = 0
    requests: int = 0
    crashes: int = 0
    answers_500: int = 0
    answers_503: int = 0
    answers_other_5xx: int = 0
    files_outside_spool: int = 0
    partial_objects: int = 0
    backend_mangled_keys: int = 0  # SeaweedFS's own handling of keys ending in "/" (not counted as partial)
    missing_objects: int = 0
    open_uploads_unexpected: int = 0
    read_back_mismatch: int = 0
    wrong_answers: int = 0
    desynced: int = 0
    tracebacks: int = 0
    tracebacks_from_parser: int = 0  # of those: aiohttp logging bytes its HTTP parser refused
    harness_errors: int = 0
    unexpected_answers: int = 0
    unexpected_from_backend: int = 0  # of those: the store's own answer, relayed
    errors_without_xml: int = 0  # from the S3 handler
    parser_answers: int = 0  # answered below the S3 handler (aiohttp's HTTP parser), no S3 XML
    timeouts: int = 0
    cases_interrupted: int = 0  # cut short by a crash
    no_answer_gateway_down: int = 0  # requests that met a dead gateway (counted under crashes)
    pipelines_refused_whole: int = 0  # see case_pipeline
    no_answer: int = 0

    MUST_BE_ZERO = (
        "crashes",
        "answers_500",
        "files_outside_spool",
        "partial_objects",
        "missing_objects",
        "open_uploads_unexpected",
        "read_back_mismatch",
        "wrong_answers",
        "desynced",
        "tracebacks",
        "harness_errors",
    )

    def failed(self) -> list[str]:
        return [name for name in self.MUST_BE_ZERO if getattr(self, name)]
