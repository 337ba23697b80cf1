"""Case kinds. Each sends hostile requests mixed with valid ones and checks that nothing was lost;
:data:`KINDS` weighs them and :func:`pick_kind` chooses one per case."""

from __future__ import annotations

import random

from loadtests.fuzz_http.kinds.auth import case_auth, case_date, case_valid
from loadtests.fuzz_http.kinds.base import CaseFn
from loadtests.fuzz_http.kinds.body import case_aws_chunked, case_length, case_payload, case_truncated
from loadtests.fuzz_http.kinds.keys import case_odd_keys, case_query, case_raw_path
from loadtests.fuzz_http.kinds.multipart import case_part_numbers, case_xml_complete, case_xml_delete
from loadtests.fuzz_http.kinds.operations import (
    case_admin,
    case_copy,
    case_list,
    case_meta,
    case_overrides,
    case_vhost,
)
from loadtests.fuzz_http.kinds.protocol import (
    case_big_head,
    case_expect,
    case_garbage,
    case_http10,
    case_methods,
    case_pipeline,
)
from loadtests.fuzz_http.kinds.reads import case_range

KINDS: tuple[tuple[str, int, CaseFn], ...] = (
    ("valid", 8, case_valid),
    ("auth", 12, case_auth),
    ("date", 6, case_date),
    ("payload-hash", 8, case_payload),
    ("truncated-body", 6, case_truncated),
    ("content-length", 6, case_length),
    ("aws-chunked", 10, case_aws_chunked),
    ("range", 6, case_range),
    ("part-numbers", 4, case_part_numbers),
    ("odd-keys", 10, case_odd_keys),
    ("raw-path-bytes", 3, case_raw_path),
    ("xml-complete", 4, case_xml_complete),
    ("xml-delete", 3, case_xml_delete),
    ("query", 4, case_query),
    ("methods", 3, case_methods),
    ("http-versions", 2, case_http10),
    ("pipelining", 3, case_pipeline),
    ("big-headers", 2, case_big_head),
    ("garbage", 4, case_garbage),
    ("expect-100", 2, case_expect),
    ("list", 3, case_list),
    ("copy", 2, case_copy),
    ("metadata", 3, case_meta),
    ("response-overrides", 2, case_overrides),
    ("virtual-host", 2, case_vhost),
    ("admin", 1, case_admin),
)


def pick_kind(seed: int, index: int, only: tuple[str, ...] = ()) -> tuple[str, CaseFn]:
    kinds = [k for k in KINDS if not only or k[0] in only]
    rng = random.Random(f"{seed}-{index}-kind")
    name, _, fn = rng.choices(kinds, weights=[w for _, w, _ in kinds])[0]
    return name, fn
