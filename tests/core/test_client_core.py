"""The decisions both clients share (``s3lanes_client._core``), with explicit ``now`` and no client at all:
request parameters, body rewinding, listing pages, the retry step and the ``wait_durable`` poll loop."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from s3lanes_client._core import Attempts, FlushWait, Listing, Pause, get_params, plan_call
from s3lanes_client.durability import Pending, Transient
from s3lanes_client.errors import NotDurableError, RetriesExhausted
from s3lanes_client.hints import LANE_PARAM, WRITE_THROUGH_PARAM
from s3lanes_client.model import UNSET, DurabilityStatus, ObjectInfo
from s3lanes_client.retry import Failure, RetryPolicy

SLOWDOWN = Failure(code="SlowDown", status=503, retry_after_s=1.0)


class Pipe(io.RawIOBase):
    """A stream that has ``seek``/``tell`` (as every IOBase) but cannot seek: a pipe, a socket file."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return 0

    def seekable(self) -> bool:
        return False


def test_plan_call_adds_the_hints_and_rewinds_a_seekable_body_to_where_it_stood() -> None:
    body = io.BytesIO(b"0123456789")
    body.seek(4)
    policy = RetryPolicy(max_attempts=3)
    plan = plan_call({"Bucket": "b", "Body": body}, lane="checkpoint", write_through=True, policy=policy)
    assert plan.params[LANE_PARAM] == "checkpoint" and plan.params[WRITE_THROUGH_PARAM] is True
    assert plan.policy is policy
    body.read()
    assert plan.before_retry is not None
    plan.before_retry()
    assert body.tell() == 4


def test_plan_call_gives_a_body_that_cannot_seek_a_single_attempt() -> None:
    plan = plan_call({"Body": Pipe()}, lane=UNSET, write_through=False, policy=None)
    assert plan.policy == RetryPolicy.no_retries() and plan.before_retry is None
    assert LANE_PARAM not in plan.params and WRITE_THROUGH_PARAM not in plan.params


def test_plan_call_leaves_bytes_bodies_and_the_policy_alone() -> None:
    plan = plan_call({"Body": b"x"}, lane=None, write_through=False, policy=None)
    assert plan.policy is None and plan.before_retry is None
    assert plan.params[LANE_PARAM] == ""  # None: explicitly no hint, not the client's default


def test_get_params_asks_nothing_for_an_empty_range() -> None:
    assert get_params("b", "k", start=5, end=5, lane=UNSET) is None
    ranged = get_params("b", "k", start=5, end=9, lane=UNSET)
    assert ranged == {"Bucket": "b", "Key": "k", "Range": "bytes=5-8"}
    assert get_params("b", "k", start=None, end=None, lane=UNSET) == {"Bucket": "b", "Key": "k"}


def test_listing_follows_continuation_tokens_and_stops_on_a_truncated_page_without_one() -> None:
    listing = Listing("b", "p/", 2)
    assert listing.next_params() == {"Bucket": "b", "Prefix": "p/", "MaxKeys": 2}
    page = {"Contents": [{"Key": "p/a", "Size": 1, "ETag": '"e"'}], "IsTruncated": True}
    page["NextContinuationToken"] = "t1"
    assert listing.objects(page) == [ObjectInfo("p/a", 1, "e")]
    assert listing.next_params() == {"Bucket": "b", "Prefix": "p/", "MaxKeys": 2, "ContinuationToken": "t1"}
    assert listing.objects({"Contents": [{"Key": "p/b", "Size": 2}], "IsTruncated": True}) == [
        ObjectInfo("p/b", 2)
    ]
    assert listing.next_params() is None  # truncated but no token: a broken store must not loop us forever


def test_attempts_raise_an_error_no_retry_can_fix_as_it_is() -> None:
    attempts = Attempts("get_object s3://b/k", RetryPolicy(), now=0.0, rng=random.Random(1))
    answer: Any = {"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}
    denied = ClientError(answer, "GetObject")
    with pytest.raises(ClientError) as info:
        attempts.failed(denied, now=0.0)
    assert info.value is denied


def test_attempts_report_each_retry_then_give_up_with_the_last_error_chained() -> None:
    policy = RetryPolicy(max_attempts=2, retry_after_jitter=0.0)
    attempts = Attempts("put_object", policy, now=0.0, rng=random.Random())
    slowdown = ClientError(
        {
            "Error": {"Code": "SlowDown"},
            "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": {"retry-after": "1"}},
        },
        "PutObject",
    )
    pause = attempts.failed(slowdown, now=0.0)
    assert pause.delay_s == 1.0 and pause.retry is not None
    retry = pause.retry
    assert (retry.operation, retry.attempt, retry.failure.code) == ("put_object", 2, "SlowDown")
    with pytest.raises(RetriesExhausted) as info:
        attempts.failed(slowdown, now=1.0)
    assert info.value.attempts == 2 and info.value.__cause__ is slowdown


def pending(n: int = 1) -> Pending:
    return Pending(DurabilityStatus(durable=False, bucket="b", prefix="p/", pending_objects=n))


def flush_wait(timeout_s: float, *, gateway: bool = True, raise_on_timeout: bool = True) -> FlushWait:
    return FlushWait(
        "b",
        "p/",
        timeout_s,
        gateway=gateway,
        policy=RetryPolicy(retry_after_jitter=0.0),
        now=100.0,
        rng=random.Random(1),
        raise_on_timeout=raise_on_timeout,
    )


def test_flush_wait_without_a_gateway_is_durable_at_once() -> None:
    wait = flush_wait(30, gateway=False)
    assert wait.status == DurabilityStatus(durable=True, bucket="b", prefix="p/", gateway=False)


def test_flush_wait_polls_in_long_requests_then_ends_with_the_time_waited() -> None:
    wait = flush_wait(90)
    assert wait.request_timeout_s(100.0) == 60
    assert wait.answered(pending(), 160.0) == Pause(0.0) and wait.status is None
    assert wait.request_timeout_s(160.0) == 30
    assert wait.answered(DurabilityStatus(durable=True, bucket="b", prefix="p/"), 175.0) == Pause(0.0)
    assert wait.status is not None and wait.status.durable and wait.status.waited_s == 75.0


def test_flush_wait_under_a_second_left_pauses_between_immediate_polls_then_times_out() -> None:
    wait = flush_wait(0.5)
    assert wait.request_timeout_s(100.0) == 0
    assert wait.answered(pending(3), 100.0) == Pause(0.25)
    assert wait.request_timeout_s(100.25) == 0
    assert wait.answered(pending(3), 100.25) == Pause(0.25)
    wait.request_timeout_s(100.5)
    with pytest.raises(NotDurableError) as info:
        wait.answered(pending(2), 100.5)
    assert info.value.status.pending_objects == 2 and info.value.status.waited_s == 0.5


def test_flush_wait_that_may_time_out_ends_with_the_last_answer() -> None:
    wait = flush_wait(0.0, raise_on_timeout=False)
    wait.request_timeout_s(100.0)
    assert wait.answered(pending(7), 100.0) == Pause(0.0)
    assert wait.status is not None and not wait.status.durable and wait.status.pending_objects == 7


def test_flush_wait_retries_a_transient_answer_within_its_own_timeout() -> None:
    wait = flush_wait(1.5)
    wait.request_timeout_s(100.0)
    pause = wait.answered(Transient(SLOWDOWN), 100.0)
    assert pause.delay_s == 1.0 and pause.retry is not None and pause.retry.operation == "flush s3://b/p/"
    wait.request_timeout_s(101.0)
    with pytest.raises(RetriesExhausted):  # a second 1 s wait would end past the 1.5 s timeout
        wait.answered(Transient(SLOWDOWN), 101.0)
