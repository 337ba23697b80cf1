"""Edges of the pure cores that the behaviour tests do not reach: every refusal of a nonsensical setting,
and the accessors the shells read. Each names what it pins."""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import zlib
from dataclasses import replace

import pytest

from s3lanes.config import Config
from s3lanes.core.access import Grant as AccessGrant
from s3lanes.core.access import TenantPolicy
from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import BodyVerifier
from s3lanes.core.chunked import AwsChunkedDecoder, encode_aws_chunked
from s3lanes.core.classify import CheckpointPrefixes, Classifier, Rule, rule_problems
from s3lanes.core.cluster_budget import ReportError, decode_report
from s3lanes.core.journal import Replay, encode_record, file_header, replay
from s3lanes.core.lanes_config import parse_rules, parse_tenant_policies, parse_tenants
from s3lanes.core.objectread import StoredObject, object_attributes_xml
from s3lanes.core.routing import RouteTable, rename_in_xml, rename_location
from s3lanes.core.s3request import parse_target, split_target
from s3lanes.core.sched_alloc import LaneDemand, allocate
from s3lanes.core.sched_control import (
    _BASELINE_MAX_SAMPLES,
    BASELINE_HISTORY_S,
    GUARD_MIN_GOOD_SAMPLES,
    GUARD_MIN_READ_SHARE,
    LatencyGuard,
    TokenBucket,
)
from s3lanes.core.scheduler import Grant, LaneSpec, Scheduler, WaitUntil
from s3lanes.core.sigv4 import (
    EMPTY_SHA256,
    UNSIGNED_PAYLOAD,
    ChunkSignatureChain,
    parse_auth,
    sign_headers,
    signing_key,
    verify,
)
from s3lanes.core.sniff import detect_content_type
from s3lanes.core.spool_deadline import CheckpointCadence
from s3lanes.core.spool_state import SpoolState, checksum_of_meta
from s3lanes.errors import (
    AccessDenied,
    InvalidArgument,
    InvalidRequest,
    MalformedTrailerError,
    S3Error,
)
from s3lanes.runtime.wiring import scheduler_config
from tests.core.test_chunked import decode, make_verified, signer_for
from tests.core.test_scheduler_progress import cut_guard
from tests.core.test_sigv4 import GOOD_AUTH, PRESIGNED_QUERY, S3_HOST, S3_NOW, S3_SECRET, request
from tests.core.test_spool_state import FAR, MARKERS, T0, seqs
from tests.core.test_spool_state import Spool as SpoolHarness

C = 100e6
SRC = "s3lanes.toml"


def test_a_lane_without_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        LaneSpec("")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"lanes": ()}, "at least one lane"),
        ({"initial_capacity_bps": 0.0}, "initial_capacity_bps"),
        ({"write_cap_mode": "sometimes"}, "write_cap_mode"),
        ({"request_cost_bytes": -1}, "request_cost_bytes"),
        ({"burst_bytes": 0}, "burst_bytes"),
        ({"window_s": 0.0}, "window_s"),
        ({"read_idle_s": -1.0}, "read_idle_s"),
        ({"read_active_min_fraction": 1.0}, "read_active_min_fraction"),
        ({"latency_target_s": 0.0}, "latency_target_s"),
        ({"inflight_bytes_max": 0}, "inflight_bytes_max"),
        ({"inflight_requests_max": 0}, "inflight_requests_max"),
        ({"progress_interval_s": 0.0}, "progress_interval_s"),
    ],
)
def test_scheduler_config_refuses_nonsense(change: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(scheduler_config(Config(), C), **change)  # type: ignore[arg-type]


def test_the_scheduler_reports_its_config_capacity_activity_and_deliveries() -> None:
    cfg = scheduler_config(Config(), C)
    s = Scheduler(cfg, 0.0)
    assert s.config is cfg
    assert s.capacity_bps == C
    assert s.reads_active is False
    assert s.delivered_bytes("dataset") == 0
    s.observe_delivered("dataset", 1234, 0.01)
    assert s.delivered_bytes("dataset") == 1234


@pytest.mark.parametrize(
    "bad",
    [
        {"reservation_bps": -1.0},
        {"limit_bps": -1.0},
        {"demand_bps": -1.0},
        {"weight": 0.0},
    ],
)
def test_a_lane_demand_with_negative_rates_or_no_weight_is_refused(bad: dict[str, float]) -> None:
    base = {"reservation_bps": 0.0, "weight": 1.0, "limit_bps": math.inf, "demand_bps": math.inf}
    with pytest.raises(ValueError):
        LaneDemand(**{**base, **bad})


def test_allocate_refuses_a_negative_or_unknown_capacity_and_gives_nothing_of_nothing() -> None:
    lane = LaneDemand(reservation_bps=0.0, weight=1.0, limit_bps=math.inf, demand_bps=math.inf)
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            allocate(bad, [lane])
    assert allocate(0.0, [lane, lane]) == (0.0, 0.0)


@pytest.mark.parametrize(("quiet_s", "history"), [(0.0, 4), (1.0, 0)])
def test_checkpoint_cadence_refuses_a_zero_quiet_time_or_history(quiet_s: float, history: int) -> None:
    with pytest.raises(ValueError):
        CheckpointCadence(quiet_s, history)


def test_a_rule_name_that_is_not_a_string_is_reported() -> None:
    problems: list[str] = []
    assert parse_rules([{"lane": "dataset", "name": 7}], {"dataset"}, SRC, problems) == ()
    assert problems == [f"{SRC} rules[0].name: expected a string (got 7)"]


def test_a_tenant_table_without_an_access_key_name_is_reported() -> None:
    problems: list[str] = []
    assert parse_tenants({"": {"lanes": ["dataset"]}}, {"dataset"}, SRC, problems) == {}
    assert problems == [f"{SRC} [tenants.]: the table name must be an access key"]


def test_tenant_grants_that_are_not_a_list_of_strings_are_reported() -> None:
    problems: list[str] = []
    parse_tenant_policies({"AKIA1": {"read": 5, "write": ["b/p"]}}, SRC, problems)
    assert problems == [f"{SRC} [tenants.AKIA1].read: expected a list of 'bucket' or 'bucket/prefix' (got 5)"]


def test_a_route_table_lists_its_routes_and_says_whether_it_is_empty() -> None:
    assert RouteTable(()).empty and RouteTable(()).routes == ()
    table = RouteTable([("ckpt", "fast", "ckpt-store")])
    assert not table.empty
    assert [(r.bucket, r.backend, r.backend_bucket) for r in table.routes] == [("ckpt", "fast", "ckpt-store")]


def test_renaming_to_the_same_bucket_or_an_empty_body_changes_nothing() -> None:
    body = b"<Name>b</Name>"
    assert rename_in_xml(body, "b", "b") is body
    assert rename_in_xml(b"", "x", "y") == b""
    assert rename_location("/b/key", "b", "b") == "/b/key"


def test_a_date_header_without_a_zone_is_no_request_date() -> None:
    headers = {
        "host": "h",
        "x-amz-content-sha256": EMPTY_SHA256,
        "authorization": GOOD_AUTH,
        "date": "Fri, 24 May 2013 00:00:00 -0000",
    }
    with pytest.raises(AccessDenied, match="valid Date or x-amz-date"):
        parse_auth(request("GET", "/", "", headers))


def test_verify_refuses_a_claim_whose_date_is_impossible() -> None:
    # parse_auth refuses such a date already; verify does not rely on it.
    req = request("GET", "/test.txt", PRESIGNED_QUERY, {"host": S3_HOST})
    auth = parse_auth(req)
    assert auth is not None
    with pytest.raises(AccessDenied, match="valid Date or x-amz-date"):
        verify(req, replace(auth, amz_date="20131324T000000Z"), S3_SECRET, S3_NOW)


def test_an_expiry_beyond_the_calendar_is_reported_as_a_number() -> None:
    req = request("GET", "/test.txt", PRESIGNED_QUERY, {"host": S3_HOST})
    auth = parse_auth(req)
    assert auth is not None
    with pytest.raises(AccessDenied, match="expired") as caught:
        verify(req, auth, S3_SECRET, 1e20)
    assert caught.value.extra["ServerTime"] == "1e+20"


def test_signing_refuses_a_request_without_a_host() -> None:
    with pytest.raises(ValueError, match="host"):
        sign_headers(
            "GET",
            "/",
            "",
            {},
            access_key="AK",
            secret_key="SK",
            region="r",
            payload_hash=EMPTY_SHA256,
            now_wall=0.0,
        )


def test_a_signing_key_of_a_secret_with_a_lone_surrogate_is_still_a_key() -> None:
    assert len(signing_key("\ud800", "20130524", "us-east-1", "s3")) == 32


def test_object_attributes_name_the_storage_class_and_refuse_a_bad_max_parts() -> None:
    obj = StoredObject(
        size=7, etag='"a-2"', last_modified=0.0, content_type="x", headers=(), part_sizes=(5, 2)
    )
    xml = object_attributes_xml(obj, {"x-amz-object-attributes": "StorageClass"}, "GLACIER")
    assert b"<StorageClass>GLACIER</StorageClass>" in xml
    for bad in ("-1", "x", "1234567890"):
        wanted = {"x-amz-object-attributes": "ObjectParts", "x-amz-max-parts": bad}
        with pytest.raises(InvalidArgument):
            object_attributes_xml(obj, wanted, "STANDARD")


def test_a_request_target_that_is_not_an_absolute_path_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="absolute path"):
        parse_target("GET", "bucket/key", "", {"host": "h"}, ())


def test_split_target_separates_path_and_query() -> None:
    assert split_target("/b/k?x=1&y") == ("/b/k", "x=1&y")
    assert split_target("/b/k") == ("/b/k", "")


@pytest.mark.parametrize(
    ("lanes", "what"),
    [('"lanes":[]', "'lanes' must be a table"), ('"lanes":{"c":5}', "lane 'c' must be a table")],
)
def test_a_report_whose_lanes_are_not_tables_is_refused(lanes: str, what: str) -> None:
    raw = '{"v":1,"node":"a","inst":"x","at":1,"cap":1,"reads":true,"mode":"normal",' + lanes + "}"
    with pytest.raises(ReportError, match=what):
        decode_report(raw)


def test_a_rule_with_an_empty_prefix_is_reported() -> None:
    assert ("prefixes", "empty prefix (omit prefixes to match every key)") in rule_problems(
        Rule("dataset", prefixes=("",)), {"dataset"}
    )


def test_an_empty_hint_names_no_lane() -> None:
    c = Classifier((), frozenset(Config().lanes), {}, CheckpointPrefixes())
    assert c.allowed_hint(None, "AK") is None
    assert c.allowed_hint("", "AK") is None


def test_a_copy_without_a_source_is_denied_and_so_is_reading_a_bucket_configuration_unowned() -> None:
    policy = TenantPolicy(read=(AccessGrant("data", "p/"),), write=(AccessGrant("data", "p/"),))
    with pytest.raises(AccessDenied):
        policy.check("CopyObject", "data", "p/k", {}, copy_source=None)
    with pytest.raises(AccessDenied):
        policy.check("GetBucketPolicy", "data", None, {})


def test_an_upload_body_names_its_checksum_hands_out_its_md5_check_and_skips_empty_pieces() -> None:
    data = b"hello"
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    headers = {
        "content-md5": md5,
        "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode(),
    }
    body = UploadBody(
        verifier=BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD), decoder=None, expected_bytes=len(data)
    )
    assert body.checksum_algorithm == "CRC32"
    assert body.checksum_in_trailer is False  # the checksum came as a header
    assert body.take_md5_check() == md5
    assert body.feed(b"") == []
    assert body.feed(data) == []  # held back until the end is verified
    assert body.finish() == data


def test_a_trailer_signature_that_is_not_hex_is_malformed() -> None:
    body = encode_aws_chunked([b"data"], signer=signer_for(make_verified()))[:-2]
    body += b"x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:" + b"z" * 64 + b"\r\n\r\n"
    with pytest.raises(MalformedTrailerError, match="64 hexadecimal"):
        decode(body, chain=ChunkSignatureChain(make_verified()), trailer_names=("x-amz-checksum-crc32c",))


def test_a_body_cut_before_its_last_chunk_is_refused_and_stays_refused() -> None:
    decoder = AwsChunkedDecoder(chain=None, trailer_names=(), decoded_length=10)
    assert decoder.feed(encode_aws_chunked([b"data"])[:-5]) == [b"data"]
    with pytest.raises(S3Error) as first:
        decoder.finish()
    with pytest.raises(S3Error) as again:
        decoder.finish()
    assert again.value is first.value


def test_feeding_a_finished_upload_body_is_a_bug() -> None:
    verifier = BodyVerifier.from_headers({}, UNSIGNED_PAYLOAD)
    body = UploadBody(verifier=verifier, decoder=None, expected_bytes=0)
    assert body.finish() == b""
    with pytest.raises(AssertionError, match="after finish"):
        body.feed(b"x")


def test_a_body_verifier_refuses_a_malformed_payload_hash_and_a_checksum_given_twice() -> None:
    none = {"content_md5_b64": None, "checksum_algorithm": None, "checksum_b64": None}
    with pytest.raises(InvalidArgument):
        BodyVerifier(sha256_hex="not-hex", expect_checksum_in_trailer=False, **none)
    with pytest.raises(ValueError, match="not both"):
        BodyVerifier(
            sha256_hex=None,
            content_md5_b64=None,
            checksum_algorithm="CRC32",
            checksum_b64="AAAAAA==",
            expect_checksum_in_trailer=True,
        )


def test_two_holes_in_the_newest_batch_are_a_torn_tail() -> None:
    # The write-back of the last batch persisted frames 2 and 4 of it, not 1 and 3: a torn tail, no damage.
    first = file_header() + encode_record({"x": 0, "_b": 1})
    frames = [encode_record({"x": n, "_b": 2}) for n in range(1, 5)]
    hole = bytes(len(frames[0]))
    data = first + hole + frames[1] + hole + frames[3]
    got = replay(data)
    assert isinstance(got, Replay)
    assert got.records == [{"x": 0, "_b": 1}]
    assert got.valid_bytes == len(first)


def test_an_upload_checksum_the_store_would_refuse_reads_back_as_none() -> None:
    assert checksum_of_meta([("x-amz-checksum-algorithm", "MD4")]) is None


def test_an_empty_spool_has_no_oldest_write_and_a_keyless_done_record_settles_its_entry() -> None:
    sp = SpoolHarness()
    assert sp.state.oldest_acked_at() is None
    entry = sp.put("k")
    assert sp.state.oldest_acked_at() == entry.acked_at
    sp.state.start_upload(entry)
    sp.state.upload_succeeded(entry)
    assert SpoolState.done_record(entry.seq).encode() == {"t": "done", "s": entry.seq}
    sp.apply(SpoolState.done_record(entry.seq))  # as older journals wrote it
    assert entry.seq not in sp.state.entries
    sp.assert_files_accounted()


def test_uploads_older_than_the_age_limit_are_expired_and_backend_uploads_survive_compaction() -> None:
    sp = SpoolHarness()
    upload = sp.create("big", "up-1")
    assert sp.state.expired_uploads(upload.created_at + 10, 60) == []
    assert sp.state.expired_uploads(upload.created_at + 61, 60) == [upload]
    entry = sp.put("other")
    sp.apply(SpoolState.backend_upload_record("bk-1", entry))
    rebuilt = SpoolState(MARKERS)
    for rec in sp.state.snapshot_records():
        rebuilt.apply(rec)
    assert rebuilt.backend_uploads == sp.state.backend_uploads


def test_a_bucket_that_never_fills_is_never_ready() -> None:
    bucket = TokenBucket(0.0, 1000.0, 0.0, full=False)
    assert bucket.ready_at(500.0, 0.0) == math.inf


def test_a_trickle_of_late_reads_does_not_cut_the_paced_lanes() -> None:
    guard = LatencyGuard(0.005, 0.1, 0.0)
    for i in range(20):
        guard.observe(1.0, 0.0, 0.01 + i * 0.001)  # every read far over the target
    verdict = guard.tick(0.1, quiet=False, read_share=GUARD_MIN_READ_SHARE / 2, can_cut=True)
    assert not verdict.missed and verdict.multiplier == 1.0


def test_the_guard_forgets_latency_history_older_than_its_window() -> None:
    guard = LatencyGuard(0.005, 0.1, 0.0)
    now = 0.0
    while now < BASELINE_HISTORY_S + 5.0:
        for i in range(GUARD_MIN_GOOD_SAMPLES + 1):
            guard.observe(0.001, 0.002, now + i * 0.001)
        now += 1.0
        guard.tick(now, quiet=True, read_share=1.0, can_cut=False)
    assert guard.baseline_s == pytest.approx(0.002)


def test_a_cut_guard_scales_a_paced_lanes_concurrency_down_but_never_below_one() -> None:
    cfg = scheduler_config(Config(), C)
    lanes = tuple(replace(x, max_concurrency=8) if x.name == "checkpoint" else x for x in cfg.lanes)
    s = Scheduler(replace(cfg, lanes=lanes, burst_bytes=1024 * 1024, progress_interval_s=None), 1000.0)
    cut_guard(s, 1000.0)
    now = 1000.8
    s.submit("dataset", 1024 * 1024, now)  # reads active: the lane is paced
    for _ in range(8):
        s.submit("checkpoint", 1024, now)
    granted = 0
    while now < 1001.5:  # while the reads are still active
        d = s.pull(now)
        if isinstance(d, WaitUntil):
            now = d.at
        elif isinstance(d, Grant):
            granted += d.lane == "checkpoint"
        else:
            break
    assert granted == 1  # 8 x the multiplier (1/32) rounds to 0: at least one; none completes here


def test_a_keyless_done_record_of_an_entry_already_gone_changes_nothing() -> None:
    sp = SpoolHarness()
    entry = sp.put("k")
    before = (dict(sp.state.entries), sp.state.bytes_on_disk)
    sp.apply(SpoolState.done_record(entry.seq + 100))  # an older journal's record of a superseded entry
    assert (dict(sp.state.entries), sp.state.bytes_on_disk) == before


def test_setting_the_same_external_limit_or_floor_again_changes_nothing() -> None:
    s = Scheduler(scheduler_config(Config(), C), 0.0)
    s.set_external_limit("checkpoint", C / 10, 0.0)
    s.set_floor("checkpoint", 0.1, 0.0)
    before = s.snapshot(0.0).lane("checkpoint")
    s.set_external_limit("checkpoint", C / 10, 0.0)
    s.set_floor("checkpoint", 0.1, 0.0)
    assert s.snapshot(0.0).lane("checkpoint") == before


def test_a_slowdown_on_an_uncapped_lane_cuts_it_below_what_it_achieved() -> None:
    s = Scheduler(scheduler_config(Config(), C), 0.0)
    now = 0.0
    for _ in range(20):  # the metadata lane alone, uncapped, for 2 s
        t = s.submit("metadata", 1024 * 1024, now)
        d = s.pull(now)
        while not isinstance(d, Grant):
            assert isinstance(d, WaitUntil)
            now = d.at
            d = s.pull(now)
        assert d.ticket == t
        s.complete(t, now)
        now += 0.1
    assert s.snapshot(now).lane("metadata").limit_bps is None  # no limit
    s.observe_backend("metadata", 503, now)
    after = s.snapshot(now).lane("metadata")
    assert after.slowdown_fraction is not None and after.slowdown_fraction < 1.0


def test_a_checkpoint_lane_paced_by_its_limit_alone_says_when_to_come_back() -> None:
    s = Scheduler(scheduler_config(Config(), C), 0.0)
    s.set_external_limit("checkpoint", C / 100, 0.0)  # 1 MB/s
    now = 0.0
    for _ in range(20):
        s.submit("checkpoint", 1024 * 1024, now)
    d = s.pull(now)
    granted = 0
    while isinstance(d, Grant):
        granted += 1
        s.complete(d.ticket, now)
        d = s.pull(now)
    assert 0 < granted < 20
    # Nothing else is queued and nothing is in flight against a concurrency limit: the lane's limit bucket
    # alone decides, and the answer is when it has refilled.
    assert isinstance(d, WaitUntil) and d.at > now


def test_the_latency_window_keeps_a_bounded_sample_of_a_flood_of_reads() -> None:
    guard = LatencyGuard(0.005, 0.1, 0.0)
    for i in range(_BASELINE_MAX_SAMPLES + 10):
        guard.observe(0.0, 0.002, i * 1e-6)  # all within one window
    assert len(guard._window_ttfb) == len(guard._window_extra) == _BASELINE_MAX_SAMPLES


def ftyp(*brands: bytes) -> bytes:
    """An ISO BMFF ``ftyp`` box: major brand, minor version, compatible brands."""
    body = b"ftyp" + brands[0] + b"\0\0\0\0" + b"".join(brands[1:])
    return struct.pack(">I", 4 + len(body)) + body


def test_an_ftyp_box_is_mp4_when_a_compatible_brand_is_and_not_for_its_minor_version() -> None:
    assert detect_content_type(ftyp(b"isom", b"iso2", b"mp41")) == "video/mp4"
    assert detect_content_type(ftyp(b"isom", b"iso2", b"avc1")) == "application/octet-stream"
    # The minor version is not a brand, even when its bytes spell one.
    box = ftyp(b"qt  ", b"qt  ")
    box = box[:12] + b"mp42" + box[16:]
    assert detect_content_type(box) == "application/octet-stream"


def test_a_done_record_for_an_entry_still_uploading_frees_its_key_for_the_next_version() -> None:
    sp = SpoolHarness()
    a = sp.put("k")
    sp.state.start_upload(a)
    sp.apply(SpoolState.done_record(a.seq))  # the done record came before the upload was reported
    assert a.seq not in sp.state.entries
    b = sp.put("k")
    assert seqs(sp.state.drainable(T0, 10)) == [b.seq]
    sp.assert_files_accounted()


@pytest.mark.parametrize("outcome", ["failed", "succeeded"])
def test_a_late_report_of_a_settled_upload_leaves_the_next_versions_upload_marked(outcome: str) -> None:
    sp = SpoolHarness()
    a = sp.put("k")
    sp.state.start_upload(a)
    sp.apply(SpoolState.done_record(a.seq))
    b = sp.put("k")
    sp.state.start_upload(b)
    if outcome == "failed":
        sp.track(sp.state.upload_failed(a, FAR, "late"))
    else:
        sp.state.upload_succeeded(a)
    c = sp.put("k")  # supersedes b, which is still on the wire: c waits for it
    assert c.seq in sp.state.entries
    assert sp.state.drainable(FAR, 10) == []


def test_a_directory_marker_and_a_key_under_it_drain_together() -> None:
    sp = SpoolHarness()
    marker = sp.put("d/")
    under = sp.put("d/x")
    after = sp.put("e")
    assert seqs(sp.state.drainable(T0, 10)) == [marker.seq, under.seq, after.seq]
