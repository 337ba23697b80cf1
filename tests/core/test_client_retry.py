"""The client's pure parts, in virtual time: retry policy, failure classification, the retry loop of
``GatewayClient`` (botocore's Stubber, no network), the flush answer reader, sharding, URIs and hints."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError, SSLError
from botocore.stub import Stubber

from s3lanes_client import ClientConfig, GatewayClient, RetriesExhausted, RetryEvent, RetryPolicy
from s3lanes_client._failures import failure_from_exception
from s3lanes_client.durability import Pending, Transient, flush_url, interpret, poll_timeout_s
from s3lanes_client.errors import BucketNotFound, FlushUnsupported, InvalidS3URI, NotDurableError
from s3lanes_client.hints import LANE_HEADER, WRITE_THROUGH_HEADER, HintHooks, check_lane
from s3lanes_client.model import DurabilityStatus
from s3lanes_client.retry import Failure, GiveUp, Retry, RetryState, parse_retry_after
from s3lanes_client.sharding import epoch_order, shard_indices
from s3lanes_client.sync import range_header
from s3lanes_client.uri import S3URI, parse_s3_uri

SLOWDOWN = Failure(code="SlowDown", status=503, retry_after_s=1.0)
RESET = Failure(code="ConnectionClosedError")


class TopRandom(random.Random):
    """Always draws the top of the range: the longest wait the policy can choose."""

    def uniform(self, a: float, b: float) -> float:
        return b


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- RetryState -------------------------------------------------------------------------------------------


def test_retry_after_is_honoured_with_upward_jitter_only() -> None:
    policy = RetryPolicy(retry_after_jitter=0.2)
    for seed in range(50):
        state = RetryState(policy, started_at=0.0, rng=random.Random(seed))
        decision = state.on_failure(SLOWDOWN, now=0.0)
        assert isinstance(decision, Retry)
        assert 1.0 <= decision.delay_s <= 1.2
        assert decision.attempt == 2


def test_retry_after_is_capped_by_the_policy() -> None:
    state = RetryState(RetryPolicy(max_retry_after_s=5.0, retry_after_jitter=0.0), started_at=0.0)
    decision = state.on_failure(Failure("SlowDown", 503, retry_after_s=3600.0), now=0.0)
    assert decision == Retry(delay_s=5.0, attempt=2)


def test_backoff_without_retry_after_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0, max_attempts=100, total_timeout_s=1e9)
    state = RetryState(policy, started_at=0.0, rng=TopRandom())
    delays = []
    for _ in range(6):
        decision = state.on_failure(RESET, now=0.0)
        assert isinstance(decision, Retry)
        delays.append(decision.delay_s)
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_backoff_is_full_jitter_below_the_ceiling() -> None:
    state = RetryState(RetryPolicy(base_delay_s=1.0, max_delay_s=1.0), started_at=0.0, rng=random.Random(7))
    delays = []
    for _ in range(10):
        decision = state.on_failure(RESET, now=0.0)
        assert isinstance(decision, Retry)
        delays.append(decision.delay_s)
    assert all(0.0 <= d <= 1.0 for d in delays)
    assert len(set(delays)) == len(delays)


def test_gives_up_after_max_attempts() -> None:
    state = RetryState(RetryPolicy(max_attempts=3, total_timeout_s=1e9), started_at=0.0)
    assert isinstance(state.on_failure(RESET, now=0.0), Retry)
    assert isinstance(state.on_failure(RESET, now=0.0), Retry)
    decision = state.on_failure(RESET, now=0.0)
    assert isinstance(decision, GiveUp)
    assert "3 of at most 3 attempts" in decision.reason


def test_never_sleeps_past_the_total_time_bound() -> None:
    """Simulated SlowDown storm: the waits plus the attempts' own durations stay within the bound."""
    policy = RetryPolicy(total_timeout_s=10.0, max_attempts=1000)
    for seed in range(20):
        t = 0.0
        state = RetryState(policy, started_at=t, rng=random.Random(seed))
        while True:
            t += 0.05  # the attempt itself
            decision = state.on_failure(SLOWDOWN, now=t)
            if isinstance(decision, GiveUp):
                break
            t += decision.delay_s
            assert t <= 10.0
        assert "total time bound" in decision.reason
        assert 5 <= state.attempts <= 11


def test_no_retries_policy_gives_up_at_the_first_failure() -> None:
    state = RetryState(RetryPolicy.no_retries(), started_at=0.0)
    assert isinstance(state.on_failure(SLOWDOWN, now=0.0), GiveUp)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"total_timeout_s": -1},
        {"base_delay_s": 0},
        {"base_delay_s": 2, "max_delay_s": 1},
    ],
)
def test_policy_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("1", 1.0), (" 2.5 ", 2.5), ("0", 0.0), ("-1", None), ("nan", None), ("inf", None), ("soon", None),
     ("Wed, 21 Oct 2015 07:28:00 GMT", None), (None, None)],
)  # fmt: skip
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


# --- classification ---------------------------------------------------------------------------------------


def client_error(code: str, status: int, headers: dict[str, str] | None = None) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} happened"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
    }
    return ClientError(response, "PutObject")


def test_slowdown_with_retry_after_is_retryable() -> None:
    failure = failure_from_exception(client_error("SlowDown", 503, {"Retry-After": "1"}))
    assert failure == Failure("SlowDown", 503, 1.0, "SlowDown happened")


@pytest.mark.parametrize(
    ("code", "status"),
    [("ServiceUnavailable", 503), ("RequestTimeout", 400), ("Throttling", 400), ("InternalError", 500),
     ("503", 503), ("", 502), ("TooManyRequestsException", 429)],
)  # fmt: skip
def test_transient_s3_errors_are_retryable(code: str, status: int) -> None:
    assert failure_from_exception(client_error(code, status)) is not None


@pytest.mark.parametrize(
    ("code", "status"), [("NoSuchKey", 404), ("AccessDenied", 403), ("SignatureDoesNotMatch", 403)]
)
def test_permanent_s3_errors_are_not_retried(code: str, status: int) -> None:
    assert failure_from_exception(client_error(code, status)) is None


def test_transport_failures_are_retryable_but_tls_and_bugs_are_not() -> None:
    refused = failure_from_exception(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert refused is not None and refused.code == "EndpointConnectionError"
    assert failure_from_exception(ReadTimeoutError(endpoint_url="http://x")) is not None
    assert failure_from_exception(ConnectionResetError()) is not None
    assert failure_from_exception(SSLError(endpoint_url="https://x", error="bad cert")) is None
    assert failure_from_exception(ValueError("bug")) is None


# --- GatewayClient's loop, stubbed ------------------------------------------------------------------------


def stubbed_client(**config: Any) -> tuple[GatewayClient, Stubber, FakeTime, list[RetryEvent]]:
    fake = FakeTime()
    events: list[RetryEvent] = []
    client = GatewayClient(
        ClientConfig(endpoint_url="http://127.0.0.1:9", access_key="AK", secret_key="SK", **config),
        on_retry=events.append,
        sleep=fake.sleep,
        clock=fake.clock,
        rng=random.Random(1),
    )
    stubber = Stubber(client.s3)
    stubber.activate()
    return client, stubber, fake, events


def add_slowdown(stubber: Stubber, method: str) -> None:
    stubber.add_client_error(
        method,
        service_error_code="SlowDown",
        service_message="Please reduce your request rate.",
        http_status_code=503,
        response_meta={"HTTPHeaders": {"retry-after": "1"}},
    )


def test_client_retries_slowdown_then_succeeds() -> None:
    client, stubber, fake, events = stubbed_client()
    add_slowdown(stubber, "put_object")
    add_slowdown(stubber, "put_object")
    stubber.add_response("put_object", {"ETag": '"abc"'})
    result = client.put_bytes("b", "k", b"data", lane="checkpoint")
    assert result["ETag"] == '"abc"'
    assert [e.attempt for e in events] == [2, 3]
    assert all(e.failure.code == "SlowDown" and e.failure.retry_after_s == 1.0 for e in events)
    assert all(1.0 <= s <= 1.2 for s in fake.sleeps) and len(fake.sleeps) == 2
    assert client.retries == 2
    stubber.assert_no_pending_responses()


def test_client_gives_up_within_the_bound_with_a_clear_error() -> None:
    client, stubber, fake, _ = stubbed_client(retry=RetryPolicy(total_timeout_s=5.0))
    for _ in range(10):
        add_slowdown(stubber, "put_object")
    with pytest.raises(RetriesExhausted) as info:
        client.put_bytes("b", "k", b"data")
    exc = info.value
    assert exc.last_failure.code == "SlowDown"
    assert exc.attempts >= 4
    assert sum(fake.sleeps) <= 5.0
    assert "gave up after" in str(exc) and "SlowDown" in str(exc) and "total time bound" in str(exc)
    assert isinstance(exc.__cause__, ClientError)


def test_client_raises_permanent_errors_at_once_unwrapped() -> None:
    client, stubber, fake, events = stubbed_client()
    stubber.add_client_error("get_object", service_error_code="NoSuchKey", http_status_code=404)
    with pytest.raises(ClientError) as info:
        client.get_bytes("b", "missing")
    assert info.value.response["Error"]["Code"] == "NoSuchKey"
    assert fake.sleeps == [] and events == []


def test_client_rewinds_a_seekable_body_between_attempts() -> None:
    import io

    client, stubber, _, _ = stubbed_client()
    add_slowdown(stubber, "put_object")
    stubber.add_response("put_object", {"ETag": '"e"'})
    body = io.BytesIO(b"0123456789")
    body.seek(3)
    seen: list[int] = []

    def attempt_reads_the_body(**_: Any) -> None:  # as a real attempt does before it fails
        seen.append(body.tell())
        body.read()

    client.s3.meta.events.register("before-parameter-build.s3.PutObject", attempt_reads_the_body)
    client.call("put_object", Bucket="b", Key="k", Body=body)
    assert seen == [3, 3]


def test_gateway_client_refuses_to_pickle_but_its_config_pickles() -> None:
    client, _, _, _ = stubbed_client(lane="dataset")
    with pytest.raises(TypeError, match="ClientConfig"):
        pickle.dumps(client)
    assert pickle.loads(pickle.dumps(client.config)) == client.config


# --- wait_durable's loop, with the flush request faked -----------------------------------------------------


def pending(n: int) -> Pending:
    return Pending(
        DurabilityStatus(durable=False, bucket="b", prefix="p/", pending_objects=n, pending_bytes=n)
    )


def fake_flush(client: GatewayClient, fake: FakeTime, answers: list[Any]) -> list[int]:
    """Replace the HTTP exchange: each poll takes the timeout it asked for when the answer is Pending."""
    asked: list[int] = []

    def flush_once(bucket: str, prefix: str, wait_s: int) -> Any:
        asked.append(wait_s)
        answer = answers.pop(0) if answers else pending(1)
        if isinstance(answer, Pending):
            fake.now += wait_s
        return answer

    client._flush_once = flush_once  # type: ignore[method-assign]
    return asked


def test_wait_durable_polls_until_durable() -> None:
    client, _, fake, _ = stubbed_client()
    done = DurabilityStatus(durable=True, bucket="b", prefix="p/")
    asked = fake_flush(client, fake, [pending(3), pending(1), done])
    status = client.wait_durable("b", "p/", timeout_s=150)
    assert status.durable and status.gateway
    assert asked == [60, 60, 30]
    assert status.waited_s == pytest.approx(120)


def test_wait_durable_raises_not_durable_at_the_deadline() -> None:
    client, _, fake, _ = stubbed_client()
    fake_flush(client, fake, [])
    with pytest.raises(NotDurableError) as info:
        client.wait_durable("b", "p/", timeout_s=2.5)
    assert info.value.status.pending_objects == 1
    assert 2.5 <= info.value.status.waited_s <= 2.6
    assert "not durable" in str(info.value)
    fake_flush(client, fake, [])
    status = client.wait_durable("b", "p/", timeout_s=1, raise_on_timeout=False)
    assert not status.durable


def test_wait_durable_retries_a_transient_flush_failure() -> None:
    client, _, fake, events = stubbed_client()
    done = DurabilityStatus(durable=True, bucket="b", prefix="")
    fake_flush(client, fake, [Transient(SLOWDOWN), done])
    assert client.wait_durable("b", "", timeout_s=30).durable
    assert [e.failure.code for e in events] == ["SlowDown"]


def test_wait_durable_without_an_endpoint_is_plain_aws() -> None:
    client = GatewayClient(ClientConfig(access_key="AK", secret_key="SK"))
    status = client.wait_durable("b", "p/")
    assert status.durable and not status.gateway


# --- the flush answer ---------------------------------------------------------------------------------------


FLUSH = {"x-s3lanes-flush": "1", "content-type": "application/json"}


def test_flush_200_is_durable() -> None:
    body = b'{"durable": true, "bucket": "b", "prefix": "p/", "pending_objects": 0, "pending_bytes": 0,'
    body += b' "oldest_pending_age_s": null, "waited_s": 0.5}'
    status = interpret(200, FLUSH, body, bucket="b", prefix="p/")
    assert status == DurabilityStatus(durable=True, bucket="b", prefix="p/", waited_s=0.5)


def test_flush_504_is_pending_with_counts() -> None:
    body = b'{"durable": false, "bucket": "b", "prefix": "p/", "pending_objects": 2, "pending_bytes": 10,'
    body += b' "oldest_pending_age_s": 3.5, "waited_s": 5}'
    outcome = interpret(504, FLUSH, body, bucket="b", prefix="p/")
    assert isinstance(outcome, Pending)
    assert (outcome.status.pending_objects, outcome.status.oldest_pending_age_s) == (2, 3.5)


def test_flush_404_is_a_missing_bucket_not_an_unsupported_api() -> None:
    body = b'{"durable": false, "bucket": "b", "error": "no bucket named \'b\' on the backend"}'
    with pytest.raises(BucketNotFound) as info:
        interpret(404, FLUSH, body, bucket="b", prefix="p/")
    assert info.value.bucket == "b" and "no bucket named" in info.value.detail


def test_no_flush_header_means_plain_s3() -> None:
    body = b"<Error><Code>InvalidBucketName</Code></Error>"
    status = interpret(400, {"x-amz-request-id": "1"}, body, bucket="b", prefix="")
    assert status == DurabilityStatus(durable=True, bucket="b", prefix="", gateway=False)


def test_a_gateway_without_the_flush_api_is_an_error_not_durable() -> None:
    with pytest.raises(FlushUnsupported):
        interpret(400, {"x-s3lanes-lane": "metadata"}, b"<Error/>", bucket="b", prefix="")


def test_flush_slowdown_is_transient() -> None:
    body = b"<Error><Code>SlowDown</Code></Error>"
    outcome = interpret(503, {"retry-after": "1"}, body, bucket="b", prefix="")
    assert isinstance(outcome, Transient)
    assert (outcome.failure.code, outcome.failure.retry_after_s) == ("SlowDown", 1.0)


def test_flush_answer_that_is_not_json_is_an_error() -> None:
    with pytest.raises(FlushUnsupported):
        interpret(200, FLUSH, b"<html>", bucket="b", prefix="")


def test_flush_url_encodes_every_parameter() -> None:
    url = flush_url("http://127.0.0.1:9000/", "b", "run 7/ü&x=1", 60)
    assert url == "http://127.0.0.1:9000/_s3lanes/flush?bucket=b&prefix=run%207%2F%C3%BC%26x%3D1&timeout=60"


def test_poll_timeouts_are_whole_seconds_at_most_a_minute() -> None:
    assert [poll_timeout_s(x) for x in (0.2, 1.9, 59.5, 3600)] == [0, 1, 59, 60]


# --- sharding, URIs, hints, ranges -------------------------------------------------------------------------


def test_shards_partition_the_samples_for_every_layout() -> None:
    for n in range(0, 40):
        for world in (1, 2, 3):
            for workers in (1, 2, 4):
                seen = [
                    i
                    for rank in range(world)
                    for worker in range(workers)
                    for i in shard_indices(
                        n, rank=rank, world_size=world, worker_id=worker, num_workers=workers
                    )
                ]
                assert sorted(seen) == list(range(n))


def test_epoch_order_is_the_same_everywhere_and_changes_per_epoch() -> None:
    a = list(epoch_order(100, shuffle=True, seed=3, epoch=1))
    assert a == list(epoch_order(100, shuffle=True, seed=3, epoch=1))
    assert a != list(epoch_order(100, shuffle=True, seed=3, epoch=2))
    assert sorted(a) == list(range(100))
    assert list(epoch_order(5, shuffle=False, seed=3, epoch=1)) == [0, 1, 2, 3, 4]


def test_s3_uris() -> None:
    assert parse_s3_uri("s3://b/a/b.pt") == S3URI("b", "a/b.pt")
    assert parse_s3_uri("s3://b") == S3URI("b", "")
    assert parse_s3_uri("s3://b/ckpt").join(".metadata").key == "ckpt/.metadata"
    assert parse_s3_uri("s3://b/ckpt/").join(".metadata").key == "ckpt/.metadata"
    for bad in ("b/k", "s3:///k", "http://b/k"):
        with pytest.raises(InvalidS3URI):
            parse_s3_uri(bad)


def test_hint_hooks_add_headers_per_call_or_from_the_default() -> None:
    hooks = HintHooks("dataset")
    params: dict[str, Any] = {"Bucket": "b", "S3LanesLane": "restore", "S3LanesWriteThrough": True}
    context: dict[str, Any] = {}
    hooks.pop_params(params=params, context=context)
    assert params == {"Bucket": "b"}
    request: dict[str, Any] = {"headers": {}}
    hooks.add_headers(params=request, context=context)
    assert request["headers"] == {LANE_HEADER: "restore", WRITE_THROUGH_HEADER: "true"}
    request = {"headers": {}}
    hooks.add_headers(params=request, context={})
    assert request["headers"] == {LANE_HEADER: "dataset"}
    context = {}
    hooks.pop_params(params={"S3LanesLane": ""}, context=context)
    request = {"headers": {}}
    hooks.add_headers(params=request, context=context)
    assert request["headers"] == {}
    with pytest.raises(ValueError):
        check_lane("bad lane\r\nx: y")


def test_range_header_is_end_exclusive() -> None:
    assert range_header(None, None) is None
    assert range_header(0, 10) == "bytes=0-9"
    assert range_header(5, None) == "bytes=5-"
    assert range_header(None, 1) == "bytes=0-0"
    with pytest.raises(ValueError):
        range_header(4, 4)
